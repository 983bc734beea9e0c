"""Streaming layers (out of core): layers read as they are needed, the next one read ahead in a background
thread, at most ``keep`` in memory; whole layers (data mode) or one part's blocks from a part plan (model mode)."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from ..errors import DasknnError
from .layers import open_store
from .plans import PlanStore

class ReadAhead:
    """Layers ``1..depth`` read as they are needed, with at most ``keep`` in memory at once and the next one read
    ahead in a background thread while the current one computes.

    This is what lets a worker run a network larger than its memory: the weights never all load. ``read(k)``
    returns layer ``k``; ``bytes_read`` adds up ``nbytes`` of what was read. With ``held`` (the
    :class:`~dasknn.store.held.HeldReads` that ``read`` reads through), a layer read again is decoded from the bytes
    it kept: ``bytes_read`` counts only the layers that fetched something from the store.
    """

    def __init__(self, read: Callable[[int], Any], depth: int, keep: int = 2,
                 nbytes: Callable[[Any], int] = lambda arrays: sum(a.nbytes for a in arrays), held: Any = None):
        from concurrent.futures import ThreadPoolExecutor

        if keep < 1:
            raise DasknnError("--keep-layers must be at least 1")
        self.depth = depth
        self.keep = keep
        self.bytes_read = 0
        self._reader = read
        self._nbytes = nbytes
        self._held = held
        self._cache: dict[int, Any] = {}  # layer -> Future of what read(k) returns
        self._front = 0  # the furthest layer asked for in this pass
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dasknn-prefetch")
        self._lock = threading.Lock()  # the cache and the front
        self._count_lock = threading.Lock()  # bytes_read, added to by the reading thread

    def _read(self, k: int) -> Any:
        # (one reading thread: what the held reads fetched meanwhile is this layer's)
        before = self._held.fetched if self._held is not None else 0
        out = self._reader(k)
        if self._held is None or self._held.fetched > before:
            with self._count_lock:
                self.bytes_read += self._nbytes(out)
        return out

    def _request(self, k: int) -> None:
        if 1 <= k <= self.depth and k not in self._cache:
            self._cache[k] = self._pool.submit(self._read, k)

    def layer(self, k: int) -> Any:
        """Layer ``k`` (1-based); starts reading the one after the furthest asked for in the background.

        The stream keeps the furthest layer asked for (its *front*), the one read ahead of it, and the
        ``keep - 2`` before it, so that a chunk that runs a few layers behind another on the same worker
        finds its layers still there. A layer before that starts the stream again from ``k``.
        """
        with self._lock:  # (the chunks of a worker's threads share its stream)
            if not self._front - max(0, self.keep - 2) <= k <= self._front:
                self._front = k  # ahead of the front, or a new pass from further back
            self._request(k)
            fut = self._cache[k]
            low = self._front - max(0, self.keep - 2)
            for old in [j for j in self._cache if not low <= j <= self._front + 1]:
                # (not cancelled: another thread may be waiting for it)
                del self._cache[old]
            if self.keep > 1:
                self._request(self._front + 1)
        return fut.result()

    def layers(self, first: int, last: int) -> Iterator[Any]:
        """Layers ``first..last`` in order."""
        for k in range(first, last + 1):
            yield self.layer(k)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._cache.clear()


class LayerStream(ReadAhead):
    """A store's layers, whole, as CSC raw arrays ``(indptr, indices, data)`` with values as ``dtype`` (data mode).
    With ``last`` (pipeline mode: a stage's last layer) nothing past that layer is read, not even ahead. With
    ``hold_bytes``, up to that many bytes of what it fetches stay in memory as stored (encoded), so a layer read
    again (a worker's next chunk, a stage's) is decoded from memory: ``bytes_read`` counts the layers fetched from
    the store. ``check`` opens the store as :func:`~dasknn.store.open_store` takes it (``"lazy"``: each layer's
    metadata read with the layer, for a reader of a few layers)."""

    def __init__(self, path: str | os.PathLike[str], dtype: str, keep: int = 2, last: int = 0, hold_bytes: int = 0,
                 check: str = "metadata"):
        self.store = open_store(path, check=check, hold_bytes=hold_bytes)
        self.dtype = np.dtype(dtype)
        super().__init__(self._layer, last or self.store.depth, keep, held=self.store.held)

    def _layer(self, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        w = self.store.layer(k)
        return w.indptr, w.indices, w.data.astype(self.dtype, copy=False)


class PartStream(ReadAhead):
    """One part's layers from a part plan, as ``(PartLayer, (indptr, indices, data))`` (model mode): a part reads
    its own columns only; with ``hold_bytes``, its worker's next chunks decode them from the bytes it kept."""

    def __init__(self, path: str | os.PathLike[str], part: int, dtype: str, keep: int = 2, hold_bytes: int = 0):
        self.plan = PlanStore(path, hold_bytes)
        super().__init__(lambda k: self.plan.part_layer(part, k, dtype), self.plan.depth, keep,
                         nbytes=lambda out: sum(a.nbytes for a in out[1]), held=self.plan.held)
