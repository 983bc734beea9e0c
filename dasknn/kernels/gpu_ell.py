"""Issue 44's candidate GPU loop: a chunk's every layer on the device, no host round trip between layers.

The layer kernel reads each layer in sliced ELL (:mod:`.ell`), one output neuron a thread for a minibatch of
images a thread, and fuses the bias, ReLU, clamp and the alive flags. Dead images are dropped on the device: the
number of images alive stays in device memory (each kernel reads it), the layer reads its images through a list of
slots and writes its outputs compactly (Hidayetoglu's way: no activations are moved to compact), and a one-block
kernel scans the alive flags into the next list. Every launch has a fixed shape, so a chunk's layers are captured
once in a CUDA graph (:class:`EllLoop`) and replayed for each chunk of the same size.

Not the default: ``run_layers_gpu`` uses it only when asked (``loop="ell"``, or ``DASKNN_GPU_LOOP=ell`` in the
environment) until a device run measures it against today's loop (benchmarks/bench_gpu_kernels.py, section 4).
Nothing here imports CuPy at module level; the source below is compiled by NVRTC on first use.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .ell import ELL_SHARED_BYTES, ELL_THREADS, EllLayer, buffer_inputs_for, ell_layer
from .nvrtc import CUDA_ARITHMETIC, compiled_kernel

#: Images a thread by dtype itemsize: the kernels compiled (a multiple of the vector load: 4 float32, 2 float64).
ELL_MINIBATCHES = {4: (4, 8, 12, 16), 8: (4, 8)}
#: The minibatch used unless one is asked for: Hidayetoglu's 12 float32; 8 float64 (the same shared bytes).
ELL_DEFAULT_MINIBATCH = {4: 12, 8: 8}
#: Threads a block the layer kernels are compiled for. Each one's launch bound asks for the registers of
#: :data:`ELL_THREADS_PER_SM` threads a multiprocessor: at most 64 registers a thread, none spilled on sm_90.
ELL_BLOCK_THREADS = (256, 512, 1024)
#: Threads a multiprocessor every layer kernel's launch bound asks registers for.
ELL_THREADS_PER_SM = 1024
#: Threads of the one-block compaction kernel.
ELL_COMPACT_THREADS = 1024
#: The layer kernel's grid along the images (minibatch groups; blocks loop over the rest).
ELL_MAX_GRID_Y = 65535

#: CUDA source of the ELL loop, compiled after :data:`~dasknn.kernels.nvrtc.CUDA_ARITHMETIC` (today's kernels'
#: ``madd`` and ``rule``). Kept as text so the CPU tests compile it (ptxas, sm_90) and read its index expressions.
ELL_CUDA_SOURCE = r"""
// ---- issue 44: a chunk's loop without a host round trip per layer ----------------------------------------------
// What the leaders do per layer (their sources read before this was written):
// - Hidayetoglu et al. 2020 (merthidayetoglu/SpDNN_Challenge2020, balanced/kernels.cu, dummy_kernel): a block of
//   256 threads, one output neuron a thread, MINIBATCH = 12 images a block (grid.y); the block's input footprint
//   staged a buffer at a time in shared memory (map[] of input ids, image-major), each warp's rows as ELL slots
//   padded to the warp's longest, lane-interleaved (coalesced), index uint16 into the buffer; a weight loaded once
//   and used for the 12 images; bias, ReLU, clamp and the alive count (atomicAdd) fused. Then the host copies
//   active[] back, compacts the image list (categories[]) and copies it in: a host round trip every layer, but
//   no activations move (images are read through the list and written compactly).
// - XY-2021 (CGCL-codes/Graphchallenge21, src/microbenchmark/all_network.cu): RadiX-Net specific. The first
//   layers image-major, 8 images a block, each output's 32 inputs two runs of 16 staged in shared memory
//   (n16384_l2_l11_kernel); later layers transposed batch-contiguous, a block computing 16 outputs that share
//   one list of 32 inputs as a 16 x 32 dense product (weights in shared memory, one image a thread, 16 sums a
//   thread, n16384_l11_kernel); dead images dropped by a transpose-and-delete kernel over a host-built
//   old_to_new map; the host reads active[] every layer.
// - SNICIT (IDEA-CUHK/SNICIT, src/SDGC/SNICIT/kernel.hpp): XY's kernels up to a threshold layer, then centroids
//   sampled and chosen on the device (reduction, centroid_sel), each image recast as a centroid plus a sparse
//   residual (coarse_cluster), residual layers (post_spMM, post_minus) whose residuals die out; the host still
//   synchronises every layer.
// Here: Hidayetoglu's layout and minibatch a thread on dasknn's neuron-major activations (row i of an
// n x cap array), the count of alive images kept on the device, the list compacted on the device by one block,
// so a chunk's layers are launches of fixed shape that one CUDA graph replays. Sums keep the CSC entry order and
// separately rounded multiply and add: results equal today's kernel's bit for bit.

