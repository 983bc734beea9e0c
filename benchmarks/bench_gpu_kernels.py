"""Where the GPU loop's time goes, and candidate layer kernels and loops side by side (issues 30 and 44).

Usage (on a machine with a CUDA device, from the repository root)::

    python benchmarks/bench_gpu_kernels.py --data .gpu-data [--images 60000] [--repeats 20] [--sections ...]
    python benchmarks/bench_gpu_kernels.py --data .gpu-data --profile [layers|ell]   # under ncu, see BENCHMARKS.md
    python benchmarks/bench_gpu_kernels.py --data .gpu-data --dry-run                # no device: the rehearsal

1. The loop's breakdown (``breakdown``): the whole :func:`dasknn.kernels.run_layers_gpu` loop against the sum of its kernels'
   times and its compactions' (CUDA events around each), on the real n1024-l120 network.
2. Candidate staged kernels, each launched on the real activations that reach chosen layers (as many images as
   are alive there), timed alone (median of ``--repeats`` launches) and checked bit for bit against the current
   kernel; the rate counts the images actually run (not the challenge's nominal count).
3. The whole loop with each candidate (its nominal TeraEdges/s, as bench_gpu.py reports).
4. (``ell``) Issue 44's ELL loop (sliced ELL, a minibatch of images a thread, compaction on the device, one CUDA
   graph) against today's loop on the real network, each minibatch, float32 and float64, checked bit for bit
   (benchmarks/bench_gpu_ell.py).
5. (``generated``) The same on generated N x 120 networks (``--generated 4096,16384,65536 --gen-images 60000``).

``--dry-run`` runs what needs no device: the ELL layouts built, the NumPy model of the ELL loop checked against
the CPU loop on ``--dry-images`` images, the source compiled for sm_90 (nvcc, ptxas). Arguments are checked first,
before any device time is spent.

The candidates keep the kernels' arithmetic (each output summed in entry order, separately rounded multiply and
add), so a faster one can replace the current one without changing a result.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import traceback
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

#: Candidate staged kernels, compiled in the same unit as the current ones (they share ``madd``, ``rule`` and
#: ``input_row``). ``R`` rows per warp in flight at once (independent sums: instruction-level parallelism),
#: 32-bit index arithmetic, the tile copied a row per warp (one 128-byte load, no division).
CANDIDATES = r"""
template <typename T, int R>
__device__ void step_staged_rows(const T* __restrict__ yt, const T* __restrict__ extra, long long split,
                                 const long long* __restrict__ indptr, const int* __restrict__ indices,
                                 const T* __restrict__ data, T bias, T ymax, T* __restrict__ out,
                                 int* __restrict__ alive, long long n_in, long long n_out, long long nb) {
    extern __shared__ __align__(16) unsigned char smem[];
    T* sh = reinterpret_cast<T*>(smem);
    __shared__ int tile_alive[TILE];
    const int lane = threadIdx.x, warp = threadIdx.y, nwarps = blockDim.y;
    const int nin = (int)n_in, nout = (int)n_out;
    for (long long tile = blockIdx.x; tile * TILE < nb; tile += gridDim.x) {
        const long long b0 = tile * TILE;
        const bool in = b0 + lane < nb;
        for (int r = warp; r < nin; r += nwarps)
            sh[r * TILE + lane] = in ? input_row(yt, extra, split, (long long)r, nb)[b0 + lane] : T(0);
        if (warp == 0) tile_alive[lane] = 0;
        __syncthreads();
        int mine = 0;
        for (int j0 = warp * R; j0 < nout; j0 += nwarps * R) {
            const int* ip[R];
            const T* dp[R];
            int len[R];
            T acc[R];
            int most = 0;
#pragma unroll
            for (int r = 0; r < R; ++r) {
                const int j = j0 + r < nout ? j0 + r : nout - 1;
                const long long p = indptr[j];
                ip[r] = indices + p;
                dp[r] = data + p;
                len[r] = j0 + r < nout ? (int)(indptr[j + 1] - p) : 0;
                acc[r] = T(0);
                most = len[r] > most ? len[r] : most;
            }
            for (int q = 0; q < most; ++q) {
#pragma unroll
                for (int r = 0; r < R; ++r)
                    if (q < len[r]) acc[r] = madd(acc[r], sh[__ldg(ip[r] + q) * TILE + lane], __ldg(dp[r] + q));
            }
#pragma unroll
            for (int r = 0; r < R; ++r) {
                if (j0 + r < nout && in) {
                    const T v = rule(acc[r], bias, ymax);
                    out[(long long)(j0 + r) * nb + b0 + lane] = v;
                    mine |= v != T(0);
                }
            }
        }
        if (mine) tile_alive[lane] = 1;
        __syncthreads();
        if (warp == 0 && in && tile_alive[lane]) alive[b0 + lane] = 1;
        __syncthreads();
    }
}
#define CANDIDATE(NAME, T, R, THREADS)                                                                       \
    extern "C" __global__ void __launch_bounds__(THREADS, 1)                                                \
    NAME(const T* yt, const T* extra, long long split, const long long* indptr, const int* indices,         \
         const T* data, T bias, T ymax, T* out, int* alive, long long n_in, long long n_out, long long nb) {   \
        step_staged_rows<T, R>(yt, extra, split, indptr, indices, data, bias, ymax, out, alive, n_in, n_out, nb); \
    }
