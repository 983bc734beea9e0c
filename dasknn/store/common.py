"""What every kind of stored thing shares: the format's constants, codecs, locations (paths or URLs), the check
that an array is plain numbers under data-only codecs, opening a store's root, and atomic replacement."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
import os
import shutil
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import zarr
from zarr.codecs import Crc32cCodec, ZstdCodec

from ..errors import DasknnError
from ..locations import (Location, are_files, bounded, is_file, is_url, join, location, protocol_of,
                         remote_error_line, remote_errors, remove, require_protocol, storage_options, writable)
from ..partials import new_partial, remove_partial

FORMAT = "dasknn-network"
INPUTS_FORMAT = "dasknn-inputs"
VERSION = 1
#: Entries per chunk of ``indices_1`` and ``values``: 4 MiB of int32, a size that reads efficiently.
CHUNK_ENTRIES = 1 << 20
#: Rows (output neurons, or images) per chunk of ``pointers_to_1``.
CHUNK_ROWS = 1 << 16
#: Stores with at most this many entries have every value checked on open; larger ones check what each read reads.
FULL_CHECK_ENTRIES = 50_000_000


#: Every chunk is written, even one equal to the fill value: a missing chunk file then always means damage.
WRITE_ALL = {"write_empty_chunks": True}


def codecs() -> list[Any]:
    """The codec chain of every array a store writes."""
    # zstd shrinks the constant values and regular indices a lot; crc32c (last) guards the stored bytes.
    return [ZstdCodec(level=3), Crc32cCodec()]


#: The only codecs a store's arrays may use: data codecs, nothing that can run code (no pickle, no objects).
SAFE_CODECS = frozenset({"bytes", "zstd", "crc32c", "gzip", "blosc", "transpose", "sharding_indexed"})


def _codec_names(chain: Any) -> Iterator[str]:
    for c in chain or ():
        c = c if isinstance(c, dict) else {"name": str(c)}
        yield str(c.get("name"))
        conf = c.get("configuration") or {}
        if isinstance(conf, dict):  # sharding nests codec chains
            yield from _codec_names(conf.get("codecs"))
            yield from _codec_names(conf.get("index_codecs"))


def file_exists(store: Location, rel: str) -> bool:
    """Whether the store holds file ``rel`` (a local path, or the same key behind a URL, asked through fsspec)."""
    return is_file(join(store if is_url(store) else Path(store), rel))


def has_group(store: Path | str, name: str) -> bool:
    """Whether the store holds group ``name``."""
    # by the group's metadata file, not zarr's listing: a child whose metadata is damaged is an error, not absent
    return file_exists(store, f"{name}/zarr.json")


def check_array(arr: Any, label: str, store: Path, kinds: str = "iuf", rows: tuple[int, int] | None = None
                ) -> zarr.Array:
    """Refuse an array that is not plain numbers under data-only codecs, before any of its chunks is decoded.

    Stores are read as data only: an object dtype or an unknown codec (a pickle codec could run code when a
    chunk is decoded) is an error naming ``label``, never a read. ``rows``: only the chunk files of rows
    ``start:stop`` (along the first axis) are asked for, where only those are read.
    """
    (problem,) = array_problems([(arr, label, kinds, rows)], store)
    if problem is not None:
        raise problem
    return arr


def array_problems(arrays: list[tuple], store: Path, kinds: str = "iuf") -> list[DasknnError | None]:
    """What :func:`check_array` would refuse each ``(array, label)`` for (None: nothing), their chunk files asked
    for side by side; an ``(array, label, kinds)`` allows its own kinds of numbers, an ``(array, label, kinds,
    (start, stop))`` has only the chunk files of those rows asked for."""
    problems: list[DasknnError | None] = []
    chunks: list[list[tuple[int, ...]]] = []
    for arr, label, *own in arrays:
        try:
            _check_metadata(arr, label, store, own[0] if own else kinds)
            problems.append(None)
            grid = [range(-(-int(n) // int(k))) for n, k in zip(arr.shape, arr.chunks)]
            if len(own) > 1 and own[1] is not None:
                start, stop = own[1]
                grid[0] = grid[0][start // int(arr.chunks[0]):-(-stop // int(arr.chunks[0]))]
            chunks.append(list(itertools.product(*grid)))
        except DasknnError as e:
            problems.append(e)
            chunks.append([])
    keys = [f"{item[0].path}/c/{'/'.join(map(str, c))}" for item, cs in zip(arrays, chunks) for c in cs]
    there = iter(are_files(store if is_url(store) else Path(store), keys, IN_FLIGHT))
    for i, ((arr, label, *_), cs) in enumerate(zip(arrays, chunks)):
        # zarr reads a missing chunk as its fill value: a lost file would be silently read as zeros
        missing = [c for c in cs if not next(there)]
        if problems[i] is not None:
            continue
        if missing:
            problems[i] = DasknnError(f"{label}: chunk {'/'.join(map(str, missing[0]))} is missing", store)
            continue
        expected = math.prod(-(-int(n) // int(k)) for n, k in zip(arr.shape, arr.chunks))
        folder = None if is_url(store) else Path(store) / arr.path / "c"
        if folder is not None and folder.is_dir() and sum(1 for f in folder.rglob("*") if f.is_file()) != expected:
            problems[i] = DasknnError(f"{label}: its chunk files do not match its shape {list(arr.shape)}", store)
    return problems


def _check_metadata(arr: Any, label: str, store: Path, kinds: str) -> None:
    # what check_array refuses before it asks for the chunk files
    if not isinstance(arr, zarr.Array):
        raise DasknnError(f"{label} is not an array", store)
    try:
        meta = arr.metadata.to_dict()
        dtype = np.dtype(arr.dtype)
    except Exception as e:  # a data type NumPy cannot represent
        raise DasknnError(f"{label}: unreadable array metadata ({type(e).__name__})", store) from None
    bad = sorted(set(_codec_names(meta.get("codecs"))) - SAFE_CODECS)
    endian = [c.get("configuration", {}).get("endian") for c in meta.get("codecs") or () if c.get("name") == "bytes"]
    if any(e not in (None, "little") for e in endian):
        # the checksum guards the stored bytes, not how they are read: a flipped endian would read as other numbers
        raise DasknnError(f"{label}: stores are little-endian, this array says {endian[0]}", store)
    if bad:
        raise DasknnError(f"{label}: codec {bad[0]} is not allowed (stores are read as data only: "
                          f"{', '.join(sorted(SAFE_CODECS))})", store)
    if dtype.kind not in kinds:
        raise DasknnError(f"{label}: data type {dtype} is not allowed (numbers only)", store)
    if meta.get("chunk_key_encoding") != {"name": "default", "configuration": {"separator": "/"}}:
        raise DasknnError(f"{label}: unexpected chunk key encoding {meta.get('chunk_key_encoding')}", store)
    if arr.ndim < 1 or min(arr.chunks) < 1:
        raise DasknnError(f"{label}: not an array with chunks", store)


#: Requests a store's reader has in flight at once when it asks side by side (:func:`open_each`,
#: :func:`read_together`, :func:`~dasknn.locations.are_files`): a store with many layers is asked in waves.
IN_FLIGHT = 64


def open_each(group: zarr.Group, wanted: list[tuple[str, list[str]]]) -> list[list[Any]]:
    """For each ``(under, names)``: the node ``under`` (name ``""``) and its children ``names`` in ``group``, their
    metadata read side by side in one call into Zarr's event loop (at most :data:`IN_FLIGHT` at once); each a
    :class:`zarr.Array` or :class:`zarr.Group`, or the exception opening it raised (a missing one's ``KeyError``
    names it as opening it from its parent would: ``under``, or its name's last part).

    Each synchronous Zarr call waits for Zarr's event-loop thread, and behind a URL for a request's answer: a
    model-mode part layer opened one node at a time waited for 6 answers in a row, a 480-layer store 1,920."""
    from zarr.core.sync import sync

    async def every() -> list[Any]:
        limit = asyncio.Semaphore(IN_FLIGHT)

        async def opened(under: str, name: str) -> Any:
            async with limit:
                try:
                    node = await group._async_group.getitem(f"{under}/{name}" if name else under)
                except KeyError:
                    raise KeyError(name.rsplit("/", 1)[-1] or under) from None
            return zarr.Array(node) if isinstance(node, zarr.AsyncArray) else zarr.Group(node)

        return await asyncio.gather(*(opened(under, n) for under, names in wanted for n in names),
                                    return_exceptions=True)

    flat = iter(sync(every()))
    return [[next(flat) for _ in names] for _, names in wanted]


def open_together(group: zarr.Group, under: str, names: list[str]) -> list[Any]:
    """:func:`open_each` of one node and its children."""
    return open_each(group, [(under, names)])[0]


def read_together(reads: list[tuple[zarr.Array, slice]], side_by_side: bool = True) -> list[Any]:
    """Slices of several arrays read in one call into Zarr's event loop (:func:`open_each` says why); each a NumPy
    array, or the exception its read raised, for the caller to raise in its own order.

    ``side_by_side`` (for a store behind a URL) asks for them all at once (at most :data:`IN_FLIGHT`), so their
    requests' waits overlap; without it they are read one after another, as from a local store: there the waits
    are nothing, and decoding them at once slowed a streamed data-mode run by 8 % (its read thread's decoding
    then competes with the compute on the worker's core)."""
    from zarr.core.sync import sync

    async def every() -> list[Any]:
        limit = asyncio.Semaphore(IN_FLIGHT)

        async def read(arr: zarr.Array, where: slice) -> Any:
            async with limit:
                return await arr._async_array.getitem(where)

        if side_by_side:
            return await asyncio.gather(*(read(arr, where) for arr, where in reads), return_exceptions=True)
        out = []
        for arr, where in reads:
            try:
                out.append(await read(arr, where))
            except Exception as e:  # (returned, as gather returns it)
                out.append(e)
        return out

    return sync(every())


@dataclass(frozen=True)
class NewArray:
    """An array to create and fill (:func:`create_together`): its path under the group, its data (one dimension),
    and its chunk's length."""

    path: str
    data: np.ndarray
    chunk: int


def create_together(group: zarr.Group, groups: dict[str, dict], arrays: list[NewArray]) -> None:
    """Create ``groups`` (each path under ``group`` with its attributes), then ``arrays`` with their data, in one
    call into Zarr's event loop: the groups side by side, then the arrays side by side (at most :data:`IN_FLIGHT`
    at once), each array written whole (:data:`WRITE_ALL`).

    Zarr creates a node after reading every node above it and checking none is an array, and writing a group's
    attributes reads its document again: behind a URL a part plan's layer written node by node waited for about 100
    answers in a row (K = 2). Parents come first (a path's groups before the groups and arrays under it, none of
    them there before: an existing node is refused as Zarr refuses it), so no parent is made implicitly, without
    its attributes, while its own document is written."""
    from zarr.core.sync import sync

    async def every() -> None:
        limit = asyncio.Semaphore(IN_FLIGHT)
        root = group._async_group

        async def made_group(path: str, attributes: dict) -> None:
            async with limit:
                await root.create_group(path, attributes=attributes)

        async def made_array(new: NewArray) -> None:
            async with limit:
                arr = await root.create_array(new.path, shape=new.data.shape, chunks=(new.chunk,),
                                              dtype=new.data.dtype, compressors=codecs(), config=WRITE_ALL)
                if new.data.size:
                    await arr.setitem(slice(None), new.data)

        # groups by depth: each level's parents are there before it
        for depth in sorted({path.count("/") for path in groups}):
            await asyncio.gather(*(made_group(path, attributes) for path, attributes in groups.items()
                                   if path.count("/") == depth))
        await asyncio.gather(*(made_array(new) for new in arrays))

    sync(every())


def raised(result: Any) -> Any:
    """``result`` of :func:`open_together` or :func:`read_together`, raising it where it is an exception."""
    if isinstance(result, BaseException):
        raise result
    return result


def store_dtype(values: np.ndarray) -> np.dtype:
    """The narrowest float dtype that holds ``values`` exactly: float32 when lossless, else float64."""
    v32 = values.astype(np.float32)
    return np.dtype(np.float32) if np.array_equal(v32.astype(values.dtype), values) else np.dtype(np.float64)


@contextlib.contextmanager
def metadata_of(store: Path) -> Iterator[None]:
    """Turn what zarr raises on mangled metadata (bad JSON, wrong types, unknown names) into one DasknnError."""
    try:
        yield
    except DasknnError:
        raise
    except Exception as e:  # zarr raises many types here; any of them means the same to the user
        remote = remote_error_line(e) if is_url(store) else None
        if remote is not None:  # a store behind a URL that did not answer is not damaged
            raise DasknnError(remote, store) from None
        raise DasknnError(f"damaged metadata ({type(e).__name__}: {e})", store) from None


def open_root(path: Path | str, formats: tuple[str, ...],
              opener: Callable[[Path | str], zarr.Group] | None = None) -> tuple[zarr.Group, dict[str, Any]]:
    """Open a complete store of one of ``formats`` for reading: its root group and its ``dasknn`` attributes;
    ``opener`` opens the root group where Zarr's own opening will not do (reads kept in memory:
    :func:`~dasknn.store.held.open_held`)."""
    if not (file_exists(path, "zarr.json") if is_url(path) else Path(path).exists()):
        raise DasknnError("no such store", path)
    try:
        with remote_errors(path):
            root = opener(path) if opener is not None else open_group(path, mode="r")
    except DasknnError:
        raise
    except Exception as e:  # zarr raises several types for a folder that is not a group
        raise DasknnError(f"not a Zarr v3 group ({type(e).__name__})", path) from None
    attrs = dict(root.attrs).get("dasknn")
    if not isinstance(attrs, dict) or attrs.get("format") not in formats:
        raise DasknnError("not a dasknn store (no 'dasknn' attributes)", path)
    if attrs.get("version") != VERSION:
        raise DasknnError(f"store format version {attrs.get('version')} is not supported (this dasknn reads {VERSION})",
                          path)
    if not attrs.get("complete"):
        raise DasknnError("the store is incomplete (its writing was interrupted); write it again", path)
    return root, attrs


def zarr_store(path: Location, read_only: bool = False) -> Any:
    """What Zarr opens ``path`` as: the local path itself, or an fsspec store of the URL opened with dasknn's
    settings (:func:`~dasknn.locations.storage_options`: bounded timeouts), not Zarr's defaults."""
    if not is_url(path):
        return Path(path)
    from zarr.storage import FsspecStore

    url = os.fspath(path)
    require_protocol(url)
    with remote_errors(url):  # (Zarr makes the file system asynchronous, wrapping one that is not: file://)
        store = FsspecStore.from_url(url, storage_options=storage_options(url), read_only=read_only)
    bounded(store.fs, url)
    return store


def open_group(path: Location, mode: str) -> zarr.Group:
    """Zarr's ``open_group`` (format 3) of a local path or a URL; what an object store raises is one line."""
    with remote_errors(path):
        return zarr.open_group(zarr_store(path, read_only=mode == "r"), mode=mode, zarr_format=3)


def staging(path: Location) -> Location:
    """Where a store is written until it is whole: a fresh hidden partial beside a local path (moved into place by
    :func:`publish`); behind a URL, the URL itself, emptied first. Object stores have no rename: a store there is
    written in place and counts as whole only once its root's attributes say so, written last."""
    if is_url(path):
        require_writable(path)
        remove(path)
        return path
    return new_partial(path)


def require_writable(url: str) -> None:
    """Refuse, in one line, a URL whose protocol cannot be written (HTTP)."""
    if not writable(url):
        raise DasknnError(f"cannot be written: {protocol_of(url)}:// is read only (object stores: s3://)", url)


def publish(tmp: Location, path: Location) -> None:
    """Put the whole store written at ``tmp`` (from :func:`staging`) in place at ``path``."""
    if not is_url(path):
        replace_atomically(Path(tmp), Path(path))


def discard(tmp: Location) -> None:
    """Remove what a failed or interrupted write left at ``tmp`` (from :func:`staging`)."""
    if is_url(tmp):
        remove(tmp)
    else:
        remove_partial(tmp)


def replace_atomically(tmp: Path, path: Path) -> None:
    """Move a finished store into place, replacing what was there only after the new one is whole."""
    if path.exists():
        trash = path.with_name(f".{path.name}.old-{uuid.uuid4().hex[:8]}")
        os.replace(path, trash)
        os.replace(tmp, path)
        shutil.rmtree(trash, ignore_errors=True)
    else:
        os.replace(tmp, path)
