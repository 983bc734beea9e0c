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

import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

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
def _layer_step_numba(yt, extra, split, indptr, indices, data, bias, ymax, out, tile):  # pragma: no cover
    # out[j, :] = h(sum_p data[p] * x[indices[p], :]) for the block's columns j, tile by tile of images, where
    # the input rows x are yt's rows followed by extra's (index i >= split reads extra[i - split]): a part in
    # model mode reads its own block and the received rows in place, with no assembled copy.
    # Four entries per pass halve the loads and stores of the accumulator; the sum is still formed left to
    # right in the block's entry order, so results do not depend on the unrolling.
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
                i0, i1, i2, i3 = indices[p], indices[p + 1], indices[p + 2], indices[p + 3]
                s0 = yt[i0, b0:b1] if i0 < split else extra[i0 - split, b0:b1]
                s1 = yt[i1, b0:b1] if i1 < split else extra[i1 - split, b0:b1]
                s2 = yt[i2, b0:b1] if i2 < split else extra[i2 - split, b0:b1]
                s3 = yt[i3, b0:b1] if i3 < split else extra[i3 - split, b0:b1]
                for b in range(n):
                    acc[b] = acc[b] + s0[b] * w0 + s1[b] * w1 + s2[b] * w2 + s3[b] * w3
                p += 4
            while p < end:
                w0 = data[p]
                i0 = indices[p]
                s0 = yt[i0, b0:b1] if i0 < split else extra[i0 - split, b0:b1]
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
    yt: np.ndarray, indptr: np.ndarray, indices: np.ndarray, data: np.ndarray, bias: float, ymax: float,
    extra: np.ndarray | None = None,
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
    extra
        More input rows (same images and dtype): index ``yt.shape[0] + r`` of ``indices`` reads ``extra[r]``.
        Model mode passes the rows received from other parts here, so they are never copied into ``yt``.

    Returns
    -------
    numpy.ndarray
        ``outputs x images`` activations of the same dtype.
    """
    dtype = yt.dtype
    yt = np.ascontiguousarray(yt)
    extra = yt if extra is None else np.ascontiguousarray(extra, dtype=dtype)
    out = np.empty((indptr.size - 1, yt.shape[1]), dtype=dtype)
    if yt.shape[1] and out.shape[0]:
        _layer_step_numba(yt, extra, yt.shape[0], indptr, indices, data.astype(dtype, copy=False),
                          dtype.type(bias), dtype.type(ymax), out,
                          tile_for(yt.shape[0] + (0 if extra is yt else extra.shape[0])))
    elif out.size:
        out[:] = 0
    return out


# --- boundary messages (model mode) ----------------------------------------------------------------------
# A message carries some rows of a part's activations for some images. Dense rows are wasteful: once images
# die or neurons fall silent the rows are sparse, and once activations saturate at the clamp they share one
# value. So a message is ``(header, bits, values)``: header = [rows, images, kind]; kind 0: values holds the
# dense rows (bits empty); 1: bits marks the nonzeros (row-major, packed), values lists them; 2: as 1, but
# every nonzero equals values[0]. The packer picks the smallest. Tuples of NumPy arrays: Dask sizes and
# serialises them without pickling their data.

DENSE, SPARSE, CONSTANT = 0, 1, 2


@numba.njit(cache=True, nogil=True, boundscheck=False)
def _scan_numba(block, rows, cols, whole, bits):  # pragma: no cover - compiled
    # pass 1, without branches on the data: the nonzero bitmap (MSB first, as np.unpackbits reads it), built a
    # byte at a time in a register; the nonzero count; the least and greatest nonzero (equal: one value)
    width = block.shape[1] if whole else cols.size
    zero = block.dtype.type(0)
    big = block.dtype.type(np.inf)
    least, most = big, -big
    nnz = 0
    t = 0
    byte = 0
    for r in rows:
        row = block[r]
        for j in range(width):
            v = row[j] if whole else row[cols[j]]
            nz = v != zero
            byte = (byte << 1) | nz
            nnz += nz
            least = min(least, v if nz else big)
            most = max(most, v if nz else -big)
            t += 1
            if (t & 7) == 0:
                bits[(t >> 3) - 1] = byte
                byte = 0
    if t & 7:
        bits[t >> 3] = byte << (8 - (t & 7))
    return nnz, least, most


@numba.njit(cache=True, nogil=True, boundscheck=False)
def _gather_numba(block, rows, cols, whole, values):  # pragma: no cover - compiled
    # pass 2, only when the values differ: the nonzeros in bitmap order
    width = block.shape[1] if whole else cols.size
    zero = block.dtype.type(0)
    n = 0
    for r in rows:
        for j in range(width):
            v = block[r, j] if whole else block[r, cols[j]]
            if v != zero:
                values[n] = v
                n += 1


@numba.njit(cache=True, nogil=True, boundscheck=False)
def _unpack_numba(bits, values, constant, out):  # pragma: no cover - compiled
    # a byte of 8 entries at a time; all-zero and all-set bytes (most, once activations saturate) skip the bits
    count = out.size
    flat = out.reshape(count)
    zero = out.dtype.type(0)
    c0 = values[0] if values.size else zero
    n = 0
    t = 0
    while t < count:
        b = bits[t >> 3]
        if t + 8 <= count and (b == 0 or b == 255):
            if b == 0:
                for i in range(8):
                    flat[t + i] = zero
            elif constant:
                for i in range(8):
                    flat[t + i] = c0
            else:
                for i in range(8):
                    flat[t + i] = values[n + i]
                n += 8
        else:
            for i in range(min(8, count - t)):
                if b & (128 >> i):
                    flat[t + i] = c0 if constant else values[n]
                    n += 1
                else:
                    flat[t + i] = zero
        t += 8


def pack_rows(block, rows: np.ndarray, cols: np.ndarray | None = None, compact: bool = True) -> tuple:
    """The message holding ``block[rows][:, cols]`` (all columns when ``cols`` is None), in its smallest form
    (``compact``), or as dense rows.

    Device (CuPy) blocks are sent as dense rows (kind 0) without leaving the device.
    """
    width = block.shape[1] if cols is None else cols.size
    header = np.array([rows.size, width, DENSE], dtype=np.int64)
    if not compact or not isinstance(block, np.ndarray):
        dense = block[rows] if cols is None else block[rows][:, cols]
        return header, np.empty(0, np.uint8), dense.ravel()
    count = rows.size * width
    bits = np.empty((count + 7) // 8, dtype=np.uint8)
    rows_ = rows.astype(np.int64, copy=False)
    cols_ = np.empty(0, np.int64) if cols is None else cols.astype(np.int64, copy=False)
    nnz, least, most = _scan_numba(block, rows_, cols_, cols is None, bits)
    item = block.dtype.itemsize
    if nnz == 0 or least == most:
        header[2] = CONSTANT if nnz else SPARSE
        return header, bits, np.full(1 if nnz else 0, least, dtype=block.dtype)
    if bits.nbytes + nnz * item < count * item:
        header[2] = SPARSE
        values = np.empty(nnz, dtype=block.dtype)
        _gather_numba(block, rows_, cols_, cols is None, values)
        return header, bits, values
    dense = block[rows] if cols is None else block[np.ix_(rows, cols)]
    return header, np.empty(0, np.uint8), np.ascontiguousarray(dense).ravel()


def message_bytes(message: tuple) -> int:
    """Bytes a message's arrays take (what crosses between workers, less a few bytes of framing)."""
    return int(sum(a.nbytes for a in message))


