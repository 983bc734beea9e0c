"""From a partition to the exchange: per layer and part, which inputs are local, which arrive from whom.

Part ``q`` computes, in layer ``k``, the output neurons it owns (``owners[k] == q``). For that it needs every
input neuron ``i`` with a nonzero in one of its columns; those it owns itself (``owners[k-1] == q``) are local,
the rest arrive from their owners. The plan lists, for every layer and part:

* ``outputs``: the owned output neurons (sorted), the rows of the part's activation block after the layer;
* ``inputs``: the needed input neurons (sorted), the rows of the part's assembled input block;
* ``local``: ``(dst, src)`` positions: rows of the part's previous block that are inputs of this layer;
* ``recv[p]``: positions in ``inputs`` filled by the message from part ``p``;
* ``send[q]``: rows of this part's previous block that part ``q`` needs, in the order ``q`` expects them.

The plan knows the sparsity pattern only (no weight values) and nothing of Dask. The volume it implies is the
partition's connectivity-1 volume: every needed input crosses once to each other part that needs it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import scipy.sparse as sp


@dataclass
class PartLayer:
    """What one part does in one layer (see the module's description)."""

    outputs: np.ndarray
    inputs: np.ndarray
    local: tuple[np.ndarray, np.ndarray]
    recv: dict[int, np.ndarray] = field(default_factory=dict)
    send: dict[int, np.ndarray] = field(default_factory=dict)


@dataclass
class Plan:
    """The exchange plan for a whole network: ``layers[k-1][q]`` is part ``q``'s :class:`PartLayer` in layer k."""

    parts: int
    neurons: int
    inputs_owned: list[np.ndarray]  # per part: the input pixels it holds before layer 1
    layers: list[list[PartLayer]]

    def volume(self, k: int) -> int:
        """Entries (neuron values per image) sent between parts in layer ``k``."""
        return int(sum(len(v) for pl in self.layers[k - 1] for v in pl.send.values()))

    def volumes(self) -> np.ndarray:
        """Per-layer volumes, layer 1 first."""
        return np.array([self.volume(k) for k in range(1, len(self.layers) + 1)], dtype=np.int64)

    def part(self, q: int) -> list[PartLayer]:
        """Part ``q``'s plan for every layer (what its worker needs)."""
        return [layer[q] for layer in self.layers]


def _owned(row: np.ndarray, q: int) -> np.ndarray:
    return np.flatnonzero(row == q).astype(np.int64)


def needed_inputs(w: sp.csc_matrix, outputs: np.ndarray) -> np.ndarray:
    """Sorted input neurons with a nonzero in any of the ``outputs`` columns of ``w``."""
    cols = w[:, outputs] if outputs.size else w[:, :0]
    return np.unique(cols.indices).astype(np.int64)


def build_plan(layers: Sequence[sp.spmatrix], owners: np.ndarray) -> Plan:
    """Derive the exchange plan from a network's patterns and an owners array of shape ``(L + 1, N)``.

    Parameters
    ----------
    layers
        ``W_1 .. W_L`` (the pattern is what matters), challenge orientation.
    owners
        ``owners[k, j]`` is the part that holds neuron ``j`` after layer ``k`` (row 0: the input pixels).
    """
    owners = np.asarray(owners)
    parts = int(owners.max()) + 1
    neurons = owners.shape[1]
    prev_out = [_owned(owners[0], q) for q in range(parts)]
    plan_layers: list[list[PartLayer]] = []
    for k, w in enumerate(layers, start=1):
        w = sp.csc_matrix(w)
        outs = [_owned(owners[k], q) for q in range(parts)]
        row: list[PartLayer] = []
        for q in range(parts):
            need = needed_inputs(w, outs[q])
            holder = owners[k - 1][need]
            mine = holder == q
            local = (np.flatnonzero(mine), np.searchsorted(prev_out[q], need[mine]))
            recv = {int(p): np.flatnonzero(holder == p) for p in np.unique(holder[~mine])}
            row.append(PartLayer(outputs=outs[q], inputs=need, local=local, recv=recv))
        for q, pl in enumerate(row):
            for p, dst in pl.recv.items():
                # part p sends, in q's order, the rows of its previous block that hold those inputs
                row[p].send[q] = np.searchsorted(prev_out[p], pl.inputs[dst])
        plan_layers.append(row)
        prev_out = outs
    return Plan(parts=parts, neurons=neurons, inputs_owned=[_owned(owners[0], q) for q in range(parts)],
                layers=plan_layers)


def local_block(w: sp.csc_matrix, pl: PartLayer, block_rows: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Part of layer ``w`` that ``pl``'s part computes, as CSC raw arrays indexed into the rows it reads.

    The part reads its previous block in place (``block_rows`` rows: index ``r`` is row ``r`` of that block)
    followed by the received rows, stacked by sender in ascending order, each sender's rows in its message's
    order (index ``block_rows + t``). Entries stay in ascending input-neuron order within each column, so sums
    are formed in the same order as the reference's.
    """
    cols = sp.csc_matrix(w[:, pl.outputs])
    cols.sort_indices()
    where = np.empty(pl.inputs.size, dtype=np.int64)  # input position -> row read
    where[pl.local[0]] = pl.local[1]
    base = block_rows
    for p in sorted(pl.recv):
        dst = pl.recv[p]
        where[dst] = base + np.arange(dst.size)
        base += dst.size
    indices = where[np.searchsorted(pl.inputs, cols.indices)].astype(np.int32)
    return cols.indptr.astype(np.int64), indices, cols.data


def received_rows(pl: PartLayer) -> int:
    """Rows that reach the part from others in this layer (the size of its receive buffer)."""
    return int(sum(v.size for v in pl.recv.values()))