template <typename T> struct Vec;
template <> struct Vec<float> { typedef float4 type; static const int width = 4; };
template <> struct Vec<double> { typedef double2 type; static const int width = 2; };

__device__ __forceinline__ void madd_vec(float* acc, float4 y, float w) {
    acc[0] = madd(acc[0], y.x, w); acc[1] = madd(acc[1], y.y, w);
    acc[2] = madd(acc[2], y.z, w); acc[3] = madd(acc[3], y.w, w);
}
__device__ __forceinline__ void madd_vec(double* acc, double2 y, double w) {
    acc[0] = madd(acc[0], y.x, w); acc[1] = madd(acc[1], y.y, w);
}

// act: n_in x cap activations (row i at act + i * cap); output slot s < *count reads column src[s] of act and is
// written to column s of out (n_out x cap); alive[s] is set to 1 where the slot's outputs are not all zero (the
// compaction clears it). Block x computes outputs x * blockDim.x + threadIdx.x for the minibatches y, y +
// gridDim.y, ...; buffer g of block x stages inputs map[map_ptr[g]:map_ptr[g + 1]] of the minibatch's images as
// sh[n * MB + f]; warp w's slots of buffer g are warp_ptr[g * warps + w] .. warp_ptr[g * warps + w + 1] - 1.
template <typename T, int MB>
__device__ void ell_step(const T* __restrict__ act, const int* __restrict__ src, const int* __restrict__ count,
                         const long long* __restrict__ block_buffers, const long long* __restrict__ map_ptr,
                         const int* __restrict__ map, const long long* __restrict__ warp_ptr,
                         const unsigned short* __restrict__ index, const T* __restrict__ value, T bias, T ymax,
                         T* __restrict__ out, int* __restrict__ alive, int n_out, long long cap) {
    typedef typename Vec<T>::type V;
    extern __shared__ __align__(16) unsigned char smem[];
    T* sh = reinterpret_cast<T*>(smem);
    __shared__ int mb_alive[MB];
    const int nb = *count;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
    const int j = blockIdx.x * blockDim.x + threadIdx.x;
    const long long g_first = block_buffers[blockIdx.x], g_last = block_buffers[blockIdx.x + 1];
    for (int s0 = blockIdx.y * MB; s0 < nb; s0 += gridDim.y * MB) {
        T acc[MB];
#pragma unroll
        for (int f = 0; f < MB; ++f) acc[f] = T(0);
        if (threadIdx.x < MB) mb_alive[threadIdx.x] = 0;
        __syncthreads();
        for (long long g = g_first; g < g_last; ++g) {
            const long long m0 = map_ptr[g];
            const int size = (int)(map_ptr[g + 1] - m0) * MB;
            for (int i = threadIdx.x; i < size; i += blockDim.x) {
                const int n = i / MB, f = i % MB;
                sh[i] = s0 + f < nb ? act[(long long)__ldg(map + m0 + n) * cap + __ldg(src + s0 + f)] : T(0);
            }
            __syncthreads();
            const long long end = warp_ptr[g * warps + warp + 1];
            for (long long m = warp_ptr[g * warps + warp]; m < end; ++m) {
                const int at = __ldg(index + m * 32 + lane);
                const T w = __ldg(value + m * 32 + lane);
                const V* y = reinterpret_cast<const V*>(sh + at * MB);
#pragma unroll
                for (int v = 0; v < MB / Vec<T>::width; ++v) madd_vec(acc + v * Vec<T>::width, y[v], w);
            }
            __syncthreads();  // the next buffer overwrites the shared inputs
        }
        if (j < n_out) {
#pragma unroll
            for (int f = 0; f < MB; ++f) {
                if (s0 + f < nb) {
                    const T v = rule(acc[f], bias, ymax);
                    out[(long long)j * cap + s0 + f] = v;
                    if (v != T(0)) mb_alive[f] = 1;
                }
            }
        }
        __syncthreads();
        if (threadIdx.x < MB && s0 + threadIdx.x < nb && mb_alive[threadIdx.x]) alive[s0 + threadIdx.x] = 1;
    }
}

