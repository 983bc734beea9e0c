"""Issue 44's ELL loop beside today's GPU loop, and its CPU rehearsal (the sections ``bench_gpu_kernels.py`` runs as
``--sections ell,generated`` and ``--dry-run``).

On a device (:func:`section_ell`, :func:`section_generated`): the whole loop, as the challenge times it from the
dense input on the GPU (inputs copied into the loop's buffer, every layer, the survivors' categories on the host),
today's loop (``run_layers_gpu``, a launch a layer, compaction every 4 layers by the host) against the ELL loop
(:class:`dasknn.kernels.gpu_ell.EllLoop`) for each minibatch, launched layer by layer and replayed as one CUDA
graph; each ELL result checked bit for bit against today's (activations and ids), categories against the truth.
Rates are nominal: all images x all layers' edges / median seconds. "layers ms" is the ELL loop's device time
alone (CUDA events around its launches or its graph), the kernel-only figure the issue asks for.

Without a device (:func:`dry_run`): the same arguments, the ELL layouts built for the real network (and two layers
of each generated width), their launch shapes, the NumPy model of the loop on a few images checked bit for bit
against the CPU loop and the truth, and the CUDA source compiled for sm_90 by nvcc and ptxas where they exist.
"""

from __future__ import annotations

import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np

HEAD = "| case | dtype | minibatch | graph | images | ms | layers ms | TeraEdges/s | equal to today's | wrong |"


def minibatches(spec: str, itemsize: int) -> list[int]:
    """The minibatches of ``spec`` (comma list) the kernels have for ``itemsize``; all of them when empty."""
    from dasknn.kernels.gpu_ell import ELL_MINIBATCHES

    have = ELL_MINIBATCHES[itemsize]
    asked = [int(x) for x in spec.split(",") if x] or list(have)
    return [m for m in asked if m in have]


def ints(spec: str) -> list[int]:
    """A comma list of integers."""
    return [int(x) for x in spec.split(",") if x]


def budgets(args) -> list[int]:
    """The shared memory a block's buffer may take, KiB, of ``--ell-shared-kib`` (a whole footprint in one buffer
    pads nothing; a smaller buffer lets more blocks share a multiprocessor)."""
    return ints(args.ell_shared_kib)


def timed_runs(fn, repeats: int) -> float:  # pragma: no cover - needs a GPU
    """Median seconds of ``fn`` after one warm-up, the device synchronised around each run."""
    import cupy

    fn()
    times = []
    for _ in range(repeats):
        cupy.cuda.Device().synchronize()
        t0 = time.perf_counter()
        fn()
        cupy.cuda.Device().synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def compare_loops(label: str, y0, layers_d, layers_h, bias: float, ymax: float, edges: int, args,
                  mbs: list[int], kibs: list[int], threads: list[int], truth=None,
                  graphs: tuple[bool, ...] = (False, True)) -> None:  # pragma: no cover - needs a GPU
    """Today's loop and the ELL loop for each block size of ``threads``, buffer size of ``kibs`` (KiB), minibatch
    of ``mbs`` and setting of ``graphs`` on the dense input ``y0`` (on the GPU), one table row each as measured."""
    import cupy

    from dasknn import kernels
    from dasknn.kernels import gpu_ell

    dtype = np.dtype(y0.dtype)
    n = y0.shape[1]
    ids = np.arange(n)

    def today():
        return kernels.run_layers_gpu(y0.copy(), layers_d, bias, ymax, ids, loop="layers")

    s = timed_runs(today, args.repeats)
    want_yt, want_ids = today()
    wrong = "" if truth is None else np.setxor1d(want_ids, truth).size
    print(f"| {label}, today's loop | {dtype} | - | - | {n} | {s * 1e3:.2f} | - | {n * edges / s / 1e12:.2f} | - "
          f"| {wrong} |", flush=True)
    want_host = cupy.asnumpy(want_yt)
    del want_yt
    configs = [(t, kib, mb) for t in threads for kib in kibs for mb in mbs if mb * dtype.itemsize <= kib * 1024]
    for block, kib, mb in configs:
        t0 = time.perf_counter()
        lays = gpu_ell.ell_layers(layers_h, y0.shape[0], dtype, mb, kib * 1024, block)
        built = time.perf_counter() - t0
        padding = np.mean([x.padding for x in lays])
        for graph in graphs:
            loop = gpu_ell.EllLoop(lays, n, dtype, bias, ymax, mb, graph)
            loop.run(y0, ids)  # the first run loads the kernels; with graph, the second captures
            s = timed_runs(lambda loop=loop: loop.run(y0, ids), args.repeats)
            parts: dict[str, float] = {}
            got_yt, got_ids = loop.run(y0, ids, timings=parts)
            same = bool(np.array_equal(got_ids, want_ids) and np.array_equal(cupy.asnumpy(got_yt), want_host))
            wrong = "" if truth is None else np.setxor1d(got_ids, truth).size
            print(f"| {label}, ELL loop ({block} threads, {kib} KiB buffers, {padding:.0%} padding; layout "
                  f"{built:.1f} s) | {dtype} "
                  f"| {mb} | {graph} | {n} | {s * 1e3:.2f} "
                  f"| {parts['layers'] * 1e3:.2f} | {n * edges / s / 1e12:.2f} | {same} | {wrong} |", flush=True)
            del loop, got_yt
            cupy.get_default_memory_pool().free_all_blocks()


