"""The CPU layer loop's looks for equal images (:mod:`dasknn.kernels.folds`): hashing a tile's columns while it is
in L2, folding the equal ones inside a tile, and the look over every tile's survivors at a group's end. The loop
that calls them is :func:`dasknn.kernels.cpu.run_layers_numpy`; equal is always decided by comparing columns, the
hash only picks which to compare."""

from __future__ import annotations

import numba
import numpy as np

from .folds import Folds, equal_to_earlier


@numba.njit(cache=True, nogil=True, boundscheck=False)
def hash_tile(buf, rows, t, coef, hashes):  # pragma: no cover - compiled
    # hashes[b] = sum_i buf[i, b] * coef[i], rows in order: equal columns hash alike, wherever they are; a pass over
    # the tile while it is still in L2
    for b in range(t):
        hashes[b] = 0.0
    for i in range(rows):
        c = coef[i]
        for b in range(t):
            hashes[b] += buf[i, b] * c


@numba.njit(cache=True, nogil=True, boundscheck=False)
def fold_tile(buf, rows, t, hashes, ids, weights, keep, fold_merged, fold_into, folded):  # pragma: no cover
    # a look inside a tile (in L2): each column equal to the first column of its hash in every row is folded into
    # it (its weight added to the head's, the pair recorded at folded[0], keep[column] cleared for the caller to
    # squeeze it out). No barrier between tiles is needed: the challenge's converging images meet the same few
    # vectors in every tile
    order = np.argsort(hashes[:t], kind="mergesort")
    for b in range(t):
        keep[b] = True
    n = folded[0]
    g = 0
    while g < t:
        head = order[g]
        e = g + 1
        while e < t and hashes[order[e]] == hashes[head]:
            m = order[e]
            same = True
            for i in range(rows):
                if buf[i, m] != buf[i, head]:
                    same = False
                    break
            if same:
                keep[m] = False
                weights[head] += weights[m]
                fold_merged[n] = ids[m]
                fold_into[n] = ids[head]
                n += 1
            e += 1
        g = e
    folded[0] = n


@numba.njit(cache=True, nogil=True, boundscheck=False)
def equal_columns(out, members, heads):  # pragma: no cover - compiled
    # which candidate members (columns whose hash equals an earlier one's, folds.equal_to_earlier) equal their head
    # in every row of out; a row at a time, so the candidates' reads stay in one row
    n = members.size
    equal = np.ones(n, dtype=np.bool_)
    for i in range(out.shape[0]):
        for p in range(n):
            if out[i, members[p]] != out[i, heads[p]]:
                equal[p] = False
    return equal


@numba.njit(cache=True, nogil=True, boundscheck=False)
def _keep_in_place(out, kept):  # pragma: no cover - compiled
    # out's columns kept (ascending) moved to its front: kept[j] >= j, so nothing still to be read is overwritten
    for i in range(out.shape[0]):
        for j in range(kept.size):
            out[i, j] = out[i, kept[j]]


def fold_group(out: np.ndarray, survivors: int, hashes: np.ndarray, ids: np.ndarray, weights: np.ndarray,
               folds: Folds):
    """A look after a group of layers: the survivors (``out``'s first columns, their ``hashes`` from
    :func:`hash_tile`) equal to an earlier one folded into it, in place; returns the kept columns (a view of
    ``out``), their images and weights, and ``folds`` with the folded images."""
    members, heads = equal_to_earlier(hashes[:survivors])
    if members.size:
        equal = equal_columns(out, members, heads)
        members, heads = members[equal], heads[equal]
    if not members.size:
        return out[:, :survivors], ids, weights, folds
    np.add.at(weights, heads, weights[members])  # (a head is never a member: it is the first of its hash)
    keep = np.ones(survivors, dtype=bool)
    keep[members] = False
    kept = np.flatnonzero(keep)
    _keep_in_place(out, kept)
    return out[:, :kept.size], ids[kept], weights[kept], folds.folded(ids[members], ids[heads])
