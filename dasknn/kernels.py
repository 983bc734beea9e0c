"""Per-block compute kernels: the fused challenge layer step, on raw arrays.

A kernel takes raw arrays (activations, and a layer block as ``indptr, indices, data``) and returns raw arrays;
Dask never appears here. Activations are held *transposed and dense*: ``yt`` has one row per neuron and one
column per image (``N x B``), so the inner loop of the sparse product is a contiguous, vectorisable run over
images. Dense because once dead images are dropped the survivors are nearly all nonzero (over the challenge's
120 layers, 93 % of the alive images' activations are nonzero).

Kernels are chosen by the activations' array type through :data:`layer_step`, a dispatcher in the style of
dask-image: NumPy is registered here; CuPy registers itself lazily the first time a CuPy array arrives, so
importing dasknn never imports CuPy.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numba
import numpy as np

class Dispatch:
    """Look up an implementation by the type of the first argument; lazy registration by top-level module."""

    def __init__(self, name: str):
        self.name = name
        self._impls: dict[type, Callable] = {}
        self._lazy: dict[str, Callable[[], None]] = {}

    def register(self, kind: type) -> Callable[[Callable], Callable]:
        def wrap(fn: Callable) -> Callable:
            self._impls[kind] = fn
            return fn

        return wrap

    def register_lazy(self, module: str) -> Callable[[Callable[[], None]], Callable[[], None]]:
        def wrap(fn: Callable[[], None]) -> Callable[[], None]:
            self._lazy[module] = fn
            return fn

        return wrap

    def dispatch(self, kind: type) -> Callable:
        for cls in kind.__mro__:
            if cls in self._impls:
                return self._impls[cls]
        top = kind.__module__.split(".")[0]
        if top in self._lazy:
            self._lazy.pop(top)()
            return self.dispatch(kind)
        raise TypeError(f"no {self.name} kernel for arrays of type {kind.__module__}.{kind.__name__}")

    def __call__(self, arg, *args, **kwargs):
        return self.dispatch(type(arg))(arg, *args, **kwargs)


layer_step = Dispatch("layer_step")


@numba.njit(cache=True, nogil=True, boundscheck=False)
def _layer_step_numba(yt, indptr, indices, data, bias, ymax, out, tile):  # pragma: no cover - compiled
    # out[j, :] = h(sum_p data[p] * yt[indices[p], :]) for the block's columns j, tile by tile of images.
    # Four entries per pass halve the loads and stores of the accumulator; the sum is still formed left to
    # right in ascending input order, so results do not depend on the unrolling.
    nout = indptr.size - 1
    nb = yt.shape[1]
    zero = out.dtype.type(0)
    for b0 in range(0, nb, tile):
        b1 = min(b0 + tile, nb)
        n = b1 - b0
        for j in range(nout):
            acc = out[j, b0:b1]
            acc[:] = zero
            p = indptr[j]
            end = indptr[j + 1]
            while p + 4 <= end:
                w0, w1, w2, w3 = data[p], data[p + 1], data[p + 2], data[p + 3]
                s0 = yt[indices[p], b0:b1]
                s1 = yt[indices[p + 1], b0:b1]
                s2 = yt[indices[p + 2], b0:b1]
                s3 = yt[indices[p + 3], b0:b1]
                for b in range(n):
                    acc[b] = acc[b] + s0[b] * w0 + s1[b] * w1 + s2[b] * w2 + s3[b] * w3
                p += 4
            while p < end:
                w0 = data[p]
                s0 = yt[indices[p], b0:b1]
                for b in range(n):
                    acc[b] += s0[b] * w0
                p += 1
            for b in range(n):
                v = acc[b]
                if v != zero:  # the bias goes to nonzeros only
                    v = v + bias
                    if v < zero:
                        v = zero
                    elif v > ymax:
                        v = ymax
                    acc[b] = v


def tile_for(inputs: int) -> int:
    """Images per tile: wide tiles amortise the loop over columns, but a tile's inputs should stay in cache
    (measured on the 1024-neuron layers: 2048 images run twice as fast as 256)."""
    return int(max(128, min(4096, (1 << 21) // max(1, inputs))))


@layer_step.register(np.ndarray)
def layer_step_numpy(
    yt: np.ndarray, indptr: np.ndarray, indices: np.ndarray, data: np.ndarray, bias: float, ymax: float
) -> np.ndarray:
    """One fused layer on the CPU: ``h(W_block^T @ yt)`` for the block's output neurons.

    Parameters
    ----------
    yt
        Input activations, ``inputs x images``, C-contiguous, float32 or float64.
    indptr, indices, data
        The block in CSC form: column ``j`` of the block (an output neuron) lists its inputs as rows of ``yt``.
    bias, ymax
        The rule's constants: the bias is added to nonzero sums only, then ReLU, then the clamp.

    Returns
    -------
    numpy.ndarray
        ``outputs x images`` activations of the same dtype.
    """
    dtype = yt.dtype
    out = np.empty((indptr.size - 1, yt.shape[1]), dtype=dtype)
    if yt.shape[1] and out.shape[0]:
        _layer_step_numba(np.ascontiguousarray(yt), indptr, indices, data.astype(dtype, copy=False),
                          dtype.type(bias), dtype.type(ymax), out, tile_for(yt.shape[0]))
    elif out.size:
        out[:] = 0
    return out


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


def run_layers(
    yt: np.ndarray,
    layers: Iterable[tuple[np.ndarray, np.ndarray, np.ndarray]],
    bias: float,
    ymax: float,
    ids: np.ndarray,
    compact_every: int = 1,
) -> tuple[np.ndarray, np.ndarray]:
    """Run consecutive layers on one block of images, dropping images that die.

    A dead image (an all-zero column) stays dead, so it is cut out of ``yt`` every ``compact_every`` layers.

    Parameters
    ----------
    yt
        ``N x B`` activations.
    layers
        Each layer as ``(indptr, indices, data)`` in CSC form (a list, or an iterator that reads them as they
        are needed).
    ids
        The images' original indices (length ``B``); they follow the surviving columns.

    Returns
    -------
    (yt, ids)
        The final activations of the surviving images and their original indices.
    """
    k = 0
    for k, (indptr, indices, data) in enumerate(layers, start=1):
        yt = layer_step(yt, indptr, indices, data, bias, ymax)
        if k % compact_every == 0:
            yt, ids = _compact(yt, ids)
        if yt.shape[1] == 0:
            break
    if k % compact_every:
        yt, ids = _compact(yt, ids)
    return yt, ids


def _compact(yt, ids: np.ndarray):
    keep = alive(yt)
    if keep.all():
        return yt, ids
    return yt[:, keep], ids[keep]


def dense_transposed(rows_csr, dtype) -> np.ndarray:
    """A CSR block of images (``B x N``) as dense ``N x B`` activations."""
    out = np.zeros((rows_csr.shape[1], rows_csr.shape[0]), dtype=dtype)
    coo = rows_csr.tocoo()
    out[coo.col, coo.row] = coo.data
    return out


@layer_step.register_lazy("cupy")
def _register_cupy() -> None:  # pragma: no cover - needs a GPU
    import cupy

    @layer_step.register(cupy.ndarray)
    def layer_step_cupy(yt, indptr, indices, data, bias, ymax):
        import cupyx.scipy.sparse as csp

        n_in = yt.shape[0]
        w = csp.csc_matrix((cupy.asarray(data, dtype=yt.dtype), cupy.asarray(indices), cupy.asarray(indptr)),
                           shape=(n_in, indptr.size - 1))
        z = w.T @ yt  # cuSPARSE SpMM; then the challenge's epilogue, bias on nonzeros only
        return cupy.where(z != 0, cupy.clip(z + yt.dtype.type(bias), 0, ymax), 0).astype(yt.dtype)
