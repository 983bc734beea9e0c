"""The fused kernel on the blocks each mode runs: the whole layer (data mode) against one part's block (model mode),
on one process alone and on several at once; or (``--compare``) today's kernel against the one before issue 18.

Usage (from the repository root)::

    python benchmarks/bench_kernel_shapes.py [--store bench-out/n65536-l480.zarr] [--layer 240] [--parts 2] \\
        [--processes 2] [--partition hypergraph-k2-s0-e0.03]
    git show 3835218:dasknn/kernels/cpu.py > /tmp/cpu_before.py     # the kernel to compare with
    python benchmarks/bench_kernel_shapes.py --compare --baseline /tmp/cpu_before.py [--images 60000] [--rounds 3] \\
        [--shapes 1024x8192,65536x256] [--skip-real]

``--compare`` times the library's CPU kernel against another version of ``dasknn/kernels/cpu.py`` (the
baseline), in one process and alternating so the shared machine's load falls on both alike: on generated layers
(32 inputs per neuron) at 1,024 .. 65,536 neurons, one step over a whole layer (model mode's parts and training
run single steps) and the loop over 8 layers (data mode's), and ``run_layers`` on the real n1024-l120 network
and its inputs, in float32 and float64; it prints the ratios and each kernel's multiply-adds per second against
this core's measured peak (``bench_machine.py``), and checks the results are bit-equal.

Each figure is :func:`dasknn.cost.kernel_rate` (multiply-adds per second over one of the kernel's tiles of
random activations), the measurement the cost model makes per mode. With ``--processes`` processes running it at
once, as that many workers would on one machine, the rate also shows what they take from each other's caches
and memory bandwidth. The partition is one saved in the store (a model-mode run or ``dasknn partition`` saves it).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import sys
import time

import numba
import numpy as np

DATA = "/work/shared/data/graphchallenge"


def _load_baseline(path: str):
    """The baseline kernel: another version of ``dasknn/kernels/cpu.py``, loaded as a module of the installed
    package so its relative imports resolve."""
    import importlib.util

    import dasknn.kernels  # noqa: F401  (the package the baseline's relative imports resolve against)

    spec = importlib.util.spec_from_file_location("dasknn.kernels.baseline_cpu", path)
    module = importlib.util.module_from_spec(spec)
    # compiled afresh each run: Numba's cache of a module loaded from a file outside the package does not load back
    # (the second run failed with "No module named '<dynamic>'")
    source = open(path).read().replace("cache=True", "cache=False")
    sys.modules[spec.name] = module  # (a dataclass looks its module up there)
    exec(compile(source, path, "exec"), module.__dict__)
    return module


def _old_run_layers(base, yt, layers, bias, ymax, ids, work=None):
    """The baseline's loop (``work`` gets the multiply-adds each layer really does: entries times the images
    still alive)."""
    if work is None:
        return base.run_layers_numpy(yt, layers, bias, ymax, ids)
    for indptr, indices, data in layers:
        work.append(indices.size * yt.shape[1])
        yt = base.layer_step_numpy(yt, indptr, indices, data, bias, ymax)
        keep = yt.any(axis=0)
        yt, ids = yt[:, keep], ids[keep]
        if yt.shape[1] == 0:
            break
    return yt, ids


def _generated_layers(neurons: int, count: int) -> list[tuple]:
    from dasknn import generate

    return [(w.indptr.astype(np.int64), w.indices, w.data.astype(np.float64))
            for w in generate.iter_layers(neurons, count, seed=1)]


def _alternate(calls: dict, rounds: int) -> dict:
    """Median seconds of each call, the calls run in turn ``rounds`` times (after one untimed warm-up)."""
    times: dict = {k: [] for k in calls}
    for f in calls.values():
        f()
    for _ in range(rounds):
        for k, f in calls.items():
            t0 = time.perf_counter()
            f()
            times[k].append(time.perf_counter() - t0)
    return {k: float(np.median(v)) for k, v in times.items()}


#: The generated layers' widths (neurons) and batches (images) ``--compare`` runs by default.
SHAPES = ((1024, 8192), (4096, 4096), (16384, 2048), (65536, 1024))


def _compare_layers(base, rounds: int, peaks: dict, shapes) -> None:
    from dasknn import kernels

    print("Generated layers; a step is one whole layer, the loop runs 8 layers (inputs at the clamp, so images")
    print("live on); multiply-adds count the images alive at each layer's input")
    print("| neurons | images | dtype | call | old madd/s | new madd/s | new / old | old % of peak | new % of peak |")
    print("|--:|--:|---|---|--:|--:|--:|--:|--:|")
    rng = np.random.default_rng(0)
    for neurons, images in shapes:
        layers = _generated_layers(neurons, 8)
        for dt in (np.float32, np.float64):
            ls = [(p, i, d.astype(dt)) for p, i, d in layers]
            yt = (rng.random((neurons, images)) < 0.25).astype(dt) * dt(32)
            ids = np.arange(images)
            work: list = []
            want = _old_run_layers(base, yt, ls, -0.3, 32.0, ids, work)
            np.testing.assert_array_equal(want[0], kernels.run_layers_numpy(yt, ls, -0.3, 32.0, ids)[0])
            step = ls[0]
            np.testing.assert_array_equal(base.layer_step_numpy(yt, *step, -0.3, 32.0),
                                          kernels.layer_step_numpy(yt, *step, -0.3, 32.0))
            for call, macs, old_f, new_f in (
                ("step", step[1].size * images, lambda: base.layer_step_numpy(yt, *step, -0.3, 32.0),
                 lambda: kernels.layer_step_numpy(yt, *step, -0.3, 32.0)),
                ("loop", sum(work), lambda: base.run_layers_numpy(yt, ls, -0.3, 32.0, ids),
                 lambda: kernels.run_layers_numpy(yt, ls, -0.3, 32.0, ids)),
            ):
                t = _alternate({"old": old_f, "new": new_f}, rounds)
                old, new = macs / t["old"], macs / t["new"]
                peak = peaks[np.dtype(dt).name]
                print(f"| {neurons} | {images} | {np.dtype(dt).name} | {call} | {old:.3g} | {new:.3g} "
                      f"| {new / old:.2f} | {100 * old / peak:.0f} % | {100 * new / peak:.0f} % |", flush=True)


def _compare_real(base, images: int, rounds: int, peaks: dict) -> None:
    from dasknn import io, kernels

    net = io.read_network(f"{DATA}/neuron1024.tar.gz")
    x = io.read_images(f"{DATA}/sparse-images-1024.tsv.gz")[:images]
    truth = io.read_categories(f"{DATA}/neuron1024-l120-categories.tsv")
    truth = truth[truth < images]
    layers = [(w.indptr, w.indices, w.data) for w in net.layers]
    edges = float(images) * sum(w.nnz for w in net.layers)
    print(f"\nrun_layers on n1024-l120, {images} images, one process (one core), median of {rounds}:")
    print("edges/s count every image at every layer, as the challenge does; useful multiply-adds/s count only the")
    print("images still alive, against one core's peak")
    print("| dtype | old s | new s | old edges/s | new edges/s | new / old | old useful madd/s | new useful madd/s "
          "| categories |")
    print("|---|--:|--:|--:|--:|--:|--:|--:|---|")
    rates = {}
    for dt in (np.float32, np.float64):
        ls = [(p, i, d.astype(dt)) for p, i, d in layers]
        yt0 = kernels.dense_transposed(x, dt)
        ids = np.arange(images)
        got: dict = {}
        calls = {k: (lambda k=k, f=f: got.__setitem__(k, f(yt0, ls, net.bias, net.ymax, ids)))
                 for k, f in (("old", base.run_layers_numpy), ("new", kernels.run_layers_numpy))}
        t = _alternate(calls, rounds)
        work: list = []
        _old_run_layers(base, yt0, ls, net.bias, net.ymax, ids, work)
        (yo, io_), (yn, in_) = got["old"], got["new"]
        same = np.array_equal(io_, in_) and np.array_equal(yo, yn)
        cats = np.sort(in_[yn.any(axis=0)])
        verdict = "bit-equal to the old kernel" if same else "DIFFERENT from the old kernel"
        if dt == np.float64:
            verdict += ", equal to the truth" if np.array_equal(cats, truth) else ", NOT the truth"
        rates[dt] = edges / t["new"]
        useful = sum(work) / t["new"], sum(work) / t["old"]
        print(f"| {np.dtype(dt).name} | {t['old']:.2f} | {t['new']:.2f} | {edges / t['old']:.3g} | {rates[dt]:.3g} "
              f"| {t['old'] / t['new']:.2f} | {useful[1]:.3g} = {100 * useful[1] / peaks[np.dtype(dt).name]:.0f} % "
              f"| {useful[0]:.3g} = {100 * useful[0] / peaks[np.dtype(dt).name]:.0f} % | {verdict} |")
    print(f"float64 / float32 (new): {rates[np.float64] / rates[np.float32]:.2f}")


def compare(argv: list[str]) -> None:
    """The ``--compare`` run (see the module docstring)."""
    from bench_machine import peak_madd

    ap = argparse.ArgumentParser()
    ap.add_argument("--compare", action="store_true")
    ap.add_argument("--images", type=int, default=60000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--skip-real", action="store_true")
    ap.add_argument("--shapes", default=",".join(f"{n}x{b}" for n, b in SHAPES),
                    help="generated layers' NEURONSxIMAGES, comma-separated (default %(default)s)")
    ap.add_argument("--baseline", required=True, help="another version of dasknn/kernels/cpu.py to compare with")
    args = ap.parse_args(argv)
    base = _load_baseline(args.baseline)
    peaks = {np.dtype(dt).name: peak_madd(dt, 0.5) for dt in (np.float32, np.float64)}
    print(f"peak multiply-adds/s on one core: float32 {peaks['float32']:.3g}, float64 {peaks['float64']:.3g}")
    print(f"numba {numba.__version__}; % of peak counts one multiply-add per edge and image")
    shapes = [tuple(int(v) for v in one.split("x")) for one in args.shapes.split(",")]
    _compare_layers(base, args.rounds, peaks, shapes)
    if not args.skip_real:
        _compare_real(base, args.images, args.rounds, peaks)


def _rate(args: tuple) -> float:
    from dasknn import cost

    return cost.kernel_rate(*args)


def main() -> None:
    import sys

    if "--compare" in sys.argv:
        compare(sys.argv[1:])
        return

    from dasknn.store import load_partition, open_store

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--store", default="bench-out/n65536-l480.zarr")
    ap.add_argument("--layer", type=int, default=None, help="default: the middle layer")
    ap.add_argument("--parts", type=int, default=2)
    ap.add_argument("--processes", type=int, default=2)
    ap.add_argument("--partition", default=None, help="saved partition name (default: hypergraph-k{parts}-s0-e0.03)")
    ap.add_argument("--dtype", default="float32")
    args = ap.parse_args()
    s = open_store(args.store, check="lazy")
    k = args.layer or max(1, s.depth // 2)
    name = args.partition or f"hypergraph-k{args.parts}-s0-e0.03"
    found = load_partition(args.store, name)
    if found is None:
        raise SystemExit(f"{args.store}: no saved partition {name!r}")
    owners = np.ascontiguousarray(found[0][k - 1:k + 1])
    print(f"kernel rates, {s.neurons} x {s.depth} layer {k}, {args.dtype}, multiply-adds per second per process")
    print("| block | 1 process | " + f"{args.processes} processes at once (each) |")
    print("|---|---|---|")
    ctx = mp.get_context("spawn")
    for label, spec in (("whole layer (data mode)", None), (f"part 0 of {args.parts} (model mode)", owners)):
        one = _rate((args.store, k, args.dtype, spec, 0))
        with ctx.Pool(args.processes) as pool:
            many = pool.map(_rate, [(args.store, k, args.dtype, spec, i % args.parts if spec is not None else 0)
                                    for i in range(args.processes)])
        print(f"| {label} | {one:.3g} | " + ", ".join(f"{r:.3g}" for r in many) + " |")


if __name__ == "__main__":
    main()
