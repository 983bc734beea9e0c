"""Twins (free vertices on the same nets) contracted before Mt-KaHyPar, and the lean rows they serve."""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from dasknn import generate
from dasknn import partition as P
from dasknn.partition import hypergraph as PH
from dasknn.partition.twins import contract, twin_groups


def _incidence(nets: list[list[int]], columns: int) -> sp.csr_matrix:
    ptr = np.concatenate([[0], np.cumsum([len(e) for e in nets])])
    flat = np.concatenate([np.asarray(e, np.int64) for e in nets])
    return sp.csr_matrix((np.ones(len(flat), np.int8), flat, ptr), shape=(len(nets), columns))


def test_twins_share_a_vertex_and_heavy_groups_are_chunked() -> None:
    # columns 0, 2, 4 lie on nets {0, 1}; 1 and 3 on {1}; 5 on nothing
    inc = _incidence([[0, 2, 4], [0, 1, 2, 3, 4]], 6)
    vertex = twin_groups(inc, 6, np.ones(6, np.int64), max_weight=10)
    assert vertex[0] == vertex[2] == vertex[4] and vertex[1] == vertex[3]
    assert len({vertex[0], vertex[1], vertex[5]}) == 3 and sorted(set(vertex)) == [0, 1, 2]
    chunked = twin_groups(inc, 6, np.ones(6, np.int64), max_weight=2)  # 0, 2, 4 weigh 3 together
    assert len({chunked[0], chunked[2], chunked[4]}) == 2
    assert np.bincount(chunked).max() <= 2


def test_contract_merges_equal_nets_and_drops_single_pins() -> None:
    # free columns 0..3 (0 and 1 twins), fixed columns 4, 5 (two hubs)
    inc = _incidence([[0, 4], [1, 4], [0, 1], [2, 5], [3, 2, 5]], 6)
    vertex = np.array([0, 0, 1, 2])
    flat, ptr, weight = contract(inc, 4, vertex)
    nets = [tuple(flat[ptr[e]:ptr[e + 1]]) for e in range(len(ptr) - 1)]
    # {0,4} and {1,4} become {v0, hub0} twice; {0,1} falls into one pin; {2,5} and {3,2,5} stay apart
    assert dict(zip(nets, weight.tolist())) == {(0, 3): 2, (1, 4): 1, (1, 2, 4): 1}


def test_lean_rows_stay_valid_balanced_and_close_to_the_full_hypergraph() -> None:
    ws = generate.network(1024, 6, seed=4, bias=-0.3).layers  # 32 distinct input sets among 1024 outputs
    PH._mtk(None)
    full = PH._layered(ws, 4, 0.03, 0, 0, "deterministic", lean=False)
    lean = PH._layered(ws, 4, 0.03, 0, 0, "deterministic", lean=True)
    P.validate_partition(lean, len(ws), 1024, 4)
    assert P.layer_imbalance(ws, lean, parts=4).max() <= 0.03 + 1e-12
    assert P.layer_volumes(ws, lean, parts=4).sum() <= 1.05 * P.layer_volumes(ws, full, parts=4).sum()