#define DASKNN_ELL_KERNEL(NAME, T, MB, THREADS)                                                               \
    extern "C" __global__ void __launch_bounds__(THREADS, ELL_THREADS_PER_SM / THREADS)                       \
    NAME(const T* act, const int* src, const int* count, const long long* block_buffers,                     \
         const long long* map_ptr, const int* map, const long long* warp_ptr, const unsigned short* index,     \
         const T* value, T bias, T ymax, T* out, int* alive, int n_out, long long cap) {                       \
        ell_step<T, MB>(act, src, count, block_buffers, map_ptr, map, warp_ptr, index, value, bias, ymax, out, \
                        alive, n_out, cap);                                                                    \
    }
// (the kernels, DASKNN_ELL_KERNEL(name, type, minibatch, threads), are listed by ell_cuda_code)

// After a layer: ids_out[s] = ids_in[src_in[s]] for s < *count_in (the image each output slot holds); src_out
// lists the slots s with alive[s] set, ascending (the CPU loop's order of survivors), *count_out their number;
// alive is cleared for the next layer. One block walks the slots a tile of blockDim.x at a time: a ballot and
// the warps' counts place each survivor.
extern "C" __global__ void __launch_bounds__(ELL_COMPACT_THREADS, 1)
dasknn_ell_compact(int* __restrict__ alive, const int* __restrict__ count_in, const int* __restrict__ src_in,
                   const long long* __restrict__ ids_in, int* __restrict__ src_out, long long* __restrict__ ids_out,
                   int* __restrict__ count_out) {
    __shared__ int warp_count[32];
    const int n = *count_in;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
    for (int s = threadIdx.x; s < n; s += blockDim.x) ids_out[s] = ids_in[src_in[s]];
    int base = 0;
    for (int t0 = 0; t0 < n; t0 += blockDim.x) {
        const int s = t0 + threadIdx.x;
        const int mine = s < n && alive[s] != 0;
        if (s < n) alive[s] = 0;
        const unsigned ballot = __ballot_sync(0xffffffffu, mine);
        if (lane == 0) warp_count[warp] = __popc(ballot);
        __syncthreads();
        int before = base, total = base;
        for (int w = 0; w < warps; ++w) {
            before += w < warp ? warp_count[w] : 0;
            total += warp_count[w];
        }
        if (mine) src_out[before + __popc(ballot & ((1u << lane) - 1u))] = s;
        base = total;
        __syncthreads();  // the next tile rewrites the warps' counts
    }
    if (threadIdx.x == 0) *count_out = base;
}
"""

_SUFFIX = {4: "f32", 8: "f64"}
_TYPE = {4: "float", 8: "double"}
#: Every layer kernel of :func:`ell_cuda_code`, with its itemsize, minibatch and threads a block.
ELL_LAYER_KERNELS = {f"dasknn_ell_{_SUFFIX[size]}_mb{mb}_t{threads}": (size, mb, threads)
                     for size, mbs in ELL_MINIBATCHES.items() for mb in mbs for threads in ELL_BLOCK_THREADS}
#: Every kernel a launch may name.
ELL_KERNELS = (*ELL_LAYER_KERNELS, "dasknn_ell_compact")


def ell_cuda_code() -> str:
    """The ELL loop's translation unit: its constants, the shared arithmetic, its source, its layer kernels."""
    kernels = "".join(f"DASKNN_ELL_KERNEL({name}, {_TYPE[size]}, {mb}, {threads})\n"
                      for name, (size, mb, threads) in ELL_LAYER_KERNELS.items())
    return (f"#define ELL_THREADS_PER_SM {ELL_THREADS_PER_SM}\n#define ELL_COMPACT_THREADS {ELL_COMPACT_THREADS}\n"
            + CUDA_ARITHMETIC + ELL_CUDA_SOURCE + kernels)