def unpack_rows(message: tuple, out) -> None:
    """Write a message's rows into ``out`` (``rows x images``, preallocated: a slice of the receive buffer)."""
    header, bits, values = message
    if int(header[2]) == DENSE:
        out[...] = values.reshape(out.shape)
    else:
        _unpack_numba(bits, values, int(header[2]) == CONSTANT, out)


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
    compact_every: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Run consecutive layers on one block of images, dropping images that die.

    A dead image (an all-zero column) stays dead, so it is cut out of ``yt`` every ``compact_every`` layers
    (by default every layer on the CPU, every :data:`GPU_COMPACT_EVERY` on a GPU, see :func:`run_layers_gpu`).

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
    if not isinstance(yt, np.ndarray):  # device arrays: their own loop (fused alive flags, fewer syncs)
        return run_layers_device(yt, layers, bias, ymax, ids, compact_every)
    compact_every = compact_every or 1
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


# --- GPU (CuPy) -----------------------------------------------------------------------------------------------
#
# The GPU kernels follow the CPU kernel's layout (activations transposed and dense, the layer in CSC form) and
# its arithmetic: each output is summed in the block's entry order with separately rounded multiplies and adds
# (no fused multiply-add), so float32 results agree with the Numba kernel and the reference bit for bit. Nothing
# here imports CuPy at module level: CuPy registers itself with the dispatchers the first time a CuPy array
# arrives, and the source below is compiled (by NVRTC, through CuPy) on the first launch.

