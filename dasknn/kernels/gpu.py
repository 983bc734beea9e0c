"""The fused layer step on the GPU (CuPy): CUDA source, launch shapes, kernel cache, the loop over layers.

The GPU kernels follow the CPU kernel's layout (activations transposed and dense, the layer in CSC form) and its
arithmetic: each output is summed in the block's entry order with separately rounded multiplies and adds (no
fused multiply-add), so float32 results agree with the Numba kernel and the reference bit for bit. Nothing here
imports CuPy at module level: the ``"gpu"`` backend (:class:`GpuBackend`) is found the first time a CuPy array
arrives (:mod:`dasknn.kernels.dispatch`), and the source below is compiled (by NVRTC, through CuPy) on the first
launch.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Hashable, Iterable, Iterator
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np

from .arrays import activations_of_rows
from .backend import BackendUnsupported
from .gpu_ell import release_ell_loops, run_layers_ell
from .grad import back_input_gpu, weight_grad_gpu
from .messages import pack_rows_dense, unpack_rows_dense
from .nvrtc import CUDA_ARITHMETIC, compiled_kernel

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

#: CUDA source of the fused layer step, compiled with ``#define``s for the constants above: the arithmetic every
#: layer kernel shares (:data:`~dasknn.kernels.nvrtc.CUDA_ARITHMETIC`), then its kernels. Kept as text so the
#: CPU tests can read it; ``tests/kernels/test_kernels_gpu.py`` carries a line-by-line Python transcription.
CUDA_SOURCE = CUDA_ARITHMETIC + r"""
// yt: split x nb activations (row-major: one row per input neuron, one column per image), extra: the rows after
// them, (n_in - split) x nb (model mode's received rows, read in place; yt itself when there are none);
// out: n_out x nb.
// The layer in CSC form: indptr (n_out + 1, int64) over output neurons, indices (int32) its input neurons,
// data its weights. alive[b] is set to 1 for every image b with a nonzero output (the caller zeroes it).

// Gather kernel. Block (x, y) computes output neuron j = x * ROWS + threadIdx.y for image
// b = tile * TILE + threadIdx.x, tile = y, y + gridDim.y, ... Output blocks vary fastest, so the blocks that run
// together share an image tile and its input rows stay in cache.
template <typename T>
__device__ __forceinline__ const T* input_row(const T* yt, const T* extra, long long split, long long i,
                                              long long nb) {
    return i < split ? yt + i * nb : extra + (i - split) * nb;
}

