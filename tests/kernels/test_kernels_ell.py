"""Issue 44's ELL loop: its layout and a NumPy model of its kernels checked bit for bit on the CPU, its CUDA
source compiled for sm_90 (registers, spills, shared memory), and on a GPU the loop against today's."""

from __future__ import annotations

import functools
import re
import sys
import types

import numpy as np
import pytest
from examples import random_activations, random_layer
from test_kernels_gpu import SM90_REGISTERS, SM90_SHARED_OPTIN, compile_for_sm90, missing_fragments

from dasknn import kernels
from dasknn.kernels import ell, gpu_ell


def csc_layers(n: int, depth: int, seed: int, dtype) -> list[tuple]:
    return [random_layer(n, n, seed=seed + k, dtype=dtype) for k in range(depth)]


# --- the layout ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("buffer_inputs,threads", [(4096, 256), (300, 256), (37, 256), (300, 512), (37, 96)])
def test_layout_holds_each_column_in_entry_order(buffer_inputs, threads):
    # walking output j's lane in its warp, buffer by buffer, gives back its CSC entries in their order; the rest of
    # the lane's slots are padding (weight 0); a buffer stages inputs of its block's footprint, ascending
    n_in, n_out = 700, 600  # blocks of outputs, the last one part full
    indptr, indices, data = random_layer(n_in, n_out, seed=21, dtype=np.float32)
    lay = ell.ell_layer(indptr, indices, data, n_in, buffer_inputs, threads=threads)
    warps = threads // ell.ELL_WARP
    assert lay.blocks == -(-n_out // threads) and lay.entries == indices.size
    assert np.diff(lay.map_ptr).max() <= buffer_inputs
    for b in range(lay.blocks):
        staged = lay.map[lay.map_ptr[lay.block_buffers[b]]:lay.map_ptr[lay.block_buffers[b + 1]]]
        assert (np.diff(staged) > 0).all()  # the footprint, ascending, cut into buffers
    for j in range(n_out):
        b, w, lane = j // threads, (j % threads) // ell.ELL_WARP, j % ell.ELL_WARP
        got_in, got_w, padding = [], [], []
        for g in range(lay.block_buffers[b], lay.block_buffers[b + 1]):
            buf_inputs = lay.map[lay.map_ptr[g]:lay.map_ptr[g + 1]]
            mine = np.isin(indices[indptr[j]:indptr[j + 1]], buf_inputs).sum()
            for k, m in enumerate(range(lay.warp_ptr[g * warps + w], lay.warp_ptr[g * warps + w + 1])):
                at = m * ell.ELL_WARP + lane
                if k < mine:
                    got_in.append(buf_inputs[lay.index[at]])
                    got_w.append(lay.value[at])
                else:
                    padding.append((lay.index[at], lay.value[at]))
        np.testing.assert_array_equal(got_in, indices[indptr[j]:indptr[j + 1]])
        np.testing.assert_array_equal(np.array(got_w, dtype=np.float32), data[indptr[j]:indptr[j + 1]])
        assert all(i == 0 and v == 0 for i, v in padding)
    assert 0 < lay.padding < 1


def test_layout_refuses_a_sum_out_of_order():
    # output 0 reads input 5 then input 1: with one input a buffer its entries would be summed 1 then 5
    indptr, indices, data = np.array([0, 2]), np.array([5, 1]), np.array([1.0, 2.0], dtype=np.float32)
    with pytest.raises(ValueError, match="output 0's inputs are not in ascending order"):
        ell.ell_layer(indptr, indices, data, 8, 1)
    lay = ell.ell_layer(indptr, indices, data, 8, 8)  # one buffer: the entry order is kept whatever it is
    yt = np.array([[0, 0, 0, 0, 0, 3, 0, 0], [0, 4, 0, 0, 0, 0, 0, 0]], dtype=np.float32).T.copy()
    got = ell.ell_loop_numpy(yt, [lay], -0.5, 32.0, np.arange(2))
    want = kernels.run_layers(yt, [(indptr, indices, data)], -0.5, 32.0, np.arange(2))
    np.testing.assert_array_equal(got[0], want[0])
    with pytest.raises(ValueError, match="lie in 0..7"):
        ell.ell_layer(indptr, np.array([5, 8]), data, 8, 8)
    with pytest.raises(ValueError, match="does not fit"):
        ell.buffer_inputs_for(16, 8, 64)
    with pytest.raises(ValueError, match="multiple of 32 threads up to 1024, not 100"):
        ell.ell_layer(indptr, indices, data, 8, 8, threads=100)


# --- the loop, modelled --------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("minibatch,threads", [(4, 256), (12, 256), (8, 1024)])
def test_modelled_loop_equals_the_cpu_loop(dtype, minibatch, threads):
    # random layers with empty outputs, both signs, the clamp; buffers of a minibatch in 2 KiB: several a block
    n, nb = 600, 70
    layers = csc_layers(n, 5, seed=31, dtype=dtype)
    yt = random_activations(n, nb, seed=31, dtype=dtype)
    lays = gpu_ell.ell_layers(layers, n, dtype, minibatch, 2048, threads)
    assert max(np.diff(lay.block_buffers).max() for lay in lays) > 1
    got_yt, got_ids, counts = ell.ell_loop_numpy(yt, lays, -0.3, 4.0, np.arange(100, 100 + nb))
    want_yt, want_ids = kernels.run_layers(yt, layers, -0.3, 4.0, np.arange(100, 100 + nb))
    np.testing.assert_array_equal(got_ids, want_ids)
    np.testing.assert_array_equal(got_yt, want_yt)  # bit for bit
    assert counts[0] == nb and counts[-1] == want_ids.size and (np.diff(counts) <= 0).all()
    assert not (got_yt == 0).all(axis=0).any()


def test_modelled_loop_on_the_slice(slice_paths):
    # the real network's slice, its layers as the GPU path gets them (float32), all its images: equal to the CPU
    # loop and to the reference's categories, the images dying layer by layer
    from dasknn import io, reference

    net = io.read_network(slice_paths["network"])
    images = io.read_images(slice_paths["images"])
    layers = [(w.indptr, w.indices, w.data.astype(np.float32)) for w in net.layers]
    lays = gpu_ell.ell_layers(layers, net.layers[0].shape[0], np.float32, 12)
    yt = kernels.dense_transposed(images, np.float32)
    ids = np.arange(yt.shape[1])
    got_yt, got_ids, counts = ell.ell_loop_numpy(yt, lays, net.bias, net.ymax, ids)
    want_yt, want_ids = kernels.run_layers(yt, layers, net.bias, net.ymax, ids)
    np.testing.assert_array_equal(got_ids, want_ids)
    np.testing.assert_array_equal(got_yt, want_yt)
    np.testing.assert_array_equal(got_ids, reference.infer_categories(net.layers, images, net.bias, net.ymax))
    assert counts[-1] < counts[0]


def test_modelled_compaction_keeps_order_and_follows_ids():
    alive = np.array([0, 1, 1, 0, 1, 0, 1], dtype=np.int32)
    src = np.array([6, 4, 3, 2, 1, 0, 5], dtype=np.int32)  # slot s of the output came from input slot src[s]
    ids = np.arange(10, 17)
    src_next, ids_next, count = ell.ell_compact_numpy(alive, 6, src, ids)
    assert count == 3 and src_next.tolist() == [1, 2, 4]  # slot 6 lies past the count: not looked at
    assert ids_next.tolist() == [16, 14, 13, 12, 11, 10]
    assert alive[:6].tolist() == [0] * 6 and alive[6] == 1


def test_transcription_follows_the_ell_source():
    # the expressions the model replays, as they stand in the source: a change to the kernel's indexing fails
    # here until the model is changed to match (and re-checked against the CPU loop)
    assert missing_fragments(gpu_ell.ELL_CUDA_SOURCE, [
        "const int j = blockIdx.x * blockDim.x + threadIdx.x;",
        "for (int s0 = blockIdx.y * MB; s0 < nb; s0 += gridDim.y * MB) {",
        "const long long g_first = block_buffers[blockIdx.x], g_last = block_buffers[blockIdx.x + 1];",
        "sh[i] = s0 + f < nb ? act[(long long)__ldg(map + m0 + n) * cap + __ldg(src + s0 + f)] : T(0);",
        "for (long long m = warp_ptr[g * warps + warp]; m < end; ++m) {",
        "const int at = __ldg(index + m * 32 + lane);",
        "const V* y = reinterpret_cast<const V*>(sh + at * MB);",
        "out[(long long)j * cap + s0 + f] = v;",
        "for (int s = threadIdx.x; s < n; s += blockDim.x) ids_out[s] = ids_in[src_in[s]];",
        "if (mine) src_out[before + __popc(ballot & ((1u << lane) - 1u))] = s;",
    ]) == []


# --- launches and the loop's choice --------------------------------------------------------------------------


def test_launch_shapes_and_names():
    indptr, indices, data = random_layer(700, 600, seed=3, dtype=np.float32)
    lay = ell.ell_layer(indptr, indices, data, 700, ell.buffer_inputs_for(12, 4))
    launch = gpu_ell.ell_launch(lay, 60000, 4, 12)
    assert launch.kernel == "dasknn_ell_f32_mb12_t256" and launch.block == ell.ELL_THREADS
    assert launch.grid == (3, 5000) and launch.shared_bytes == np.diff(lay.map_ptr).max() * 12 * 4
    assert launch.shared_bytes <= ell.ELL_SHARED_BYTES
    assert gpu_ell.ell_launch(lay, 3_000_000, 8, 8).grid[1] == gpu_ell.ELL_MAX_GRID_Y
    wide = ell.ell_layer(indptr, indices, data, 700, ell.buffer_inputs_for(8, 8), np.float64, threads=1024)
    assert gpu_ell.ell_launch(wide, 100, 8, 8) == gpu_ell.EllLaunch("dasknn_ell_f64_mb8_t1024", (1, 13), 1024,
                                                                     np.diff(wide.map_ptr).max() * 8 * 8)
    code = gpu_ell.ell_cuda_code()
    for name, (size, mb, threads) in gpu_ell.ELL_LAYER_KERNELS.items():
        assert gpu_ell.ell_kernel_name(size, mb, threads) == name and f"DASKNN_ELL_KERNEL({name}," in code
        assert mb % {4: 4, 8: 2}[size] == 0  # a whole number of vector loads a slot
    assert len(gpu_ell.ELL_LAYER_KERNELS) == 6 * len(gpu_ell.ELL_BLOCK_THREADS)
    with pytest.raises(ValueError, match="images a thread in blocks of"):
        gpu_ell.ell_kernel_name(4, 10)
    with pytest.raises(ValueError, match="not 8 in 128"):
        gpu_ell.ell_kernel_name(4, 8, 128)


def test_the_loop_is_chosen_by_argument_or_environment(monkeypatch):
    monkeypatch.delenv("DASKNN_GPU_LOOP", raising=False)
    assert kernels.gpu.gpu_loop() == "layers"  # today's loop stays the default
    monkeypatch.setenv("DASKNN_GPU_LOOP", "ell")
    assert kernels.gpu.gpu_loop() == "ell" and kernels.gpu.gpu_loop("layers") == "layers"
    monkeypatch.setenv("DASKNN_GPU_LOOP", "fast")
    with pytest.raises(ValueError, match="GPU loop must be one of layers, ell, not 'fast'"):
        kernels.gpu.gpu_loop()


# --- the loop's host logic, with CuPy stood in for by NumPy and the kernels by the model ----------------------


def numpy_cupy(launched: list) -> types.ModuleType:
    """A stand-in CuPy: NumPy arrays, a stream that records launches while capturing and a graph that replays them,
    and each ELL kernel run by the NumPy model on the arrays it is handed (views included, as pointers would)."""
    capturing: list = []

    class Kernel:
        shared_size_bytes = 64

        def __init__(self, name):
            self.name, self.max_dynamic_shared_size_bytes = name, 48 * 1024 - 64

        def __call__(self, grid, block, args, shared_mem=0):
            run = functools.partial(self.run, grid, block, args, shared_mem)
            if capturing:  # recorded into the graph, not run
                capturing[-1].append(run)
                launched.append(f"captured {self.name}")
            else:
                launched.append(self.name)
                run()

        def run(self, grid, block, args, shared_mem):
            if self.name == "dasknn_ell_compact":
                alive, count_in, src_in, ids_in, src_out, ids_out, count_out = args
                assert grid == (1,) and block == (gpu_ell.ELL_COMPACT_THREADS,)
                src_next, ids_next, count = ell.ell_compact_numpy(alive, int(count_in[0]), src_in, ids_in)
                src_out[:count], ids_out[: ids_next.size], count_out[0] = src_next, ids_next, count
                return
            act, src, count, block_buffers, map_ptr, in_map, warp_ptr, index, value, bias, ymax, out, alive, n_out, cap = args
            _, mb, threads = gpu_ell.ELL_LAYER_KERNELS[self.name]
            layer = ell.EllLayer(act.shape[0], int(n_out), threads, 0, block_buffers, map_ptr, in_map, warp_ptr, index,
                                 value, 0)
            assert grid[0] == layer.blocks and block == (threads,) and cap == act.shape[1] == out.shape[1]
            assert shared_mem >= np.diff(map_ptr).max() * mb * act.itemsize and value.dtype == act.dtype
            ell.ell_step_numpy(layer, act, src, int(count[0]), bias, ymax, out, alive)

    class Module:
        def __init__(self, code, options):
            assert "dasknn_ell_compact" in code

        def get_function(self, name):
            return Kernel(name)

    class Graph:
        def __init__(self, runs):
            self.runs = runs

        def launch(self, stream=None):
            launched.append("graph")
            for run in self.runs:
                run()

    class Stream:
        def __init__(self, non_blocking=False):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def begin_capture(self):
            capturing.append([])

        def end_capture(self):
            return Graph(capturing.pop())

        def wait_event(self, event):
            assert isinstance(event, Event)

        def record(self):
            return Event()

        def synchronize(self):
            pass

    class Event:
        def record(self, stream=None):
            return self

    fake = types.ModuleType("cupy")
    for name in ("zeros", "arange", "int32", "int64", "ascontiguousarray"):
        setattr(fake, name, getattr(np, name))
    fake.asarray = lambda a, dtype=None: np.array(a, dtype=dtype)
    fake.asnumpy = lambda a, stream=None: np.array(a)
    fake.RawModule = Module
    fake.cuda = types.SimpleNamespace(
        Device=lambda: types.SimpleNamespace(id=0, attributes={"MaxSharedMemoryPerBlockOptin": 227 * 1024}),
        Stream=Stream, Event=Event, get_current_stream=lambda: Stream(), get_elapsed_time=lambda a, b: 0.0)
    return fake


@pytest.mark.parametrize("graph", [False, True])
def test_loop_host_logic_with_numpy_standins(monkeypatch, graph):
    # EllLoop's buffers (activations, slots, ids, counts, each pair used in turn), its launches in order, the
    # capture on the second run and the replays after, and the survivors gathered: equal to the CPU loop on three
    # chunks of different images through one loop (the last one smaller than the loop holds)
    launched: list = []
    monkeypatch.setitem(sys.modules, "cupy", numpy_cupy(launched))
    monkeypatch.setattr(gpu_ell, "_MODULES", {})
    monkeypatch.setattr(gpu_ell, "_KERNELS", {})
    n, depth, nb = 300, 5, 40
    layers = csc_layers(n, depth, seed=41, dtype=np.float32)
    loop = gpu_ell.EllLoop(gpu_ell.ell_layers(layers, n, np.float32, 8), nb, np.float32, -0.3, 4.0, 8, graph)
    for run, count in enumerate([nb, nb, 29]):
        yt = random_activations(n, count, seed=50 + run, dtype=np.float32)
        ids = np.arange(1000, 1000 + count)
        launched.clear()
        times: dict = {}
        got_yt, got_ids = loop.run(yt, ids, timings=times)
        want_yt, want_ids = kernels.run_layers(yt, layers, -0.3, 4.0, ids)
        np.testing.assert_array_equal(got_ids, want_ids)
        np.testing.assert_array_equal(got_yt, want_yt)
        assert loop.counts[0] == count and loop.counts[-1] == want_ids.size and "layers" in times
        kinds = ["dasknn_ell_f32_mb8_t256", "dasknn_ell_compact"] * depth
        if not graph or run == 0:  # launched one by one (the first run loads every kernel before a capture)
            assert launched == kinds
        else:  # captured on the second run, replayed from then on
            assert launched == ([f"captured {k}" for k in kinds] if run == 1 else []) + ["graph"]
    with pytest.raises(ValueError, match="holds 40 float32 images of 300 inputs"):
        loop.run(np.zeros((n, nb + 1), dtype=np.float32), np.arange(nb + 1))


def test_run_layers_gpu_by_the_ell_loop_keeps_its_loops(monkeypatch):
    # run_layers_gpu(loop="ell") in runs of layers, as the loop between folding's looks calls it: each layer's ELL
    # form built once, a loop for each run kept and reused by a smaller chunk, replaced for a larger one, all let
    # go with the kept layers
    launched: list = []
    monkeypatch.setitem(sys.modules, "cupy", numpy_cupy(launched))
    for cache in ("_MODULES", "_KERNELS", "_LOOPS", "_LAYOUTS"):
        monkeypatch.setattr(gpu_ell, cache, {})
    layers = csc_layers(300, 5, seed=43, dtype=np.float32)
    for nb in (50, 50, 20, 60):
        yt = random_activations(300, nb, seed=nb, dtype=np.float32)
        want = kernels.run_layers(yt, layers, -0.3, 4.0, np.arange(nb))
        got_yt, got_ids = kernels.run_layers_gpu(yt, layers[:2], -0.3, 4.0, np.arange(nb), loop="ell")
        got = kernels.run_layers_gpu(got_yt, layers[2:], -0.3, 4.0, got_ids, loop="ell")
        np.testing.assert_array_equal(got[1], want[1])
        np.testing.assert_array_equal(got[0], want[0])
        assert len(gpu_ell._LOOPS) == 2 and len(gpu_ell._LAYOUTS) == 5
        assert max(loop.capacity for _, loop in gpu_ell._LOOPS.values()) == max(50, nb)
    kernels.release_device_layers()
    assert gpu_ell._LOOPS == {} and gpu_ell._LAYOUTS == {}


# --- the source through CUDA's compilers (no GPU needed) -----------------------------------------------------


def test_ell_source_compiles_for_sm90_within_its_launch(tmp_path):
    # each kernel: no spills, the launch bound is the launch, its registers and shared memory let the blocks a
    # multiprocessor it asks for fit; separately rounded multiply and add; the minibatch read a vector at a time
    ptx, report = compile_for_sm90(gpu_ell.ell_cuda_code(), tmp_path)
    for name in gpu_ell.ELL_KERNELS:
        compact = name == "dasknn_ell_compact"
        threads = gpu_ell.ELL_COMPACT_THREADS if compact else gpu_ell.ELL_LAYER_KERNELS[name][2]
        blocks = 1 if compact else gpu_ell.ELL_THREADS_PER_SM // threads
        k = report[name]
        bound = re.search(rf"\.entry {name}\((?:.|\n)*?\.maxntid (\d+), 1, 1", ptx)
        assert bound and int(bound[1]) == threads, name
        per_warp = -(-k["registers"] * 32 // 256) * 256  # registers are allocated per warp, 256 at a time
        assert k["spills"] == 0, (name, k)
        assert blocks * (threads // 32) * per_warp <= SM90_REGISTERS, (name, k)
        # a block's static shared memory and the default buffers within what one block may opt in to
        assert k["smem"] + ell.ELL_SHARED_BYTES <= SM90_SHARED_OPTIN, (name, k)
    assert "fma." not in ptx and "mul.rn.f32" in ptx and "add.rn.f64" in ptx
    assert "ld.shared.v4.f32" in ptx and "ld.shared.v2.f64" in ptx


# --- on a GPU ------------------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("graph", [False, True])
def test_gpu_ell_loop_equals_todays_loop(slice_paths, dtype, graph):
    import cupy

    from dasknn import io

    net = io.read_network(slice_paths["network"])
    images = io.read_images(slice_paths["images"])
    layers = [tuple(cupy.asarray(a) for a in (w.indptr, w.indices, w.data.astype(dtype))) for w in net.layers]
    yt = cupy.asarray(kernels.dense_transposed(images, np.dtype(dtype)))
    ids = np.arange(yt.shape[1])
    want_yt, want_ids = kernels.run_layers_gpu(yt, layers, net.bias, net.ymax, ids, loop="layers")
    lays = gpu_ell.ell_layers(layers, yt.shape[0], dtype, gpu_ell.ELL_DEFAULT_MINIBATCH[np.dtype(dtype).itemsize])
    loop = gpu_ell.EllLoop(lays, yt.shape[1], dtype, net.bias, net.ymax,
                           gpu_ell.ELL_DEFAULT_MINIBATCH[np.dtype(dtype).itemsize], graph)
    for _ in range(3):  # the first run launches; with graph, the second captures and the third replays
        got_yt, got_ids = loop.run(yt, ids)
        np.testing.assert_array_equal(got_ids, want_ids)
        np.testing.assert_array_equal(cupy.asnumpy(got_yt), cupy.asnumpy(want_yt))
    model = ell.ell_loop_numpy(cupy.asnumpy(yt), lays, net.bias, net.ymax, ids)
    np.testing.assert_array_equal(loop.counts, model[2])
    via = kernels.run_layers_gpu(yt, layers, net.bias, net.ymax, ids, loop="ell")
    np.testing.assert_array_equal(via[1], want_ids)