CANDIDATE(rows1_w32, float, 1, 1024)
CANDIDATE(rows2_w32, float, 2, 1024)
CANDIDATE(rows4_w32, float, 4, 1024)
CANDIDATE(rows2_w16, float, 2, 512)
CANDIDATE(rows4_w16, float, 4, 512)

// half-warp tiles: 16 images a tile (a third of the shared memory, so up to three blocks share a multiprocessor
// and one block's copy overlaps another's sums); lanes 0-15 and 16-31 work on different rows
template <typename T, int R>
__device__ void step_staged_half(const T* __restrict__ yt, const T* __restrict__ extra, long long split,
                                 const long long* __restrict__ indptr, const int* __restrict__ indices,
                                 const T* __restrict__ data, T bias, T ymax, T* __restrict__ out,
                                 int* __restrict__ alive, long long n_in, long long n_out, long long nb) {
    extern __shared__ __align__(16) unsigned char smem[];
    T* sh = reinterpret_cast<T*>(smem);
    __shared__ int tile_alive[16];
    const int c = threadIdx.x & 15, half = threadIdx.x >> 4;
    const int group = 2 * threadIdx.y + half, groups = 2 * blockDim.y;
    const int nin = (int)n_in, nout = (int)n_out;
    for (long long tile = blockIdx.x; tile * 16 < nb; tile += gridDim.x) {
        const long long b0 = tile * 16;
        const bool in = b0 + c < nb;
        for (int r = group; r < nin; r += groups)
            sh[r * 16 + c] = in ? input_row(yt, extra, split, (long long)r, nb)[b0 + c] : T(0);
        if (group == 0) tile_alive[c] = 0;
        __syncthreads();
        int mine = 0;
        for (int j0 = group * R; j0 < nout; j0 += groups * R) {
            const int* ip[R];
            const T* dp[R];
            int len[R];
            T acc[R];
            int most = 0;
#pragma unroll
            for (int r = 0; r < R; ++r) {
                const int j = j0 + r < nout ? j0 + r : nout - 1;
                const long long p = indptr[j];
                ip[r] = indices + p;
                dp[r] = data + p;
                len[r] = j0 + r < nout ? (int)(indptr[j + 1] - p) : 0;
                acc[r] = T(0);
                most = len[r] > most ? len[r] : most;
            }
            for (int q = 0; q < most; ++q) {
#pragma unroll
                for (int r = 0; r < R; ++r)
                    if (q < len[r]) acc[r] = madd(acc[r], sh[__ldg(ip[r] + q) * 16 + c], __ldg(dp[r] + q));
            }
#pragma unroll
            for (int r = 0; r < R; ++r) {
                if (j0 + r < nout && in) {
                    const T v = rule(acc[r], bias, ymax);
                    out[(long long)(j0 + r) * nb + b0 + c] = v;
                    mine |= v != T(0);
                }
            }
        }
        if (mine) tile_alive[c] = 1;
        __syncthreads();
        if (group == 0 && in && tile_alive[c]) alive[b0 + c] = 1;
        __syncthreads();
    }
}
#define CANDIDATE_HALF(NAME, T, R, THREADS, BLOCKS)                                                          \
    extern "C" __global__ void __launch_bounds__(THREADS, BLOCKS)                                           \
    NAME(const T* yt, const T* extra, long long split, const long long* indptr, const int* indices,         \
         const T* data, T bias, T ymax, T* out, int* alive, long long n_in, long long n_out, long long nb) {   \
        step_staged_half<T, R>(yt, extra, split, indptr, indices, data, bias, ymax, out, alive, n_in, n_out, nb); \
    }
