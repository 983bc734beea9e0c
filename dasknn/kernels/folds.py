"""Images that converge are computed once: a chunk's record of the images folded into an equal one.

After a dozen of the challenge's layers most alive images of a chunk hold one of a handful of activation vectors
(on the real 1024 x 120 network, from layer 40 on, all of them hold the same one). Two images equal after layer
``k`` stay equal after every later layer: the same inputs go through the same kernel in the same order of additions.
So the layer loop keeps one *representative* of each distinct vector, drops the others' columns as it drops dead
images, and records here which image each dropped one was *folded into*; the chunk's end expands the record (its
categories, kept activations, ``--results``). Dead-image removal is the special case of the zero vector.

Looking costs a pass over the activations (a hash per image, then a comparison of the images whose hashes agree:
equal is decided by comparing, never by the hash alone), so the loop looks only now and then: after every layer
while each look folds many images, twice as far apart after each look that folds few (:meth:`Folds.ran`).

Two parts: :class:`Folds`, the frozen record a chunk carries from segment to segment (and from stage to stage), and
:func:`fold_equal_columns` with :func:`run_layers_folding`, the fold on any backend's arrays and the loop around a
backend's own loop for a backend that does not fold inside its loop (the CPU's does, :mod:`.cpu`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from itertools import islice

import numpy as np

#: Layers between the first looks: a look costs a pass over a tile already in cache, a small part of a layer
#: that reads each input ~32 times, so a chunk starts looking after every layer.
FIRST_EVERY = 1
#: Layers between looks at most, however little the looks fold (detection then costs a pass in this many layers).
MOST_EVERY = 16
#: Looks that fold at least this share of the columns they saw look again after every layer.
FOLD_OFTEN = 1 / 16
#: Looks that fold less than this share double the layers between looks (between the two: unchanged).
FOLD_SOME = 1 / 256


def _empty_ids() -> np.ndarray:
    return np.empty(0, dtype=np.int64)


@dataclass(frozen=True, eq=False)
class Folds:
    """A chunk's folded images and when its loop looks next.

    Parameters
    ----------
    merged, into
        Image ``merged[i]`` (an original index) was folded into image ``into[i]``, alive and distinct when it was
        folded, in the order of the folds (a later fold may fold ``into[i]`` itself).
    every, to_look
        Layers between looks now, and layers to the next one (1: after the next layer).
    columns, alive
        One entry per layer run so far: the columns the layer computed (its distinct input vectors, as far as the
        looks found them), and the images alive after it (the folded ones counted with their representative).
    enabled
        False: nothing is folded, the layers are only counted (``compress=False``).
    """

    merged: np.ndarray = field(default_factory=_empty_ids)
    into: np.ndarray = field(default_factory=_empty_ids)
    every: int = FIRST_EVERY
    to_look: int = FIRST_EVERY
    columns: np.ndarray = field(default_factory=_empty_ids)
    alive: np.ndarray = field(default_factory=_empty_ids)
    enabled: bool = True

    def roots(self) -> np.ndarray:
        """For each folded image, the image it stands for now (the end of its chain of folds)."""
        root = self.into.copy()
        if not root.size:
            return root
        order = np.argsort(self.merged, kind="stable")
        merged = self.merged[order]
        for _ in range(self.merged.size):  # a chain is as long as the looks at most: a few rounds
            at = np.minimum(np.searchsorted(merged, root), merged.size - 1)
            folded = merged[at] == root
            if not folded.any():
                break
            root[folded] = self.into[order[at[folded]]]
        return root

    def weights(self, ids: np.ndarray) -> np.ndarray:
        """How many images each of the columns ``ids`` stands for (itself and those folded into it)."""
        ids = np.asarray(ids, dtype=np.int64)
        weights = np.ones(ids.size, dtype=np.int64)
        if self.merged.size and ids.size:
            column, found = self._columns_of(ids, self.roots())
            np.add.at(weights, column[found], 1)
        return weights

    def expand(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The chunk's end: every image alive after the last layer and the column it reads.

        Parameters
        ----------
        ids
            The images of the final columns (representatives), in column order.

        Returns
        -------
        (images, columns)
            ``ids`` followed by each folded image whose representative is alive, and for each the column of
            ``ids`` that holds its activations.
        """
        ids = np.asarray(ids, dtype=np.int64)
        own = np.arange(ids.size)
        if not self.merged.size or not ids.size:
            return ids, own
        column, found = self._columns_of(ids, self.roots())
        return np.concatenate([ids, self.merged[found]]), np.concatenate([own, column[found]])

    @staticmethod
    def _columns_of(ids: np.ndarray, roots: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        # the column of ids holding each root, and whether it is there (a root that died is not)
        by_id = np.argsort(ids, kind="stable")
        at = np.minimum(np.searchsorted(ids[by_id], roots), ids.size - 1)
        return by_id[at], ids[by_id[at]] == roots

    def counted(self, columns: np.ndarray, alive: np.ndarray) -> Folds:
        """This record with the counts of the layers just run appended."""
        return dataclasses.replace(self, columns=np.concatenate([self.columns, np.asarray(columns, np.int64)]),
                                   alive=np.concatenate([self.alive, np.asarray(alive, np.int64)]))

    def alive_through(self, start: int, stop: int, weight: int) -> Folds:
        """This record with ``weight`` more images alive after each of its layers ``start`` to ``stop - 1``
        (counted from 0; layers not counted, as after all of its images died, count 0 before): images whose later
        layers were known without running them (:mod:`dasknn.kernels.ends`)."""
        columns = np.zeros(max(stop, self.columns.size), dtype=np.int64)
        alive = np.zeros_like(columns)
        columns[:self.columns.size], alive[:self.alive.size] = self.columns, self.alive
        alive[start:stop] += weight
        return dataclasses.replace(self, columns=columns, alive=alive)

    def folded(self, merged: np.ndarray, into: np.ndarray) -> Folds:
        """This record with images ``merged`` folded into ``into`` (alive and distinct when they were)."""
        if not len(merged):
            return self
        return dataclasses.replace(self, merged=np.concatenate([self.merged, np.asarray(merged, np.int64)]),
                                   into=np.concatenate([self.into, np.asarray(into, np.int64)]))

    def looks(self, layers: int) -> np.ndarray:
        """Which of the next ``layers`` layers to look after (a mask; none where the record only counts)."""
        mask = np.zeros(layers, dtype=bool)
        if self.enabled:
            mask[self.to_look - 1::self.every] = True
        return mask

    def layers_to_run(self, most: int) -> int:
        """Layers a loop runs before its next look (``most`` where it does not fold, or where none comes sooner)."""
        return min(most, self.to_look) if self.enabled else most

    def ran(self, layers: int, share: float) -> Folds:
        """This record after ``layers`` layers looked at as :meth:`looks` said, whose looks folded ``share`` of the
        columns that entered them: after every layer while they fold many, twice as far apart while they fold
        few (:data:`MOST_EVERY` layers at most); where they did not look, the schedule only moves on."""
        if not self.enabled:
            return self
        at = self.to_look - 1  # the layer of the next look, counted from the first of these
        looked = at < layers
        if looked:
            at += ((layers - 1 - at) // self.every + 1) * self.every
        to_look, every = at - layers + 1, self.every
        if looked:
            every = 1 if share >= FOLD_OFTEN else every if share >= FOLD_SOME else min(MOST_EVERY, 2 * every)
        return dataclasses.replace(self, every=every, to_look=min(to_look, every))


#: Where a column's hash coefficients come from (fixed: equal columns must hash alike in every process).
HASH_SEED = 20261206
_COEFFICIENTS: dict[int, np.ndarray] = {}


def hash_coefficients(rows: int) -> np.ndarray:
    """One float64 a row, in [1, 2): a column's hash is the sum of its entries times these, in row order."""
    coef = _COEFFICIENTS.get(rows)
    if coef is None:
        coef = _COEFFICIENTS[rows] = 1.0 + np.random.default_rng(HASH_SEED).random(rows)
    return coef


def equal_to_earlier(hashes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The candidates a look compares: each column whose hash equals an earlier column's (``members``), beside the
    first column with that hash (``heads``); both host arrays of column numbers."""
    order = np.argsort(hashes, kind="stable")  # (equal hashes keep their column order: the head is the first)
    sorted_h = hashes[order]
    first = np.ones(order.size, dtype=bool)
    first[1:] = sorted_h[1:] != sorted_h[:-1]
    head_at = np.maximum.accumulate(np.where(first, np.arange(order.size), 0))
    members = ~first
    return order[members], order[head_at[members]]


def fold_equal_columns(backend, yt, ids: np.ndarray):
    """One look on any backend's arrays: the columns of ``yt`` equal to an earlier one dropped. A column is compared with the first column of its hash only: one that differs from it (a collision)
    is kept, as a representative of its own.

    Returns
    -------
    (yt, ids, merged, into)
        The kept columns and their images, the folded images and the image each was folded into.
    """
    if yt.shape[1] < 2:
        return yt, ids, _empty_ids(), _empty_ids()
    xp = backend.array_module()
    # in the activations' own type: no copy of them (a collision costs a comparison, never a wrong fold)
    coef = xp.asarray(hash_coefficients(yt.shape[0]).astype(yt.dtype))
    hashes = backend.to_host(coef @ yt)
    members, heads = equal_to_earlier(hashes)
    if members.size:
        equal = backend.to_host(xp.all(yt[:, xp.asarray(members)] == yt[:, xp.asarray(heads)], axis=0))
        members, heads = members[equal], heads[equal]
    if not members.size:
        return yt, ids, _empty_ids(), _empty_ids()
    keep = np.ones(yt.shape[1], dtype=bool)
    keep[members] = False
    return yt[:, xp.asarray(np.flatnonzero(keep))], ids[keep], ids[members], ids[heads]


def run_layers_folding(backend, yt, layers, bias: float, ymax: float, ids: np.ndarray, compact_every: int | None,
                       folds: Folds):
    """A backend's loop (:meth:`~dasknn.kernels.backend.Backend.run_layers` without ``folds``) run between looks,
    each look a :func:`fold_equal_columns` on its arrays: folding for a backend whose loop does not fold itself.
    Its per-layer counts are per run of layers between looks: each layer of a run is counted with the columns that
    entered the run and the images alive after it."""
    layers = iter(layers)
    ids = np.asarray(ids)
    while yt.shape[1]:
        run = list(islice(layers, folds.layers_to_run(MOST_EVERY)))
        if not run:
            break
        entering = yt.shape[1]
        yt, ids = backend.run_layers(yt, run, bias, ymax, ids, compact_every)
        weight = int(folds.weights(ids).sum())
        folds = folds.counted(np.full(len(run), entering), np.full(len(run), weight))
        share = 0.0
        if folds.looks(len(run))[-1]:
            columns = yt.shape[1]
            yt, ids, merged, into = fold_equal_columns(backend, yt, ids)
            folds, share = folds.folded(merged, into), merged.size / max(1, columns)
        folds = folds.ran(len(run), share)
    return yt, ids, folds

