"""Segments of layers partitioned independently (on different workers) and stitched into one partition.

A segment of layers ``a + 1 .. b`` is partitioned on its own (rows ``a .. b``, :func:`~.fast.fast`), so the
segments of a deep network can run in parallel. Their part labels are arbitrary, so each segment is then
*stitched* to the one before it: its labels are permuted to agree as much as possible with the previous
segment's last row (both own row ``a``; a maximum-weight matching of parts on the neurons they place alike),
its own row ``a`` is replaced by the previous segment's, and the rows around the seam are refined with their
neighbours fixed. Every function is pure (owners in, owners out), so the stitching can run on any process.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import scipy.sparse as sp
from scipy.optimize import linear_sum_assignment

from .fast import fast, refine_rows
from .hypergraph import _Layered

#: Rows refined on each side of a seam after stitching.
SEAM_ROWS = 2


def match_parts(reference: np.ndarray, row: np.ndarray, parts: int) -> np.ndarray:
    """The relabelling of ``row``'s parts that agrees most with ``reference`` (the same neurons' owners).

    Parameters
    ----------
    reference, row
        Two owners rows of the same neurons (``int``, values below ``parts``).
    parts
        Number of parts.

    Returns
    -------
    numpy.ndarray
        ``int32`` ``relabel`` of length ``parts``: ``relabel[row]`` keeps the most neurons where ``reference``
        has them (a maximum-weight perfect matching between the two rows' parts).
    """
    overlap = np.zeros((parts, parts), dtype=np.int64)
    np.add.at(overlap, (np.asarray(row, dtype=np.int64), np.asarray(reference, dtype=np.int64)), 1)
    old, new = linear_sum_assignment(overlap, maximize=True)
    relabel = np.empty(parts, dtype=np.int32)
    relabel[old] = new
    return relabel


def stitch(previous_last: np.ndarray, segment: np.ndarray, parts: int) -> np.ndarray:
    """Relabel a segment's owners to agree with the previous segment and give it that segment's last row.

    Parameters
    ----------
    previous_last
        The previous segment's last row of owners (the row both segments share).
    segment
        The segment's owners, row 0 being its own (discarded) choice for that shared row.
    parts
        Number of parts.

    Returns
    -------
    numpy.ndarray
        ``int32`` owners of the segment's rows: relabelled, with row 0 set to ``previous_last``.
    """
    out = match_parts(previous_last, segment[0], parts)[segment]
    out[0] = previous_last
    return out


def relabel_chain(firsts: Sequence[np.ndarray], lasts: Sequence[np.ndarray], parts: int) -> list[np.ndarray]:
    """Each segment's relabelling so that it agrees with the segment before it, from their end rows only.

    Parameters
    ----------
    firsts, lasts
        Each segment's own first and last rows of owners, as it partitioned them (segment ``s``'s last row and
        segment ``s + 1``'s first row are the same neurons).
    parts
        Number of parts.

    Returns
    -------
    list of numpy.ndarray
        ``relabel[s]`` for every segment (the first's is the identity): ``relabel[s][owners]`` are segment
        ``s``'s owners in the first segment's labels.
    """
    chain = [np.arange(parts, dtype=np.int32)]
    for s in range(1, len(firsts)):
        chain.append(match_parts(chain[-1][lasts[s - 1]], firsts[s], parts))
    return chain


def refine_window(ws: Sequence[sp.csc_matrix], owners: np.ndarray, parts: int, eps: float, seed: int,
                  method: str, preset: str = "default") -> None:
    """Refine rows ``1 .. L - 1`` of a window of rows around a seam, in place, its first and last rows fixed.

    ``ws`` are the window's ``L`` layers and ``owners`` its ``L + 1`` rows. ``hypergraph`` re-partitions each row
    with Mt-KaHyPar and keeps it where that sends less (:meth:`~.hypergraph._Layered.sweep`); ``fast`` moves
    neurons by label propagation (:func:`~.fast.refine_rows`).
    """
    rows = list(range(1, len(ws)))
    if method == "hypergraph":
        _Layered(ws, parts, eps, seed, preset, lean=True).sweep(owners, rows)
    else:
        refine_rows(ws, owners, rows, parts, eps, seed)


def bounds(layers: int, segments: int) -> list[tuple[int, int]]:
    """Rows ``(a, b)`` of each of ``segments`` near-equal runs of layers (layers ``a + 1 .. b``)."""
    cuts = np.linspace(0, layers, min(segments, layers) + 1).round().astype(int)
    return [(int(a), int(b)) for a, b in zip(cuts[:-1], cuts[1:])]


def fast_segments(ws: Sequence[sp.csc_matrix], parts: int, eps: float, seed: int, segments: int = 4,
                  preset: str = "default") -> np.ndarray:
    """The ``fast-segments`` method: :func:`~.fast.fast` on ``segments`` runs of layers, stitched, seams refined.

    Returns
    -------
    numpy.ndarray
        ``int32`` owners of shape ``(L + 1, N)``.
    """
    owners = np.zeros((len(ws) + 1, ws[0].shape[0]), dtype=np.int32)
    seams = []
    for s, (a, b) in enumerate(bounds(len(ws), segments)):
        seg = fast(ws[a:b], parts, eps, seed + 104729 * s, sweeps=1, preset=preset)  # independent: parallel on a cluster
        owners[a:b + 1] = seg if a == 0 else stitch(owners[a], seg, parts)
        if a > 0:
            seams.append(a)
    for a in seams:
        rows = range(max(0, a - SEAM_ROWS), min(len(ws), a + SEAM_ROWS) + 1)
        refine_rows(ws, owners, list(rows), parts, eps, seed + a)
    return owners
