"""The network's layers: ``layers/1 .. layers/L``, one binsparse CSC group per layer, written layer by layer
(:class:`StoreWriter`) and read lazily, by layer or by block of output neurons (:class:`NetworkStore`)."""

from __future__ import annotations

import datetime as _dt
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp
import zarr

from ..errors import DasknnError
from ..locations import as_location, exists, filesystem, remote_errors
from ..network import Network, as_csc_layer
from .common import (
    FORMAT,
    FULL_CHECK_ENTRIES,
    VERSION,
    create_together,
    discard,
    file_exists,
    has_group,
    is_url,
    location,
    metadata_of,
    open_group,
    open_root,
    publish,
    staging,
    store_dtype,
)
from .held import held_opener
from .inputs import Inputs, write_inputs
from .sparse import Sparse, sparse_arrays, sparse_attributes

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
        self.path = as_location(path)
        if exists(self.path) and not overwrite:
            raise DasknnError("already exists (pass --overwrite to replace it)", self.path)
        self.neurons, self.layers, self.bias, self.ymax = int(neurons), int(layers), float(bias), float(ymax)
        self.source = source
        self.dtype = None if dtype is None else np.dtype(dtype)
        self._tmp = staging(self.path)
        self._written: set[int] = set()
        self._edges = 0
        self._dtypes: set[str] = set()
        self.root: zarr.Group | None = None

    def __enter__(self) -> StoreWriter:
        if not is_url(self.path):
            self.path.parent.mkdir(parents=True, exist_ok=True)
        self.root = open_group(self._tmp, mode="w")
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
        # the layer's group with its attributes, then its three arrays side by side: behind a URL each node made
        # one after another waited for Zarr's checks of the nodes above it
        create_together(self.root, {f"layers/{k}": sparse_attributes("CSC", m)}, sparse_arrays(m, f"layers/{k}"))
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
                discard(self._tmp)
                raise DasknnError(f"store not written: layer {missing[0]} was never given", self.path)
            self.root.attrs["dasknn"] = self._attrs(complete=True)
            publish(self._tmp, self.path)
        else:
            discard(self._tmp)


def write_network(
    path: str | os.PathLike[str],
    network: Network,
    images: sp.spmatrix | None = None,
    truth: np.ndarray | None = None,
    overwrite: bool = False,
) -> Path | str:
    """Write an in-memory :class:`~dasknn.network.Network` (and optional inputs) as a store; return its path."""
    with StoreWriter(path, network.neurons, network.depth, network.bias, network.ymax, network.source,
                     overwrite=overwrite) as w:
        for k, layer in enumerate(network.layers, start=1):
            w.write_layer(k, layer)
        if images is not None:
            w.write_inputs(images, truth)
    return w.path



class _StoreLayers(Sequence):
    def __init__(self, store: NetworkStore, first: int = 1, last: int | None = None):
        self.store = store
        self.first = first  # [0] reads layer ``first``
        self.count = (store.depth if last is None else last) - first + 1

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        k = int(i) + 1 if i >= 0 else len(self) + int(i) + 1
        if not 1 <= k <= len(self):
            raise IndexError(i)  # how a Sequence's iteration ends
        return self.store.layer(self.first + k - 1)


class NetworkStore:
    """A dasknn store opened for reading. Layers are numbered from 1, as in the challenge's file names.

    Reads are lazy: :meth:`layer` reads one layer, :meth:`columns` only a block of its output neurons, and
    ``inputs.rows`` only a block of images. Each read checks what it read (monotone pointers, indices in range,
    finite values, checksums) and names the layer if something is wrong.
    """

    def __init__(self, path: str | os.PathLike[str], check: str = "auto", hold_bytes: int = 0):
        self.path = location(path)
        #: whether every layer's metadata was read and checked on opening (every ``check`` but ``"lazy"``)
        self.metadata_checked = check != "lazy"
        self.root, attrs = open_root(self.path, (FORMAT,), held_opener(hold_bytes))
        #: with ``hold_bytes``: the reads kept in memory (:class:`~dasknn.store.held.HeldReads`), else None
        self.held = self.root.store if hold_bytes > 0 else None
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
        self._layers: list[Sparse | None] = [None] * self.depth
        with metadata_of(self.path):
            if check != "lazy":
                # every layer's metadata read side by side (Sparse.open_all): behind a URL, a few waves of answers
                named = [(f"layers/{k}", f"layer {k}") for k in range(1, self.depth + 1)]
                self._layers = Sparse.open_all(self.root, named, "CSC", (n, n), self.path)
                if sum(s.nnz for s in self._layers) != self.edges:
                    raise DasknnError("the layers' entries do not add up to the store's edge count", self.path)
            # by the folder, not zarr's listing: inputs whose metadata is damaged are an error, not absent
            self.inputs = Inputs(self.root, n, self.path) if has_group(self.path, "inputs") else None
        if check == "full" or (check == "auto" and self.edges <= FULL_CHECK_ENTRIES):
            self.check()

    def _layer_meta(self, k: int) -> Sparse:
        # opened (its metadata read and checked) once, when first needed
        meta = self._layers[k - 1]
        if meta is None:
            n = self.neurons
            meta = self._layers[k - 1] = Sparse.open(self.root, f"layers/{k}", "CSC", (n, n), f"layer {k}", self.path)
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

    def layer_entries(self) -> np.ndarray:
        """Every layer's entries, in order (int64; from metadata, no read)."""
        return np.array([self.layer_nnz(k) for k in range(1, self.depth + 1)], dtype=np.int64)

    def iter_layers(self) -> Iterator[sp.csc_matrix]:
        """Yield the layers one at a time, holding one in memory."""
        for k in range(1, self.depth + 1):
            yield self.layer(k)

    def network(self) -> Network:
        """Read every layer into an in-memory :class:`~dasknn.network.Network`."""
        return Network(list(self.iter_layers()), self.bias, self.ymax, source=str(self.path))

    def lazy_layers(self, first: int = 1, last: int | None = None) -> Sequence[sp.csc_matrix]:
        """Layers ``first .. last`` (1-based, inclusive; default all) as a sequence that reads each one when it is
        indexed (``[k - first]`` reads layer k)."""
        last = self.depth if last is None else last
        if not 1 <= first <= last <= self.depth:
            raise DasknnError(f"layers {first}..{last} are outside 1..{self.depth}", self.path)
        return _StoreLayers(self, first, last)

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
            fs, root = filesystem(self.path)
            with remote_errors(self.path):
                sizes = fs.du(root, total=False)
            return sum(int(n) for key, n in sizes.items() if not key.startswith(f"{root}/plans/"))
        plans = self.path / "plans"  # derived data, not the network
        return sum(f.stat().st_size for f in self.path.rglob("*") if f.is_file() and plans not in f.parents)


def open_store(path: str | os.PathLike[str], check: str = "auto", hold_bytes: int = 0) -> NetworkStore:
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
    hold_bytes
        Keep up to this many bytes of what is fetched in memory, as stored (encoded), and read them from there
        again (a pipeline stage that streams its layers once per chunk fetches them once).

    Raises
    ------
    DasknnError
        Naming the store and the layer at fault.
    """
    return NetworkStore(path, check=check, hold_bytes=hold_bytes)


def is_store(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` looks like a Zarr store (a folder, or a URL, with ``zarr.json``)."""
    return file_exists(location(path), "zarr.json")
