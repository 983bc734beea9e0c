"""Twins: free vertices that lie on exactly the same nets, contracted before Mt-KaHyPar sees the hypergraph.

A RadiX-Net layer is made of small dense blocks: on the challenge network every output shares its set of inputs
with 15 others (64 distinct sets among 1024 outputs), on a generated 65536-wide layer with 31 others (2048
distinct sets). Vertices on the same nets can always share a part without cutting more, so a row's hypergraph
can lose them: each group of twins becomes one vertex carrying their weight, the nets that then hold the same
pins become one weighted net, and Mt-KaHyPar partitions a hypergraph a few hundred times smaller. Only balance
can ask to split twins, so a group is cut into chunks of at most ``max_weight`` (a fraction of the allowed
imbalance) and the owners come out within the same capacities.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp


def _set_hashes(indptr: np.ndarray, indices: np.ndarray, count: int) -> np.ndarray:
    """Two order-free 64-bit hashes (and the size) of each compressed row's set of ``indices`` (``< count``):
    wrapping sums of fixed pseudo-random keys, shape ``(rows, 3)``."""
    keys = np.random.default_rng(0x7A15EED).integers(1, 2**63, size=(2, count), dtype=np.uint64)
    size = np.diff(indptr)
    out = np.zeros((len(size), 3), np.uint64)
    out[:, 0] = size
    full = size > 0
    for h in (0, 1):  # the rows with pins are contiguous runs of indices starting at their pointers
        out[full, h + 1] = np.add.reduceat(keys[h][indices], indptr[:-1][full]) if full.any() else 0
    return out


def _column_hashes(incidence: sp.csr_matrix, n: int) -> np.ndarray:
    """Degree and three order-free hashes of the nets of each of the first ``n`` columns, shape ``(n, 4)``:
    sums of 32-bit keys, exact in ``float64`` below 2**21 nets per column, without transposing."""
    keys = np.random.default_rng(0x7A15EED).integers(1, 2**32, size=(3, incidence.shape[0])).astype(np.float64)
    row = np.repeat(np.arange(incidence.shape[0]), np.diff(incidence.indptr))
    free = incidence.indices < n
    col, row = incidence.indices[free], row[free]
    out = np.empty((n, 4), np.float64)
    out[:, 0] = np.bincount(col, minlength=n)
    for h in range(3):
        out[:, h + 1] = np.bincount(col, weights=keys[h][row], minlength=n)
    return out


def _sorted_keys(key: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The order that sorts the rows of ``key`` (stable) and where each run of equal rows starts."""
    order = np.lexsort((np.arange(len(key)),) + tuple(key[:, c] for c in range(key.shape[1] - 1, -1, -1)))
    new = np.ones(len(key), dtype=np.bool_)
    new[1:] = (key[order][1:] != key[order][:-1]).any(axis=1)
    return order, new


def twin_groups(incidence: sp.csr_matrix, free: int, weight: np.ndarray, max_weight: int) -> np.ndarray:
    """Vertex of the contracted hypergraph for each of the first ``free`` columns of ``incidence`` (nets x
    vertices).

    Columns with the same nets share a vertex, up to ``max_weight`` of ``weight`` per vertex (a group of twins
    heavier than that is cut into chunks). Two columns are taken for twins when their degree and three
    independent 32-bit hashes of their nets agree; a false match would only cost volume, never validity.

    Returns
    -------
    numpy.ndarray
        ``int64`` vertex of every column, ``0 .. vertices - 1``.
    """
    n = free
    order, new_group = _sorted_keys(_column_hashes(incidence, n))
    w = np.maximum(weight[order], 1).astype(np.int64)
    # a running weight inside each group; a new chunk where it passes max_weight
    group = np.cumsum(new_group) - 1
    start = np.flatnonzero(new_group)
    run = np.cumsum(w)
    before = np.concatenate([[0], run[start[1:] - 1]]) if len(start) else np.zeros(0, np.int64)
    within = run - before[group]
    chunk = (within - 1) // max(1, int(max_weight))
    new_vertex = new_group.copy()
    new_vertex[1:] |= chunk[1:] != chunk[:-1]
    vertex = np.empty(n, np.int64)
    vertex[order] = np.cumsum(new_vertex) - 1
    # number the vertices by their first column: the row keeps its own order (the hashes' order is arbitrary)
    first = np.full(int(vertex.max()) + 1 if n else 0, n, np.int64)
    np.minimum.at(first, vertex, np.arange(n))
    rank = np.empty(len(first), np.int64)
    rank[np.argsort(first)] = np.arange(len(first))
    return rank[vertex]


def contract(incidence: sp.csr_matrix, free: int, vertex: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The nets of ``incidence`` (nets x ``free`` + fixed columns) on the contracted vertices, merged.

    Free column ``j`` becomes vertex ``vertex[j]``; fixed column ``free + p`` becomes ``vertices + p``. Pins
    that fall together count once, nets with one pin are dropped (they can never be cut), and nets with the
    same pins become one net weighing as many.

    Returns
    -------
    tuple
        ``flat``, ``ptr`` (the nets as CSR) and ``int64`` net weights.
    """
    nv = int(vertex.max()) + 1 if len(vertex) else 0
    fixed = incidence.shape[1] - free
    to = np.concatenate([vertex, nv + np.arange(fixed, dtype=np.int64)])
    m = sp.csr_matrix((np.ones(incidence.nnz, np.int8), to[incidence.indices], incidence.indptr),
                      shape=(incidence.shape[0], nv + fixed))
    m.sum_duplicates()  # one pin per contracted vertex, pins sorted
    key = _set_hashes(m.indptr, m.indices, m.shape[1])
    kept = np.flatnonzero(key[:, 0] >= 2)
    order, new = _sorted_keys(key[kept])
    starts = np.flatnonzero(new)
    counts = np.diff(np.append(starts, len(order)))
    first = order[starts]  # the stable sort puts each run's first net first
    by_first = np.argsort(first)
    nets = kept[first[by_first]]
    weights = counts[by_first]
    sub = m[nets]
    return sub.indices.astype(np.int64), sub.indptr.astype(np.int64), weights.astype(np.int64)
