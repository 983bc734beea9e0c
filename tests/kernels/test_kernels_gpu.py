"""GPU kernels: CPU-side checks everywhere, and ``gpu``-marked checks on a machine with a CUDA device.

Without a GPU the CUDA source cannot run, so its indexing is tested through a Python transcription of each
thread's work over a small grid (same launch shapes, same loops, same flat offsets), compared bit for bit with
the Numba kernel; the source itself is compiled with NVRTC where that library is installed (it needs no GPU).
"""

from __future__ import annotations

import ctypes
import glob
import os
import re
import shutil
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

from dasknn import kernels
from examples import random_activations, random_layer

ROOT = Path(__file__).resolve().parents[2]


# --- a Python transcription of CUDA_SOURCE -------------------------------------------------------------------


def _madd(acc, y, w):
    # __fadd_rn(acc, __fmul_rn(y, w)): NumPy scalars round each operation to their own precision
    return acc + y * w


def _rule(v, bias, ymax):
    zero = type(v)(0)
    if v != zero:
        v = v + bias
        v = zero if v < zero else (ymax if v > ymax else v)
    return v


def _input_row(yt, extra, split, i, nb):
    # input_row: (array, offset) for the pointer yt + i * nb, or extra + (i - split) * nb
    return (yt, i * nb) if i < split else (extra, (i - split) * nb)


def emulate_gather(yt, extra, split, indptr, indices, data, bias, ymax, out, alive, n_in, n_out, nb, grid, block):
    """step_gather, thread by thread: ``yt``, ``extra``, ``out`` are flat (pointer arithmetic), ``alive`` int32
    flags."""
    TILE, ROWS = kernels.GPU_TILE, kernels.GPU_ROWS
    T = yt.dtype.type
    assert block == (TILE, ROWS)
    for bx in range(grid[0]):
        for by in range(grid[1]):
            tile_alive = [None] * TILE  # __shared__
            tile = by
            while tile * TILE < nb:
                for ty in range(block[1]):  # phase 1: threadIdx.y == 0 clears the flags
                    for tx in range(block[0]):
                        if ty == 0:
                            tile_alive[tx] = 0
                # __syncthreads()
                for ty in range(block[1]):  # phase 2: every thread computes its (j, b)
                    for tx in range(block[0]):
                        j = bx * ROWS + ty
                        b = tile * TILE + tx
                        if j < n_out and b < nb:
                            acc = T(0)
                            for p in range(indptr[j], indptr[j + 1]):
                                row, at = _input_row(yt, extra, split, int(indices[p]), nb)
                                acc = _madd(acc, row[at + b], data[p])
                            v = _rule(acc, bias, ymax)
                            out[j * nb + b] = v
                            if v != T(0):
                                tile_alive[tx] = 1
                # __syncthreads()
                for ty in range(block[1]):  # phase 3: warp 0 publishes the tile's flags
                    for tx in range(block[0]):
                        b = tile * TILE + tx
                        if ty == 0 and b < nb and tile_alive[tx]:
                            alive[b] = 1
                tile += grid[1]