def section_ell(args, net, images, truth) -> None:  # pragma: no cover - needs a GPU
    """The real network, ``--images`` images, each dtype of ``--ell-dtypes`` (its footprints fit any buffer: the
    first size of ``--ell-shared-kib`` only)."""
    from bench_gpu import dense_on_device, device_layers

    print(f"\n4. the ELL loop against today's, real n1024-l120\n{HEAD}\n|" + "---|" * 10, flush=True)
    for name in args.ell_dtypes.split(","):
        dtype = np.dtype(name)
        layers_d = device_layers(net, dtype)
        y0 = dense_on_device(images, dtype)
        compare_loops("n1024-l120", y0, layers_d, layers_d, net.bias, net.ymax, net.edges, args,
                      minibatches(args.minibatches, dtype.itemsize), budgets(args)[:1], ints(args.ell_threads), truth)
        del y0, layers_d


def section_generated(args) -> None:  # pragma: no cover - needs a GPU
    """Generated N x 120 networks of ``--generated`` widths, ``--gen-images`` images each, float32, the ELL loop at
    the minibatches of ``--gen-minibatches`` as one graph only (a 65,536-wide network's layouts take minutes to
    build on the host)."""
    import cupy
    import scipy.sparse as sp

    from bench_gpu import dense_on_device, device_layers

    from dasknn import generate

    print(f"\n5. the ELL loop against today's, generated networks\n{HEAD}\n|" + "---|" * 10, flush=True)
    f32 = np.dtype(np.float32)
    for neurons in [int(x) for x in args.generated.split(",") if x]:
        gnet = generate.network(neurons, 120)
        gimages = sp.csr_matrix(generate.images(args.gen_images, neurons))
        layers_d = device_layers(gnet, f32)
        y0 = dense_on_device(gimages, f32)
        host = [(w.indptr, w.indices, w.data.astype(f32)) for w in gnet.layers]
        compare_loops(f"generated {neurons} x 120", y0, layers_d, host, gnet.bias, gnet.ymax, gnet.edges, args,
                      minibatches(args.gen_minibatches, 4), budgets(args), ints(args.gen_threads), graphs=(True,))
        del y0, layers_d
        cupy.get_default_memory_pool().free_all_blocks()


def profile_ell(net, images, minibatch: int) -> None:  # pragma: no cover - needs a GPU
    """The ELL loop run twice without a graph (the kernels each a launch of their own, for Nsight Compute)."""
    import cupy
    from bench_gpu import dense_on_device, device_layers

    from dasknn.kernels import gpu_ell

    f32 = np.dtype(np.float32)
    layers_d = device_layers(net, f32)
    y0 = dense_on_device(images, f32)
    loop = gpu_ell.EllLoop(gpu_ell.ell_layers(layers_d, y0.shape[0], f32, minibatch), y0.shape[1], f32, net.bias,
                           net.ymax, minibatch, graph=False)
    for _ in range(2):
        loop.run(y0, np.arange(y0.shape[1]))
    cupy.cuda.Device().synchronize()


