"""The Zarr layer store: the out-of-core format every later stage reads.

Layout of a store (a Zarr v3 group)::

    STORE.zarr/                     attrs["dasknn"]: format, version, neurons, layers, bias, ymax, edges, source,
                                                     dtype, complete
      layers/1 .. layers/L          one binsparse group per layer: W_k in CSC form
        pointers_to_1  (N+1,) int64    column pointers, chunked by blocks of output neurons
        indices_1      (nnz,) int32    input neuron of each entry
        values         (nnz,) float    weight of each entry
      inputs/                       optional: the images as a binsparse CSR matrix (images x N), chunked by images
        truth          (c,)  int64     optional: 0-based indices of the images the truth says are categories
      partitions/...                written by later stages
      plans/DIGEST/                 part plans (model mode out of core): per layer l{k} and part p{q}, the part's
                                    block (binsparse CSC over the rows it reads) and its exchange lists

Why CSC of the challenge's ``W`` (that is, CSR of ``W^T``, the seed paper's row-wise orientation): everything
output neuron ``j`` needs is one contiguous run of entries, so a block of output neurons, the unit a worker owns,
reads without reading the layer. Every array carries a CRC-32C checksum, so a flipped byte on disk is an error
rather than a wrong answer.

A store is written under a temporary name and renamed into place when complete; the ``complete`` attribute is
set last, so an interrupted write never opens as valid.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import hashlib
import itertools
import math
import os
import shutil
import threading
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp
import zarr
from zarr.codecs import Crc32cCodec, ZstdCodec

from .errors import DasknnError
from .network import Network, as_csc_layer

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
_WRITE_ALL = {"write_empty_chunks": True}


def _codecs() -> list[Any]:
    # zstd shrinks the constant values and regular indices a lot; crc32c (last) guards the stored bytes.
    return [ZstdCodec(level=3), Crc32cCodec()]


def _binsparse(fmt: str, shape: tuple[int, int], nnz: int, values: np.dtype) -> dict[str, Any]:
    return {
        "version": "0.1",
        "format": fmt,
        "shape": [int(shape[0]), int(shape[1])],
        "number_of_stored_values": int(nnz),
        "data_types": {"pointers_to_1": "int64", "indices_1": "int32", "values": np.dtype(values).name},
    }


#: The only codecs a store's arrays may use: data codecs, nothing that can run code (no pickle, no objects).
SAFE_CODECS = frozenset({"bytes", "zstd", "crc32c", "gzip", "blosc", "transpose", "sharding_indexed"})


def _codec_names(codecs: Any) -> Iterator[str]:
    for c in codecs or ():
        c = c if isinstance(c, dict) else {"name": str(c)}
        yield str(c.get("name"))
        conf = c.get("configuration") or {}
        if isinstance(conf, dict):  # sharding nests codec chains
            yield from _codec_names(conf.get("codecs"))
            yield from _codec_names(conf.get("index_codecs"))


def is_url(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` names a store by URL (``s3://``, ``gs://``, ``https://``, ``file://`` ...: read through
    fsspec) rather than a local folder."""
    return "://" in os.fspath(path)


def location(path: str | os.PathLike[str]) -> Path | str:
    """A store's location: an absolute local path, or the URL as given (without a trailing slash)."""
    return os.fspath(path).rstrip("/") if is_url(path) else Path(path).resolve()


def _file_exists(store: Path | str, rel: str) -> bool:
    # whether the store holds file ``rel`` (a local path, or the same key behind a URL, asked through fsspec)
    if not is_url(store):
        return (Path(store) / rel).is_file()
    import fsspec.core

    fs, root = fsspec.core.url_to_fs(str(store))
    try:
        return bool(fs.isfile(f"{root.rstrip('/')}/{rel}"))
    except Exception:  # a server that refuses the question has no such file as far as we can know
        return False


def _has_group(store: Path | str, name: str) -> bool:
    # by the group's metadata file, not zarr's listing: a child whose metadata is damaged is an error, not absent
    return _file_exists(store, f"{name}/zarr.json")