def ell_kernel_name(itemsize: int, minibatch: int, threads: int = ELL_THREADS) -> str:
    """The layer kernel for ``itemsize``-byte activations, ``minibatch`` images a thread, ``threads`` a block."""
    name = f"dasknn_ell_{_SUFFIX.get(itemsize, '?')}_mb{minibatch}_t{threads}"
    if name not in ELL_LAYER_KERNELS:
        raise ValueError(f"the ELL kernels run {itemsize}-byte activations {ELL_MINIBATCHES.get(itemsize, ())} "
                         f"images a thread in blocks of {ELL_BLOCK_THREADS} threads, not {minibatch} in {threads}")
    return name


@dataclass(frozen=True)
class EllLaunch:
    """How one ELL layer is launched: kernel, grid (output blocks, minibatch groups), threads, shared bytes."""

    kernel: str
    grid: tuple[int, int]
    block: int
    shared_bytes: int


def ell_launch(layer: EllLayer, capacity: int, itemsize: int, minibatch: int,
               max_grid: int = ELL_MAX_GRID_Y) -> EllLaunch:
    """The launch of ``layer`` for at most ``capacity`` images: sized for the capacity, whatever the count alive
    (blocks past it exit at once), so one shape serves every chunk a graph replays. Pure arithmetic."""
    largest = int(np.diff(layer.map_ptr).max()) if layer.map_ptr.size > 1 else 1
    groups = max(1, -(-capacity // minibatch))
    return EllLaunch(ell_kernel_name(itemsize, minibatch, layer.threads), (layer.blocks, min(groups, max_grid)),
                     layer.threads, max(1, largest) * minibatch * itemsize)


def ell_layers(layers: Sequence[tuple], n_in: int, dtype, minibatch: int, shared_bytes: int = ELL_SHARED_BYTES,
               threads: int = ELL_THREADS) -> list[EllLayer]:
    """Host CSC layers (``indptr, indices, data``; NumPy or CuPy) in sliced ELL for ``minibatch`` images a thread
    and blocks of ``threads`` outputs; layer ``k``'s inputs are layer ``k - 1``'s outputs."""
    dtype = np.dtype(dtype)
    buffer = buffer_inputs_for(minibatch, dtype.itemsize, shared_bytes)
    out = []
    for indptr, indices, data in layers:
        host = [a.get() if hasattr(a, "get") else np.asarray(a) for a in (indptr, indices, data)]
        out.append(ell_layer(*host, n_in=n_in, buffer_inputs=buffer, dtype=dtype, threads=threads))
        n_in = out[-1].n_out
    return out


_MODULES: dict[int, Any] = {}  # device id -> the compiled ELL source
_KERNELS: dict[tuple[int, str], tuple[Any, int]] = {}  # (device id, kernel name) -> (kernel, dynamic shared limit)


def ell_kernel(name: str) -> tuple[Any, int]:  # pragma: no cover - needs a GPU
    """The ELL kernel ``name`` on the current device, and the dynamic shared memory it may ask for."""
    return compiled_kernel(name, ell_cuda_code, _MODULES, _KERNELS)


def device_layout(layer: EllLayer, dtype) -> tuple:  # pragma: no cover - needs a GPU
    """``layer``'s arrays on the device as the layer kernel takes them, and its outputs."""
    import cupy

    return (cupy.asarray(layer.block_buffers), cupy.asarray(layer.map_ptr), cupy.asarray(layer.map),
            cupy.asarray(layer.warp_ptr), cupy.asarray(layer.index), cupy.asarray(layer.value, dtype=dtype),
            layer.n_out)


class EllLoop:  # pragma: no cover - needs a GPU
    """A chunk's whole loop on the device for up to ``capacity`` images: ELL layers resident, buffers of fixed
    address, and (``graph=True``) the layers' launches captured once in a CUDA graph.

    :meth:`run` copies a chunk in, replays the layers, reads back the survivors' count (the one synchronisation)
    and returns ``(yt, ids)`` as :func:`dasknn.kernels.run_layers` does; ``counts`` then holds the images alive
    into each layer (NumPy), as :func:`dasknn.kernels.ell.ell_loop_numpy` models them.
    """

    def __init__(self, layers: Sequence[EllLayer], capacity: int, dtype, bias: float, ymax: float,
                 minibatch: int, graph: bool = True, device: Sequence[tuple] | None = None):
        import cupy

        self.dtype = np.dtype(dtype)
        self.capacity, self.minibatch, self.graph_wanted = int(capacity), int(minibatch), graph
        self.bias, self.ymax = self.dtype.type(bias), self.dtype.type(ymax)
        self.layers = list(device) if device is not None else [device_layout(x, self.dtype) for x in layers]
        self.lock = threading.Lock()  # one chunk at a time: the buffers and the graph are the loop's own
        self.launches = [ell_launch(layer, capacity, self.dtype.itemsize, minibatch) for layer in layers]
        for launch in self.launches:
            limit = ell_kernel(launch.kernel)[1]
            if launch.shared_bytes > limit:
                raise ValueError(f"{launch.kernel} needs {launch.shared_bytes} bytes of shared memory; {limit} allowed")
        width = max([layers[0].n_in] + [layer.n_out for layer in layers])
        self.act = [cupy.zeros((width, capacity), dtype=self.dtype) for _ in range(2)]
        self.act_in = cupy.zeros((layers[0].n_in, capacity), dtype=self.dtype)
        self.src = [cupy.arange(capacity, dtype=cupy.int32), cupy.zeros(capacity, dtype=cupy.int32)]
        self.first_src = self.src[0].copy()
        self.ids = [cupy.zeros(capacity, dtype=cupy.int64) for _ in range(2)]
        self.alive = cupy.zeros(capacity, dtype=cupy.int32)
        self.counts_d = cupy.zeros(len(layers) + 1, dtype=cupy.int32)
        self.compact = ell_kernel("dasknn_ell_compact")[0]
        self.stream = cupy.cuda.Stream(non_blocking=True)
        self.graph = None
        self.warm = False  # the first run launches without capture: every kernel is loaded before one
        self.counts: np.ndarray | None = None

    def _launch_layers(self) -> None:
        """Every layer's launch and compaction, on the current stream (recorded once when capturing)."""
        act = self.act_in
        for k, (layer, launch) in enumerate(zip(self.layers, self.launches)):
            block_buffers, map_ptr, in_map, warp_ptr, index, value, n_out = layer
            src, out = self.src[k % 2], self.act[k % 2]
            count = self.counts_d[k:]
            ell_kernel(launch.kernel)[0](
                launch.grid, (launch.block,),
                (act, src, count, block_buffers, map_ptr, in_map, warp_ptr, index, value, self.bias, self.ymax,
                 out, self.alive, np.int32(n_out), np.int64(self.capacity)),
                shared_mem=launch.shared_bytes)
            self.compact((1,), (ELL_COMPACT_THREADS,),
                 (self.alive, count, src, self.ids[k % 2], self.src[(k + 1) % 2], self.ids[(k + 1) % 2],
                  self.counts_d[k + 1:]))
            act = out

    def run(self, yt, ids: np.ndarray, timings: dict | None = None):
        """The chunk ``yt`` (``inputs x images``, at most ``capacity`` images) through every layer; with
        ``timings``, the layers' device seconds (CUDA events around their launches or graph) go in ``"layers"``."""
        import cupy

        n_in, nb = yt.shape
        if nb > self.capacity or yt.dtype != self.dtype or n_in != self.act_in.shape[0]:
            raise ValueError(f"the loop holds {self.capacity} {self.dtype} images of {self.act_in.shape[0]} inputs, "
                             f"not {nb} {yt.dtype} of {n_in}")
        # the loop's stream does not wait for the default one by itself: it waits for whatever made yt
        self.stream.wait_event(cupy.cuda.get_current_stream().record())
        with self.lock, self.stream:
            self.act_in[:, :nb] = yt
            self.ids[0][:nb] = cupy.asarray(ids)
            self.src[0][...] = self.first_src
            self.counts_d[0:1] = nb
            if self.graph is None and self.graph_wanted and self.warm:
                self.stream.begin_capture()
                self._launch_layers()
                self.graph = self.stream.end_capture()
            start, stop = cupy.cuda.Event(), cupy.cuda.Event()
            start.record(self.stream)
            if self.graph is not None:
                self.graph.launch(self.stream)
            else:
                self._launch_layers()
                self.warm = True
            stop.record(self.stream)
            self.counts = cupy.asnumpy(self.counts_d, stream=self.stream)  # waits for the layers
            last = len(self.layers)
            keep = self.src[last % 2][: int(self.counts[-1])]
            out = cupy.ascontiguousarray(self.act[(last - 1) % 2][: self.layers[-1][-1]][:, keep])
            kept_ids = cupy.asnumpy(self.ids[last % 2][keep], stream=self.stream)
            self.stream.synchronize()  # (the buffers are free for the next chunk)
        if timings is not None:
            timings["layers"] = cupy.cuda.get_elapsed_time(start, stop) / 1e3
        return out, kept_ids


#: ELL loops kept between chunks, the least recently used dropped past this many (with folding on, a chunk runs
#: its layers in several runs between looks, each a loop of its own).
ELL_KEPT_LOOPS = 16
#: Layers' ELL forms kept (host and device), the least recently used dropped past this many: two 120-layer
#: networks' worth; layers streamed anew every chunk would otherwise pile up.
ELL_KEPT_LAYOUTS = 256
#: (device id, id(data), n_in, dtype, minibatch) -> (data, its ELL form, that on the device)
_LAYOUTS: dict[tuple, tuple[Any, EllLayer, tuple]] = {}
#: (device id, the layers' data ids, inputs, dtype, minibatch, graph, bias, ymax) -> (layers, loop)
_LOOPS: dict[tuple, tuple[list, EllLoop]] = {}


def kept_layouts(layers: Sequence[tuple], n_in: int, dtype: np.dtype,
                 minibatch: int) -> tuple[list[EllLayer], list[tuple]]:  # pragma: no cover - needs a GPU
    """Each layer's ELL form and its device copy, built once per layer (by its weights array, kept alive with
    them so that its id is not reused) whichever runs of layers and chunk sizes ask for it."""
    import cupy

    host, device, dev = [], [], cupy.cuda.Device().id
    for indptr, indices, data in layers:
        key = (dev, id(data), n_in, dtype.str, minibatch)
        kept = _LAYOUTS.pop(key, None)
        if kept is None:
            layout = ell_layers([(indptr, indices, data)], n_in, dtype, minibatch)[0]
            kept = (data, layout, device_layout(layout, dtype))
        _LAYOUTS[key] = kept  # the most recently used last
        host.append(kept[1])
        device.append(kept[2])
        n_in = kept[1].n_out
    while len(_LAYOUTS) > ELL_KEPT_LAYOUTS:
        _LAYOUTS.pop(next(iter(_LAYOUTS)))
    return host, device


def run_layers_ell(yt, layers, bias: float, ymax: float, ids: np.ndarray,
                   minibatch: int | None = None, graph: bool = True):  # pragma: no cover - needs a GPU
    """:func:`dasknn.kernels.gpu.run_layers_gpu`'s result by the ELL loop. The layers' ELL forms are built once
    (:func:`kept_layouts`); a loop (its buffers, its graph) once per run of layers, and reused by every later chunk
    of those layers that it holds (a smaller one included)."""
    layers = list(layers)
    if yt.shape[1] == 0 or not layers:
        return yt, np.asarray(ids)
    dtype = np.dtype(yt.dtype)
    mb = ELL_DEFAULT_MINIBATCH[dtype.itemsize] if minibatch is None else minibatch
    import cupy

    key = (cupy.cuda.Device().id, tuple(id(layer[2]) for layer in layers), yt.shape[0], dtype.str, mb, graph,
           float(bias), float(ymax))
    kept = _LOOPS.pop(key, None)
    if kept is None or kept[1].capacity < yt.shape[1]:
        kept = None  # a larger chunk than the loop holds: its buffers are let go before new ones are made
        host, device = kept_layouts(layers, yt.shape[0], dtype, mb)
        # the layers are held with the loop so that their ids, the key, are not reused by other arrays
        kept = (layers, EllLoop(host, yt.shape[1], dtype, bias, ymax, mb, graph, device))
    _LOOPS[key] = kept  # the most recently used last
    while len(_LOOPS) > ELL_KEPT_LOOPS:
        _LOOPS.pop(next(iter(_LOOPS)))
    return kept[1].run(yt, ids)


def release_ell_loops() -> None:
    """Free every kept ELL loop (its layers, buffers and graph) and layout."""
    _LOOPS.clear()
    _LAYOUTS.clear()
