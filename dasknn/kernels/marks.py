"""Model mode's sync marks where images fold: each part's classes of equal columns on its own rows
(:func:`column_classes`), sent beside its alive mask (:class:`SyncMarks`), and the columns every part keeps from all
the parts' marks (:func:`kept_columns`): the images equal on every part fold into one. The record of a chunk's folds
is :class:`~dasknn.kernels.folds.Folds`."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .cpu_folds import equal_columns, hash_tile
from .dispatch import backend_of
from .folds import _empty_ids, equal_to_earlier, hash_coefficients


@dataclass(frozen=True, eq=False)
class SyncMarks:
    """What a model-mode part tells the others after a sync layer where images fold: which of its columns are
    alive, and for each column the first column equal to it on the part's own rows (itself where none is). Two
    images are equal when they are equal on every part's rows: the parts fold the same columns from the same
    marks (:func:`kept_columns`), so their blocks keep agreeing column for column."""

    alive: np.ndarray
    classes: np.ndarray


def column_classes(yt) -> np.ndarray:
    """For each column of ``yt`` (a block of any backend), the first column equal to it (itself where none is), as
    host int64: hashes pick the candidates, a comparison decides (a candidate unequal to the first column of its
    hash stays a class of its own)."""
    columns = np.arange(yt.shape[1])
    if yt.shape[1] < 2:
        return columns
    if isinstance(yt, np.ndarray):
        block = np.ascontiguousarray(yt)
        hashes = np.empty(block.shape[1])
        hash_tile(block, block.shape[0], block.shape[1], hash_coefficients(block.shape[0]), hashes)
        members, heads = equal_to_earlier(hashes)
        equal = equal_columns(block, members, heads) if members.size else np.zeros(0, dtype=bool)
    else:
        backend = backend_of(yt)
        xp = backend.array_module()
        members, heads = equal_to_earlier(backend.to_host(xp.asarray(hash_coefficients(yt.shape[0]).astype(yt.dtype))
                                                          @ yt))
        equal = backend.to_host(xp.all(yt[:, xp.asarray(members)] == yt[:, xp.asarray(heads)], axis=0)) \
            if members.size else np.zeros(0, dtype=bool)
    columns[members[equal]] = heads[equal]
    return columns


def kept_columns(marks: list) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The columns the parts keep after a sync layer, from every part's marks: alive masks (nothing folds), or
    :class:`SyncMarks` (a column equal on every part to an earlier one folds into the first of them).

    Returns
    -------
    (keep, folded, into)
        A mask of the columns kept; the columns folded and, for each, the column it folds into (kept).
    """
    if not isinstance(marks[0], SyncMarks):
        keep = marks[0].copy()
        for m in marks[1:]:
            keep |= m
        return keep, _empty_ids(), _empty_ids()
    alive = marks[0].alive.copy()
    for m in marks[1:]:
        alive |= m.alive
    labels = np.stack([m.classes for m in marks], axis=1)  # columns x parts: equal everywhere, equal rows here
    _, first, inverse = np.unique(labels, axis=0, return_index=True, return_inverse=True)
    head = first[inverse.reshape(-1)]
    folded = np.flatnonzero(alive & (head != np.arange(head.size)))
    keep = alive.copy()
    keep[folded] = False
    return keep, folded, head[folded]