def check_array(arr: Any, label: str, store: Path, kinds: str = "iuf") -> zarr.Array:
    """Refuse an array that is not plain numbers under data-only codecs, before any of its chunks is decoded.

    Stores are read as data only: an object dtype or an unknown codec (a pickle codec could run code when a
    chunk is decoded) is an error naming ``label``, never a read.
    """
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
    # zarr reads a missing chunk as its fill value: a lost file would be silently read as zeros
    if arr.ndim < 1 or min(arr.chunks) < 1:
        raise DasknnError(f"{label}: not an array with chunks", store)
    for c in itertools.product(*(range(-(-int(n) // int(k))) for n, k in zip(arr.shape, arr.chunks))):
        if not _file_exists(store, f"{arr.path}/c/{'/'.join(map(str, c))}"):
            raise DasknnError(f"{label}: chunk {'/'.join(map(str, c))} is missing", store)
    expected = math.prod(-(-int(n) // int(k)) for n, k in zip(arr.shape, arr.chunks))
    folder = None if is_url(store) else Path(store) / arr.path / "c"
    if folder is not None and folder.is_dir() and sum(1 for f in folder.rglob("*") if f.is_file()) != expected:
        raise DasknnError(f"{label}: its chunk files do not match its shape {list(arr.shape)}", store)
    return arr


def _write_sparse(group: zarr.Group, fmt: str, m: sp.csc_matrix | sp.csr_matrix, extra: dict | None = None) -> None:
    nnz = int(m.nnz)
    nptr = m.indptr.size
    for name, data, chunk in (
        ("pointers_to_1", m.indptr.astype(np.int64, copy=False), min(CHUNK_ROWS + 1, nptr)),
        ("indices_1", m.indices.astype(np.int32, copy=False), max(1, min(CHUNK_ENTRIES, nnz))),
        ("values", m.data, max(1, min(CHUNK_ENTRIES, nnz))),
    ):
        arr = group.create_array(name, shape=data.shape, chunks=(chunk,), dtype=data.dtype, compressors=_codecs(),
                                 config=_WRITE_ALL)
        if data.size:
            arr[:] = data
    group.attrs.update({"binsparse": _binsparse(fmt, m.shape, nnz, m.data.dtype), **(extra or {})})


def store_dtype(values: np.ndarray) -> np.dtype:
    """The narrowest float dtype that holds ``values`` exactly: float32 when lossless, else float64."""
    v32 = values.astype(np.float32)
    return np.dtype(np.float32) if np.array_equal(v32.astype(values.dtype), values) else np.dtype(np.float64)


class StoreWriter:
    """Write a store layer by layer, so networks larger than memory can be streamed in.

    Use it as a context manager; the store appears at ``path`` only when the block exits without error::

        with StoreWriter(path, neurons=1024, layers=120, bias=-0.3) as w:
            for k, layer in enumerate(layers, start=1):
                w.write_layer(k, layer)
            w.write_inputs(images)
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        neurons: int,
        layers: int,
        bias: float,
        ymax: float = 32.0,
        source: str = "",
        dtype: np.dtype | str | None = None,
        overwrite: bool = False,
    ):
        self.path = Path(path)
        if self.path.exists() and not overwrite:
            raise DasknnError("already exists (pass --overwrite to replace it)", self.path)
        self.neurons, self.layers, self.bias, self.ymax = int(neurons), int(layers), float(bias), float(ymax)
        self.source = source
        self.dtype = None if dtype is None else np.dtype(dtype)
        self._tmp = self.path.with_name(f".{self.path.name}.partial-{uuid.uuid4().hex[:8]}")
        self._written: set[int] = set()
        self._edges = 0
        self._dtypes: set[str] = set()
        self.root: zarr.Group | None = None

    def __enter__(self) -> StoreWriter:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.root = zarr.open_group(self._tmp, mode="w", zarr_format=3)
        self.root.attrs["dasknn"] = self._attrs(complete=False)
        self.root.create_group("layers")
        return self

    def _attrs(self, complete: bool) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "version": VERSION,
            "neurons": self.neurons,
            "layers": self.layers,
            "bias": self.bias,
            "ymax": self.ymax,
            "edges": self._edges,
            "source": self.source,
            "dtype": sorted(self._dtypes)[-1] if self._dtypes else None,  # 'float64' > 'float32'
            "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "complete": complete,
        }

    def write_layer(self, k: int, w: sp.spmatrix | sp.sparray) -> None:
        """Write layer ``k`` (1-based), given as any SciPy sparse ``N x N`` matrix in the challenge's orientation."""
        if not 1 <= k <= self.layers:
            raise DasknnError(f"layer {k} is outside 1..{self.layers}")
        m = as_csc_layer(w)
        if m.shape != (self.neurons, self.neurons):
            raise DasknnError(f"layer {k} is {m.shape[0]} x {m.shape[1]}, expected {self.neurons} x {self.neurons}")
        dtype = self.dtype or store_dtype(m.data)
        m.data = m.data.astype(dtype, copy=False)
        _write_sparse(self.root.create_group(f"layers/{k}"), "CSC", m)
        self._written.add(k)
        self._edges += int(m.nnz)
        self._dtypes.add(dtype.name)

    def write_inputs(self, images: sp.spmatrix | sp.sparray, truth: np.ndarray | None = None,
                     truth_float32: np.ndarray | None = None) -> None:
        """Write the inputs (``images x N``) and, optionally, the truth categories (0-based image indices)."""
        write_inputs(self.root, images, truth, self.neurons, truth_float32)

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            missing = sorted(set(range(1, self.layers + 1)) - self._written)
            if missing:
                shutil.rmtree(self._tmp, ignore_errors=True)
                raise DasknnError(f"store not written: layer {missing[0]} was never given", self.path)
            self.root.attrs["dasknn"] = self._attrs(complete=True)
            replace_atomically(self._tmp, self.path)
        else:
            shutil.rmtree(self._tmp, ignore_errors=True)


def write_inputs(
    root: zarr.Group,
    images: sp.spmatrix | sp.sparray,
    truth: np.ndarray | None,
    neurons: int,
    truth_float32: np.ndarray | None = None,
) -> None:
    """Write (or replace) the ``inputs`` group of an open store group.

    ``truth`` is the canonical (float64) truth; ``truth_float32``, when given, is what a float32 run must find
    (images that sit exactly on a threshold can flip between the two precisions).
    """
    m = sp.csr_matrix(images)
    m.sort_indices()
    if m.shape[1] != neurons:
        raise DasknnError(f"the inputs have {m.shape[1]} pixels per image, the network {neurons} neurons")
    if "inputs" in root:
        del root["inputs"]
    g = root.create_group("inputs")
    m.data = m.data.astype(store_dtype(m.data), copy=False)
    _write_sparse(g, "CSR", m)
    for name, t in (("truth", truth), ("truth_float32", truth_float32)):
        if t is None:
            continue
        t = np.asarray(t, dtype=np.int64)
        if t.size and (t.min() < 0 or t.max() >= m.shape[0]):
            raise DasknnError(f"truth names an image outside 1..{m.shape[0]}")
        arr = g.create_array(name, shape=t.shape, chunks=(max(1, min(CHUNK_ENTRIES, t.size)),), dtype=np.int64,
                             compressors=_codecs(), config=_WRITE_ALL)
        if t.size:
            arr[:] = t
        # the count kept apart from the array's metadata: a shrunken shape would otherwise drop categories unseen
        g.attrs[f"{name}_count"] = int(t.size)


def write_network(
    path: str | os.PathLike[str],
    network: Network,
    images: sp.spmatrix | None = None,
    truth: np.ndarray | None = None,
    overwrite: bool = False,
) -> Path:
    """Write an in-memory :class:`~dasknn.network.Network` (and optional inputs) as a store; return its path."""
    with StoreWriter(path, network.neurons, network.depth, network.bias, network.ymax, network.source,
                     overwrite=overwrite) as w:
        for k, layer in enumerate(network.layers, start=1):
            w.write_layer(k, layer)
        if images is not None:
            w.write_inputs(images, truth)
    return Path(path)


@dataclass(frozen=True)
class _Sparse:
    """One stored binsparse matrix, opened lazily; reads check what they read."""

    pointers: zarr.Array
    indices: zarr.Array
    values: zarr.Array
    shape: tuple[int, int]
    fmt: str
    name: str
    store: Path

    @classmethod
    def open(cls, root: zarr.Group, name: str, fmt: str, shape: tuple[int, int], label: str, store: Path) -> _Sparse:
        try:
            g = root[name]
            desc = dict(g.attrs)["binsparse"]
            p, i, v = (g[a] for a in ("pointers_to_1", "indices_1", "values"))
        except KeyError as e:
            raise DasknnError(f"{label} is missing or incomplete ({e})", store) from None
        except Exception as e:  # metadata zarr cannot parse (a mangled zarr.json, an unknown codec)
            raise DasknnError(f"{label}: damaged metadata ({type(e).__name__}: {e})", store) from None
        for a, arr in (("pointers_to_1", p), ("indices_1", i), ("values", v)):
            check_array(arr, f"{label}: {a}", store)
        if not isinstance(desc, dict) or not isinstance(desc.get("shape"), list):
            raise DasknnError(f"{label}: the binsparse descriptor is damaged", store)
        if desc.get("format") != fmt or list(desc.get("shape", [])) != list(shape):
            raise DasknnError(f"{label}: expected a {fmt} matrix of shape {list(shape)}, the descriptor says "
                              f"{desc.get('format')} {desc.get('shape')}", store)
        nnz = desc.get("number_of_stored_values")
        if type(nnz) is not int or nnz < 0:
            raise DasknnError(f"{label}: number_of_stored_values is {nnz!r}, not a count", store)
        major = shape[1] if fmt == "CSC" else shape[0]
        if p.shape != (major + 1,):
            raise DasknnError(f"{label}: pointers_to_1 has {p.shape[0]} entries, expected {major + 1}", store)
        if i.shape != (nnz,) or v.shape != (nnz,):
            raise DasknnError(f"{label}: indices_1 and values must both hold {nnz} entries", store)
        if not np.issubdtype(p.dtype, np.integer) or not np.issubdtype(i.dtype, np.integer):
            raise DasknnError(f"{label}: pointers and indices must be integers", store)
        if not np.issubdtype(v.dtype, np.floating):
            raise DasknnError(f"{label}: values must be floating point, not {v.dtype}", store)
        return cls(p, i, v, tuple(shape), fmt, label, store)

    @property
    def nnz(self) -> int:
        return int(self.values.shape[0])

    def read(self, start: int, stop: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Read rows (CSR) or columns (CSC) ``start:stop``: (pointers from 0, indices, values), checked."""
        minor = self.shape[0] if self.fmt == "CSC" else self.shape[1]
        try:
            ptr = np.asarray(self.pointers[start : stop + 1], dtype=np.int64)
            if ptr.size and (np.any(np.diff(ptr) < 0) or ptr[0] < 0 or ptr[-1] > self.nnz):
                raise DasknnError(f"{self.name}: pointers_to_1 is not monotone within 0..nnz", self.store)
            if start == 0 and ptr.size and ptr[0] != 0:
                raise DasknnError(f"{self.name}: pointers_to_1 must start at 0", self.store)
            if stop == self.pointers.shape[0] - 1 and ptr.size and ptr[-1] != self.nnz:
                raise DasknnError(f"{self.name}: pointers_to_1 must end at the number of entries", self.store)
            a, b = int(ptr[0]), int(ptr[-1])
            idx = np.asarray(self.indices[a:b], dtype=np.int32)
            val = np.asarray(self.values[a:b])
        except DasknnError:
            raise
        except Exception as e:  # a checksum mismatch or a missing/garbled chunk
            raise DasknnError(f"{self.name}: cannot read entries ({self._bad_chunk(start, stop)}{type(e).__name__}: "
                              f"{e}); the store is damaged", self.store) from None
        if idx.size and (idx.min() < 0 or idx.max() >= minor):
            raise DasknnError(f"{self.name}: an index is outside 0..{minor - 1}", self.store)
        if not np.all(np.isfinite(val)):
            raise DasknnError(f"{self.name}: a value is NaN or infinite", self.store)
        return ptr - a, idx, val

    def _bad_chunk(self, start: int, stop: int) -> str:
        """Which chunk a failed read of ``start:stop`` could not decode (read again one chunk at a time)."""
        ranges = [("pointers_to_1", self.pointers, start, stop + 1)]
        try:
            ptr = np.asarray(self.pointers[start : stop + 1], dtype=np.int64)
            ranges += [("indices_1", self.indices, int(ptr[0]), int(ptr[-1])),
                       ("values", self.values, int(ptr[0]), int(ptr[-1]))]
        except Exception:
            pass  # the pointers themselves are damaged: one of their chunks is named below
        for name, arr, a, b in ranges:
            size = max(1, int(arr.chunks[0]))
            for c in range(a // size, -(-b // size)):
                try:
                    arr[c * size : min((c + 1) * size, arr.shape[0])]
                except Exception:
                    return f"{name} chunk {c}, entries {c * size}..{min((c + 1) * size, arr.shape[0]) - 1}: "
        return ""


class Inputs:
    """The input images of a store (``images x N``, CSR by image), read lazily by blocks of images."""

    def __init__(self, root: zarr.Group, neurons: int, store: Path):
        desc = dict(root["inputs"].attrs).get("binsparse")
        shape = desc.get("shape") if isinstance(desc, dict) else None
        if not isinstance(shape, list) or len(shape) != 2 or type(shape[0]) is not int or shape[0] < 0:
            raise DasknnError("inputs: the binsparse descriptor is damaged", store)
        self.neurons = neurons
        self.store = store
        self._root = root
        self._m = _Sparse.open(root, "inputs", "CSR", (int(shape[0]), neurons), "inputs", store)

    @property
    def images(self) -> int:
        """Number of images."""
        return self._m.shape[0]

    @property
    def nnz(self) -> int:
        """Number of nonzero pixels over all images."""
        return self._m.nnz

    def rows(self, start: int = 0, stop: int | None = None) -> sp.csr_matrix:
        """Read images ``start:stop`` as a CSR matrix (``images x N``)."""
        stop = self.images if stop is None else min(stop, self.images)
        ptr, idx, val = self._m.read(start, stop)
        return sp.csr_matrix((val, idx, ptr), shape=(stop - start, self.neurons))

    def truth(self, dtype: str = "float64") -> np.ndarray | None:
        """The stored truth categories (sorted 0-based image indices), or None.

        With ``dtype="float32"``, the float32 truth if one was stored (else the canonical one).
        """
        single = np.dtype(dtype) == np.float32
        name = "truth_float32" if single and _has_group(self.store, "inputs/truth_float32") else "truth"
        if not _has_group(self.store, f"inputs/{name}"):
            return None
        with _metadata_of(self.store):
            arr = check_array(self._root["inputs"][name], f"inputs: {name}", self.store, kinds="iu")
        count = dict(self._root["inputs"].attrs).get(f"{name}_count")
        if count is not None and arr.shape != (count,):
            raise DasknnError(f"inputs: {name} holds {arr.shape} entries, its count says {count}", self.store)
        try:
            return np.asarray(arr[:], dtype=np.int64)
        except Exception as e:  # a checksum mismatch or a missing chunk
            raise DasknnError(f"inputs: cannot read {name} ({type(e).__name__}: {e}); the store is damaged",
                              self.store) from None


@contextlib.contextmanager
def _metadata_of(store: Path) -> Iterator[None]:
    """Turn what zarr raises on mangled metadata (bad JSON, wrong types, unknown names) into one DasknnError."""
    try:
        yield
    except DasknnError:
        raise
    except Exception as e:  # zarr raises many types here; any of them means the same to the user
        raise DasknnError(f"damaged metadata ({type(e).__name__}: {e})", store) from None


def _open_root(path: Path | str, formats: tuple[str, ...]) -> tuple[zarr.Group, dict[str, Any]]:
    if not (_file_exists(path, "zarr.json") if is_url(path) else Path(path).exists()):
        raise DasknnError("no such store", path)
    try:
        root = zarr.open_group(path, mode="r", zarr_format=3)
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


class _StoreLayers(Sequence):
    def __init__(self, store: NetworkStore):
        self.store = store

    def __len__(self) -> int:
        return self.store.depth

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        k = int(i) + 1 if i >= 0 else len(self) + int(i) + 1
        if not 1 <= k <= len(self):
            raise IndexError(i)  # how a Sequence's iteration ends
        return self.store.layer(k)


class NetworkStore:
    """A dasknn store opened for reading. Layers are numbered from 1, as in the challenge's file names.

    Reads are lazy: :meth:`layer` reads one layer, :meth:`columns` only a block of its output neurons, and
    ``inputs.rows`` only a block of images. Each read checks what it read (monotone pointers, indices in range,
    finite values, checksums) and names the layer if something is wrong.
    """

    def __init__(self, path: str | os.PathLike[str], check: str = "auto"):
        self.path = location(path)
        self.root, attrs = _open_root(self.path, (FORMAT,))
        try:
            self.neurons = int(attrs["neurons"])
            self.depth = int(attrs["layers"])
            self.bias = float(attrs["bias"])
            self.ymax = float(attrs["ymax"])
            self.edges = int(attrs["edges"])
        except (KeyError, TypeError, ValueError, OverflowError) as e:
            raise DasknnError(f"store attributes are damaged ({e})", self.path) from None
        if self.neurons < 1 or self.depth < 1 or self.edges < 0 or not np.isfinite(self.bias):
            raise DasknnError(f"store attributes are damaged (neurons {self.neurons}, layers {self.depth}, "
                              f"edges {self.edges}, bias {self.bias})", self.path)
        self.source = str(attrs.get("source", ""))
        self.attrs = attrs
        n = self.neurons
        self._layers: list[_Sparse | None] = [None] * self.depth
        with _metadata_of(self.path):
            if check != "lazy":
                self._layers = [self._layer_meta(k) for k in range(1, self.depth + 1)]
                if sum(s.nnz for s in self._layers) != self.edges:
                    raise DasknnError("the layers' entries do not add up to the store's edge count", self.path)
            # by the folder, not zarr's listing: inputs whose metadata is damaged are an error, not absent
            self.inputs = Inputs(self.root, n, self.path) if _has_group(self.path, "inputs") else None
        if check == "full" or (check == "auto" and self.edges <= FULL_CHECK_ENTRIES):
            self.check()

    def _layer_meta(self, k: int) -> _Sparse:
        # opened (its metadata read and checked) once, when first needed
        meta = self._layers[k - 1]
        if meta is None:
            n = self.neurons
            meta = self._layers[k - 1] = _Sparse.open(self.root, f"layers/{k}", "CSC", (n, n), f"layer {k}", self.path)
        return meta

    def layer(self, k: int) -> sp.csc_matrix:
        """Read layer ``k`` (1-based) whole, as a CSC matrix in the challenge's orientation."""
        return self.columns(k, 0, self.neurons)

    def columns(self, k: int, start: int, stop: int) -> sp.csc_matrix:
        """Read output neurons ``start:stop`` of layer ``k``: ``W_k[:, start:stop]``, touching only their chunks."""
        if not 1 <= k <= self.depth:
            raise DasknnError(f"layer {k} is outside 1..{self.depth}", self.path)
        ptr, idx, val = self._layer_meta(k).read(start, stop)
        return sp.csc_matrix((val, idx, ptr), shape=(self.neurons, stop - start))

    def layer_nnz(self, k: int) -> int:
        """Entries of layer ``k`` (from metadata, no read)."""
        return self._layer_meta(k).nnz

    def iter_layers(self) -> Iterator[sp.csc_matrix]:
        """Yield the layers one at a time, holding one in memory."""
        for k in range(1, self.depth + 1):
            yield self.layer(k)

    def network(self) -> Network:
        """Read every layer into an in-memory :class:`~dasknn.network.Network`."""
        return Network(list(self.iter_layers()), self.bias, self.ymax, source=str(self.path))

    def lazy_layers(self) -> Sequence[sp.csc_matrix]:
        """The layers as a sequence that reads each one when it is indexed (``[k - 1]`` reads layer k)."""
        return _StoreLayers(self)

    def partition_layers(self) -> Sequence[sp.csc_matrix]:
        """The layers as partitioning reads them: in memory when the network is small (up to
        :data:`FULL_CHECK_ENTRIES` entries), else read on demand, a layer or two at a time (out of core)."""
        return self.network().layers if self.edges <= FULL_CHECK_ENTRIES else self.lazy_layers()

    def check(self) -> None:
        """Read every stored array once and check it (pointers, index ranges, finite values, checksums)."""
        for k in range(1, self.depth + 1):
            self.layer(k)
        if self.inputs is not None:
            self.inputs.rows()

    def nbytes_on_disk(self) -> int:
        """Bytes the store takes on disk (or behind its URL)."""
        if is_url(self.path):
            import fsspec.core

            fs, root = fsspec.core.url_to_fs(str(self.path))
            return int(fs.du(root))
        plans = self.path / "plans"  # derived data, not the network
        return sum(f.stat().st_size for f in self.path.rglob("*") if f.is_file() and plans not in f.parents)


def open_inputs(path: str | os.PathLike[str], check: str = "metadata") -> Inputs:
    """Open the inputs of a store: a network store holding inputs, or an inputs-only store.

    Every block read is checked as it is read; ``check="full"`` also reads and checks them all now.
    """
    path = location(path)
    root, attrs = _open_root(path, (FORMAT, INPUTS_FORMAT))
    if not _has_group(path, "inputs"):
        raise DasknnError("the store holds no inputs; give --inputs or import them", path)
    neurons = attrs.get("neurons")
    if type(neurons) is not int or neurons < 1:
        raise DasknnError(f"store attributes are damaged (neurons {neurons!r})", path)
    with _metadata_of(path):
        inputs = Inputs(root, neurons, path)
    if check == "full":
        inputs.rows()
    return inputs


def write_inputs_store(path: str | os.PathLike[str], images: sp.spmatrix, truth: np.ndarray | None = None,
                       source: str = "", overwrite: bool = False) -> Path:
    """Write images (and truth) as an inputs-only store, atomically."""
    path = Path(path)
    if path.exists() and not overwrite:
        raise DasknnError("already exists (pass --overwrite to replace it)", path)
    tmp = path.with_name(f".{path.name}.partial-{uuid.uuid4().hex[:8]}")
    try:
        root = zarr.open_group(tmp, mode="w", zarr_format=3)
        write_inputs(root, images, truth, images.shape[1])
        root.attrs["dasknn"] = {"format": INPUTS_FORMAT, "version": VERSION, "neurons": int(images.shape[1]),
                                "images": int(images.shape[0]), "source": source, "complete": True}
        replace_atomically(tmp, path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return path


def replace_atomically(tmp: Path, path: Path) -> None:
    """Move a finished store into place, replacing what was there only after the new one is whole."""
    if path.exists():
        trash = path.with_name(f".{path.name}.old-{uuid.uuid4().hex[:8]}")
        os.replace(path, trash)
        os.replace(tmp, path)
        shutil.rmtree(trash, ignore_errors=True)
    else:
        os.replace(tmp, path)


def open_store(path: str | os.PathLike[str], check: str = "auto") -> NetworkStore:
    """Open and validate a dasknn store.

    Parameters
    ----------
    path
        The store's folder (``*.zarr``).
    check
        ``"auto"`` reads and checks every value of small stores (up to :data:`FULL_CHECK_ENTRIES` entries) and
        only the metadata of larger ones, whose reads are checked as they happen; ``"full"`` always reads
        everything; ``"metadata"`` never does; ``"lazy"`` reads a layer's metadata only when that layer is first
        read (a worker's task that reads one layer of a store the client has already opened).

    Raises
    ------
    DasknnError
        Naming the store and the layer at fault.
    """
    return NetworkStore(path, check=check)


def is_store(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` looks like a Zarr store (a folder, or a URL, with ``zarr.json``)."""
    return _file_exists(location(path), "zarr.json")


# --- partitions kept with the network ------------------------------------------------------------------------


def partition_name(method: str, parts: int, seed: int = 0, epsilon: float = 0.03) -> str:
    """The name a computed partition is saved under in a store."""
    return f"{method}-k{parts}-s{seed}-e{epsilon:g}"


def save_partition(path: str | os.PathLike[str], name: str, owners: np.ndarray, report: dict | None = None) -> None:
    """Save an owners array (and its metrics) in the store's ``partitions/NAME`` group.

    The ``complete`` attribute is written last, so a partition whose saving was interrupted is never loaded.
    """
    root = zarr.open_group(Path(path), mode="r+", zarr_format=3)
    group = f"partitions/{name}"
    if group in root:
        del root[group]
    g = root.require_group(group)
    arr = g.create_array("owners", shape=owners.shape, chunks=owners.shape, dtype=np.int32, compressors=_codecs(),
                         config=_WRITE_ALL)
    arr[:] = owners.astype(np.int32)
    g.attrs.update({"report": report or {}, "complete": True})


def load_partition(path: str | os.PathLike[str], name: str) -> tuple[np.ndarray, dict] | None:
    """A saved partition's owners and report, or None if the store has none of that name."""
    path = location(path)
    root = zarr.open_group(path if is_url(path) else Path(path), mode="r", zarr_format=3)
    group = f"partitions/{name}"
    if not _has_group(path, group) or not dict(root[group].attrs).get("complete"):
        return None
    try:
        owners = np.asarray(check_array(root[f"{group}/owners"], f"partition {name}", path, "iu")[:])
    except Exception as e:  # a damaged chunk: recompute rather than trust it
        raise DasknnError(f"partition {name} is damaged ({type(e).__name__}); delete it or recompute", path) from None
    return owners, dict(dict(root[group].attrs).get("report", {}))


# --- part plans: each part's blocks and exchange lists, layer by layer (model mode out of core) ----------------

PLAN_FORMAT = "dasknn-part-plan"


def plan_digest(network: str, owners: np.ndarray) -> str:
    """A name for the part plan of ``network`` under ``owners`` (the same network and owners, the same name)."""
    h = hashlib.sha256(str(network).encode())
    h.update(np.ascontiguousarray(owners, dtype=np.int32).tobytes())
    return h.hexdigest()[:16]


def create_plan_store(path: str | os.PathLike[str], network: str, owners: np.ndarray) -> None:
    """Start an empty part plan store for ``network`` partitioned by ``owners`` (layers are added by
    :func:`write_plan_layer`, then :func:`finish_plan_store` marks it complete)."""
    path = Path(path)
    if path.exists():
        shutil.rmtree(path)
    root = zarr.open_group(path, mode="w", zarr_format=3)
    # a row per chunk: the task that writes layer k reads rows k - 1 and k only
    arr = root.create_array("owners", shape=owners.shape, chunks=(1, owners.shape[1]), dtype=np.int32,
                            compressors=_codecs(), config=_WRITE_ALL)
    arr[:] = owners.astype(np.int32)
    root.attrs["dasknn"] = {"format": PLAN_FORMAT, "version": VERSION, "network": str(network),
                            "digest": plan_digest(network, owners), "layers": int(owners.shape[0] - 1),
                            "neurons": int(owners.shape[1]), "parts": int(owners.max()) + 1, "complete": False}


def read_plan_owners(path: str | os.PathLike[str], start: int, stop: int) -> np.ndarray:
    """Rows ``start:stop`` of the owners of a part plan (complete or being written)."""
    root = zarr.open_group(location(path), mode="r", zarr_format=3)
    return np.asarray(check_array(root["owners"], "owners", location(path), "iu")[start:stop])


#: The lists of a PartLayer, in the order they are packed into one array per part and layer.
_LISTS = ("outputs", "inputs", "local_dst", "local_src")


def write_plan_layer(path: str | os.PathLike[str], k: int, row: list, blocks: list[sp.csc_matrix]) -> None:
    """Write layer ``k`` of a part plan: every part's :class:`~dasknn.plan.PartLayer` (``row``) and its block
    of the layer, indexed into the rows it reads (``blocks``, from :func:`dasknn.plan.local_block`)."""
    root = zarr.open_group(Path(path), mode="r+", zarr_format=3)
    layer = root.require_group(f"l{k}")
    for q, (pl, block) in enumerate(zip(row, blocks)):
        g = layer.require_group(f"p{q}")
        lists = [pl.outputs, pl.inputs, pl.local[0], pl.local[1]]
        lists += [pl.recv[p] for p in sorted(pl.recv)] + [pl.send[p] for p in sorted(pl.send)]
        flat = np.concatenate([np.asarray(a, dtype=np.int64) for a in lists])
        arr = g.create_array("lists", shape=flat.shape, chunks=(max(1, flat.size),), dtype=np.int64,
                             compressors=_codecs(), config=_WRITE_ALL, overwrite=True)
        if flat.size:
            arr[:] = flat
        _write_sparse(g.require_group("block"), "CSC", block)
        g.attrs["lists"] = {"sizes": [int(np.asarray(a).size) for a in lists],
                            "recv": sorted(int(p) for p in pl.recv), "send": sorted(int(p) for p in pl.send)}
    layer.attrs["complete"] = True


def finish_plan_store(path: str | os.PathLike[str], counts: np.ndarray) -> None:
    """Mark a part plan complete, with its exchange counts ``(L, parts, parts)``, once every layer is written."""
    root = zarr.open_group(Path(path), mode="r+", zarr_format=3)
    arr = root.create_array("counts", shape=counts.shape, chunks=counts.shape, dtype=np.int64, compressors=_codecs(),
                            config=_WRITE_ALL, overwrite=True)
    arr[:] = counts
    root.attrs["dasknn"] = {**dict(root.attrs)["dasknn"], "complete": True}


class PlanStore:
    """A part plan opened for reading: what each part of a model-mode run reads, layer by layer, instead of the
    whole layer (its own columns, already indexed into the rows it reads, and its exchange lists)."""

    def __init__(self, path: str | os.PathLike[str]):
        self.path = location(path)
        self.root, attrs = _open_root(self.path, (PLAN_FORMAT,))
        try:
            self.parts, self.depth, self.neurons = int(attrs["parts"]), int(attrs["layers"]), int(attrs["neurons"])
            self.network, self.digest = str(attrs["network"]), str(attrs["digest"])
        except (KeyError, TypeError, ValueError) as e:
            raise DasknnError(f"part plan attributes are damaged ({e})", self.path) from None

    def owners(self) -> np.ndarray:
        """The partition the plan was made for."""
        return np.asarray(check_array(self.root["owners"], "owners", self.path, "iu")[:])

    def counts(self) -> np.ndarray:
        """``(L, parts, parts)``: entries part p sends part q in layer k, at ``[k - 1, p, q]``."""
        return np.asarray(check_array(self.root["counts"], "counts", self.path, "iu")[:])

    def part_layer(self, q: int, k: int, dtype: str | np.dtype) -> tuple[Any, tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """Part ``q``'s PartLayer and block (CSC raw arrays, values as ``dtype``) in layer ``k``."""
        from .plan import PartLayer

        label = f"part plan layer {k} part {q}"
        try:
            g = self.root[f"l{k}/p{q}"]
            desc = dict(g.attrs)["lists"]
            sizes, recv, send = list(desc["sizes"]), list(desc["recv"]), list(desc["send"])
            flat = np.asarray(check_array(g["lists"], f"{label}: lists", self.path, "iu")[:], dtype=np.int64)
            shape = tuple(dict(g["block"].attrs)["binsparse"]["shape"])
        except DasknnError:
            raise
        except Exception as e:  # a missing group or chunk, damaged metadata, a checksum
            raise DasknnError(f"{label}: missing or damaged ({type(e).__name__}: {e})", self.path) from None
        if len(sizes) != len(_LISTS) + len(recv) + len(send) or sum(sizes) != flat.size:
            raise DasknnError(f"{label}: its lists do not match their sizes", self.path)
        lists = np.split(flat, np.cumsum(sizes)[:-1])
        pl = PartLayer(outputs=lists[0], inputs=lists[1], local=(lists[2], lists[3]),
                       recv=dict(zip(recv, lists[4:4 + len(recv)])), send=dict(zip(send, lists[4 + len(recv):])))
        block = _Sparse.open(g, "block", "CSC", shape, f"{label}: block", self.path)
        indptr, indices, data = block.read(0, shape[1])
        return pl, (indptr, indices, data.astype(dtype, copy=False))


def open_plan_store(path: str | os.PathLike[str], network: str, owners: np.ndarray) -> PlanStore | None:
    """The complete part plan at ``path`` if it was made for ``network`` and ``owners``; None otherwise."""
    try:
        plan = PlanStore(path)
    except DasknnError:
        return None
    if plan.digest != plan_digest(network, owners):
        return None
    return plan


# --- streaming layers (out of core) --------------------------------------------------------------------------


class ReadAhead:
    """Layers ``1..depth`` read as they are needed, with at most ``keep`` in memory at once and the next one read
    ahead in a background thread while the current one computes.

    This is what lets a worker run a network larger than its memory: the weights never all load. ``read(k)``
    returns layer ``k``; ``bytes_read`` adds up ``nbytes`` of what was read.
    """

    def __init__(self, read: Callable[[int], Any], depth: int, keep: int = 2,
                 nbytes: Callable[[Any], int] = lambda arrays: sum(a.nbytes for a in arrays)):
        from concurrent.futures import ThreadPoolExecutor

        if keep < 1:
            raise DasknnError("--keep-layers must be at least 1")
        self.depth = depth
        self.keep = keep
        self.bytes_read = 0
        self._reader = read
        self._nbytes = nbytes
        self._cache: dict[int, Any] = {}  # layer -> Future of what read(k) returns
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dasknn-prefetch")
        self._lock = threading.Lock()

    def _read(self, k: int) -> Any:
        out = self._reader(k)
        with self._lock:
            self.bytes_read += self._nbytes(out)
        return out

    def _request(self, k: int) -> None:
        if 1 <= k <= self.depth and k not in self._cache:
            self._cache[k] = self._pool.submit(self._read, k)

    def layer(self, k: int) -> Any:
        """Layer ``k`` (1-based); starts reading ``k + 1`` in the background."""
        self._request(k)
        fut = self._cache[k]
        # drop everything but the layer in hand and the one being read ahead
        for old in [j for j in self._cache if j not in (k, k + 1)]:
            del self._cache[old]
        if self.keep > 1:
            self._request(k + 1)
        return fut.result()

    def layers(self, first: int, last: int) -> Iterator[Any]:
        """Layers ``first..last`` in order."""
        for k in range(first, last + 1):
            yield self.layer(k)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._cache.clear()


class LayerStream(ReadAhead):
    """A store's layers, whole, as CSC raw arrays ``(indptr, indices, data)`` with values as ``dtype`` (data mode)."""

    def __init__(self, path: str | os.PathLike[str], dtype: str, keep: int = 2):
        self.store = open_store(path, check="metadata")
        self.dtype = np.dtype(dtype)
        super().__init__(self._layer, self.store.depth, keep)

    def _layer(self, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        w = self.store.layer(k)
        return w.indptr, w.indices, w.data.astype(self.dtype, copy=False)


class PartStream(ReadAhead):
    """One part's layers from a part plan, as ``(PartLayer, (indptr, indices, data))`` (model mode): a part reads
    its own columns only."""

    def __init__(self, path: str | os.PathLike[str], part: int, dtype: str, keep: int = 2):
        self.plan = PlanStore(path)
        super().__init__(lambda k: self.plan.part_layer(part, k, dtype), self.plan.depth, keep,
                         nbytes=lambda out: sum(a.nbytes for a in out[1]))


# --- results written chunk by chunk (resumable runs) -----------------------------------------------------------

RESULTS_FORMAT = "dasknn-results"


def open_results(path: str | os.PathLike[str], run: dict[str, Any], resume: bool,
                 activations: bool = False) -> tuple[list, set[int]]:
    """Create (or, with ``resume``, reopen) a results store for a run; return its chunk bounds and the chunks
    already written.

    ``run`` describes the run (network, inputs, images, chunk bounds, dtype); a store made for another run is
    refused rather than mixed. A chunk counts as written only once its ``complete`` attribute is set, which is
    written after its data. With ``activations``, the group the workers write them into is made here, once:
    workers that each made it when missing raced (one of them found it made and failed).
    """
    path = Path(path)
    if path.exists():
        if not resume:
            raise DasknnError("already exists; pass --resume to continue that run, or choose another --results", path)
        try:
            root = zarr.open_group(path, mode="r+", zarr_format=3)
            attrs = dict(root.attrs).get("dasknn", {})
        except Exception as e:
            raise DasknnError(f"not a results store ({type(e).__name__})", path) from None
        if attrs.get("format") != RESULTS_FORMAT:
            raise DasknnError("not a dasknn results store", path)
        saved = attrs.get("run", {})
        for key in ("network", "inputs", "images", "dtype"):
            if saved.get(key) != run.get(key):
                raise DasknnError(f"was written by another run ({key}: {saved.get(key)!r}, now {run.get(key)!r}); "
                                  f"choose another --results", path)
        bounds = [tuple(b) for b in saved["chunks"]]
        if activations:
            root.require_group("activations")
        return bounds, set(_written_chunks(root, path))
    root = zarr.open_group(path, mode="w", zarr_format=3)
    root.attrs["dasknn"] = {"format": RESULTS_FORMAT, "version": VERSION, "run": run}
    if activations:
        root.require_group("activations")
    return [tuple(b) for b in run["chunks"]], set()


def write_chunk_result(path: str, chunk: int, ids: np.ndarray, activations: sp.spmatrix | None = None) -> None:
    """Write one chunk's categories (original 0-based image indices) into a results store, and, when given,
    the final activations of those images (rows in the order of ``ids``) before the chunk counts as written."""
    root = zarr.open_group(path, mode="r+", zarr_format=3)
    ids = np.asarray(ids, dtype=np.int64)
    # what a killed writer left of this chunk (maybe a half-written zarr.json zarr cannot even overwrite) goes first
    shutil.rmtree(Path(path) / f"chunk-{chunk}", ignore_errors=True)
    shutil.rmtree(Path(path) / "activations" / f"chunk-{chunk}", ignore_errors=True)
    if activations is not None:
        rows = sp.csr_matrix(activations)
        group = root["activations"].require_group(f"chunk-{chunk}")  # made by open_results
        for name, a in (("ids", ids), ("indptr", rows.indptr.astype(np.int64)),
                        ("indices", rows.indices.astype(np.int32)), ("values", rows.data)):
            arr = group.create_array(name, shape=a.shape, chunks=(max(1, a.size),), dtype=a.dtype,
                                     compressors=_codecs(), overwrite=True, config=_WRITE_ALL)
            if a.size:
                arr[:] = a
        group.attrs["neurons"] = int(rows.shape[1])
    arr = root.create_array(f"chunk-{chunk}", shape=ids.shape, chunks=(max(1, ids.size),), dtype=np.int64,
                            compressors=_codecs(), overwrite=True, config=_WRITE_ALL)
    if ids.size:
        arr[:] = ids
    arr.attrs["complete"] = True


def _written_chunks(root: zarr.Group, path: Path) -> dict[int, zarr.Array]:
    """A results store's chunks whose writing finished (their ``complete`` attribute is set). A chunk whose
    metadata a killed writer left half written is not written: it is computed again."""
    out = {}
    for entry in sorted(Path(path).glob("chunk-*")):
        try:
            c = int(entry.name.split("-")[1])
            a = root[entry.name]
            complete = isinstance(a, zarr.Array) and dict(a.attrs).get("complete") is True
        except Exception:  # a truncated zarr.json, a name that is not ours
            continue
        if complete:
            out[c] = a
    return out


def read_results(path: str | os.PathLike[str], chunks: set[int] | None = None) -> dict[int, np.ndarray]:
    """The written chunks' categories, by chunk."""
    root = zarr.open_group(Path(path), mode="r", zarr_format=3)
    return {c: np.asarray(check_array(a, f"chunk-{c}", Path(path), "iu")[:], dtype=np.int64)
            for c, a in _written_chunks(root, Path(path)).items() if chunks is None or c in chunks}


def read_activations(path: str | os.PathLike[str], images: int | None = None) -> sp.csr_matrix:
    """The final activations a run wrote (``--activations``): ``images x neurons`` CSR, the rows of images
    that died all zero. ``images`` defaults to the run's batch size."""
    path = Path(path)
    root = zarr.open_group(path, mode="r", zarr_format=3)
    if "activations" not in root:
        raise DasknnError("holds no activations (run with --activations)", path)
    run = dict(root.attrs).get("dasknn", {}).get("run", {})
    n_images = images if images is not None else int(run.get("images", 0))
    done = set(read_results(path))
    blocks, neurons = [], None
    for name, group in root["activations"].groups():
        if int(name.split("-")[1]) not in done:
            continue  # a chunk whose categories were not written did not finish
        neurons = int(group.attrs["neurons"])
        part = {k: check_array(group[k], f"activations/{name}/{k}", path)[:] for k in ("ids", "indptr", "indices", "values")}
        blocks.append(part)
    if neurons is None:
        return sp.csr_matrix((n_images, 0))
    coo_rows, coo_cols, coo_vals = [], [], []
    for b in blocks:
        counts = np.diff(b["indptr"])
        coo_rows.append(np.repeat(b["ids"], counts))
        coo_cols.append(b["indices"])
        coo_vals.append(b["values"])
    return sp.csr_matrix((np.concatenate(coo_vals), (np.concatenate(coo_rows), np.concatenate(coo_cols))),
                         shape=(n_images, neurons))