CANDIDATE_HALF(half1_w16, float, 1, 512, 3)
CANDIDATE_HALF(half2_w16, float, 2, 512, 3)
CANDIDATE_HALF(half2_w8, float, 2, 256, 6)

// a row's entries loaded by the warp together (lane l holds entry l of each 32), then handed round by shuffles:
// the shared-memory load no longer waits for a load of its index from global memory
template <typename T, int R>
__device__ void step_staged_shfl(const T* __restrict__ yt, const T* __restrict__ extra, long long split,
                                 const long long* __restrict__ indptr, const int* __restrict__ indices,
                                 const T* __restrict__ data, T bias, T ymax, T* __restrict__ out,
                                 int* __restrict__ alive, long long n_in, long long n_out, long long nb) {
    extern __shared__ __align__(16) unsigned char smem[];
    T* sh = reinterpret_cast<T*>(smem);
    __shared__ int tile_alive[TILE];
    const unsigned FULL = 0xffffffffu;
    const int lane = threadIdx.x, warp = threadIdx.y, nwarps = blockDim.y;
    const int nin = (int)n_in, nout = (int)n_out;
    for (long long tile = blockIdx.x; tile * TILE < nb; tile += gridDim.x) {
        const long long b0 = tile * TILE;
        const bool in = b0 + lane < nb;
        for (int r = warp; r < nin; r += nwarps)
            sh[r * TILE + lane] = in ? input_row(yt, extra, split, (long long)r, nb)[b0 + lane] : T(0);
        if (warp == 0) tile_alive[lane] = 0;
        __syncthreads();
        int mine = 0;
        for (int j0 = warp * R; j0 < nout; j0 += nwarps * R) {
            long long p[R];
            int len[R];
            T acc[R];
            int most = 0;
#pragma unroll
            for (int r = 0; r < R; ++r) {
                const int j = j0 + r < nout ? j0 + r : nout - 1;
                p[r] = indptr[j];
                len[r] = j0 + r < nout ? (int)(indptr[j + 1] - p[r]) : 0;
                acc[r] = T(0);
                most = len[r] > most ? len[r] : most;
            }
            for (int c = 0; c < most; c += 32) {
                int at[R];
                T w[R];
#pragma unroll
                for (int r = 0; r < R; ++r) {
                    const bool has = c + lane < len[r];
                    at[r] = has ? __ldg(indices + p[r] + c + lane) * TILE : 0;
                    w[r] = has ? __ldg(data + p[r] + c + lane) : T(0);
                }
                const int n = most - c < 32 ? most - c : 32;
                if (n == 32) {
#pragma unroll
                    for (int q = 0; q < 32; ++q) {
#pragma unroll
                        for (int r = 0; r < R; ++r)
                            if (c + q < len[r])
                                acc[r] = madd(acc[r], sh[__shfl_sync(FULL, at[r], q) + lane], __shfl_sync(FULL, w[r], q));
                    }
                } else {
                    for (int q = 0; q < n; ++q) {
#pragma unroll
                        for (int r = 0; r < R; ++r)
                            if (c + q < len[r])
                                acc[r] = madd(acc[r], sh[__shfl_sync(FULL, at[r], q) + lane], __shfl_sync(FULL, w[r], q));
                    }
                }
            }
#pragma unroll
            for (int r = 0; r < R; ++r) {
                if (j0 + r < nout && in) {
                    const T v = rule(acc[r], bias, ymax);
                    out[(long long)(j0 + r) * nb + b0 + lane] = v;
                    mine |= v != T(0);
                }
            }
        }
        if (mine) tile_alive[lane] = 1;
        __syncthreads();
        if (warp == 0 && in && tile_alive[lane]) alive[b0 + lane] = 1;
        __syncthreads();
    }
}
#define CANDIDATE_SHFL(NAME, T, R, THREADS)                                                                  \
    extern "C" __global__ void __launch_bounds__(THREADS, 1)                                                \
    NAME(const T* yt, const T* extra, long long split, const long long* indptr, const int* indices,         \
         const T* data, T bias, T ymax, T* out, int* alive, long long n_in, long long n_out, long long nb) {   \
        step_staged_shfl<T, R>(yt, extra, split, indptr, indices, data, bias, ymax, out, alive, n_in, n_out, nb); \
    }
