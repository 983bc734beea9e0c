"""Training kernels on raw arrays: the weight gradient at the stored pattern and the error passed down.

Both take a layer block in CSC form (``indptr`` over output neurons, ``indices`` its input neurons, ``data`` its
values) and activations or errors held transposed and dense (``neurons x batch``), as the inference kernels do.
They are the backend's of the activations (:mod:`.dispatch`): NumPy arrays run the Numba kernels below, CuPy
arrays the CUDA kernels (the ``"gpu"`` backend is found the first time a CuPy array arrives, so importing dasknn
never imports CuPy).

Both devices sum in the same order with separately rounded multiplies and adds (no fused multiply-add):

* ``weight_grad``: entry ``p = (i, j)`` sums ``xin[i, b] * delta[j, b]`` over the images ``b`` in ascending order;
* ``back_input``: input ``i`` sums ``data[p] * delta[j, b]`` over its entries in ascending output ``j``,

so a float64 training step gives the same values on either device.
"""

from __future__ import annotations

from typing import Any

import numba
import numpy as np

from .dispatch import Dispatch
from .nvrtc import GPU_COMPILE_OPTIONS

#: The kernels of the activations' backend (the first argument of each).
weight_grad_device = Dispatch("weight_grad")
back_input_device = Dispatch("back_input")


def weight_grad(indptr, indices, xin, delta):
    """Gradient values at the stored pattern: ``sum_b xin[i, b] * delta[j, b]`` for every stored ``(i, j)``.

    Parameters
    ----------
    indptr, indices
        The layer's pattern in CSC form (``indptr`` has one entry per output neuron, plus one).
    xin
        The layer's inputs, ``n_in x batch`` (NumPy or CuPy).
    delta
        The error at the layer's outputs times the rule's derivative, ``n_out x batch``, same array type.

    Returns
    -------
    array
        One float64 value per stored entry, aligned with ``indices``, on the inputs' device.
    """
    return weight_grad_device(xin, delta, indptr, indices)


def back_input(indptr, indices, data, delta, n_in: int):
    """The error passed to the layer's inputs: ``W_block @ delta`` (``n_in x batch``, float64).

    Parameters
    ----------
    indptr, indices, data
        The layer block in CSC form.
    delta
        The error at the block's outputs, ``n_out x batch`` (NumPy or CuPy); the result is on its device.
    n_in
        Rows of the result (the block's inputs).
    """
    return back_input_device(delta, indptr, indices, data, n_in)


# --- CPU (Numba) ------------------------------------------------------------------------------------------------


@numba.njit(cache=True, nogil=True)
def _wgrad_numba(indptr, indices, xin, delta, out):  # pragma: no cover - compiled
    # out[p] = sum_b xin[indices[p], b] * delta[j, b] for the stored entries p of column j
    nb = xin.shape[1]
    for j in range(indptr.size - 1):
        for p in range(indptr[j], indptr[j + 1]):
            s = 0.0
            row = xin[indices[p]]
            d = delta[j]
            for b in range(nb):
                s += row[b] * d[b]
            out[p] = s


@numba.njit(cache=True, nogil=True)
def _backin_numba(indptr, indices, data, delta, out):  # pragma: no cover - compiled
    # out[i, :] += data[p] * delta[j, :]  (out = W_block @ delta), columns j in ascending order
    nb = delta.shape[1]
    for j in range(indptr.size - 1):
        d = delta[j]
        for p in range(indptr[j], indptr[j + 1]):
            w = data[p]
            o = out[indices[p]]
            for b in range(nb):
                o[b] += w * d[b]


def weight_grad_numpy(xin: np.ndarray, delta: np.ndarray, indptr: np.ndarray, indices: np.ndarray) -> np.ndarray:
    """:func:`weight_grad` on NumPy arrays (the Numba kernel)."""
    out = np.empty(indices.size, dtype=np.float64)
    _wgrad_numba(indptr, indices, np.ascontiguousarray(xin, dtype=np.float64),
                 np.ascontiguousarray(delta, dtype=np.float64), out)
    return out