#: Images per thread block: one per lane of a warp, so a warp's loads of one neuron's row are one transaction.
GPU_TILE = 32
#: Output neurons per block in the gather kernel (one per warp).
GPU_ROWS = 8
#: Warps per block in the staged kernel (they share the tile's inputs held in shared memory).
GPU_STAGED_WARPS = 32
#: Largest shared-memory tile (``inputs x GPU_TILE`` activations) the staged kernel uses, before the device's
#: own opt-in limit: 1024 float32 inputs (128 KiB) fit; float64 and wider layers use the gather kernel.
GPU_STAGED_MAX_BYTES = 160 * 1024
#: Layers between compactions on the GPU: each compaction waits for the device (to learn how many images are
#: left), so doing it every layer would cost a synchronisation per layer.
GPU_COMPACT_EVERY = 4
#: Grid dimension limit of CUDA (y and z); kernels loop over image tiles beyond it.
GPU_MAX_GRID_Y = 65535

#: CUDA source of the fused layer step, compiled with ``#define``s for the constants above. Kept as text so the
#: CPU tests can read it; ``tests/test_kernels_gpu.py`` carries a line-by-line Python transcription.
CUDA_SOURCE = r"""
// yt: n_in x nb activations (row-major: one row per input neuron, one column per image); out: n_out x nb.
// The layer in CSC form: indptr (n_out + 1, int64) over output neurons, indices (int32) its input neurons,
// data its weights. alive[b] is set to 1 for every image b with a nonzero output (the caller zeroes it).

__device__ __forceinline__ float madd(float acc, float y, float w) { return __fadd_rn(acc, __fmul_rn(y, w)); }
__device__ __forceinline__ double madd(double acc, double y, double w) { return __dadd_rn(acc, __dmul_rn(y, w)); }

template <typename T>
__device__ __forceinline__ T rule(T v, T bias, T ymax) {
    if (v != T(0)) {  // the bias goes to nonzero sums only, then ReLU and the clamp
        v = v + bias;
        v = v < T(0) ? T(0) : (v > ymax ? ymax : v);
    }
    return v;
}

// Gather kernel. Block (x, y) computes output neuron j = x * ROWS + threadIdx.y for image
// b = tile * TILE + threadIdx.x, tile = y, y + gridDim.y, ... Output blocks vary fastest, so the blocks that run
// together share an image tile and its input rows stay in cache.
template <typename T>
__device__ void step_gather(const T* __restrict__ yt, const long long* __restrict__ indptr,
                            const int* __restrict__ indices, const T* __restrict__ data, T bias, T ymax,
                            T* __restrict__ out, int* __restrict__ alive, long long n_in, long long n_out,
                            long long nb) {
    __shared__ int tile_alive[TILE];
    const long long j = (long long)blockIdx.x * ROWS + threadIdx.y;
    for (long long tile = blockIdx.y; tile * TILE < nb; tile += gridDim.y) {
        const long long b = tile * TILE + threadIdx.x;
        if (threadIdx.y == 0) tile_alive[threadIdx.x] = 0;
        __syncthreads();
        if (j < n_out && b < nb) {
            T acc = T(0);
            const long long end = indptr[j + 1];
#pragma unroll 4
            for (long long p = indptr[j]; p < end; ++p)
                acc = madd(acc, __ldg(yt + (long long)__ldg(indices + p) * nb + b), __ldg(data + p));
            const T v = rule(acc, bias, ymax);
            out[j * nb + b] = v;
            if (v != T(0)) tile_alive[threadIdx.x] = 1;
        }
        __syncthreads();
        if (threadIdx.y == 0 && b < nb && tile_alive[threadIdx.x]) alive[b] = 1;
    }
}

// Staged kernel, for layers whose tile of inputs (n_in x TILE) fits in shared memory. Block x computes every
// output neuron for the images of tile x (then x + gridDim.x, ...): the block copies the tile's inputs into
// shared memory once (zeros past the last image), then warp w computes neurons w, w + blockDim.y, ... reading
// every gathered input from shared memory.
template <typename T>
__device__ void step_staged(const T* __restrict__ yt, const long long* __restrict__ indptr,
                            const int* __restrict__ indices, const T* __restrict__ data, T bias, T ymax,
                            T* __restrict__ out, int* __restrict__ alive, long long n_in, long long n_out,
                            long long nb) {
    extern __shared__ __align__(16) unsigned char smem[];
    T* sh = reinterpret_cast<T*>(smem);
    __shared__ int tile_alive[TILE];
    const int lane = threadIdx.x;
    const int tid = threadIdx.y * blockDim.x + threadIdx.x;
    const int nthreads = blockDim.x * blockDim.y;
    const int size = (int)n_in * TILE;
    for (long long tile = blockIdx.x; tile * TILE < nb; tile += gridDim.x) {
        const long long b0 = tile * TILE;
        for (int i = tid; i < size; i += nthreads) {
            const int r = i / TILE, c = i % TILE;
            sh[i] = b0 + c < nb ? yt[(long long)r * nb + b0 + c] : T(0);
        }
        if (threadIdx.y == 0) tile_alive[lane] = 0;
        __syncthreads();
        const long long b = b0 + lane;
        int mine = 0;
        if (b < nb) {
            for (long long j = threadIdx.y; j < n_out; j += blockDim.y) {
                T acc = T(0);
                const long long end = indptr[j + 1];
#pragma unroll 4
                for (long long p = indptr[j]; p < end; ++p)
                    acc = madd(acc, sh[__ldg(indices + p) * TILE + lane], __ldg(data + p));
                const T v = rule(acc, bias, ymax);
                out[j * nb + b] = v;
                mine |= v != T(0);
            }
        }
        if (mine) tile_alive[lane] = 1;
        __syncthreads();
        if (threadIdx.y == 0 && b < nb && tile_alive[lane]) alive[b] = 1;
        __syncthreads();  // the next tile overwrites the shared inputs
    }
}

#define DASKNN_KERNEL(NAME, BODY, T)                                                                         \
    extern "C" __global__ void NAME(const T* yt, const long long* indptr, const int* indices, const T* data,  \
                                    T bias, T ymax, T* out, int* alive, long long n_in, long long n_out,     \
                                    long long nb) {                                                          \
        BODY<T>(yt, indptr, indices, data, bias, ymax, out, alive, n_in, n_out, nb);                         \
    }
DASKNN_KERNEL(dasknn_gather_f32, step_gather, float)
DASKNN_KERNEL(dasknn_gather_f64, step_gather, double)
DASKNN_KERNEL(dasknn_staged_f32, step_staged, float)
DASKNN_KERNEL(dasknn_staged_f64, step_staged, double)
"""

