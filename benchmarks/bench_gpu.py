"""GPU benchmark (issues 9, 19): the fused CuPy kernels on one GPU, in a plain loop and through the Dask engine,
then generated networks, then the straightforward cupyx loop.

Usage (from the repository root, with the shared data beside the checkout, on a machine with a CUDA device)::

    python benchmarks/bench_gpu.py [--images 60000] [--repeats 5] [--generated 4096,16384,65536]

Sections run cheapest and most important first, and each prints its table as soon as it is measured, so a run
cut short by a timeout still brings back what it measured:

1. Real n1024-l120, its images: the fused kernels (:func:`dasknn.kernels.run_layers_gpu`) in a plain Python loop,
   timed as the challenge counts (weights already on the GPU; the input copied, densified and run; categories
   back on the host), per kernel variant and compaction interval; float64 checked exactly against the truth.
2. The same through the Dask engine, data mode, one worker on the GPU (``dask_cuda.LocalCUDACluster`` when
   installed, else a LocalCluster of 1 worker x 1 thread); the engine's own clock (inputs already loaded), set
   beside the loop timed the same way.
3. Generated N x 120 networks (dasknn.generate): rates, and categories against the SciPy reference on a subset.
4. The straightforward cupyx loop: sparse activations times sparse weights per layer (SpGEMM), then the rule,
   as a CuPy port of the SciPy reference (slow: last, one repeat by default).

Every figure is the median of ``--repeats`` runs after a warm-up, with the device synchronised around each run
(CUDA events give the same to within microseconds). Rows print as measured, each section's table after it, and
the whole table last.
Without a CUDA device it prints one line starting "no GPU" and exits with status 1.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable
from datetime import date
from pathlib import Path

import numpy as np

ROWS: list[tuple[str, ...]] = []


def gpu_count() -> tuple[int, str]:
    """Visible CUDA devices, and why there are none (a device count, not merely an import)."""
    with warnings.catch_warnings():  # a warning while CuPy imports is not a missing device
        warnings.simplefilter("ignore")
        try:
            import cupy
        except ImportError as e:
            return 0, f"CuPy is not installed ({e})"
        try:
            n = int(cupy.cuda.runtime.getDeviceCount())
        except Exception as e:  # no driver, no device
            return 0, f"{type(e).__name__}: {e}"
    return n, "no CUDA device is visible" if n == 0 else ""


def timed(fn: Callable[[], object], repeats: int) -> tuple[float, object]:
    """Median seconds of ``repeats`` runs of ``fn`` after one warm-up, the device synchronised around each."""
    import cupy

    result = fn()
    times = []
    for _ in range(repeats):
        cupy.cuda.Device().synchronize()
        start, stop = cupy.cuda.Event(), cupy.cuda.Event()
        start.record()
        t0 = time.perf_counter()
        result = fn()
        stop.record()
        stop.synchronize()
        wall = time.perf_counter() - t0
        times.append(max(wall, cupy.cuda.get_elapsed_time(start, stop) / 1e3))
    return statistics.median(times), result


HEAD = ("case", "images", "ms", "TeraEdges/s", "mismatched", "note")


def row(*cells: object) -> None:
    ROWS.append(tuple(str(c) for c in cells))
    print("  " + " | ".join(ROWS[-1]), flush=True)


def table(title: str, rows: list[tuple[str, ...]]) -> None:
    """A Markdown table of ``rows``, printed at once (a section's as it ends, all of them last)."""
    print(f"\n{title}\n| " + " | ".join(HEAD) + " |\n|" + "---|" * len(HEAD), flush=True)
    for r in rows:
        print("| " + " | ".join(r) + " |", flush=True)


def dense_on_device(images, dtype):
    """The CSR images (``B x N``) as dense transposed activations (``N x B``) on the GPU: the sparse arrays are
    copied, the dense ones made there (far fewer bytes cross the bus)."""
    import cupy

    indptr = cupy.asarray(images.indptr)
    cols = cupy.asarray(images.indices)
    rows = cupy.searchsorted(indptr, cupy.arange(images.nnz), side="right") - 1
    yt = cupy.zeros((images.shape[1], images.shape[0]), dtype=dtype)
    yt[cols, rows] = cupy.asarray(images.data).astype(dtype)
    return yt


def fused_loop(images, layers, bias: float, ymax: float, dtype, variant: str = "auto",
               compact_every: int | None = None) -> np.ndarray:
    """Inference as the challenge times it: input copied and densified, every layer, categories on the host."""
    from dasknn import kernels

    yt = dense_on_device(images, dtype)
    _, ids = kernels.run_layers_gpu(yt, layers, bias, ymax, np.arange(images.shape[0]), compact_every, variant)
    return np.sort(ids)


def device_layers(net, dtype) -> list[tuple]:
    import cupy

    return [(cupy.asarray(w.indptr.astype(np.int64)), cupy.asarray(w.indices.astype(np.int32)),
             cupy.asarray(w.data.astype(dtype))) for w in net.layers]


def to_cupyx(m, dtype):
    """A SciPy sparse matrix as a cupyx CSR matrix of ``dtype`` (int32 indices, as cuSPARSE takes)."""
    import cupy
    import cupyx.scipy.sparse as csp

    m = m.tocsr()
    return csp.csr_matrix((cupy.asarray(m.data.astype(dtype)), cupy.asarray(m.indices.astype(np.int32)),
                           cupy.asarray(m.indptr.astype(np.int32))), shape=m.shape)


def cupyx_loop(images, layers_csr, bias: float, ymax: float, dtype) -> np.ndarray:
    """The CuPy port of the SciPy reference: ``Y = h(Y @ W)`` with sparse ``Y`` and ``W`` (cuSPARSE SpGEMM)."""
    import cupy
    import cupyx.scipy.sparse as csp

    y = to_cupyx(images, dtype)
    for w in layers_csr:
        z = y @ w
        data = z.data + dtype.type(bias)
        data = cupy.where(z.data != 0, cupy.clip(data, 0, ymax), 0).astype(dtype)
        # keep the nonzeros only (the rule's zeros are not entries of the next product)
        keep = data != 0
        rows = cupy.searchsorted(z.indptr, cupy.arange(z.nnz), side="right") - 1
        counts = cupy.bincount(rows[keep], minlength=z.shape[0])
        indptr = cupy.concatenate([cupy.zeros(1, dtype=cupy.int32), cupy.cumsum(counts).astype(cupy.int32)])
        y = csp.csr_matrix((data[keep], z.indices[keep], indptr), shape=z.shape)
    return np.sort(cupy.asnumpy(cupy.flatnonzero(cupy.diff(y.indptr))))


def engine_runs(store: Path, inputs: Path, chunks: int, dtype: str, repeats: int):
    """Median engine seconds (its own clock) and the last result, one GPU worker."""
    from distributed import Client, LocalCluster

    from dasknn import engine

    try:
        from dask_cuda import LocalCUDACluster

        cluster = LocalCUDACluster(n_workers=1, threads_per_worker=1, host="127.0.0.1",
                                   dashboard_address="127.0.0.1:0")
        kind = "LocalCUDACluster"
    except Exception:  # dask-cuda missing (or unable to start): one plain worker process, one thread
        cluster = LocalCluster(n_workers=1, threads_per_worker=1, processes=True, host="127.0.0.1",
                               dashboard_address="127.0.0.1:0")
        kind = "LocalCluster"
    with cluster, Client(cluster) as client:
        results = [engine.infer(store, inputs, client, mode="data", chunks=chunks, dtype=dtype, backend="gpu")
                   for _ in range(repeats + 1)]  # the first warms the worker (CUDA context, kernel compile)
    return statistics.median(r.seconds for r in results[1:]), results[-1], kind


class Bench:
    """What every section shares: the real network and images on the host, its truth, the rates so far."""

    def __init__(self, args: argparse.Namespace, card: str):
        from dasknn import io

        self.args, self.card = args, card
        data = Path(args.data)
        self.data = data
        self.n = args.images
        self.net = io.read_network(data / "neuron1024.tar.gz")
        self.images = io.read_images(data / "sparse-images-1024.tsv.gz")[:self.n]
        truth = io.read_categories(data / "neuron1024-l120-categories.tsv")
        self.truth = truth[truth < self.n]
        self.rates: dict[str, float] = {}
        self.loop_kernels_only: float | None = None
        self.layers32 = device_layers(self.net, np.dtype(np.float32))
        print(f"real n1024-l120: {self.net.edges} edges, {self.n} images, {self.truth.size} categories in the truth",
              flush=True)

    def record(self, name: str, seconds: float, cats: np.ndarray, count: int, edges: int, want: np.ndarray,
               note: str = "") -> None:
        from dasknn.kernels.gpu import gpu_loop

        name = f"{name} [ELL loop]" if gpu_loop() == "ell" else name
        rate = count * edges / seconds
        self.rates[name] = rate
        wrong = np.setxor1d(cats, want).size
        row(name, f"{count}", f"{seconds * 1e3:.2f}", f"{rate / 1e12:.2f}", str(wrong), note)


def section_loop(b: Bench) -> None:
    """The fused kernels in a plain loop, per variant and compaction interval; float64 against the truth."""
    from dasknn import kernels

    f32, f64, net, n, repeats = np.dtype(np.float32), np.dtype(np.float64), b.net, b.n, b.args.repeats
    for variant, every in (("auto", None), ("gather", None), ("auto", 1), ("auto", 8)):
        s, cats = timed(lambda: fused_loop(b.images, b.layers32, net.bias, net.ymax, f32, variant, every), repeats)
        b.record(f"fused loop {variant}, compact every {every or 'default'}", s, cats, n, net.edges, b.truth,
                 "float32: a handful may differ from the float64 truth")
    layers64 = device_layers(net, f64)
    s, cats = timed(lambda: fused_loop(b.images, layers64, net.bias, net.ymax, f64), repeats)
    b.record("fused loop float64", s, cats, n, net.edges, b.truth, "must be 0 mismatched")
    del layers64
    # the engine's clock starts with the inputs on the GPU: the same loop without the copy, for its overhead
    bounds = np.linspace(0, n, b.args.chunks + 1).astype(int)
    parts = [dense_on_device(b.images[lo:hi], f32) for lo, hi in zip(bounds[:-1], bounds[1:])]

    def kernels_only() -> np.ndarray:
        ids = [kernels.run_layers_gpu(yt, b.layers32, net.bias, net.ymax, np.arange(lo, hi))[1]
               for yt, lo, hi in zip(parts, bounds[:-1], bounds[1:])]
        return np.sort(np.concatenate(ids))

    b.loop_kernels_only, cats = timed(kernels_only, repeats)
    b.record(f"fused loop, inputs on GPU, {b.args.chunks} chunk(s)", b.loop_kernels_only, cats, n, net.edges,
             b.truth, "as the engine's clock counts")


def section_engine(b: Bench) -> None:
    """The Dask engine, data mode, one GPU worker, weights resident, beside the loop timed the same way."""
    from dasknn.cli import import_network
    from dasknn.store import write_inputs_store

    with tempfile.TemporaryDirectory() as tmp:
        store = import_network(b.data / "neuron1024.tar.gz", Path(tmp) / "real.zarr")
        inputs = write_inputs_store(Path(tmp) / "in.zarr", b.images)
        for dtype in b.args.engine_dtypes.split(","):
            s, r, kind = engine_runs(store, inputs, b.args.chunks, dtype, b.args.repeats)
            over = (f"overhead {s / b.loop_kernels_only - 1:+.1%} vs the loop"
                    if b.loop_kernels_only and dtype == "float32" else "must be 0 mismatched" if dtype == "float64"
                    else "")
            b.record(f"Dask engine ({kind}, 1 worker, {r.chunks} chunk(s), {dtype})", s, r.categories, b.n,
                     b.net.edges, b.truth, over)


def section_generated(b: Bench) -> None:
    """Generated N x 120 networks: rates, and categories against the SciPy reference on the first images."""
    import cupy
    import scipy.sparse as sp

    from dasknn import generate, reference

    f32 = np.dtype(np.float32)
    for neurons in [int(x) for x in b.args.generated.split(",") if x]:
        count = b.args.gen_images or min(60000, 2**28 // neurons)
        t0 = time.perf_counter()
        gnet = generate.network(neurons, 120)
        gimages = sp.csr_matrix(generate.images(count, neurons))
        made = time.perf_counter() - t0
        glayers = device_layers(gnet, f32)
        s, cats = timed(lambda: fused_loop(gimages, glayers, gnet.bias, gnet.ymax, f32), b.args.repeats)
        check = max(1, min(count, b.args.check_work // neurons))
        ref = reference.infer_categories(gnet.layers, gimages[:check], gnet.bias, gnet.ymax, f32)
        b.record(f"generated {neurons} x 120, fused loop", s, cats[cats < check], count, gnet.edges, ref,
                 f"mismatched of the first {check} (SciPy reference); generated in {made:.0f} s")
        del glayers
        cupy.get_default_memory_pool().free_all_blocks()


def section_cupyx(b: Bench) -> None:
    """The cupyx loop (SpGEMM per layer), weights on the GPU beforehand as for the others."""
    f32 = np.dtype(np.float32)
    dev_csr = [to_cupyx(w, f32) for w in b.net.layers]
    s, cats = timed(lambda: cupyx_loop(b.images, dev_csr, b.net.bias, b.net.ymax, f32), b.args.cupyx_repeats)
    best = max((v for k, v in b.rates.items() if k.startswith(("fused loop auto, compact every default",
                                                               "Dask engine"))), default=float("nan"))
    b.record("cupyx loop (SpGEMM, reference port)", s, cats, b.n, b.net.edges, b.truth,
             f"fused / cupyx: {best / (b.n * b.net.edges / s):.1f}x")


SECTIONS = {"loop": section_loop, "engine": section_engine, "generated": section_generated, "cupyx": section_cupyx}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=str(Path(__file__).resolve().parents[2] / "shared/data/graphchallenge"))
    ap.add_argument("--images", type=int, default=60000, help="real images to run (default: all 60,000)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--chunks", type=int, default=1, help="image chunks in the engine (and the loop beside it)")
    ap.add_argument("--engine-dtypes", default="float32", help="comma list of the engine section's dtypes")
    ap.add_argument("--cupyx-repeats", type=int, default=1)
    ap.add_argument("--generated", default="4096,16384,65536", help="neurons of generated 120-layer networks")
    ap.add_argument("--gen-images", type=int, default=0,
                    help="images per generated network (default: min(60000, 2**28 / neurons))")
    ap.add_argument("--check-work", type=int, default=2**20,
                    help="images x neurons checked against the SciPy reference per generated network")
    ap.add_argument("--skip", default="", help="comma list of sections to skip: " + ",".join(SECTIONS))
    ap.add_argument("--gpu-loop", choices=("layers", "ell"), default=None,
                    help="the GPU loop every section runs, the engine's workers included (DASKNN_GPU_LOOP; issue 44)")
    args = ap.parse_args()
    if args.gpu_loop:
        os.environ["DASKNN_GPU_LOOP"] = args.gpu_loop  # before the cluster starts: its workers inherit it

    n_gpu, why = gpu_count()
    if n_gpu == 0:
        print(f"no GPU: {why}; bench_gpu.py needs a CUDA device", flush=True)
        sys.exit(1)

    import cupy

    skip = set(filter(None, args.skip.split(",")))
    props = cupy.cuda.runtime.getDeviceProperties(0)
    card = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    print(f"dasknn GPU benchmark, {date.today()}, {platform.node()}, {card}, CuPy {cupy.__version__}, "
          f"{os.cpu_count()} cores", flush=True)
    b = Bench(args, card)
    print("  " + " | ".join(HEAD), flush=True)
    failed = []
    for name, section in SECTIONS.items():
        if name in skip:
            continue
        t0, first = time.perf_counter(), len(ROWS)
        try:
            section(b)
        except Exception:  # the later sections still run; the exit status says one failed
            traceback.print_exc()
            failed.append(name)
        table(f"{name}: {card}, {date.today()}, {time.perf_counter() - t0:.0f} s", ROWS[first:])
    table(f"all: {card}, {date.today()}, float32 unless named; rate = images x edges / median seconds", ROWS)
    if failed:
        print(f"sections that failed: {', '.join(failed)}", flush=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
