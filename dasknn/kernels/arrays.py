"""Array helpers of every backend: placement, dead-image flags, dense activations, the array module.

The placement functions forward to the backend of their array (:func:`~dasknn.kernels.dispatch.backend_of`) or of
their run (:func:`~dasknn.kernels.dispatch.backend_named`); the dense activations of images are made on the host.
Nothing here imports CuPy at module level: only a call that asks for a device array does.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import partial
from types import ModuleType

import numpy as np

from .dispatch import backend_named, backend_of, find_backend
from .uniform import held_with_forms


def alive(yt) -> np.ndarray:
    """Which images (columns of ``yt``) still have a nonzero activation, as a NumPy mask (small; kept on the
    host so image indices never leave it)."""
    return backend_of(yt).alive(yt)


def to_host(a) -> np.ndarray:
    """A NumPy copy of an array of any backend (a NumPy array is returned as it is)."""
    return backend_of(a).to_host(a)


def to_device(a: np.ndarray, backend: str):
    """``a`` on the device of the backend named ``backend``: a NumPy array for ``"cpu"`` (``a`` itself if it is
    one), a CuPy array for ``"gpu"``."""
    return backend_named(backend).to_device(a)


def held_layers(layers: Iterable[tuple], entries: int, dtype, backend: str) -> list[tuple]:
    """A network's layers (``(indptr, indices, data)`` host arrays, as read; ``entries`` in all) held on the
    backend named ``backend`` for the chunks that will run through them, with ``dtype`` weights: as its
    ``hold_layers`` holds them where it has one (the CPU's packed one after another, read in place by its loop),
    else each array on the device."""
    held = backend_named(backend)
    hold = getattr(held, "hold_layers", None) or partial(_each_on_device, held.to_device)
    # each layer's form (regular iso-valued or not: kernels.uniform) found as it is read, for uniform columns
    return held_with_forms(lambda read: hold(read, entries, np.dtype(dtype)), layers)


def _each_on_device(dev, layers: Iterable[tuple], entries: int, dtype) -> list[tuple]:
    # a backend without hold_layers: each array on its device
    return [(dev(indptr), dev(indices), dev(np.asarray(data, dtype=dtype))) for indptr, indices, data in layers]


def empty_like_kind(a, shape: tuple[int, ...]):
    """An uninitialised array of ``shape`` and ``a``'s dtype, on ``a``'s device."""
    return backend_of(a).empty(shape, a.dtype)


def array_module(a) -> ModuleType:
    """The NumPy-like module of ``a``'s backend (``numpy``, ``cupy``), as ``cupy.get_array_module`` without
    importing CuPy for NumPy arrays.

    An object no backend runs on (a list, a scalar) gets the ``"gpu"`` backend's module, as before the backends
    were registered (NumPy for NumPy arrays, CuPy for any other).
    """
    backend = find_backend(type(a))
    return (backend_named("gpu") if backend is None else backend).array_module()


def rows_on_host(block):
    """Images in memory on the host: a NumPy array or ``scipy.sparse`` matrix as it is, a device array or sparse
    matrix (CuPy's, cupyx's: a type from a module whose name starts with ``cupy``) copied by its ``get()``."""
    return block.get() if type(block).__module__.startswith("cupy") else block


def dense_transposed(rows_csr, dtype) -> np.ndarray:
    """A CSR block of images (``B x N``) as dense ``N x B`` activations."""
    out = np.zeros((rows_csr.shape[1], rows_csr.shape[0]), dtype=dtype)
    coo = rows_csr.tocoo()
    out[coo.col, coo.row] = coo.data
    return out


def activations_of_rows(block, dtype, neurons: np.ndarray | None = None) -> np.ndarray:
    """Images in memory (rows: a NumPy array, a ``scipy.sparse`` matrix, or their CuPy counterparts) as the
    kernels' dense ``N x B`` activations on the host; only the ``neurons`` given, in their order, if any.

    The neurons are taken before the block is made dense: a model-mode part densifies its own rows only, not
    the whole width (on a 65,536-wide network, 1,000 images are 262 MB of float32 when dense).
    """
    import scipy.sparse as sp

    block = rows_on_host(block)
    if sp.issparse(block):
        block = sp.csr_matrix(block)
        return dense_transposed(block if neurons is None else block[:, neurons], dtype)
    block = np.asarray(block)
    return np.ascontiguousarray((block if neurons is None else block[:, neurons]).T, dtype=dtype)
