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

    def volumes(self) -> np.ndarray:
        """Per-layer volumes (entries per image sent between parts), layer 1 first."""
        return self.outline().volumes()

    def part(self, q: int) -> list[PartLayer]:
        """Part ``q``'s plan for every layer (what its worker needs)."""
        return [layer[q] for layer in self.layers]

    def outline(self) -> Outline:
        """What the client needs of this plan to build the task graph."""
        return Outline(parts=self.parts, neurons=self.neurons, inputs_owned=self.inputs_owned,
                       counts=np.stack([layer_counts(row) for row in self.layers]),
                       last_outputs=[pl.outputs for pl in self.layers[-1]])


@dataclass
class Outline:
    """A plan without its per-neuron lists: what the client needs to build the task graph (who sends to whom in
    each layer, how many entries), whether the lists are in its memory (:class:`Plan`) or in a part plan store
    that the workers read as they go (out of core)."""

    parts: int
    neurons: int
    inputs_owned: list[np.ndarray]  # per part: the input pixels it holds before layer 1
    counts: np.ndarray  # (L, parts, parts): entries part p sends part q in layer k, at counts[k - 1, p, q]
    last_outputs: list[np.ndarray]  # per part: the neurons it holds after the last layer

    @classmethod
    def from_owners(cls, owners: np.ndarray, counts: np.ndarray) -> Outline:
        """The outline of the plan for ``owners`` whose exchange counts are ``counts``."""
        parts = int(owners.max()) + 1
        return cls(parts=parts, neurons=owners.shape[1], inputs_owned=[_owned(owners[0], q) for q in range(parts)],
                   counts=counts, last_outputs=[_owned(owners[-1], q) for q in range(parts)])

    def senders(self, k: int, q: int) -> tuple[int, ...]:
        """Parts that send to part ``q`` in layer ``k``, ascending (the order ``q`` stacks their rows)."""
        return tuple(int(p) for p in np.flatnonzero(self.counts[k - 1, :, q]))

    def receivers(self, k: int, p: int) -> tuple[int, ...]:
        """Parts that part ``p`` sends to in layer ``k``."""
        return tuple(int(q) for q in np.flatnonzero(self.counts[k - 1, p, :]))

    def volume(self, k: int) -> int:
        """Entries (neuron values per image) sent between parts in layer ``k``."""
        return int(self.counts[k - 1].sum())

    def volumes(self) -> np.ndarray:
        """Per-layer volumes, layer 1 first."""
        return self.counts.sum(axis=(1, 2)).astype(np.int64)


def layer_counts(row: Sequence[PartLayer]) -> np.ndarray:
    """``counts[p, q]``: entries part ``p`` sends part ``q`` in one layer (``row``: every part's PartLayer)."""
    counts = np.zeros((len(row), len(row)), dtype=np.int64)
    for p, pl in enumerate(row):
        for q, rows in pl.send.items():
            counts[p, q] = rows.size
    return counts


def _owned(row: np.ndarray, q: int) -> np.ndarray:
    return np.flatnonzero(row == q).astype(np.int64)


def needed_inputs(w: sp.csc_matrix, outputs: np.ndarray) -> np.ndarray:
    """Sorted input neurons with a nonzero in any of the ``outputs`` columns of ``w``."""
    cols = w[:, outputs] if outputs.size else w[:, :0]
    used = np.zeros(w.shape[0], dtype=bool)  # a mark per input: linear, where a sort of the entries is not
    used[cols.indices] = True
    return np.flatnonzero(used).astype(np.int64)


def part_inputs(w: sp.csc_matrix, before: np.ndarray, after: np.ndarray, q: int,
                prev_block: np.ndarray | None = None) -> PartLayer:
    """Part ``q``'s :class:`PartLayer` for layer ``w`` without its send lists: its outputs, the inputs they
    read, which of those its previous block holds (``prev_block``: the neurons ``before`` gives it) and which
    it receives from each other part."""
    prev_block = _owned(before, q) if prev_block is None else prev_block
    outputs = _owned(after, q)
    need = needed_inputs(w, outputs)
    holder = before[need]
    mine = holder == q
    local = (np.flatnonzero(mine), np.searchsorted(prev_block, need[mine]))
    recv = {int(p): np.flatnonzero(holder == p) for p in np.unique(holder[~mine])}
    return PartLayer(outputs=outputs, inputs=need, local=local, recv=recv)


def plan_layer(w: sp.spmatrix, before: np.ndarray, after: np.ndarray, parts: int) -> list[PartLayer]:
    """Every part's :class:`PartLayer` for one layer ``w``, from the owners of its inputs (``before``, row
    ``k - 1`` of the owners array) and of its outputs (``after``, row ``k``)."""
    w = sp.csc_matrix(w)
    prev_out = [_owned(before, q) for q in range(parts)]
    row = [part_inputs(w, before, after, q, prev_out[q]) for q in range(parts)]
    for q, pl in enumerate(row):
        for p, dst in pl.recv.items():
            # part p sends, in q's order, the rows of its previous block that hold those inputs
            row[p].send[q] = np.searchsorted(prev_out[p], pl.inputs[dst])
    return row


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
    plan_layers = [plan_layer(w, owners[k - 1], owners[k], parts) for k, w in enumerate(layers, start=1)]
    return Plan(parts=parts, neurons=owners.shape[1], inputs_owned=[_owned(owners[0], q) for q in range(parts)],
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
    row_of = np.zeros(w.shape[0], dtype=np.int64)  # input neuron -> row read: a lookup, not a search per entry
    row_of[pl.inputs] = where
    indices = row_of[cols.indices].astype(np.int32)
    return cols.indptr.astype(np.int64), indices, cols.data


def received_rows(pl: PartLayer) -> int:
    """Rows that reach the part from others in this layer (the size of its receive buffer)."""
    return int(sum(v.size for v in pl.recv.values()))


def part_plan_layer(w: sp.spmatrix, before: np.ndarray, after: np.ndarray, parts: int, q: int) -> PartLayer:
    """Part ``q``'s :class:`PartLayer` for layer ``w``: the same as
    ``plan_layer(w, before, after, parts)[q]``, without making the other parts' lists.

    ``before`` and ``after`` are rows ``k - 1`` and ``k`` of the owners array (of ``parts`` parts). Its send
    lists come from the layer's entries whose input part ``q`` holds: one pass over the entries, not one column
    slice per part.
    """
    w = sp.csc_matrix(w)
    mine_before = np.flatnonzero(before == q).astype(np.int64)  # the rows of the part's previous block
    pl = part_inputs(w, before, after, q, mine_before)
    # which of this part's inputs each part reads: one pass over the entries whose input this part holds
    cols = np.repeat(np.arange(w.shape[1], dtype=np.int64), np.diff(w.indptr))
    held = before[w.indices] == q
    read = np.zeros((parts, w.shape[0]), dtype=bool)
    read[after[cols[held]], w.indices[held]] = True
    read[q] = False
    for r in np.flatnonzero(read.any(axis=1)):
        pl.send[int(r)] = np.searchsorted(mine_before, np.flatnonzero(read[r]))
    return pl


def send_counts(part: list[PartLayer], parts: int) -> np.ndarray:
    """``counts[k - 1, r]``: entries the part sends part ``r`` for layer ``k`` (its row of the outline's counts)."""
    counts = np.zeros((len(part), parts), dtype=np.int64)
    for k, pl in enumerate(part):
        for r, rows in pl.send.items():
            counts[k, r] = rows.size
    return counts
