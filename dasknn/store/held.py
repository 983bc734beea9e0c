"""Reads kept in memory as the bytes they are stored as: a store read again and again (a pipeline stage streams its
layers once per chunk) is fetched from its disk or its URL once, and decoded from memory after that.

The bytes are kept encoded (zstd), so a stage whose layers do not fit its worker decoded often fits encoded (a
generated 65,536 x 480 network is 8.3 GB as CSR and 0.3 GB stored); what is over the limit is fetched each time.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from functools import partial
from pathlib import Path

import zarr
from zarr.abc.store import ByteRequest
from zarr.core.buffer import Buffer, BufferPrototype
from zarr.storage import LocalStore, WrapperStore

from .common import is_url, zarr_store


class HeldReads(WrapperStore):
    """A read-only Zarr store that keeps what it fetched whole, up to ``limit`` bytes, and answers from memory
    after that.

    ``fetched`` counts the bytes fetched from the wrapped store, ``held`` those kept.
    """

    def __init__(self, store, limit: int = 0):
        super().__init__(store)
        self.limit = int(limit)
        self.fetched = 0
        self.held = 0
        self._kept: dict[str, Buffer] = {}
        self._lock = threading.Lock()  # (zarr may read a layer's chunks concurrently)

    def _with_store(self, store) -> HeldReads:
        return type(self)(store, self.limit)

    async def get(self, key: str, prototype: BufferPrototype, byte_range: ByteRequest | None = None) -> Buffer | None:
        if byte_range is None:
            kept = self._kept.get(key)
            if kept is not None:
                return kept
        out = await self._store.get(key, prototype, byte_range)
        if out is None:
            return None
        with self._lock:
            self.fetched += len(out)
            if byte_range is None and self.held + len(out) <= self.limit and key not in self._kept:
                self._kept[key] = out
                self.held += len(out)
        return out


def open_held(path: Path | str, limit: int) -> zarr.Group:
    """The root group of the store at ``path`` (a local folder or a URL), read through a :class:`HeldReads` that
    keeps up to ``limit`` bytes; the wrapper is the group's ``store``."""
    base = zarr_store(path, read_only=True) if is_url(path) else LocalStore(path, read_only=True)
    return zarr.open_group(HeldReads(base, limit), mode="r", zarr_format=3)


def held_opener(limit: int) -> Callable[[Path | str], zarr.Group] | None:
    """What :func:`~dasknn.store.common.open_root` opens a store with to keep up to ``limit`` bytes of its reads
    (:func:`open_held`); None (Zarr's own opening) without a limit."""
    return partial(open_held, limit=limit) if limit > 0 else None
