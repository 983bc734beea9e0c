"""Ends already known: a chunk's column equal, after some layer, to a column an earlier chunk of the run had there
skips the rest of the segment and takes that column's end.

Folding (:mod:`dasknn.kernels.folds`) computes each distinct vector once per chunk; but the challenge's images
converge onto the same few vectors in every chunk, so each chunk of a deep network carried the same vector through
its last layers (1,890 of a generated 1,024 x 1,920 network's: most of a chunk's time once the rest folded). A run
keeps, on each worker, the vectors its chunks had after some layers (:data:`ENDS_EVERY` apart, once a chunk is
down to :data:`ENDS_MOST_COLUMNS` columns; farther apart while a chunk is not, :func:`next_span`) with the
activations each ended the segment with; a later chunk's column
equal to one of them there (hashed, then compared, never trusted to the hash) takes that end instead of running on.
Exact, bit for bit: equal inputs through the same layers and kernel give equal outputs whatever else is in the
chunk, the argument folding rests on. Only ends alive after the segment's last layer are kept: an image alive then
was alive after every layer between (a dead image stays dead), so the skipped layers' alive counts are known too.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from itertools import islice
from typing import Iterable

import numpy as np

from .arrays import array_module, to_host
from .dispatch import backend_of, run_layers
from .folds import Folds, hash_coefficients
from .scratch import hand_over, take_back
from .uniform import UniformRun, run_uniform, uniform_values

#: Layers between the points where a chunk's columns are looked up and remembered (the layer numbers, counted
#: from the network's first, divisible by it).
ENDS_EVERY = 32
#: Layers between a chunk's stops at most, once its stops find nothing to share (:func:`next_span`). A stop cuts
#: the chunk's loop in two, which costs a pass over its activations (the loop gathers its survivors before it
#: returns) and, before the loop's input was handed over to it (:func:`~dasknn.kernels.scratch.hand_over`), a fresh
#: buffer, whose pages fault in under a Dask nanny's malloc settings: 32 layers apart that was 5 % of a 120-layer
#: loop where nothing collapses (one process, 7,500 images).
ENDS_MOST_SPAN = 8 * ENDS_EVERY
#: A chunk is looked up and remembered only while it has this many columns at most (it has converged: more
#: would be copies of vectors no other chunk meets).
ENDS_MOST_COLUMNS = 8
#: Bytes of vectors a run keeps on one worker at most; later ones are not remembered.
ENDS_MOST_BYTES = 64 << 20


@dataclass(frozen=True)
class KnownEnd:
    """A column after layer ``at_layer`` (``at``, host) and the same column after the segment's last (``end``)."""

    at: np.ndarray
    end: np.ndarray
    hash: float


class KnownEnds:
    """The ends a run's chunks found on one worker, by (layer, segment's last layer, dtype); thread-safe (a worker's
    threads run chunks side by side)."""

    def __init__(self, most_bytes: int = ENDS_MOST_BYTES) -> None:
        self._ends: dict[tuple[int, int, str], list[KnownEnd]] = {}
        self._bytes = 0
        self._most = most_bytes
        self._lock = threading.Lock()

    def __len__(self) -> int:
        with self._lock:
            return sum(len(v) for v in self._ends.values())

    def find(self, layer: int, last: int, host: np.ndarray) -> list[np.ndarray | None]:
        """For each column of ``host`` (activations after ``layer``, on the host): the end after ``last`` of a
        known equal column, or None."""
        with self._lock:
            known = list(self._ends.get((layer, last, host.dtype.str), ()))
        if not known:
            return [None] * host.shape[1]
        hashes = hash_coefficients(host.shape[0]) @ host
        return [next((e.end for e in known if e.hash == h and np.array_equal(e.at, host[:, c])), None)
                for c, h in enumerate(hashes)]

    def learn(self, last: int, seen: list[tuple[int, np.ndarray, np.ndarray]], end: np.ndarray, end_ids: np.ndarray,
              folds: Folds) -> None:
        """Remember each column of ``seen`` (``(layer, host columns, their images)``, as the chunk had them) whose
        image, or the one it was folded into later, is among ``end_ids``, the images of ``end``'s columns (host,
        after ``last``)."""
        roots = folds.roots()
        column_of = {int(i): c for c, i in enumerate(end_ids)}
        merged_into = dict(zip(folds.merged.tolist(), roots.tolist()))
        for layer, host, ids in seen:
            hashes = hash_coefficients(host.shape[0]) @ host
            for c, image in enumerate(ids.tolist()):
                column = column_of.get(merged_into.get(image, image))
                if column is not None:
                    self._add((layer, last, host.dtype.str), KnownEnd(host[:, c].copy(), end[:, column].copy(),
                                                                      float(hashes[c])))

    def _add(self, key: tuple[int, int, str], known: KnownEnd) -> None:
        with self._lock:
            same = self._ends.setdefault(key, [])
            if self._bytes + known.at.nbytes + known.end.nbytes > self._most or any(
                    e.hash == known.hash and np.array_equal(e.at, known.at) for e in same):
                return
            same.append(known)
            self._bytes += known.at.nbytes + known.end.nbytes

    def clear(self) -> None:
        with self._lock:
            self._ends.clear()
            self._bytes = 0