CANDIDATE_SHFL(shfl1_w32, float, 1, 1024)
CANDIDATE_SHFL(shfl2_w32, float, 2, 1024)
CANDIDATE_SHFL(shfl1_w16, float, 1, 512)
CANDIDATE_SHFL(shfl2_w16, float, 2, 512)

// the current kernel with the row's entries read four at a time (one 16-byte load of indices, one of weights):
// the uniform loads, not the sums, fill the load/store pipe (three of its operations an entry before)
template <typename T, int U>
__device__ void step_staged_vec(const T* __restrict__ yt, const T* __restrict__ extra, long long split,
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
                long long p = indptr[j];
                const long long end = indptr[j + 1];
                for (; p < end && (p & 3); ++p)
                    acc = madd(acc, sh[__ldg(indices + p) * TILE + lane], __ldg(data + p));
#pragma unroll U
                for (; p + 4 <= end; p += 4) {
                    const int4 at = __ldg(reinterpret_cast<const int4*>(indices + p));
                    const float4 w = __ldg(reinterpret_cast<const float4*>(data + p));
                    acc = madd(acc, sh[at.x * TILE + lane], w.x);
                    acc = madd(acc, sh[at.y * TILE + lane], w.y);
                    acc = madd(acc, sh[at.z * TILE + lane], w.z);
                    acc = madd(acc, sh[at.w * TILE + lane], w.w);
                }
                for (; p < end; ++p)
                    acc = madd(acc, sh[__ldg(indices + p) * TILE + lane], __ldg(data + p));
                const T v = rule(acc, bias, ymax);
                out[j * nb + b] = v;
                mine |= v != T(0);
            }
        }
        if (mine) tile_alive[lane] = 1;
        __syncthreads();
        if (threadIdx.y == 0 && b < nb && tile_alive[lane]) alive[b] = 1;
        __syncthreads();
    }
}
#define CANDIDATE_VEC(NAME, U, THREADS)                                                                      \
    extern "C" __global__ void __launch_bounds__(THREADS, 1)                                                \
    NAME(const float* yt, const float* extra, long long split, const long long* indptr, const int* indices, \
         const float* data, float bias, float ymax, float* out, int* alive, long long n_in, long long n_out,   \
         long long nb) {                                                                                      \
        step_staged_vec<float, U>(yt, extra, split, indptr, indices, data, bias, ymax, out, alive, n_in, n_out, nb); \
    }