def back_input_numpy(delta: np.ndarray, indptr: np.ndarray, indices: np.ndarray, data: np.ndarray,
                     n_in: int) -> np.ndarray:
    """:func:`back_input` on NumPy arrays (the Numba kernel)."""
    out = np.zeros((n_in, delta.shape[1]), dtype=np.float64)
    _backin_numba(indptr, indices, np.asarray(data, dtype=np.float64), np.ascontiguousarray(delta, dtype=np.float64),
                  out)
    return out


# --- GPU (CuPy) -------------------------------------------------------------------------------------------------
#
# One thread per stored entry (weight gradient) or per input neuron and image (error passed down), each summing
# in the CPU kernels' order. The error passed down reads the block by rows: ``transposed_pattern`` gives, for each
# input neuron, its entries in ascending output order (a stable sort of the CSC entries by row), so no two threads
# write the same output and no atomics reorder the sums.

#: Threads per block of the training kernels.
GRAD_THREADS = 256
#: Blocks per multiprocessor the launch bound asks ptxas to allow for: 4 x 256 threads leave 64 registers a
#: thread (with the thread count alone, ptxas capped these kernels at 32 and spilled).
GRAD_BLOCKS_PER_SM = 4

#: CUDA source of the training kernels (float64: training keeps its values in float64). Kept as text so the CPU
#: tests compile it for the target architectures and read it beside its Python transcription.
GRAD_CUDA_SOURCE = r"""
__device__ __forceinline__ double madd(double acc, double a, double b) { return __dadd_rn(acc, __dmul_rn(a, b)); }

// out[p] = sum_b xin[indices[p] * nb + b] * delta[col[p] * nb + b], b ascending; one thread per stored entry p.
extern "C" __global__ void __launch_bounds__(GRAD_THREADS, GRAD_BLOCKS_PER_SM)
dasknn_wgrad_f64(const double* __restrict__ xin, const double* __restrict__ delta,
                 const int* __restrict__ indices, const long long* __restrict__ col, double* __restrict__ out,
                 long long nnz, long long nb) {
    for (long long p = (long long)blockIdx.x * blockDim.x + threadIdx.x; p < nnz;
         p += (long long)gridDim.x * blockDim.x) {
        const double* x = xin + (long long)indices[p] * nb;
        const double* d = delta + col[p] * nb;
        double s = 0.0;
        for (long long b = 0; b < nb; ++b) s = madd(s, x[b], d[b]);
        out[p] = s;
    }
}

// out[i * nb + b] = sum over the entries r of row i (ascending output j) of data[perm[r]] * delta[col[r] * nb + b];
// one thread per (i, b), images fastest so a warp's reads of one delta row are one transaction.
extern "C" __global__ void __launch_bounds__(GRAD_THREADS, GRAD_BLOCKS_PER_SM)
dasknn_backin_f64(const double* __restrict__ delta, const long long* __restrict__ rowptr,
                  const long long* __restrict__ perm, const long long* __restrict__ col,
                  const double* __restrict__ data, double* __restrict__ out, long long n_in, long long nb) {
    const long long total = n_in * nb;
    for (long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x; t < total;
         t += (long long)gridDim.x * blockDim.x) {
        const long long i = t / nb, b = t % nb;
        double s = 0.0;
        for (long long r = rowptr[i]; r < rowptr[i + 1]; ++r) s = madd(s, data[perm[r]], delta[col[r] * nb + b]);
        out[t] = s;
    }
}
"""

#: The training kernels' names, as compiled from :data:`GRAD_CUDA_SOURCE`.
GRAD_KERNELS = ("dasknn_wgrad_f64", "dasknn_backin_f64")