GPU_VARIANTS = ("auto", "gather", "staged")
run_layers_device = Dispatch("run_layers")


def cuda_code() -> str:
    """The complete CUDA translation unit: the constants as ``#define``s, then :data:`CUDA_SOURCE`."""
    return f"#define TILE {GPU_TILE}\n#define ROWS {GPU_ROWS}\n" + CUDA_SOURCE


@dataclass(frozen=True)
class GpuLaunch:
    """How one fused layer step is launched: kernel name, grid and block shapes (x, y), dynamic shared bytes."""

    kernel: str
    grid: tuple[int, int]
    block: tuple[int, int]
    shared_bytes: int


def gpu_launch(variant: str, n_in: int, n_out: int, nb: int, itemsize: int,
               shared_limit: int = GPU_STAGED_MAX_BYTES, max_grid: int = GPU_MAX_GRID_Y) -> GpuLaunch:
    """Choose the kernel and its launch shape for a layer of ``n_in`` inputs, ``n_out`` outputs and ``nb`` images.

    ``variant`` is ``"gather"``, ``"staged"`` or ``"auto"`` (staged when the tile's inputs fit in
    ``shared_limit`` bytes of shared memory). ``max_grid`` caps the grid's image-tile dimension; the kernels
    loop over the remaining tiles. Pure arithmetic, so it is tested on the CPU.
    """
    if variant not in GPU_VARIANTS:
        raise ValueError(f"GPU kernel variant must be one of {', '.join(GPU_VARIANTS)}, not {variant!r}")
    suffix = {4: "f32", 8: "f64"}[itemsize]
    tiles = max(1, -(-nb // GPU_TILE))
    staged_bytes = n_in * GPU_TILE * itemsize
    if variant == "staged" and staged_bytes > shared_limit:
        raise ValueError(f"the staged kernel needs {staged_bytes} bytes of shared memory; the limit is {shared_limit}")
    if variant == "staged" or (variant == "auto" and staged_bytes <= shared_limit):
        return GpuLaunch(f"dasknn_staged_{suffix}", (min(tiles, max_grid), 1), (GPU_TILE, GPU_STAGED_WARPS),
                         staged_bytes)
    return GpuLaunch(f"dasknn_gather_{suffix}", (max(1, -(-n_out // GPU_ROWS)), min(tiles, max_grid)),
                     (GPU_TILE, GPU_ROWS), 0)


_GPU_MODULES: dict[int, Any] = {}


def _gpu_kernel(name: str, shared_bytes: int):  # pragma: no cover - needs a GPU
    import cupy

    dev = cupy.cuda.Device().id
    if dev not in _GPU_MODULES:
        _GPU_MODULES[dev] = cupy.RawModule(code=cuda_code(), options=("--std=c++14",))
    kernel = _GPU_MODULES[dev].get_function(name)
    if shared_bytes > 48 * 1024:
        with warnings.catch_warnings():  # some CuPy versions deprecate the attribute's old spelling
            warnings.simplefilter("ignore", DeprecationWarning)
            if kernel.max_dynamic_shared_size_bytes < shared_bytes:
                kernel.max_dynamic_shared_size_bytes = shared_bytes  # opt in beyond the default 48 KiB
    return kernel


_GPU_SHARED: dict[int, int] = {}


def _gpu_shared_limit() -> int:  # pragma: no cover - needs a GPU
    import cupy

    dev = cupy.cuda.Device()
    if dev.id not in _GPU_SHARED:
        optin = dev.attributes.get("MaxSharedMemoryPerBlockOptin", 48 * 1024)
        # the kernel's own static shared memory (the alive flags) comes out of the same budget
        _GPU_SHARED[dev.id] = min(GPU_STAGED_MAX_BYTES, int(optin) - 1024)
    return _GPU_SHARED[dev.id]


def _gpu_step(yt, indptr, indices, data, bias: float, ymax: float, alive, variant: str = "auto"):  # pragma: no cover
    # one launch of the fused kernel; ``alive`` (int32, >= images) gets 1 for each image with a nonzero output
    import cupy

    dtype = yt.dtype
    if dtype not in (np.float32, np.float64):
        raise TypeError(f"GPU kernels run float32 or float64 activations, not {dtype}")
    yt = cupy.ascontiguousarray(yt)
    indptr = cupy.asarray(indptr, dtype=cupy.int64)
    indices = cupy.asarray(indices, dtype=cupy.int32)
    data = cupy.asarray(data, dtype=dtype)
    n_in, nb = yt.shape
    n_out = indptr.size - 1
    out = cupy.empty((n_out, nb), dtype=dtype)
    if nb == 0 or n_out == 0:
        return out
    launch = gpu_launch(variant, n_in, n_out, nb, dtype.itemsize, _gpu_shared_limit(), GPU_MAX_GRID_Y)
    kernel = _gpu_kernel(launch.kernel, launch.shared_bytes)
    kernel(launch.grid, launch.block,
           (yt, indptr, indices, data, dtype.type(bias), dtype.type(ymax), out, alive,
            np.int64(n_in), np.int64(n_out), np.int64(nb)),
           shared_mem=launch.shared_bytes)
    return out


def layer_step_gpu(yt, indptr, indices, data, bias: float, ymax: float, extra=None, *,
                   variant: str = "auto"):  # pragma: no cover - needs a GPU
    """One fused layer on the GPU (CuPy arrays in and out): the same contract as :func:`layer_step_numpy`.

    ``variant`` picks the kernel (see :func:`gpu_launch`); results do not depend on it.
    """
    import cupy

    if extra is not None:
        yt = cupy.concatenate([yt, cupy.asarray(extra, dtype=yt.dtype)])
    alive = cupy.zeros(max(1, yt.shape[1]), dtype=cupy.int32)
    return _gpu_step(yt, indptr, indices, data, bias, ymax, alive, variant)


def run_layers_gpu(yt, layers: Iterable[tuple], bias: float, ymax: float, ids: np.ndarray,
                   compact_every: int | None = None, variant: str = "auto"):  # pragma: no cover - needs a GPU
    """:func:`run_layers` on CuPy activations: fused layer steps, compaction of dead images from their flags.

    Every step also marks the images with a nonzero output, so a compaction needs no separate reduction: the
    surviving columns are gathered every ``compact_every`` layers (:data:`GPU_COMPACT_EVERY` by default) and
    after the last. ``ids`` follow on the device; they come back to the host (a NumPy array) at the end.
    """
    import cupy

    every = GPU_COMPACT_EVERY if compact_every is None else compact_every
    ids_d = cupy.asarray(ids)
    alive = cupy.zeros(max(1, yt.shape[1]), dtype=cupy.int32)
    k = 0
    for k, (indptr, indices, data) in enumerate(layers, start=1):
        if yt.shape[1] == 0:
            break
        alive[: yt.shape[1]] = 0
        yt = _gpu_step(yt, indptr, indices, data, bias, ymax, alive, variant)
        if k % every == 0:
            yt, ids_d = _compact_gpu(yt, ids_d, alive)
    if k % every and yt.shape[1]:
        yt, ids_d = _compact_gpu(yt, ids_d, alive)
    return yt, cupy.asnumpy(ids_d)


def _compact_gpu(yt, ids_d, alive):  # pragma: no cover - needs a GPU
    import cupy

    keep = cupy.flatnonzero(alive[: yt.shape[1]])  # waits for the device: the survivors' count sizes the rest
    if keep.size == yt.shape[1]:
        return yt, ids_d
    return cupy.ascontiguousarray(yt[:, keep]), ids_d[keep]


def layer_step_cusparse(yt, indptr, indices, data, bias: float, ymax: float):  # pragma: no cover - needs a GPU
    """The layer as one cuSPARSE product (``W^T @ yt``) and an element-wise epilogue: a library baseline for the
    fused kernels (sums in cuSPARSE's order, so float32 may differ in the last bit)."""
    import cupy
    import cupyx.scipy.sparse as csp

    w = csp.csc_matrix((cupy.asarray(data, dtype=yt.dtype), cupy.asarray(indices), cupy.asarray(indptr)),
                       shape=(yt.shape[0], indptr.size - 1))
    z = w.T @ yt
    return cupy.where(z != 0, cupy.clip(z + yt.dtype.type(bias), 0, ymax), 0).astype(yt.dtype)


@layer_step.register_lazy("cupy")
@run_layers_device.register_lazy("cupy")
def _register_cupy() -> None:  # pragma: no cover - needs CuPy
    import cupy

    layer_step.register(cupy.ndarray)(layer_step_gpu)
    run_layers_device.register(cupy.ndarray)(run_layers_gpu)
