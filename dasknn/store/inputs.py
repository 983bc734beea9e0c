"""The input images of a store (``inputs/``: ``images x N`` binsparse CSR, chunked by images, and the truth),
kept with a network or in an inputs-only store."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import scipy.sparse as sp
import zarr

from ..errors import DasknnError
from ..locations import as_location, exists
from . import common
from .common import (
    FORMAT,
    INPUTS_FORMAT,
    VERSION,
    NewArray,
    check_array,
    create_together,
    discard,
    has_group,
    location,
    metadata_of,
    open_group,
    open_root,
    publish,
    staging,
    store_dtype,
)
from .sparse import Sparse, sparse_arrays, sparse_attributes

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
        self._m = Sparse.open(root, "inputs", "CSR", (int(shape[0]), neurons), "inputs", store)

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
        name = "truth_float32" if single and has_group(self.store, "inputs/truth_float32") else "truth"
        if not has_group(self.store, f"inputs/{name}"):
            return None
        with metadata_of(self.store):
            arr = check_array(self._root["inputs"][name], f"inputs: {name}", self.store, kinds="iu")
        count = dict(self._root["inputs"].attrs).get(f"{name}_count")
        if count is not None and arr.shape != (count,):
            raise DasknnError(f"inputs: {name} holds {arr.shape} entries, its count says {count}", self.store)
        try:
            return np.asarray(arr[:], dtype=np.int64)
        except Exception as e:  # a checksum mismatch or a missing chunk
            raise DasknnError(f"inputs: cannot read {name} ({type(e).__name__}: {e}); the store is damaged",
                              self.store) from None


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
    m.data = m.data.astype(store_dtype(m.data), copy=False)
    attributes = sparse_attributes("CSR", m)
    arrays = sparse_arrays(m, "inputs")
    for name, t in (("truth", truth), ("truth_float32", truth_float32)):
        if t is None:
            continue
        t = np.asarray(t, dtype=np.int64)
        if t.size and (t.min() < 0 or t.max() >= m.shape[0]):
            raise DasknnError(f"truth names an image outside 1..{m.shape[0]}")
        arrays.append(NewArray(f"inputs/{name}", t, max(1, min(common.CHUNK_ENTRIES, t.size))))
        # the count kept apart from the array's metadata: a shrunken shape would otherwise drop categories unseen
        attributes[f"{name}_count"] = int(t.size)
    if "inputs" in root:
        del root["inputs"]
    # the group with its attributes, then the images' three arrays and the truths side by side
    create_together(root, {"inputs": attributes}, arrays)


def open_inputs(path: str | os.PathLike[str], check: str = "metadata") -> Inputs:
    """Open the inputs of a store: a network store holding inputs, or an inputs-only store.

    Every block read is checked as it is read; ``check="full"`` also reads and checks them all now.
    """
    path = location(path)
    root, attrs = open_root(path, (FORMAT, INPUTS_FORMAT))
    if not has_group(path, "inputs"):
        raise DasknnError("the store holds no inputs; give --inputs or import them", path)
    neurons = attrs.get("neurons")
    if type(neurons) is not int or neurons < 1:
        raise DasknnError(f"store attributes are damaged (neurons {neurons!r})", path)
    with metadata_of(path):
        inputs = Inputs(root, neurons, path)
    if check == "full":
        inputs.rows()
    return inputs


def write_inputs_store(path: str | os.PathLike[str], images: sp.spmatrix, truth: np.ndarray | None = None,
                       source: str = "", overwrite: bool = False) -> Path | str:
    """Write images (and truth) as an inputs-only store, atomically."""
    path = as_location(path)
    if exists(path) and not overwrite:
        raise DasknnError("already exists (pass --overwrite to replace it)", path)
    tmp = staging(path)
    try:
        root = open_group(tmp, mode="w")
        write_inputs(root, images, truth, images.shape[1])
        root.attrs["dasknn"] = {"format": INPUTS_FORMAT, "version": VERSION, "neurons": int(images.shape[1]),
                                "images": int(images.shape[0]), "source": source, "complete": True}
        publish(tmp, path)
    except BaseException:
        discard(tmp)
        raise
    return path