def dry_run(args, net, images, truth) -> None:
    """Everything the device sections do that needs no device (see the module's description)."""
    from dasknn import generate, kernels
    from dasknn.kernels import ell, gpu_ell

    print("dry run: no device used", flush=True)
    for name in args.ell_dtypes.split(","):
        dtype = np.dtype(name)
        layers = [(w.indptr, w.indices, w.data.astype(dtype)) for w in net.layers]
        for block, mb in ((t, mb) for t in ints(args.ell_threads) for mb in minibatches(args.minibatches,
                                                                                         dtype.itemsize)):
            t0 = time.perf_counter()
            lays = gpu_ell.ell_layers(layers, net.layers[0].shape[0], dtype, mb, threads=block)
            built = time.perf_counter() - t0
            launch = gpu_ell.ell_launch(lays[0], args.images, dtype.itemsize, mb)
            print(f"  n1024 {dtype} minibatch {mb}, {block} threads: layouts in {built:.1f} s, {launch.kernel} grid {launch.grid} "
                  f"x {launch.block} threads, {launch.shared_bytes} B shared, padding "
                  f"{np.mean([x.padding for x in lays]):.3f}", flush=True)
        count = min(args.dry_images, images.shape[0])
        yt = kernels.dense_transposed(images[:count], dtype)
        got_yt, got_ids, counts = ell.ell_loop_numpy(yt, lays, net.bias, net.ymax, np.arange(count))
        want_yt, want_ids = kernels.run_layers(yt, layers, net.bias, net.ymax, np.arange(count))
        same = np.array_equal(got_ids, want_ids) and np.array_equal(got_yt, want_yt)
        wrong = np.setxor1d(got_ids, truth[truth < count]).size
        print(f"  model of the ELL loop, {count} images, {dtype}: equal to the CPU loop {same}, {wrong} categories "
              f"off the truth, alive into layers 1/2/30/120: {counts[0]}/{counts[1]}/{counts[29]}/{counts[119]}",
              flush=True)
        if not same:
            raise SystemExit("dry run: the ELL model differs from the CPU loop")
    for neurons in [int(x) for x in args.generated.split(",") if x]:
        gnet = generate.network(neurons, 2)
        for block, kib, mb in ((t, kib, mb) for t in ints(args.gen_threads) for kib in budgets(args)
                               for mb in minibatches(args.gen_minibatches, 4)):
            t0 = time.perf_counter()
            lays = gpu_ell.ell_layers([(w.indptr, w.indices, w.data) for w in gnet.layers], neurons, np.float32,
                                      mb, kib * 1024, block)
            per = (time.perf_counter() - t0) / 2
            launch = gpu_ell.ell_launch(lays[0], args.gen_images, 4, mb)
            print(f"  generated {neurons}, minibatch {mb}, {block} threads, {kib} KiB buffers: layout {per:.2f} s a layer (about {120 * per:.0f} s "
                  f"for 120 here), {int(np.diff(lays[0].block_buffers).max())} buffers a block, padding "
                  f"{lays[0].padding:.3f}, grid {launch.grid}, {launch.shared_bytes} B shared", flush=True)
    compile_report()


def compile_report() -> None:
    """The ELL source through nvcc and ptxas for sm_90 (registers, spills, shared memory), where they exist."""
    from dasknn.kernels import gpu_ell
    from dasknn.kernels.nvrtc import GPU_COMPILE_OPTIONS

    nvcc, ptxas = shutil.which("nvcc"), shutil.which("ptxas")
    if not (nvcc and ptxas):
        print("  (no nvcc or ptxas here: the source was not compiled)", flush=True)
        return
    with tempfile.TemporaryDirectory(prefix="ell-ptx-") as tmp:
        src, ptx = Path(tmp) / "ell.cu", Path(tmp) / "ell.ptx"
        src.write_text(gpu_ell.ell_cuda_code())
        subprocess.run([nvcc, "--ptx", "-arch=compute_90", *GPU_COMPILE_OPTIONS, "-o", str(ptx), str(src)],
                       check=True)
        r = subprocess.run([ptxas, "-arch=sm_90", "-v", "-o", str(Path(tmp) / "ell.cubin"), str(ptx)],
                           capture_output=True, text=True, check=True)
    name = ""
    for line in r.stderr.splitlines():
        if "Function properties for" in line:
            name = line.rsplit(" ", 1)[-1]
        elif "spill" in line or "Used" in line:
            print(f"  ptxas sm_90 {name}: {line.split(':', 1)[-1].strip()}", flush=True)
