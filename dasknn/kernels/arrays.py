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


def activations_of_rows(block, dtype, neurons: np.ndarray | None = None) -> np.ndarray:
    """Images in memory (rows: a NumPy array, a ``scipy.sparse`` matrix, or their CuPy counterparts) as the
    kernels' dense ``N x B`` activations on the host; only the ``neurons`` given, in their order, if any.

    The neurons are taken before the block is made dense: a model-mode part densifies its own rows only, not
    the whole width (on a 65,536-wide network, 1,000 images are 262 MB of float32 when dense).
    """
    import scipy.sparse as sp

    if type(block).__module__.startswith("cupy"):
        block = block.get()  # a CuPy array, or a cupyx.scipy.sparse matrix: the host copy
    if sp.issparse(block):
        block = sp.csr_matrix(block)
        return dense_transposed(block if neurons is None else block[:, neurons], dtype)
    block = np.asarray(block)
    return np.ascontiguousarray((block if neurons is None else block[:, neurons]).T, dtype=dtype)