def next_span(span: int, columns_before: int, columns: int) -> int:
    """Layers from a chunk's stop to its next (rounded by :func:`next_stop`): :data:`ENDS_EVERY` where the chunk is
    down to :data:`ENDS_MOST_COLUMNS` columns (the stop looked its columns up) or has lost half its columns since
    the stop before (``columns_before``: it folds or dies fast, and may be down to them soon); otherwise twice
    ``span``, the span that led to this stop, :data:`ENDS_MOST_SPAN` at most. Where nothing collapses the stops
    then cost a few cuts of a chunk's loop however deep the network."""
    if columns <= ENDS_MOST_COLUMNS or 2 * columns <= columns_before:
        return ENDS_EVERY
    return min(2 * span, max(ENDS_MOST_SPAN, ENDS_EVERY))


def next_stop(done: int, span: int) -> int:
    """The layer of a chunk's next stop after layer ``done``, ``span`` layers on: a layer divisible by
    :data:`ENDS_EVERY` (where other chunks stop too, and remember what they had), the first from ``done + 1`` on
    where ``span`` is :data:`ENDS_EVERY`."""
    return (done // ENDS_EVERY + max(1, span // ENDS_EVERY)) * ENDS_EVERY


def run_layers_remembering(ends: KnownEnds, yt, layers: Iterable[tuple], first: int, last: int, bias: float,
                           ymax: float, ids: np.ndarray, folds: Folds):
    """:func:`~dasknn.kernels.dispatch.run_layers` with ``folds`` over the network's layers ``first`` to ``last``
    (``layers``), in runs that end at stops, after layers divisible by :data:`ENDS_EVERY` (farther apart while the
    stops find nothing to share: :func:`next_span`): there, once the chunk is down
    to :data:`ENDS_MOST_COLUMNS` columns, those equal to a column ``ends`` knows leave the loop with its end, and
    the others are remembered, to be learnt with their own ends after ``last``; where each of those holds one
    value in all its rows, they go on through the regular iso-valued layers that follow without the loop
    (:mod:`dasknn.kernels.uniform`).

    Returns
    -------
    (yt, ids, folds)
        As :func:`~dasknn.kernels.dispatch.run_layers`'s, the columns that took a known end after the others;
        the record counts them alive after each layer they skipped.
    """
    layers = iter(layers)
    done = first - 1
    seen: list[tuple[int, np.ndarray, np.ndarray]] = []
    taken_ids: list[int] = []
    taken: list[np.ndarray] = []
    skipped: list[tuple[int, int]] = []  # (layers run before, images): counted alive after the layers they skipped
    span, columns = ENDS_EVERY, ids.size
    while done < last and ids.size:
        stop = min(last, next_stop(done, span))
        if done >= first:  # yt is the loop's own now, not its caller's: its buffer may take a later output
            hand_over(yt)
        yt, ids, folds = run_layers(yt, islice(layers, stop - done), bias, ymax, ids, folds=folds)
        take_back(None)  # (not left for a later loop where this backend's loop did not take it)
        done = stop
        span, columns = next_span(span, columns, ids.size), ids.size
        if done == last or not 0 < ids.size <= ENDS_MOST_COLUMNS:
            continue
        host = to_host(yt)
        found = ends.find(done, last, host)
        known = np.array([e is not None for e in found])
        if known.any():
            skipped.append((done, int(folds.weights(ids[known]).sum())))
            taken_ids += ids[known].tolist()
            taken += [e for e in found if e is not None]
            yt = yt[:, array_module(yt).asarray(np.flatnonzero(~known))]
            ids, host = ids[~known], host[:, ~known]
        if ids.size:
            seen.append((done, host.copy(), ids.copy()))
        values = uniform_values(host) if ids.size else None
        if values is not None:  # (every column one value: through the regular iso-valued layers without the loop)
            stretch = run_uniform(values, layers, last - done, bias, ymax)
            layers, done = stretch.rest, done + stretch.ran
            yt, ids, folds = _after_stretch(yt, ids, folds, stretch)
    if seen and ids.size:
        ends.learn(last, seen, to_host(yt), ids, folds)
    for before, images in skipped:  # (once the loop has counted every layer it ran)
        folds = folds.alive_through(before, last, images)
    if taken:
        xp = array_module(yt)
        yt = xp.concatenate([yt, backend_of(yt).to_device(np.stack(taken, axis=1))], axis=1)
        ids = np.concatenate([ids, np.array(taken_ids, dtype=ids.dtype)])
    return yt, ids, folds


def _after_stretch(yt, ids: np.ndarray, folds: Folds, stretch: UniformRun):
    # the chunk after uniform columns ran ``stretch``: its live columns made anew on yt's backend, the record
    # counting the images alive after each layer (and no columns computed: the kernels ran none)
    if not stretch.ran:
        return yt, ids, folds
    folds = folds.counted(np.zeros(stretch.ran, dtype=np.int64), stretch.alive_after(folds.weights(ids)))
    live = stretch.values != 0
    host = np.empty((stretch.outputs, int(live.sum())), dtype=stretch.values.dtype)
    host[:] = stretch.values[live]
    return backend_of(yt).to_device(host), ids[live], folds