CANDIDATE_VEC(vec_u1_w32, 1, 1024)
CANDIDATE_VEC(vec_u2_w32, 2, 1024)
CANDIDATE_VEC(vec_u2_w16, 2, 512)
CANDIDATE_VEC(vec_u4_w32, 4, 1024)
"""

#: name -> (warps per block, images per tile), of the candidates above
SHAPES = {"rows1_w32": (32, 32), "rows2_w32": (32, 32), "rows4_w32": (32, 32), "rows2_w16": (16, 32),
          "rows4_w16": (16, 32), "half1_w16": (16, 16), "half2_w16": (16, 16), "half2_w8": (8, 16),
          "shfl1_w32": (32, 32), "shfl2_w32": (32, 32), "shfl1_w16": (16, 32), "shfl2_w16": (16, 32),
          "vec_u1_w32": (32, 32), "vec_u2_w32": (32, 32), "vec_u2_w16": (16, 32), "vec_u4_w32": (32, 32)}


def source() -> str:
    from dasknn.kernels import gpu

    return gpu.cuda_code() + CANDIDATES


class Candidates:
    """The candidate kernels on the current device, launched as :func:`dasknn.kernels.gpu.gpu_step` launches."""

    def __init__(self):
        import cupy

        from dasknn.kernels.nvrtc import GPU_COMPILE_OPTIONS

        t0 = time.perf_counter()
        self.module = cupy.RawModule(code=source(), options=GPU_COMPILE_OPTIONS)
        self.kernels = {}
        optin = int(cupy.cuda.Device().attributes.get("MaxSharedMemoryPerBlockOptin", 48 * 1024))
        for name in SHAPES:
            k = self.module.get_function(name)
            k.max_dynamic_shared_size_bytes = optin - int(k.shared_size_bytes)
            self.kernels[name] = k
        print(f"candidates compiled in {time.perf_counter() - t0:.1f} s: "
              + ", ".join(f"{n} ({getattr(k, 'num_regs', '?')} registers)" for n, k in self.kernels.items()), flush=True)

    def step(self, name: str, yt, layer, bias: float, ymax: float, alive, out=None):
        import cupy

        indptr, indices, data = layer
        n_in, nb = yt.shape
        n_out = indptr.size - 1
        if out is None:
            out = cupy.empty((n_out, nb), dtype=yt.dtype)
        sms = cupy.cuda.Device().attributes["MultiProcessorCount"]
        warps, tile = SHAPES[name]
        grid = (min(-(-nb // tile), 64 * sms), 1)
        self.kernels[name](grid, (32, warps),
                           (yt, yt, np.int64(n_in), indptr, indices, data, np.float32(bias), np.float32(ymax), out,
                            alive, np.int64(n_in), np.int64(n_out), np.int64(nb)),
                           shared_mem=n_in * tile * yt.dtype.itemsize)
        return out


def event_time(fn, repeats: int) -> float:
    """Median seconds of ``fn`` on the device (CUDA events), after one warm-up launch."""
    import cupy

    fn()
    times = []
    for _ in range(repeats):
        start, stop = cupy.cuda.Event(), cupy.cuda.Event()
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, stop) / 1e3)
    return statistics.median(times)


def loop_with(step, yt, layers, bias, ymax, ids, every: int = 4, timings: dict | None = None):
    """:func:`dasknn.kernels.run_layers_gpu` with ``step(yt, layer, alive)`` as its layer kernel; with
    ``timings``, the kernels' and compactions' device seconds are summed into it (events around each)."""
    import cupy

    from dasknn.kernels.gpu import _compact_gpu

    ids_d = cupy.asarray(ids)
    alive = cupy.zeros(max(1, yt.shape[1]), dtype=cupy.int32)

    def timed(kind, fn):
        if timings is None:
            return fn()
        start, stop = cupy.cuda.Event(), cupy.cuda.Event()
        start.record()
        r = fn()
        stop.record()
        stop.synchronize()
        timings[kind] = timings.get(kind, 0.0) + cupy.cuda.get_elapsed_time(start, stop) / 1e3
        return r

    k = 0
    for k, layer in enumerate(layers, start=1):
        if yt.shape[1] == 0:
            break
        alive[: yt.shape[1]] = 0
        yt = timed("kernels", lambda: step(yt, layer, alive))
        if k % every == 0:
            yt, ids_d = timed("compactions", lambda: _compact_gpu(yt, ids_d, alive))
    if k % every and yt.shape[1]:
        yt, ids_d = timed("compactions", lambda: _compact_gpu(yt, ids_d, alive))
    return np.sort(cupy.asnumpy(ids_d))


SECTIONS = ("breakdown", "alone", "whole_loop", "ell", "generated")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The arguments, checked before any device time is spent: a bad one ends the run with one line."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=".gpu-data")
    ap.add_argument("--images", type=int, default=60000)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--layers", default="1,2,4,30,119", help="layers whose real activations time each kernel")
    ap.add_argument("--only", default="", help="comma list of the candidates to run (default: all)")
    ap.add_argument("--sections", default="breakdown,alone,whole_loop,ell",
                    help=f"comma list of the sections to run, in this order: {','.join(SECTIONS)}")
    ap.add_argument("--minibatches", default="", help="the ELL loop's images a thread to run (default: all)")
    ap.add_argument("--ell-dtypes", default="float32,float64", help="dtypes of the ELL section (real network)")
    ap.add_argument("--generated", default="", help="neurons of generated 120-layer networks (section generated)")
    ap.add_argument("--gen-images", type=int, default=60000, help="images of each generated network")
    ap.add_argument("--gen-minibatches", default="4,12", help="the ELL loop's minibatches on generated networks")
    ap.add_argument("--ell-threads", default="256,1024", help="the ELL loop's threads a block (real network)")
    ap.add_argument("--gen-threads", default="256", help="the ELL loop's threads a block (generated networks)")
    ap.add_argument("--ell-shared-kib", default="64",
                    help="comma list of the ELL loop's shared-memory buffer sizes, KiB (at most 227 on sm_90)")
    ap.add_argument("--profile", nargs="?", const="layers", choices=("layers", "ell"),
                    help="run one loop and stop, for Nsight Compute: today's (layers; ncu -k regex:dasknn_staged) "
                         "or the ELL loop (ell; ncu -k regex:dasknn_ell)")
    ap.add_argument("--dry-run", action="store_true",
                    help="no device: build the ELL layouts, check the NumPy model of the ELL loop against the CPU "
                         "loop, compile the source for sm_90 (nvcc, ptxas), and stop")
    ap.add_argument("--dry-images", type=int, default=200, help="images the dry run's model runs")
    args = ap.parse_args(argv)
    unknown = set(args.sections.split(",")) - set(SECTIONS)
    if unknown:
        ap.error(f"--sections: unknown {', '.join(sorted(unknown))} (known: {', '.join(SECTIONS)})")
    for name in args.ell_dtypes.split(","):
        if name not in ("float32", "float64"):
            ap.error(f"--ell-dtypes: {name!r} is not float32 or float64")
    try:
        asked = [int(x) for x in args.minibatches.split(",") if x]
        generated = [int(x) for x in args.gen_minibatches.split(",") if x]
        [int(x) for x in args.generated.split(",") if x]
    except ValueError:
        ap.error("--minibatches, --gen-minibatches and --generated take comma lists of integers")
    from dasknn.kernels.gpu_ell import ELL_MINIBATCHES

    if not set(asked) <= set(ELL_MINIBATCHES[4] + ELL_MINIBATCHES[8]):
        ap.error(f"--minibatches: the ELL kernels have {ELL_MINIBATCHES} images a thread by itemsize")
    try:
        kib = [int(x) for x in args.ell_shared_kib.split(",") if x]
    except ValueError:
        ap.error("--ell-shared-kib takes a comma list of integers")
    if not kib or not all(1 <= k <= 227 for k in kib):
        ap.error("--ell-shared-kib: buffers of 1 to 227 KiB (sm_90's most a block may opt in to)")
    from dasknn.kernels.gpu_ell import ELL_BLOCK_THREADS

    try:
        threads = [int(x) for x in (args.ell_threads + "," + args.gen_threads).split(",") if x]
    except ValueError:
        ap.error("--ell-threads and --gen-threads take comma lists of integers")
    if not threads or not set(threads) <= set(ELL_BLOCK_THREADS):
        ap.error(f"--ell-threads, --gen-threads: the ELL kernels run blocks of {ELL_BLOCK_THREADS} threads")
    if not generated or not set(generated) <= set(ELL_MINIBATCHES[4]):
        ap.error(f"--gen-minibatches: float32 kernels have {ELL_MINIBATCHES[4]} images a thread")
    missing = [f for f in ("neuron1024.tar.gz", "sparse-images-1024.tsv.gz", "neuron1024-l120-categories.tsv")
               if not (Path(args.data) / f).exists()]
    if missing:
        ap.error(f"--data {args.data}: missing {', '.join(missing)} (bash benchmarks/gpu_check.sh prepare)")
    return args


def main() -> None:
    args = parse_args()
    import bench_gpu_ell

    from dasknn import io, kernels

    data = Path(args.data)
    net = io.read_network(data / "neuron1024.tar.gz")
    images = io.read_images(data / "sparse-images-1024.tsv.gz")[: args.images]
    truth = io.read_categories(data / "neuron1024-l120-categories.tsv")
    truth = truth[truth < args.images]
    if args.dry_run:
        bench_gpu_ell.dry_run(args, net, images, truth)
        return
    from bench_gpu import gpu_count

    if not gpu_count()[0]:
        print(f"no GPU: {gpu_count()[1]}; bench_gpu_kernels.py needs a CUDA device (--dry-run rehearses without)",
              flush=True)
        sys.exit(1)
    if args.profile == "ell":
        bench_gpu_ell.profile_ell(net, images, max(bench_gpu_ell.minibatches(args.minibatches, 4)))
        return

    import cupy
    from bench_gpu import dense_on_device, device_layers

    f32 = np.dtype(np.float32)
    layers = device_layers(net, f32)
    n = args.images
    sections = args.sections.split(",")
    cand = Candidates() if {"alone", "whole_loop"} & set(sections) and not args.profile else None
    chosen = [c for c in SHAPES if not args.only or c in args.only.split(",")]

    def current(yt, layer, alive):
        return kernels.gpu.gpu_step(yt, *layer, net.bias, net.ymax, alive, "auto")

    y0 = dense_on_device(images, f32)
    if args.profile:
        kernels.run_layers_gpu(y0, layers, net.bias, net.ymax, np.arange(n))
        cupy.cuda.Device().synchronize()
        return
    copy = event_time(lambda: y0.copy(), 5)

    def breakdown() -> None:
        whole = event_time(lambda: kernels.run_layers_gpu(y0.copy(), layers, net.bias, net.ymax, np.arange(n)), 5)
        parts: dict[str, float] = {}
        loop_with(current, y0.copy(), layers, net.bias, net.ymax, np.arange(n), timings=parts)
        print(f"\n1. the loop, {n} images, inputs on the GPU: {whole * 1e3:.2f} ms; its kernels "
              f"{parts['kernels'] * 1e3:.2f} ms, its compactions {parts['compactions'] * 1e3:.2f} ms, the rest "
              f"(launches, the host) {(whole - copy - sum(parts.values())) * 1e3:.2f} ms", flush=True)

    def alone() -> None:
        want = sorted(int(x) for x in args.layers.split(","))
        reach = {}
        yt = y0.copy()
        for k, layer in enumerate(layers, start=1):
            if k in want:
                reach[k] = yt
            alive = cupy.zeros(yt.shape[1], dtype=cupy.int32)
            yt = current(yt, layer, alive)
            yt = cupy.ascontiguousarray(yt[:, cupy.flatnonzero(alive)])
        print("\n2. one layer alone | layer | images | kernel | us | GEdge-images/s (run) | equal", flush=True)
        for k, yin in reach.items():
            layer = layers[k - 1]
            alive = cupy.zeros(yin.shape[1], dtype=cupy.int32)
            ref = current(yin, layer, alive)
            edges = int(layer[1].size)
            for name in ("current", *chosen):
                fn = (lambda: current(yin, layer, alive)) if name == "current" else (
                    lambda name=name: cand.step(name, yin, layer, net.bias, net.ymax, alive))
                s = event_time(fn, args.repeats)
                same = bool(cupy.array_equal(fn(), ref))
                print(f"  | {k} | {yin.shape[1]} | {name} | {s * 1e6:.1f} | {edges * yin.shape[1] / s / 1e9:.0f} "
                      f"| {same}", flush=True)

    def whole_loop() -> None:
        print("\n3. the whole loop | kernel | ms | TeraEdges/s (nominal) | mismatched (float32)", flush=True)
        for name in ("current", *chosen):
            step = current if name == "current" else (
                lambda yt, layer, alive, name=name: cand.step(name, yt, layer, net.bias, net.ymax, alive))
            s = event_time(lambda: loop_with(step, y0.copy(), layers, net.bias, net.ymax, np.arange(n)), 5) - copy
            cats = loop_with(step, y0.copy(), layers, net.bias, net.ymax, np.arange(n))
            print(f"  | {name} | {s * 1e3:.2f} | {n * net.edges / s / 1e12:.2f} | {np.setxor1d(cats, truth).size}",
                  flush=True)

    def ell() -> None:
        bench_gpu_ell.section_ell(args, net, images, truth)

    def generated() -> None:
        bench_gpu_ell.section_generated(args)

    failed = []
    known = {"breakdown": breakdown, "alone": alone, "whole_loop": whole_loop, "ell": ell, "generated": generated}
    for section in (known[name] for name in sections):
        try:
            section()
        except Exception:  # the next section still runs; the exit status says one failed
            traceback.print_exc()
            failed.append(section.__name__)
    if failed:
        print(f"sections that failed: {', '.join(failed)}", flush=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
