"""Array helpers shared by the CPU and GPU kernels: device placement, dead-image flags, dense activations.

Nothing here imports CuPy at module level: only a call that asks for a device array does.
"""

from __future__ import annotations

import numpy as np


def alive(yt) -> np.ndarray:
    """Which images (columns of ``yt``) still have a nonzero activation, as a NumPy mask (small; kept on the
    host so image indices never leave it)."""
    return to_host(yt.any(axis=0))


def to_host(a) -> np.ndarray:
    """A NumPy copy of a device array (a NumPy array is returned as it is)."""
    return a if isinstance(a, np.ndarray) else a.get()


def to_device(a: np.ndarray, backend: str):
    """``a`` on the backend's device: itself for ``"cpu"``, a CuPy array for ``"gpu"``."""
    if backend == "cpu":
        return a
    import cupy

    return cupy.asarray(a)


def empty_like_kind(a, shape: tuple[int, ...]):
    """An uninitialised array of ``shape`` and ``a``'s dtype, on ``a``'s device."""
    if isinstance(a, np.ndarray):
        return np.empty(shape, dtype=a.dtype)
    import cupy

    return cupy.empty(shape, dtype=a.dtype)


def dense_transposed(rows_csr, dtype) -> np.ndarray:
    """A CSR block of images (``B x N``) as dense ``N x B`` activations."""
    out = np.zeros((rows_csr.shape[1], rows_csr.shape[0]), dtype=dtype)
    coo = rows_csr.tocoo()
    out[coo.col, coo.row] = coo.data
    return out