def grad_cuda_code() -> str:
    """The complete CUDA translation unit of the training kernels."""
    return f"#define GRAD_THREADS {GRAD_THREADS}\n#define GRAD_BLOCKS_PER_SM {GRAD_BLOCKS_PER_SM}\n" + GRAD_CUDA_SOURCE


def grid_for(items: int, max_blocks: int = 65535 * 32) -> int:
    """Blocks of :data:`GRAD_THREADS` threads for ``items`` work items (the kernels loop past the grid)."""
    return max(1, min(-(-items // GRAD_THREADS), max_blocks))


def entry_columns(indptr, xp: Any = np):
    """The output neuron of every stored entry of a CSC pattern (``xp``: NumPy or CuPy, as ``indptr``)."""
    indptr = xp.asarray(indptr, dtype=xp.int64)
    return xp.searchsorted(indptr, xp.arange(int(indptr[-1]), dtype=xp.int64), side="right") - 1


def transposed_pattern(indptr, indices, n_in: int, xp: Any = np) -> tuple[Any, Any, Any]:
    """The block's entries by input neuron, for :func:`back_input` on the GPU.

    Returns ``(rowptr, perm, col)``: input ``i``'s entries are ``perm[rowptr[i]:rowptr[i + 1]]`` (positions in the
    CSC arrays) in ascending output order, ``col`` their output neurons. ``xp`` is NumPy or CuPy, as the inputs.
    """
    indices = xp.asarray(indices)
    # sorted by input neuron, ties by position, which is ascending output neuron in CSC order
    perm = xp.lexsort(xp.stack([xp.arange(indices.size, dtype=xp.int64), indices.astype(xp.int64)]))
    rowptr = xp.zeros(n_in + 1, dtype=xp.int64)
    rowptr[1:] = xp.cumsum(xp.bincount(indices, minlength=n_in))
    return rowptr, perm.astype(xp.int64), entry_columns(indptr, xp)[perm]


_GRAD_MODULES: dict[int, Any] = {}


def _grad_kernel(name: str):  # pragma: no cover - needs a GPU
    # compiled once per device, looked up once per name
    import cupy

    dev = cupy.cuda.Device().id
    if dev not in _GRAD_MODULES:
        _GRAD_MODULES[dev] = (cupy.RawModule(code=grad_cuda_code(), options=GPU_COMPILE_OPTIONS), {})
    module, found = _GRAD_MODULES[dev]
    if name not in found:
        found[name] = module.get_function(name)
    return found[name]


def weight_grad_gpu(xin, delta, indptr, indices):  # pragma: no cover - needs a GPU
    """:func:`weight_grad` on CuPy arrays."""
    import cupy

    xin = cupy.ascontiguousarray(xin, dtype=cupy.float64)
    delta = cupy.ascontiguousarray(delta, dtype=cupy.float64)
    indices = cupy.asarray(indices, dtype=cupy.int32)
    col = entry_columns(indptr, cupy)
    out = cupy.empty(indices.size, dtype=cupy.float64)
    if indices.size:
        _grad_kernel("dasknn_wgrad_f64")((grid_for(indices.size),), (GRAD_THREADS,),
                                         (xin, delta, indices, col, out, np.int64(indices.size),
                                          np.int64(xin.shape[1])))
    return out


def back_input_gpu(delta, indptr, indices, data, n_in: int):  # pragma: no cover - needs a GPU
    """:func:`back_input` on CuPy arrays."""
    import cupy

    delta = cupy.ascontiguousarray(delta, dtype=cupy.float64)
    rowptr, perm, col = transposed_pattern(indptr, indices, n_in, cupy)
    out = cupy.empty((n_in, delta.shape[1]), dtype=cupy.float64)
    if out.size:
        _grad_kernel("dasknn_backin_f64")((grid_for(out.size),), (GRAD_THREADS,),
                                          (delta, rowptr, perm, col, cupy.asarray(data, dtype=cupy.float64), out,
                                           np.int64(n_in), np.int64(delta.shape[1])))
    return out