template <typename T>
__device__ void step_gather(const T* __restrict__ yt, const T* __restrict__ extra, long long split,
                            const long long* __restrict__ indptr, const int* __restrict__ indices,
                            const T* __restrict__ data, T bias, T ymax, T* __restrict__ out,
                            int* __restrict__ alive, long long n_in, long long n_out, long long nb) {
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
                acc = madd(acc, __ldg(input_row(yt, extra, split, __ldg(indices + p), nb) + b), __ldg(data + p));
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
__device__ void step_staged(const T* __restrict__ yt, const T* __restrict__ extra, long long split,
                            const long long* __restrict__ indptr, const int* __restrict__ indices,
                            const T* __restrict__ data, T bias, T ymax, T* __restrict__ out,
                            int* __restrict__ alive, long long n_in, long long n_out, long long nb) {
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
            sh[i] = b0 + c < nb ? input_row(yt, extra, split, r, nb)[b0 + c] : T(0);
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

// THREADS: the block size every launch uses, declared so that the compiler keeps within the registers a launch
// has (at 1,024 threads a block, 64 a thread) rather than emit a kernel that cannot launch; BLOCKS: the blocks
// it should fit on a multiprocessor at once (without it, ptxas aims at two 1,024-thread blocks and spills)
#define DASKNN_KERNEL(NAME, BODY, T, THREADS, BLOCKS)                                                        \
    extern "C" __global__ void __launch_bounds__(THREADS, BLOCKS)                                            \
    NAME(const T* yt, const T* extra, long long split, const long long* indptr, const int* indices,         \
         const T* data, T bias, T ymax, T* out, int* alive, long long n_in, long long n_out, long long nb) {   \
        BODY<T>(yt, extra, split, indptr, indices, data, bias, ymax, out, alive, n_in, n_out, nb);           \
    }
// the gather kernel at full occupancy (2,048 threads a multiprocessor); a staged block's shared tile (up to
// 160 KiB) leaves room for one block at a time
DASKNN_KERNEL(dasknn_gather_f32, step_gather, float, TILE * ROWS, 2048 / (TILE * ROWS))
DASKNN_KERNEL(dasknn_gather_f64, step_gather, double, TILE * ROWS, 2048 / (TILE * ROWS))
DASKNN_KERNEL(dasknn_staged_f32, step_staged, float, TILE * STAGED_WARPS, 1)
DASKNN_KERNEL(dasknn_staged_f64, step_staged, double, TILE * STAGED_WARPS, 1)
"""

GPU_VARIANTS = ("auto", "gather", "staged")
#: The loops :func:`run_layers_gpu` can run a chunk by (:func:`gpu_loop`).
GPU_LOOPS = ("layers", "ell")


def cuda_code() -> str:
    """The complete CUDA translation unit: the constants as ``#define``s, then :data:`CUDA_SOURCE`."""
    return (f"#define TILE {GPU_TILE}\n#define ROWS {GPU_ROWS}\n#define STAGED_WARPS {GPU_STAGED_WARPS}\n"
            + CUDA_SOURCE)


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
    suffix = _SUFFIX[itemsize]
    tiles = max(1, -(-nb // GPU_TILE))
    staged_bytes = n_in * GPU_TILE * itemsize
    if variant == "staged" and staged_bytes > shared_limit:
        raise ValueError(f"the staged kernel needs {staged_bytes} bytes of shared memory; the limit is {shared_limit}")
    if variant == "staged" or (variant == "auto" and staged_bytes <= shared_limit):
        return GpuLaunch(f"dasknn_staged_{suffix}", (min(tiles, max_grid), 1), (GPU_TILE, GPU_STAGED_WARPS),
                         staged_bytes)
    return GpuLaunch(f"dasknn_gather_{suffix}", (max(1, -(-n_out // GPU_ROWS)), min(tiles, max_grid)),
                     (GPU_TILE, GPU_ROWS), 0)


_SUFFIX = {4: "f32", 8: "f64"}
_MODULES: dict[int, Any] = {}  # device id -> the compiled source
_KERNELS: dict[tuple[int, str], tuple[Any, int]] = {}  # (device id, kernel name) -> (kernel, dynamic shared limit)


def gpu_kernel(name: str) -> tuple[Any, int]:  # pragma: no cover - needs a GPU
    """The kernel ``name`` of :func:`cuda_code` on the current device, and the most dynamic shared memory one launch
    of it may ask for (see :func:`compiled_kernel`)."""
    return compiled_kernel(name, cuda_code, _MODULES, _KERNELS)


def gpu_step(yt, indptr, indices, data, bias: float, ymax: float, alive, variant: str = "auto",
             extra=None, out=None):  # pragma: no cover - needs a GPU
    """One launch of the fused kernel: :func:`layer_step_gpu`'s result, and ``alive`` (int32, at least as long as
    the images) set to 1 for each image with a nonzero output (the caller zeroes it).

    Input rows past ``yt``'s are read from ``extra`` where they lie, as the CPU kernel reads them: no copy of
    ``yt`` and ``extra`` together is made. ``out``: where to write (``outputs x images``, C-contiguous, ``yt``'s
    dtype); a new array when None.
    """
    import cupy

    dtype = yt.dtype
    if dtype not in (np.float32, np.float64):
        raise TypeError(f"GPU kernels run float32 or float64 activations, not {dtype}")
    yt = cupy.ascontiguousarray(yt)
    extra = yt if extra is None else cupy.ascontiguousarray(cupy.asarray(extra, dtype=dtype))
    if extra.shape[1] != yt.shape[1]:
        raise ValueError(f"extra rows hold {extra.shape[1]} images, the activations {yt.shape[1]}")
    indptr = cupy.asarray(indptr, dtype=cupy.int64)
    indices = cupy.asarray(indices, dtype=cupy.int32)
    data = cupy.asarray(data, dtype=dtype)
    split, nb = yt.shape
    n_in = split + (0 if extra is yt else extra.shape[0])
    n_out = indptr.size - 1
    if out is None:
        out = cupy.empty((n_out, nb), dtype=dtype)
    elif out.shape != (n_out, nb) or out.dtype != dtype or not out.flags.c_contiguous:
        raise ValueError(f"out must be a C-contiguous {dtype} array of shape {(n_out, nb)}")
    if nb == 0 or n_out == 0:
        return out
    staged_limit = min(GPU_STAGED_MAX_BYTES, gpu_kernel(f"dasknn_staged_{_SUFFIX[dtype.itemsize]}")[1])
    launch = gpu_launch(variant, n_in, n_out, nb, dtype.itemsize, staged_limit, GPU_MAX_GRID_Y)
    kernel = gpu_kernel(launch.kernel)[0]
    kernel(launch.grid, launch.block,
           (yt, extra, np.int64(split), indptr, indices, data, dtype.type(bias), dtype.type(ymax), out, alive,
            np.int64(n_in), np.int64(n_out), np.int64(nb)),
           shared_mem=launch.shared_bytes)
    return out


def layer_step_gpu(yt, indptr, indices, data, bias: float, ymax: float, extra=None, columns=None, out=None, *,
                   variant: str = "auto"):
    """One fused layer on the GPU (CuPy arrays in and out): the same contract as :func:`layer_step_numpy`, but
    for ``columns``: the kernels compute every output of the block, so a subset raises
    :class:`~dasknn.kernels.backend.BackendUnsupported`.

    ``extra`` (received rows) is read in place; ``out`` is written where given. ``variant`` picks the kernel (see
    :func:`gpu_launch`); results do not depend on it.
    """
    if columns is not None:
        raise BackendUnsupported("gpu", "compute some of a layer's columns (its kernels compute them all)")
    import cupy

    alive = cupy.zeros(max(1, yt.shape[1]), dtype=cupy.int32)
    return gpu_step(yt, indptr, indices, data, bias, ymax, alive, variant, extra, out)


def gpu_loop(loop: str | None = None) -> str:
    """The GPU loop to run: ``loop``, else ``DASKNN_GPU_LOOP`` from the environment, else ``"layers"`` (today's:
    a launch a layer, compaction by the host). ``"ell"`` is issue 44's candidate (:mod:`.gpu_ell`), opt-in until
    a device run measures it."""
    chosen = loop or os.environ.get("DASKNN_GPU_LOOP") or "layers"
    if chosen not in GPU_LOOPS:
        raise ValueError(f"GPU loop must be one of {', '.join(GPU_LOOPS)}, not {chosen!r}")
    return chosen


def run_layers_gpu(yt, layers: Iterable[tuple], bias: float, ymax: float, ids: np.ndarray,
                   compact_every: int | None = None, variant: str = "auto",
                   loop: str | None = None):  # pragma: no cover - needs a GPU
    """:func:`run_layers` on CuPy activations: fused layer steps, compaction of dead images from their flags.

    Every step also marks the images with a nonzero output, so a compaction needs no separate reduction: the
    surviving columns are gathered every ``compact_every`` layers (:data:`GPU_COMPACT_EVERY` by default) and
    after the last. ``ids`` follow on the device; they come back to the host (a NumPy array) at the end.
    ``loop`` (see :func:`gpu_loop`) ``"ell"`` runs the chunk by :func:`~dasknn.kernels.gpu_ell.run_layers_ell`
    instead (every layer compacted on the device; the same result).
    """
    import cupy

    if gpu_loop(loop) == "ell":
        return run_layers_ell(yt, layers, bias, ymax, ids)
    every = GPU_COMPACT_EVERY if compact_every is None else compact_every
    ids_d = cupy.asarray(ids)
    alive = cupy.zeros(max(1, yt.shape[1]), dtype=cupy.int32)
    k = 0
    for k, (indptr, indices, data) in enumerate(layers, start=1):
        if yt.shape[1] == 0:
            break
        alive[: yt.shape[1]] = 0
        yt = gpu_step(yt, indptr, indices, data, bias, ymax, alive, variant)
        if k % every == 0:
            yt, ids_d = _compact_gpu(yt, ids_d, alive)
    if k % every and yt.shape[1]:
        yt, ids_d = _compact_gpu(yt, ids_d, alive)
    return yt, cupy.asnumpy(ids_d)


def keep_columns_gpu(a, keep: np.ndarray):  # pragma: no cover - needs a GPU
    """``a[:, keep]`` for a boolean NumPy mask: a new CuPy array (``a`` is left as it is)."""
    import cupy

    return a[:, cupy.asarray(keep)]


def _compact_gpu(yt, ids_d, alive):  # pragma: no cover - needs a GPU
    import cupy

    keep = cupy.flatnonzero(alive[: yt.shape[1]])  # waits for the device: the survivors' count sizes the rest
    if keep.size == yt.shape[1]:
        return yt, ids_d
    return cupy.ascontiguousarray(yt[:, keep]), ids_d[keep]


#: Share of a device's free memory (as found on first use) that streamed layers kept there may take.
GPU_KEEP_FRACTION = 0.5
_KEPT: dict[int, dict[Hashable, tuple]] = {}  # device id -> (stream key, layer) -> the layer on the device
_KEPT_BYTES: dict[int, list[int]] = {}  # device id -> [bytes kept, budget]


def keep_on_device(key: Hashable, first: int, layers: Iterable[tuple]) -> Iterator[tuple]:
    """Layers ``first, first + 1, ...`` of a stream (host arrays, as read) as device arrays, keeping what fits.

    A streamed network is read again for every chunk of images; its layers would cross to the device every
    layer of every chunk. Here each layer's device copy (indptr int64, indices int32, as the kernels take them)
    is kept under ``(key, layer)`` while the kept layers take at most :data:`GPU_KEEP_FRACTION` of the device's
    free memory; the first layers are kept and the rest stream (a scan in layer order would evict every layer
    before its reuse under least-recently-used). ``key`` names the stream (its store and dtype) and must change
    when the layers do. :func:`release_device_layers` frees them.
    """
    import cupy

    dev = cupy.cuda.Device().id
    kept = _KEPT.setdefault(dev, {})
    if dev not in _KEPT_BYTES:
        _KEPT_BYTES[dev] = [0, int(cupy.cuda.runtime.memGetInfo()[0] * GPU_KEEP_FRACTION)]
    for k, (indptr, indices, data) in enumerate(layers, start=first):
        layer = kept.get((key, k))
        if layer is None:
            layer = (cupy.asarray(indptr, dtype=cupy.int64), cupy.asarray(indices, dtype=cupy.int32),
                     cupy.asarray(data))
            size = sum(int(a.nbytes) for a in layer)
            if _KEPT_BYTES[dev][0] + size <= _KEPT_BYTES[dev][1]:
                kept[key, k] = layer
                _KEPT_BYTES[dev][0] += size
        yield layer


def release_device_layers() -> None:
    """Free every layer :func:`keep_on_device` kept (after a run: its streams are closed), and the ELL loops."""
    _KEPT.clear()
    _KEPT_BYTES.clear()
    release_ell_loops()


def layer_step_cusparse(yt, indptr, indices, data, bias: float, ymax: float):  # pragma: no cover - needs a GPU
    """The layer as one cuSPARSE product (``W^T @ yt``) and an element-wise epilogue: a library baseline for the
    fused kernels (sums in cuSPARSE's order, so float32 may differ in the last bit)."""
    import cupy
    import cupyx.scipy.sparse as csp

    w = csp.csc_matrix((cupy.asarray(data, dtype=yt.dtype), cupy.asarray(indices), cupy.asarray(indptr)),
                       shape=(yt.shape[0], indptr.size - 1))
    z = w.T @ yt
    return cupy.where(z != 0, cupy.clip(z + yt.dtype.type(bias), 0, ymax), 0).astype(yt.dtype)


@dataclass(frozen=True)
class GpuBackend:
    """The ``"gpu"`` backend (:class:`~dasknn.kernels.backend.Backend`): CuPy arrays and the CUDA kernels, its
    members in the contract's order. CuPy is imported by the methods that need it, never by this module or by
    looking the backend up by name."""

    name: str = "gpu"
    reuse_space: bool = False

    def missing(self) -> str | None:
        try:
            importlib.import_module("cupy")
        except ImportError:
            return "CuPy: pip install 'dasknn[gpu]'"
        return None

    def array_types(self) -> tuple[type, ...]:
        return (self.array_module().ndarray,)

    def array_module(self) -> ModuleType:
        import cupy

        return cupy

    def to_device(self, a):
        return self.array_module().asarray(a)

    def to_host(self, a) -> np.ndarray:  # pragma: no cover - needs a GPU
        return a.get()

    def empty(self, shape: tuple[int, ...], dtype):
        return self.array_module().empty(shape, dtype=dtype)

    def activations_of_rows(self, block, dtype, neurons: np.ndarray | None = None):
        # made dense on the host (a model-mode part's own rows only), then copied over
        return self.to_device(activations_of_rows(block, dtype, neurons))

    layer_step = staticmethod(layer_step_gpu)
    run_layers = staticmethod(run_layers_gpu)
    keep_columns = staticmethod(keep_columns_gpu)

    def alive(self, yt) -> np.ndarray:  # pragma: no cover - needs a GPU
        return yt.any(axis=0).get()  # (the flags are few: image indices stay on the host)

    # messages as dense rows, which never leave the device
    pack_rows = staticmethod(pack_rows_dense)
    unpack_rows = staticmethod(unpack_rows_dense)
    # training's CUDA kernels
    weight_grad = staticmethod(weight_grad_gpu)
    back_input = staticmethod(back_input_gpu)
    # streamed layers kept on the device, freed after a run
    keep_on_device = staticmethod(keep_on_device)
    release = staticmethod(release_device_layers)


#: The backend this module registers as ``"gpu"`` (:mod:`dasknn.kernels.dispatch`).
BACKEND = GpuBackend()