def emulate_staged(yt, extra, split, indptr, indices, data, bias, ymax, out, alive, n_in, n_out, nb, grid, block,
                   shared_bytes):
    """step_staged, thread by thread, with the dynamic shared memory as a flat array of ``shared_bytes``."""
    TILE = kernels.GPU_TILE
    T = yt.dtype.type
    assert block[0] == TILE and shared_bytes == n_in * TILE * yt.itemsize
    nthreads = block[0] * block[1]
    size = n_in * TILE
    for bx in range(grid[0]):
        sh = np.full(shared_bytes // yt.itemsize, np.nan, dtype=yt.dtype)  # garbage until written
        tile_alive = [None] * TILE
        tile = bx
        while tile * TILE < nb:
            b0 = tile * TILE
            for ty in range(block[1]):  # phase 1: the block copies the tile's inputs, zero past the last image
                for lane in range(block[0]):
                    tid = ty * block[0] + lane
                    for i in range(tid, size, nthreads):
                        r, c = i // TILE, i % TILE
                        row, at = _input_row(yt, extra, split, r, nb)
                        sh[i] = row[at + b0 + c] if b0 + c < nb else T(0)
                    if ty == 0:
                        tile_alive[lane] = 0
            # __syncthreads()
            mine = {}
            for ty in range(block[1]):  # phase 2: warp ty computes neurons ty, ty + blockDim.y, ...
                for lane in range(block[0]):
                    b = b0 + lane
                    mine[ty, lane] = 0
                    if b < nb:
                        for j in range(ty, n_out, block[1]):
                            acc = T(0)
                            for p in range(indptr[j], indptr[j + 1]):
                                acc = _madd(acc, sh[int(indices[p]) * TILE + lane], data[p])
                            v = _rule(acc, bias, ymax)
                            out[j * nb + b] = v
                            mine[ty, lane] |= int(v != T(0))
                    if mine[ty, lane]:
                        tile_alive[lane] = 1
            # __syncthreads()
            for lane in range(block[0]):  # phase 3
                b = b0 + lane
                if b < nb and tile_alive[lane]:
                    alive[b] = 1
            # __syncthreads()
            tile += grid[0]


def emulate_step(yt, indptr, indices, data, bias, ymax, variant, max_grid=kernels.GPU_MAX_GRID_Y, extra=None):
    """What one launch of :func:`dasknn.kernels.gpu.gpu_step` computes, by emulation: ``(out, alive flags)``."""
    dtype = yt.dtype
    split, nb = yt.shape
    extra = yt if extra is None else extra
    n_in = split + (0 if extra is yt else extra.shape[0])
    n_out = indptr.size - 1
    launch = kernels.gpu_launch(variant, n_in, n_out, nb, dtype.itemsize, max_grid=max_grid)
    out = np.full(n_out * nb, np.nan, dtype=dtype)  # uninitialised, as cupy.empty
    alive = np.zeros(nb, dtype=np.int32)
    args = (yt.ravel(), extra.ravel(), split, indptr, indices, data.astype(dtype), dtype.type(bias), dtype.type(ymax), out, alive,
            n_in, n_out, nb, launch.grid, launch.block)
    if launch.kernel.startswith("dasknn_gather"):
        emulate_gather(*args)
    else:
        emulate_staged(*args, launch.shared_bytes)
    return out.reshape(n_out, nb), alive


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("variant,max_grid", [("gather", kernels.GPU_MAX_GRID_Y), ("gather", 2),
                                              ("staged", kernels.GPU_MAX_GRID_Y), ("staged", 2)])
def test_emulated_kernel_equals_numba(dtype, variant, max_grid):
    # 70 images: two full tiles and a partial one; max_grid=2 makes the blocks loop over tiles; 43 outputs is
    # not a multiple of the rows per block
    n_in, n_out, nb = 40, 43, 70
    indptr, indices, data = random_layer(n_in, n_out, seed=3, dtype=dtype)
    yt = random_activations(n_in, nb, seed=3, dtype=dtype)
    bias, ymax = -0.3, 4.0
    want = kernels.layer_step_numpy(yt, indptr, indices, data, bias, ymax)
    got, alive = emulate_step(yt, indptr, indices, data, bias, ymax, variant, max_grid)
    np.testing.assert_array_equal(got, want)  # bit for bit, every entry written (no NaN left)
    np.testing.assert_array_equal(alive.astype(bool), want.any(axis=0))
    assert want.any() and not want.all(axis=0).all()  # the case exercises both nonzero and dead columns
    assert (want == ymax).any() and (want == 0).any()


@pytest.mark.parametrize("variant", ["gather", "staged"])
def test_emulated_kernel_odd_shapes(variant):
    # fewer images than a tile, an odd number of inputs and outputs, the challenge's clamp
    indptr, indices, data = random_layer(33, 17, seed=5, dtype=np.float32)
    yt = random_activations(33, 19, seed=5, dtype=np.float32)
    want = kernels.layer_step_numpy(yt, indptr, indices, data, -0.3, 32.0)
    got, alive = emulate_step(yt, indptr, indices, data, -0.3, 32.0, variant)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(alive.astype(bool), want.any(axis=0))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("variant", ["gather", "staged"])
@pytest.mark.parametrize("received", [1, 23])
def test_emulated_kernel_reads_received_rows_in_place(dtype, variant, received):
    # model mode: rows past the block's own are read from the received rows where they lie, as the CPU kernel's
    # extra= does; the same result as the rows stacked, bit for bit
    own, n_out, nb = 40, 43, 70
    indptr, indices, data = random_layer(own + received, n_out, seed=11, dtype=dtype)
    x = random_activations(own + received, nb, seed=11, dtype=dtype)
    yt, extra = np.ascontiguousarray(x[:own]), np.ascontiguousarray(x[own:])
    want = kernels.layer_step_numpy(yt, indptr, indices, data, -0.3, 4.0, extra=extra)
    np.testing.assert_array_equal(want, kernels.layer_step_numpy(x, indptr, indices, data, -0.3, 4.0))
    got, alive = emulate_step(yt, indptr, indices, data, -0.3, 4.0, variant, 2, extra=extra)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(alive.astype(bool), want.any(axis=0))
    assert (indices >= own).any()  # the layer reads some received rows


def test_emulated_run_layers_equals_cpu(slice_paths):
    # the GPU loop's logic (fused flags, compaction every few layers) over the real slice's first layers
    from dasknn import io

    net = io.read_network(slice_paths["network"])
    images = io.read_images(slice_paths["images"])[:45]
    layers = [(w.indptr.astype(np.int64), w.indices.astype(np.int32), w.data.astype(np.float32))
              for w in net.layers[:3]]
    yt0 = kernels.dense_transposed(images, np.float32)
    want_yt, want_ids = kernels.run_layers(yt0, layers, net.bias, net.ymax, np.arange(45))
    yt, ids = yt0, np.arange(45)
    for k, (indptr, indices, data) in enumerate(layers, start=1):
        yt, flags = emulate_step(yt, indptr, indices, data, net.bias, net.ymax, "gather" if k % 2 else "staged")
        if k % 2 == 0:
            keep = np.flatnonzero(flags)
            yt, ids = np.ascontiguousarray(yt[:, keep]), ids[keep]
    keep = np.flatnonzero(yt.any(axis=0))
    np.testing.assert_array_equal(ids[keep], want_ids)
    np.testing.assert_array_equal(yt[:, keep], want_yt)


def _numpy_cupy() -> types.ModuleType:
    # the few CuPy functions the GPU loop calls, backed by NumPy
    fake = types.ModuleType("cupy")
    for name in ("asarray", "zeros", "int32", "ascontiguousarray", "flatnonzero"):
        setattr(fake, name, getattr(np, name))
    fake.asnumpy = np.asarray
    return fake


@pytest.mark.parametrize("compact_every", [1, 3, None])
def test_gpu_loop_logic_with_numpy_standins(monkeypatch, slice_paths, compact_every):
    # run_layers_gpu's own logic (flags cleared per layer, compaction every few layers and after the last, ids
    # following the columns) with each launch replaced by the CPU kernel plus the flags the kernel would set
    from dasknn import io, reference

    launches = []

    def step(yt, indptr, indices, data, bias, ymax, alive, variant="auto"):
        assert not alive[: yt.shape[1]].any()  # cleared before every launch
        out = kernels.layer_step_numpy(yt, indptr, indices, data, bias, ymax)
        alive[np.flatnonzero(out.any(axis=0))] = 1
        launches.append(yt.shape[1])
        return out

    monkeypatch.setitem(sys.modules, "cupy", _numpy_cupy())
    monkeypatch.setattr(kernels.gpu, "gpu_step", step)
    net = io.read_network(slice_paths["network"])
    images = io.read_images(slice_paths["images"])[:300]
    layers = [(w.indptr, w.indices, w.data) for w in net.layers]
    yt = kernels.dense_transposed(images, np.float32)
    got_yt, got_ids = kernels.run_layers_gpu(yt, layers, net.bias, net.ymax, np.arange(300), compact_every)
    want_yt, want_ids = kernels.run_layers(yt, layers, net.bias, net.ymax, np.arange(300))
    np.testing.assert_array_equal(got_ids, want_ids)
    np.testing.assert_array_equal(got_yt, want_yt)
    np.testing.assert_array_equal(got_ids, reference.infer_categories(net.layers, images, net.bias, net.ymax))
    every = kernels.GPU_COMPACT_EVERY if compact_every is None else compact_every
    # the batch narrows only right after a compaction layer
    for k in range(1, len(launches)):
        if k % every:
            assert launches[k] == launches[k - 1]
    assert launches[-1] < 300


def test_kernels_are_compiled_once_per_device_and_opt_in_to_the_shared_memory_left(monkeypatch):
    # a stand-in CuPy that counts compilations and lookups; a device with 227 KiB of shared memory per block
    # and kernels with 128 bytes of static shared memory (their alive flags), as ptxas reports for sm_90
    made, looked_up = [], []

    class Function:
        shared_size_bytes = 128

        def __init__(self, name):
            self.name = name
            self.max_dynamic_shared_size_bytes = 48 * 1024 - 128  # CUDA's default: 48 KiB in all

    class Module:
        def __init__(self, code, options):
            made.append(options)

        def get_function(self, name):
            looked_up.append(name)
            return Function(name)

    current = [0]
    fake = types.ModuleType("cupy")
    fake.RawModule = Module
    fake.cuda = types.SimpleNamespace(Device=lambda: types.SimpleNamespace(
        id=current[0], attributes={"MaxSharedMemoryPerBlockOptin": 227 * 1024}))
    monkeypatch.setitem(sys.modules, "cupy", fake)
    monkeypatch.setattr(kernels.gpu, "_MODULES", {})
    monkeypatch.setattr(kernels.gpu, "_KERNELS", {})
    kernel, limit = kernels.gpu.gpu_kernel("dasknn_staged_f32")
    assert limit == 227 * 1024 - 128 == kernel.max_dynamic_shared_size_bytes
    for _ in range(3):
        assert kernels.gpu.gpu_kernel("dasknn_staged_f32")[0] is kernel
    kernels.gpu.gpu_kernel("dasknn_gather_f32")
    assert len(made) == 1 and looked_up == ["dasknn_staged_f32", "dasknn_gather_f32"]
    current[0] = 1  # another device: its own module and lookups
    assert kernels.gpu.gpu_kernel("dasknn_staged_f32")[0] is not kernel
    assert len(made) == 2 and made[0] == kernels.nvrtc.GPU_COMPILE_OPTIONS
    # 384 float32 inputs: a tile of exactly 48 KiB of dynamic shared memory, staged within the kernel's limit
    launch = kernels.gpu_launch("auto", 384, 10, 100, 4, min(kernels.GPU_STAGED_MAX_BYTES, limit))
    assert launch.kernel == "dasknn_staged_f32" and launch.shared_bytes == 48 * 1024 <= limit


def test_streamed_layers_kept_on_the_device_while_they_fit(monkeypatch):
    # a stand-in CuPy backed by NumPy, whose device has room for the first two of four layers (half its free
    # memory): those are copied once and reused by the next chunk; the others are copied every time
    copies = []
    fake = _numpy_cupy()
    fake.int64 = np.int64
    fake.asarray = lambda a, dtype=None: copies.append(1) or np.array(a, dtype=dtype)
    indptr, indices, data = random_layer(30, 20, seed=0, dtype=np.float32)
    layers = [(indptr, indices, data * (k + 1)) for k in range(4)]  # of one size
    size = sum(a.astype(t).nbytes for a, t in zip(layers[0], (np.int64, np.int32, np.float32)))
    fake.cuda = types.SimpleNamespace(Device=lambda: types.SimpleNamespace(id=0),
                                      runtime=types.SimpleNamespace(memGetInfo=lambda: (4 * size + 10, 0)))
    monkeypatch.setitem(sys.modules, "cupy", fake)
    monkeypatch.setattr(kernels.gpu, "_KEPT", {})
    monkeypatch.setattr(kernels.gpu, "_KEPT_BYTES", {})
    first = list(kernels.keep_on_device("net", 1, layers))
    assert len(copies) == 12
    again = list(kernels.keep_on_device("net", 1, layers))
    assert again[0] is first[0] and again[1] is first[1] and again[2] is not first[2]
    assert len(copies) == 12 + 6  # only the layers that did not fit crossed again
    for got, want in zip(again, layers):
        assert got[0].dtype == np.int64 and got[1].dtype == np.int32
        for a, b in zip(got, want):
            np.testing.assert_array_equal(a, b)
    assert list(kernels.keep_on_device("other", 1, layers[:1]))[0] is not first[0]  # another stream's layer 1
    kernels.release_device_layers()
    assert kernels.gpu._KEPT == {} and kernels.gpu._KEPT_BYTES == {}


# --- launch shapes and the source ----------------------------------------------------------------------------


@pytest.mark.parametrize("n_in,n_out,nb,itemsize", [(1024, 1024, 60000, 4), (1024, 1024, 60000, 8),
                                                    (65536, 65536, 60000, 4), (4096, 700, 1, 4),
                                                    (16, 3, 3_000_000, 8)])
def test_launch_covers_every_output_and_image(n_in, n_out, nb, itemsize):
    for variant in ("auto", "gather"):
        launch = kernels.gpu_launch(variant, n_in, n_out, nb, itemsize)
        tile = kernels.GPU_TILE
        assert launch.block[0] == tile and launch.block[0] * launch.block[1] <= 1024
        assert launch.grid[1] <= kernels.GPU_MAX_GRID_Y
        if launch.kernel.startswith("dasknn_staged"):
            # every tile is reached by block x, x + gridDim.x, ...; every output by some warp
            assert launch.shared_bytes == n_in * tile * itemsize <= kernels.GPU_STAGED_MAX_BYTES
            assert launch.grid[0] * tile >= min(nb, launch.grid[0] * tile) and launch.grid[0] >= 1
        else:
            assert launch.shared_bytes == 0
            assert launch.grid[0] * launch.block[1] >= n_out
            tiles = -(-nb // tile)
            assert launch.grid[1] == min(tiles, kernels.GPU_MAX_GRID_Y)
        assert launch.kernel.endswith({4: "f32", 8: "f64"}[itemsize])
    auto = kernels.gpu_launch("auto", n_in, n_out, nb, itemsize)
    assert auto.kernel.startswith("dasknn_staged") == (n_in * kernels.GPU_TILE * itemsize
                                                       <= kernels.GPU_STAGED_MAX_BYTES)


def test_launch_rejects_bad_requests():
    with pytest.raises(ValueError, match="variant"):
        kernels.gpu_launch("fast", 8, 8, 8, 4)
    with pytest.raises(ValueError, match="shared memory"):
        kernels.gpu_launch("staged", 65536, 8, 8, 4)


def test_source_names_the_launched_kernels():
    code = kernels.cuda_code()
    assert f"#define TILE {kernels.GPU_TILE}\n" in code and f"#define ROWS {kernels.GPU_ROWS}\n" in code
    for itemsize in (4, 8):
        for variant in ("gather", "staged"):
            name = kernels.gpu_launch(variant, 8, 8, 8, itemsize).kernel
            assert f"DASKNN_KERNEL({name}," in code
    assert code.count("{") == code.count("}") and code.count("(") == code.count(")")


def missing_fragments(source: str, fragments: list[str]) -> list[str]:
    """The ``fragments`` not in ``source``, whitespace runs counted as one space."""
    code = " ".join(source.split())
    return [f for f in fragments if f not in code]


def test_transcription_follows_the_source():
    # the index expressions the emulation transcribes, as they stand in the source: a change to the kernel's
    # indexing fails here until the transcription above is changed to match (and re-checked against Numba)
    assert missing_fragments(kernels.CUDA_SOURCE, [
        "const long long j = (long long)blockIdx.x * ROWS + threadIdx.y;",
        "for (long long tile = blockIdx.y; tile * TILE < nb; tile += gridDim.y) {",
        "const long long b = tile * TILE + threadIdx.x;",
        "return i < split ? yt + i * nb : extra + (i - split) * nb;",
        "acc = madd(acc, __ldg(input_row(yt, extra, split, __ldg(indices + p), nb) + b), __ldg(data + p));",
        "out[j * nb + b] = v;",
        "if (threadIdx.y == 0 && b < nb && tile_alive[threadIdx.x]) alive[b] = 1;",
        "for (long long tile = blockIdx.x; tile * TILE < nb; tile += gridDim.x) {",
        "for (int i = tid; i < size; i += nthreads) {",
        "const int r = i / TILE, c = i % TILE;",
        "sh[i] = b0 + c < nb ? input_row(yt, extra, split, r, nb)[b0 + c] : T(0);",
        "for (long long j = threadIdx.y; j < n_out; j += blockDim.y) {",
        "acc = madd(acc, sh[__ldg(indices + p) * TILE + lane], __ldg(data + p));",
        "return __fadd_rn(acc, __fmul_rn(y, w));",
        "v = v < T(0) ? T(0) : (v > ymax ? ymax : v);",
    ]) == []


# --- the source through CUDA's compilers (no GPU needed) -----------------------------------------------------

#: sm_90 (H100, H200): registers per block, shared memory per block with the opt-in, threads per block
SM90_REGISTERS, SM90_SHARED_OPTIN, MAX_THREADS = 65536, 227 * 1024, 1024
NO_COMPILER = ("no NVRTC or nvcc, or no ptxas: pip install 'dasknn[gpu-compile]' to compile the CUDA source "
               "without a GPU")


def _nvrtc() -> ctypes.CDLL | None:
    # NVRTC compiles CUDA C++ to PTX without a GPU: from the nvidia-cuda-nvrtc wheel, or the system's library
    candidates = []
    try:
        import nvidia.cuda_nvrtc

        for d in nvidia.cuda_nvrtc.__path__:
            candidates += sorted(glob.glob(os.path.join(d, "lib", "libnvrtc.so*")))
    except ImportError:
        pass
    candidates += ["libnvrtc.so"]
    for c in candidates:
        try:
            return ctypes.CDLL(c)
        except OSError:
            continue
    return None


def _ptxas() -> str | None:
    # ptxas assembles PTX for one architecture and reports each kernel's registers, spills and shared memory
    try:
        import nvidia.cuda_nvcc

        for d in nvidia.cuda_nvcc.__path__:
            if os.access(os.path.join(d, "bin", "ptxas"), os.X_OK):
                return os.path.join(d, "bin", "ptxas")
    except ImportError:
        pass
    return shutil.which("ptxas")


def nvrtc_ptx(lib: ctypes.CDLL, code: str, arch: str = "compute_90") -> str:
    """``code`` compiled by NVRTC to PTX, with the options the GPU path uses; fails on an error or a warning."""
    prog = ctypes.c_void_p()
    assert lib.nvrtcCreateProgram(ctypes.byref(prog), code.encode(), b"dasknn.cu", 0, None, None) == 0
    opts = [o.encode() for o in kernels.nvrtc.GPU_COMPILE_OPTIONS] + [f"--gpu-architecture={arch}".encode()]
    rc = lib.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
    size = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetProgramLog(prog, log)
    assert rc == 0, log.value.decode()
    assert "warning" not in log.value.decode().lower(), log.value.decode()
    lib.nvrtcGetPTXSize(prog, ctypes.byref(size))
    ptx = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetPTX(prog, ptx)
    lib.nvrtcDestroyProgram(ctypes.byref(prog))
    return ptx.value.decode()


def ptxas_report(ptxas: str, ptx: str, tmp: Path, arch: str = "sm_90") -> dict[str, dict[str, int]]:
    """Per kernel, what ptxas reports assembling ``ptx`` for ``arch``: registers, spill bytes, static shared."""
    (tmp / "dasknn.ptx").write_text(ptx)
    r = subprocess.run([ptxas, f"-arch={arch}", "-v", "-o", str(tmp / "dasknn.cubin"), str(tmp / "dasknn.ptx")],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    report: dict[str, dict[str, int]] = {}
    name = ""
    for line in r.stderr.splitlines():
        if m := re.search(r"Function properties for (\w+)", line):
            name = m[1]
            report[name] = {"registers": 0, "spills": 0, "smem": 0}
        elif m := re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", line):
            report[name]["spills"] = int(m[1]) + int(m[2])
        elif m := re.search(r"Used (\d+) registers", line):
            report[name]["registers"] = int(m[1])
            sm = re.search(r"(\d+) bytes smem", line)
            report[name]["smem"] = int(sm[1]) if sm else 0
    return report


def launch_limits_broken(report: dict[str, dict[str, int]], ptx: str) -> list[str]:
    """What in ptxas's report would stop or slow a launch as :func:`dasknn.kernels.gpu_launch` shapes it on sm_90:
    spills, more registers than the block's threads have, more shared memory than the opt-in allows."""
    broken = []
    for itemsize in (4, 8):
        for variant in ("gather", "staged"):
            launch = kernels.gpu_launch(variant, 8, 8, 8, itemsize)
            k = report[launch.kernel]
            threads = launch.block[0] * launch.block[1]
            warps = -(-threads // 32)
            per_warp = -(-k["registers"] * 32 // 256) * 256  # registers are allocated per warp, 256 at a time
            dynamic = kernels.gpu.GPU_STAGED_MAX_BYTES if variant == "staged" else 0  # the most a launch asks for
            bound = re.search(rf"\.entry {launch.kernel}\((?:.|\n)*?\.maxntid (\d+), 1, 1", ptx)
            if threads > MAX_THREADS or not bound or int(bound[1]) != threads:
                broken.append(f"{launch.kernel}: {threads} threads a block, launch bound {bound and bound[1]}")
            if k["spills"]:
                broken.append(f"{launch.kernel}: spills {k['spills']} bytes")
            if warps * per_warp > SM90_REGISTERS:
                broken.append(f"{launch.kernel}: {k['registers']} registers x {threads} threads")
            if k["smem"] + dynamic > SM90_SHARED_OPTIN:
                broken.append(f"{launch.kernel}: {k['smem']} + {dynamic} bytes of shared memory")
    return broken


def nvcc_ptx(nvcc: str, code: str, tmp: Path, arch: str = "compute_90") -> str:
    """``code`` compiled by nvcc to PTX with the GPU path's options, where NVRTC is not installed (the same
    front end); fails on an error or a warning."""
    (tmp / "dasknn.cu").write_text(code)
    r = subprocess.run([nvcc, "--ptx", f"-arch={arch}", *kernels.nvrtc.GPU_COMPILE_OPTIONS, "-o",
                        str(tmp / "dasknn_nvcc.ptx"), str(tmp / "dasknn.cu")], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    assert "warning" not in r.stderr.lower(), r.stderr
    return (tmp / "dasknn_nvcc.ptx").read_text()


def compile_for_sm90(code: str, tmp: Path) -> tuple[str, dict[str, dict[str, int]]]:
    """``code`` as PTX (NVRTC, else nvcc) and ptxas's report for sm_90; skips without the compilers."""
    lib, nvcc, ptxas = _nvrtc(), shutil.which("nvcc"), _ptxas()
    if (lib is None and nvcc is None) or ptxas is None:
        pytest.skip(NO_COMPILER)
    ptx = nvrtc_ptx(lib, code) if lib is not None else nvcc_ptx(nvcc, code, tmp)
    return ptx, ptxas_report(ptxas, ptx, tmp)


@pytest.fixture(scope="module")
def compiled(tmp_path_factory) -> tuple[str, dict[str, dict[str, int]]]:
    return compile_for_sm90(kernels.cuda_code(), tmp_path_factory.mktemp("ptx"))


@pytest.mark.parametrize("itemsize", [4, 8])
def test_cuda_source_compiles_for_sm90_within_its_launch(compiled, itemsize):
    ptx, report = compiled
    for variant in ("gather", "staged"):
        assert f".entry {kernels.gpu_launch(variant, 8, 8, 8, itemsize).kernel}(" in ptx
    assert launch_limits_broken(report, ptx) == []
    # no fused multiply-add: each product is rounded before it is added, as on the CPU (bit-for-bit results)
    kind = {4: "f32", 8: "f64"}[itemsize]
    assert "fma." not in ptx and f"mul.rn.{kind}" in ptx and f"add.rn.{kind}" in ptx


def test_launch_check_catches_a_broken_bound(compiled, monkeypatch):
    # the check itself: a launch of more threads than declared, and a shared tile beyond the opt-in, both fail
    ptx, report = compiled
    monkeypatch.setattr(kernels.gpu, "GPU_STAGED_WARPS", 16)
    monkeypatch.setattr(kernels.gpu, "GPU_STAGED_MAX_BYTES", SM90_SHARED_OPTIN)
    broken = " ".join(launch_limits_broken(report, ptx))
    assert "512 threads a block, launch bound 1024" in broken and "bytes of shared memory" in broken
    spilling = {name: dict(k, spills=8) for name, k in report.items()}
    assert "spills 8 bytes" in " ".join(launch_limits_broken(spilling, ptx))


@pytest.mark.subprocess
def test_training_kernels_compile_for_sm90_within_their_launch(tmp_path):
    # the training kernels (kernels.grad): no spills, the launch bound is the launch, registers fit the block,
    # and no fused multiply-add (float64 steps equal the CPU's)
    ptx, report = compile_for_sm90(kernels.grad.grad_cuda_code(), tmp_path)
    threads = kernels.grad.GRAD_THREADS
    for name in kernels.grad.GRAD_KERNELS:
        k = report[name]
        bound = re.search(rf"\.entry {name}\((?:.|\n)*?\.maxntid (\d+), 1, 1", ptx)
        assert bound and int(bound[1]) == threads, name
        assert k["spills"] == 0 and k["registers"] * threads <= SM90_REGISTERS, (name, k)
    assert "fma." not in ptx and "mul.rn.f64" in ptx and "add.rn.f64" in ptx


# --- dispatch and lazy CuPy ----------------------------------------------------------------------------------


def test_dispatcher_picks_gpu_kernels_for_a_cupy_like_type(monkeypatch):
    # a stand-in module named cupy whose ndarray reports module "cupy", as CuPy's does: the lazy registration
    # runs on first sight and registers the GPU kernels for it; real CuPy is never imported
    fake = types.ModuleType("cupy")

    class ndarray:  # noqa: N801 - CuPy's name
        pass

    ndarray.__module__ = "cupy"
    fake.ndarray = ndarray
    monkeypatch.setitem(sys.modules, "cupy", fake)
    for d in (kernels.layer_step, kernels.run_layers_device):
        monkeypatch.setattr(d, "_impls", dict(d._impls))
        monkeypatch.setattr(d, "_lazy", dict(d._lazy))
    assert kernels.layer_step.dispatch(ndarray) is kernels.layer_step_gpu
    assert kernels.run_layers_device.dispatch(ndarray) is kernels.run_layers_gpu
    assert kernels.layer_step.dispatch(np.ndarray) is kernels.layer_step_numpy

    class Other:
        pass

    with pytest.raises(TypeError, match="no layer_step kernel"):
        kernels.layer_step.dispatch(Other)


def test_run_layers_sends_device_arrays_to_the_device_loop(monkeypatch):
    class Device:
        pass

    calls = []
    monkeypatch.setattr(kernels.run_layers_device, "_impls", {Device: lambda *a: calls.append(a) or ("yt", "ids")})
    assert kernels.run_layers(Device(), [], -0.3, 32.0, np.arange(3)) == ("yt", "ids")
    assert calls and calls[0][5] is None  # the device loop picks its own compaction interval


@pytest.mark.subprocess
def test_importing_dasknn_does_not_import_cupy(tmp_path):
    # a cupy on the path that records being imported: the check can fail here, without a real CuPy. (Not
    # dasknn.engine: it imports zarr, whose GPU buffers import CuPy when it is installed.)
    (tmp_path / "cupy").mkdir()
    (tmp_path / "cupy" / "__init__.py").write_text("IMPORTED = True\n")
    code = textwrap.dedent("""
        import sys
        import dasknn, dasknn.kernels, dasknn.cli
        assert "cupy" not in sys.modules, "cupy was imported"
        import cupy
        assert cupy.IMPORTED  # the stand-in is the cupy this interpreter would import
        print("ok")
    """)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), str(ROOT)]))
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


def test_gpu_tests_skip_only_for_want_of_a_device(request):
    from conftest import gpu_count, gpu_required

    gpu_items = [i for i in request.session.items if i.get_closest_marker("gpu")]
    if not gpu_items:
        pytest.skip("the gpu tests were deselected")
    for item in gpu_items:
        skip = item.get_closest_marker("skip")
        if gpu_count() > 0 or gpu_required():
            assert skip is None
        else:
            assert skip is not None and skip.kwargs.get("reason", "").startswith("no GPU")


# --- on a GPU ------------------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("variant", ["gather", "staged", "auto"])
def test_gpu_kernel_equals_numba(dtype, variant):
    import cupy

    n_in, n_out, nb = 256, 300, 1000
    indptr, indices, data = random_layer(n_in, n_out, seed=7, dtype=dtype)
    yt = random_activations(n_in, nb, seed=7, dtype=dtype)
    want = kernels.layer_step_numpy(yt, indptr, indices, data, -0.3, 4.0)
    alive = cupy.zeros(nb, dtype=cupy.int32)
    got = kernels.gpu_step(cupy.asarray(yt), cupy.asarray(indptr), cupy.asarray(indices), cupy.asarray(data),
                            -0.3, 4.0, alive, variant)
    np.testing.assert_array_equal(cupy.asnumpy(got), want)  # bit for bit: same order, no FMA
    np.testing.assert_array_equal(cupy.asnumpy(alive).astype(bool), want.any(axis=0))
    via_dispatch = kernels.layer_step(cupy.asarray(yt), indptr, indices, data, -0.3, 4.0)
    np.testing.assert_array_equal(cupy.asnumpy(via_dispatch), want)
    cus = kernels.layer_step_cusparse(cupy.asarray(yt), cupy.asarray(indptr), cupy.asarray(indices),
                                      cupy.asarray(data), -0.3, 4.0)
    # cuSPARSE sums in its own order, with fused multiply-adds: within the rounding a sum of that many terms
    # allows (n terms, each rounding at most eps of the sum of magnitudes), the rule being 1-Lipschitz
    terms = int(np.diff(indptr).max())
    magnitudes = sp.csc_matrix((np.abs(data).astype(np.float64), indices, indptr), shape=(n_in, n_out)).T @ np.abs(
        yt.astype(np.float64))
    bound = (terms + 1) * np.finfo(dtype).eps * magnitudes + np.finfo(dtype).tiny
    assert (np.abs(cupy.asnumpy(cus).astype(np.float64) - want) <= bound).all()


@pytest.mark.gpu
def test_gpu_kernel_loops_over_tiles_beyond_the_grid(monkeypatch):
    import cupy

    monkeypatch.setattr(kernels.gpu, "GPU_MAX_GRID_Y", 3)  # 16 tiles of images, 3 blocks along them
    indptr, indices, data = random_layer(64, 50, seed=9, dtype=np.float32)
    yt = random_activations(64, 500, seed=9, dtype=np.float32)
    want = kernels.layer_step_numpy(yt, indptr, indices, data, -0.3, 32.0)
    for variant in ("gather", "staged"):
        got = kernels.layer_step_gpu(cupy.asarray(yt), indptr, indices, data, -0.3, 32.0, variant=variant)
        np.testing.assert_array_equal(cupy.asnumpy(got), want)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("compact_every", [1, 3, None])
def test_gpu_run_layers_on_the_slice(slice_paths, slice_truth, dtype, compact_every):
    import cupy

    from dasknn import io, reference

    net = io.read_network(slice_paths["network"])
    images = io.read_images(slice_paths["images"])
    layers = [(w.indptr, w.indices, w.data.astype(dtype)) for w in net.layers]
    yt = kernels.dense_transposed(images, np.dtype(dtype))
    want_yt, want_ids = kernels.run_layers(yt, layers, net.bias, net.ymax, np.arange(yt.shape[1]))
    dev_layers = [tuple(cupy.asarray(a) for a in layer) for layer in layers]
    got_yt, got_ids = kernels.run_layers(cupy.asarray(yt), dev_layers, net.bias, net.ymax,
                                         np.arange(yt.shape[1]), compact_every)
    assert isinstance(got_ids, np.ndarray)
    np.testing.assert_array_equal(got_ids, want_ids)
    np.testing.assert_array_equal(cupy.asnumpy(got_yt), want_yt)
    ref = reference.infer_categories(net.layers, images, net.bias, net.ymax, np.dtype(dtype))
    np.testing.assert_array_equal(got_ids, ref)
    if dtype == "float64":
        np.testing.assert_array_equal(got_ids, slice_truth)


@pytest.mark.cluster
@pytest.mark.gpu
def test_gpu_engine_on_the_slice_store(slice_store, slice_truth, client):
    from dasknn import engine

    r = engine.infer(slice_store, client=client, mode="data", dtype="float64", backend="gpu")
    np.testing.assert_array_equal(r.categories, slice_truth)
    r32 = engine.infer(slice_store, client=client, mode="data", dtype="float32", backend="gpu")
    cpu = engine.infer(slice_store, client=client, mode="data", dtype="float32", backend="cpu")
    np.testing.assert_array_equal(r32.categories, cpu.categories)


@pytest.mark.gpu
@pytest.mark.parametrize("variant", ["gather", "staged"])
def test_gpu_kernel_reads_received_rows_in_place(variant):
    import cupy

    own, received, n_out, nb = 200, 56, 300, 1000
    indptr, indices, data = random_layer(own + received, n_out, seed=13, dtype=np.float32)
    x = random_activations(own + received, nb, seed=13, dtype=np.float32)
    yt, extra = np.ascontiguousarray(x[:own]), np.ascontiguousarray(x[own:])
    want = kernels.layer_step_numpy(yt, indptr, indices, data, -0.3, 4.0, extra=extra)
    got = kernels.layer_step(cupy.asarray(yt), indptr, indices, data, -0.3, 4.0, extra=cupy.asarray(extra))
    np.testing.assert_array_equal(cupy.asnumpy(got), want)
    got = kernels.layer_step_gpu(cupy.asarray(yt), indptr, indices, data, -0.3, 4.0, extra=cupy.asarray(extra),
                                 variant=variant)
    np.testing.assert_array_equal(cupy.asnumpy(got), want)
