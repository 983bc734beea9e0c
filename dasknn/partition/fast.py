"""The ``fast`` method: one row of owners at a time by greedy placement and label propagation, in Numba.

Row ``r`` of owners is chosen with its neighbouring rows fixed, as in the layered Mt-KaHyPar pass, but by a
linear-time local method instead of a multilevel partitioner:

* **greedy placement**: every output ``j`` goes, in a seeded random order, to the part with room that already
  holds most of its inputs' nets (the inputs' fixed owners, and the outputs placed before it), so it adds the
  fewest new parts to those nets;
* **label propagation**: passes that move an output to the part that cuts fewest nets, when that part has room
  (or, at equal cut, when the move evens the load).

With the next row fixed too, the nets of the next layer (the output as an input, owned by its owner) count
as well: a backward sweep over the rows refines every row with both neighbours fixed. Only row 1 (nothing
fixed yet) uses Mt-KaHyPar. Every function here is pure: a layer and its fixed neighbouring owners in, one
row of owners out, so a worker can compute any row (or a segment of rows, :mod:`.segments`) on its own.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numba
import numpy as np
import scipy.sparse as sp

from .hypergraph import first_row
from .simple import _cap, _rebalance

#: Label-propagation passes after greedy placement (measured: later passes move almost nothing).
PASSES = 3


@numba.njit(cache=True, nogil=True)
def _scores(j, indptr, indices, conn, nb, own, score):  # pragma: no cover - compiled
    """Nets of output ``j`` that already reach each part (its own pin excluded when ``own >= 0``)."""
    score[:] = 0
    parts = score.shape[0]
    for e in range(indptr[j], indptr[j + 1]):
        i = indices[e]
        for p in range(parts):
            c = conn[i, p] - (1 if p == own else 0)
            if c > 0:
                score[p] += 1
    if nb.shape[0] > 0:
        for p in range(parts):
            if nb[j, p]:
                score[p] += 1


@numba.njit(cache=True, nogil=True)
def _place(indptr, indices, prev, nb, weight, row, cap, order, passes):  # pragma: no cover - compiled
    """Greedy placement of the outputs with ``row[j] < 0``, then label-propagation passes; ``row`` in place."""
    parts = nb.shape[1]
    conn = np.zeros((prev.shape[0], parts), np.int32)  # pins of input i's net in each part
    for i in range(prev.shape[0]):
        conn[i, prev[i]] += 1
    load = np.zeros(parts, np.int64)
    for j in range(row.shape[0]):
        if row[j] >= 0:
            load[row[j]] += weight[j]
            for e in range(indptr[j], indptr[j + 1]):
                conn[indices[e], row[j]] += 1
    score = np.zeros(parts, np.int64)
    for t in range(order.shape[0]):
        j = order[t]
        if row[j] >= 0:
            continue
        _scores(j, indptr, indices, conn, nb, -1, score)
        best = -1
        for p in range(parts):
            if load[p] + weight[j] <= cap and (best < 0 or score[p] > score[best]
                                               or (score[p] == score[best] and load[p] < load[best])):
                best = p
        if best < 0:
            best = int(np.argmin(load))
        row[j] = best
        load[best] += weight[j]
        for e in range(indptr[j], indptr[j + 1]):
            conn[indices[e], best] += 1
    for _ in range(passes):
        moved = 0
        for t in range(order.shape[0]):
            j = order[t]
            a = row[j]
            _scores(j, indptr, indices, conn, nb, a, score)
            best = a
            for p in range(parts):
                if p == a or load[p] + weight[j] > cap:
                    continue
                if score[p] > score[best] or (score[p] == score[best] and load[p] + weight[j] < load[best]):
                    best = p
            if best != a:
                row[j] = best
                load[a] -= weight[j]
                load[best] += weight[j]
                for e in range(indptr[j], indptr[j + 1]):
                    conn[indices[e], a] -= 1
                    conn[indices[e], best] += 1
                moved += 1
        if moved == 0:
            break


def place_row(
    parts: int,
    weight: np.ndarray,
    *,
    layer: sp.csc_matrix | None = None,
    prev: np.ndarray | None = None,
    next_layer: sp.csc_matrix | None = None,
    next_owners: np.ndarray | None = None,
    init: np.ndarray | None = None,
    epsilon: float = 0.03,
    seed: int = 0,
    passes: int = PASSES,
) -> np.ndarray:
    """Owners of one row with its neighbouring rows fixed, minimising the volume of the layers it touches.

    Parameters
    ----------
    parts
        Number of parts ``K``.
    weight
        Work of each neuron of the row (its layer's column counts; ones for the input row).
    layer, prev
        The layer whose outputs this row owns and the owners of its inputs (the row before), or both ``None``.
    next_layer, next_owners
        The layer this row feeds and the owners of its outputs (the row after), or both ``None``.
    init
        Current owners to refine (label propagation only); default: greedy placement first.
    epsilon
        Allowed imbalance of the row's work, ``max / mean - 1``.
    seed
        Seeds the order in which neurons are visited.
    passes
        Label-propagation passes.

    Returns
    -------
    numpy.ndarray
        ``int32`` owners of the row, each part's work within ``floor((1 + epsilon) * mean)``.
    """
    weight = np.asarray(weight, dtype=np.int64)
    n = weight.shape[0]
    if layer is not None:
        indptr, indices = layer.indptr.astype(np.int64), layer.indices.astype(np.int64)
        prev_a = np.asarray(prev, dtype=np.int64)
    else:
        indptr, indices = np.zeros(n + 1, np.int64), np.zeros(0, np.int64)
        prev_a = np.zeros(0, np.int64)
    if next_layer is not None:
        csr = next_layer.tocsr()
        nb = np.zeros((n, parts), dtype=np.bool_)
        nb[np.repeat(np.arange(n), np.diff(csr.indptr)), np.asarray(next_owners)[csr.indices]] = True
    else:
        nb = np.zeros((0, parts), dtype=np.bool_)
    row = np.full(n, -1, np.int64) if init is None else np.asarray(init, dtype=np.int64).copy()
    cap = _cap(float(weight.sum()), parts, epsilon)
    order = np.random.default_rng(seed).permutation(n).astype(np.int64)
    if layer is not None and init is None:
        # the most certain outputs first (most inputs in one part): they set each net's parts for the rest
        aff = np.zeros((n, parts), np.int64)
        np.add.at(aff, (np.repeat(np.arange(n), np.diff(indptr)), prev_a[indices]), 1)
        deg = np.maximum(np.diff(indptr), 1)
        order = order[np.argsort(-(aff.max(axis=1) / deg)[order], kind="stable")]
    _place(indptr, indices, prev_a, np.ascontiguousarray(nb.reshape(-1, parts)), weight, row, cap, order, passes)
    return _rebalance(row.astype(np.int32), weight, parts, cap)


def _weight(ws: Sequence[sp.csc_matrix], r: int) -> np.ndarray:
    """Work of row ``r``'s neurons: layer ``r``'s column counts; the input row (0) weighs one each."""
    n = ws[0].shape[0]
    return np.ones(n, np.int64) if r == 0 else np.diff(ws[r - 1].indptr).astype(np.int64)


def forward_rows(ws: Sequence[sp.csc_matrix], owners: np.ndarray, start: int, parts: int, eps: float,
                 seed: int, progress: Callable[[int], None] | None = None) -> None:
    """Place rows ``start .. L`` of ``owners`` (in place), each with the row before it fixed; ``progress(r)``
    after row ``r``."""
    for r in range(start, len(ws) + 1):
        owners[r] = place_row(parts, _weight(ws, r), layer=ws[r - 1], prev=owners[r - 1], epsilon=eps, seed=seed + r)
        if progress is not None:
            progress(r)


def refine_rows(ws: Sequence[sp.csc_matrix], owners: np.ndarray, rows: Sequence[int], parts: int, eps: float,
                seed: int) -> None:
    """Refine each row in ``rows`` (in that order, in place) with both of its neighbouring rows fixed."""
    last = len(ws)
    for r in rows:
        owners[r] = place_row(
            parts, _weight(ws, r),
            layer=ws[r - 1] if r >= 1 else None, prev=owners[r - 1] if r >= 1 else None,
            next_layer=ws[r] if r < last else None, next_owners=owners[r + 1] if r < last else None,
            init=owners[r], epsilon=eps, seed=seed + r,
        )


def fast(ws: Sequence[sp.csc_matrix], parts: int, eps: float, seed: int, sweeps: int = 1,
         preset: str = "default", progress: Callable[[int, int], None] | None = None) -> np.ndarray:
    """The ``fast`` method: row 1 by Mt-KaHyPar, row 0 to fit it, rows 2 .. L placed forward, then ``sweeps``
    label-propagation sweeps over all rows (backward first: the forward pass never looked ahead);
    ``progress(rows done, total)`` as rows of the forward pass and sweeps finish.

    Returns
    -------
    numpy.ndarray
        ``int32`` owners of shape ``(L + 1, N)``.
    """
    row1 = first_row(ws[0].tocsr(), _weight(ws, 1), parts, eps, seed, preset)
    row0 = place_row(parts, _weight(ws, 0), next_layer=ws[0], next_owners=row1, epsilon=eps, seed=seed)
    owners = np.zeros((len(ws) + 1, ws[0].shape[0]), dtype=np.int32)
    owners[0] = row0
    owners[1] = row1
    rows = list(range(len(ws) + 1))
    total = len(rows) * (1 + sweeps)
    forward_rows(ws, owners, 2, parts, eps, seed, None if progress is None else lambda r: progress(r + 1, total))
    for s in range(sweeps):
        refine_rows(ws, owners, rows[::-1] if s % 2 == 0 else rows, parts, eps, seed + 7919 * (s + 1))
        if progress is not None:
            progress(len(rows) * (s + 2), total)
    return owners
