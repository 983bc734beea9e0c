"""Partition quality and time on the challenge network, its label-shuffled copy and a generated wide network.

For every network and K it prints one row per method: total volume (connectivity-1 summed over layers), the
ratio to ``random`` at the same K, the busiest part's sends, the worst layer's work imbalance and the time
to partition. Targets (issue 3): at K = 16 the default ``hypergraph`` sends at most 1/10 of ``random``,
imbalance <= 3 % in every layer, under 60 s on 2 cores; the same on the shuffled copy; a generated
16384 x 120 network partitions at K = 16 in under 10 minutes. Issue 16 adds ``fast`` and ``fast-segments``
and a speed target: generated 65536 x 480 at K = 2 in at most 150 s (``--generated 65536 --generated-layers 480
--generated-parts 2 --no-real``).

Usage::

    python benchmarks/bench_partition.py                      # real + shuffled, K = 4, 16, 64
    python benchmarks/bench_partition.py --generated 16384    # adds the generated 16384 x 120 row (K = 16)
    python benchmarks/bench_partition.py --parts 16 --methods random hypergraph --plot bench-out/p16.png
    python benchmarks/bench_partition.py --parts 16 --methods random hypergraph fast fast-segments --generated 16384 \
        --generated-methods random hypergraph fast fast-segments --generated-layers 120
    python benchmarks/bench_partition.py --on-cluster 65536 1920 --parts 2 16   # on 2 workers of 2 GB (issue 16)
    python benchmarks/bench_partition.py --auto-vs-data 65536 120 200           # auto against --mode data
    python benchmarks/bench_partition.py --end-to-end 65536 480 1000            # model mode's first and second run

The machine matters: timings in BENCHMARKS.md come from a shared 2-core box and are noisy.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import scipy.sparse as sp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dasknn import partition as P  # noqa: E402
from dasknn.io import read_network  # noqa: E402

DATA = Path(os.environ.get("DASKNN_DATA", "/work/shared/data/graphchallenge")) / "neuron1024.tar.gz"
DEFAULT_METHODS = ["random", "block", "hypergraph-shared", "hypergraph", "hypergraph-layered"]


def shuffled(layers: list[sp.csc_matrix], seed: int) -> list[sp.csc_matrix]:
    """The same network with neuron labels permuted: one permutation for every layer's rows and columns."""
    perm = np.random.default_rng(seed).permutation(layers[0].shape[0])
    return [sp.csc_matrix(w[perm][:, perm]) for w in layers]


def run(
    name: str, layers: list[sp.csc_matrix], parts: list[int], methods: list[str], threads: int, rows: list[dict], plot: str | None
) -> None:
    for k in parts:
        random_volume = None
        for method in ["random"] + [m for m in methods if m != "random"]:
            t0 = time.perf_counter()
            owners = P.partition_network(layers, k, method, threads=threads)
            seconds = time.perf_counter() - t0
            rep = P.partition_report(layers, owners, method, seconds, parts=k)
            if method == "random":
                random_volume = rep["volume_total"]
                if "random" not in methods:
                    continue
            rep["network"] = name
            rep["ratio_to_random"] = rep["volume_total"] / random_volume if random_volume else float("nan")
            rows.append(rep)
            print(
                f"| {name:<22} | {method:<18} | {k:>3} | {rep['volume_total']:>10,} | {rep['ratio_to_random']:>7.4f} "
                f"| {rep['max_part_send']:>9,} | {rep['imbalance_max']:>7.2%} | {seconds:>8.1f} |",
                flush=True,
            )
            if plot and method == "hypergraph" and k == 16 and name == "n1024-l120":
                P.plot_partition(layers, owners, method, plot)


def _fresh_store(tmp: str, neurons: int, layers: int, images: int) -> Path:
    """A generated store with ``images`` images in ``tmp`` (no partition, no plan yet)."""
    import subprocess

    store = Path(tmp) / "net.zarr"
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "dasknn", "generate", "--neurons", str(neurons), "--layers", str(layers),
                    "--images", str(images), "--out", str(store)], check=True, capture_output=True)
    print(f"# generated {neurons} x {layers} with {images} images in {time.perf_counter() - t0:.1f} s")
    return store


def _infer_rows(store: Path, images: int, memory: str, runs: list[tuple[str, list[str]]]) -> dict[str, float]:
    """``dasknn infer`` on ``store`` once per ``(label, extra arguments)``, one after the other, each on its own
    fresh cluster of 2 workers of ``memory``: a table row each (wall time, what ran, the setup it spent, what auto
    predicted). Returns each label's wall seconds."""
    import subprocess

    print("| command | mode run | wall s | inference s | partition s | plan s | predicted |")
    print("|---|---|--:|--:|--:|--:|---|")
    walls: dict[str, float] = {}
    for label, extra in runs:
        cmd = [sys.executable, "-m", "dasknn", "infer", "--network", str(store), "--batch", str(images),
               "--workers", "2", "--memory-limit", memory, "--json", *extra]
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        if proc.returncode != 0:
            print(f"# {label} failed: {proc.stderr.strip()[-400:]}")
            continue
        walls[label] = wall
        r = json.loads(proc.stdout)
        model = [p for p in r.get("predictions", []) if p["mode"] == "model"]
        data = [p for p in r.get("predictions", []) if p["mode"] == "data"]
        told = (f"{model[0]['seconds']:.1f} s ({model[0]['setup_seconds']:.1f} s setup, "
                f"{model[0]['volumes_from']}); data {data[0]['seconds']:.1f} s") if model else "-"
        print(f"| {label} | {r['mode']} | {wall:.1f} | {r['seconds']:.1f} | "
              f"{r.get('partition_seconds', 0):.1f} | {r['plan_seconds']:.1f} | {told} |", flush=True)
    return walls


def auto_against_data(neurons: int, layers: int, images: int, memory: str) -> None:
    """Default ``dasknn infer`` (auto) on a fresh generated store against ``--mode data``, side by side: the
    wall time of each command (a fresh 2-worker cluster each), what auto chose, and its setup figures."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="bench-auto-") as tmp:
        store = _fresh_store(tmp, neurons, layers, images)
        walls = _infer_rows(store, images, memory, [("dasknn infer (auto)", []),
                                                    ("dasknn infer --mode data", ["--mode", "data"])])
    if len(walls) == 2:
        print(f"# auto / data wall time: {walls['dasknn infer (auto)'] / walls['dasknn infer --mode data']:.2f}")


def end_to_end(neurons: int, layers: int, images: int, memory: str) -> None:
    """Model mode on a fresh generated store twice (the first run partitions on the cluster and writes the part
    plan, the second reuses both), then streamed data mode, each on a fresh 2-worker cluster: wall times side by
    side, as ratios to data mode."""
    import tempfile

    first, second, data = ("model, first run (partition + plan + inference)", "model, second run (both reused)",
                           "data, streamed")
    with tempfile.TemporaryDirectory(prefix="bench-e2e-") as tmp:
        store = _fresh_store(tmp, neurons, layers, images)
        walls = _infer_rows(store, images, memory, [(first, ["--mode", "model"]), (second, ["--mode", "model"]),
                                                    (data, ["--mode", "data"])])
    if len(walls) == 3:
        print(f"# first run / data: {walls[first] / walls[data]:.2f}; second run / data: "
              f"{walls[second] / walls[data]:.2f} (wall times)")


def _peak_rss(proc) -> tuple[float, float]:
    """Poll a running process until it ends: its own peak resident bytes and the largest of its descendants'
    (a local cluster's workers)."""
    import psutil

    top = psutil.Process(proc.pid)
    own = others = 0.0
    while proc.poll() is None:
        try:
            own = max(own, top.memory_info().rss)
            for child in top.children(recursive=True):
                others = max(others, child.memory_info().rss)
        except psutil.Error:  # a process ended between listing and reading it
            pass
        time.sleep(0.2)
    return own, others


def on_cluster(neurons: int, layers: int, parts: list[int], memory: str, store_dir: str) -> None:
    """``dasknn partition --workers 2`` on a generated store (made once, kept in ``store_dir``), per K: wall time,
    the partition's figures, the client's peak memory and the largest worker's."""
    import subprocess

    store = Path(store_dir) / f"n{neurons}-l{layers}.zarr"
    if not store.exists():
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "dasknn", "generate", "--neurons", str(neurons), "--layers",
                        str(layers), "--out", str(store)], check=True, capture_output=True)
        print(f"# generated {store} in {time.perf_counter() - t0:.1f} s")
    print(f"| network | K | wall s | partition s | volume | worst imbalance | client peak GB | worker peak GB "
          f"(limit {memory}) |")
    print("|---|--:|--:|--:|--:|--:|--:|--:|")
    for k in parts:
        cmd = [sys.executable, "-m", "dasknn", "partition", str(store), "--parts", str(k), "--workers", "2",
               "--memory-limit", memory, "--json"]
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        own, worker = _peak_rss(proc)
        out, err = proc.communicate()
        wall = time.perf_counter() - t0
        if proc.returncode != 0:
            print(f"# K = {k} failed: {err.strip()[-400:]}")
            continue
        r = json.loads(out)
        print(f"| {neurons} x {layers} | {k} | {wall:.1f} | {r['seconds']:.1f} | {r['volume_total']:,} | "
              f"{r['imbalance_max']:.2%} | {own / 1e9:.2f} | {worker / 1e9:.2f} |", flush=True)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=str(DATA), help="the challenge network (.tar.gz or directory)")
    ap.add_argument("--parts", type=int, nargs="+", default=[4, 16, 64])
    ap.add_argument("--methods", nargs="+", default=DEFAULT_METHODS, choices=P.METHODS)
    ap.add_argument("--no-shuffled", action="store_true", help="skip the label-shuffled copy")
    ap.add_argument("--shuffle-seed", type=int, default=1)
    ap.add_argument("--generated", type=int, default=0, metavar="N", help="also partition a generated N x 120 network at K = 16")
    ap.add_argument("--generated-methods", nargs="+", default=["random", "block", "hypergraph"], choices=P.METHODS)
    ap.add_argument("--generated-layers", type=int, default=120, help="depth of the generated network")
    ap.add_argument("--generated-parts", type=int, default=16, help="K for the generated network")
    ap.add_argument("--no-real", action="store_true", help="skip the challenge network (and its shuffled copy)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", default="bench-out/partition.json")
    ap.add_argument("--plot", default="bench-out/partition-n1024-k16.png")
    ap.add_argument("--auto-vs-data", type=int, nargs=3, metavar=("N", "LAYERS", "IMAGES"),
                    help="only: default dasknn infer against --mode data on a fresh generated store (2 workers)")
    ap.add_argument("--end-to-end", type=int, nargs=3, metavar=("N", "LAYERS", "IMAGES"),
                    help="only: dasknn infer --mode model twice (first run, second run) and --mode data on a fresh "
                         "generated store (2 workers)")
    ap.add_argument("--memory-limit", default=None,
                    help="each worker's memory limit (default 600MB with --auto-vs-data, 2GB with --on-cluster and "
                         "--end-to-end)")
    ap.add_argument("--on-cluster", type=int, nargs=2, metavar=("N", "LAYERS"),
                    help="only: dasknn partition --workers 2 on a generated store, for each of --parts")
    ap.add_argument("--store-dir", default="bench-out", help="with --on-cluster: where the generated store is kept")
    args = ap.parse_args(argv)
    if args.on_cluster:
        print(f"# {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, {platform.node()}, {os.cpu_count()} CPUs")
        on_cluster(*args.on_cluster, args.parts, args.memory_limit or "2GB", args.store_dir)
        return
    if args.auto_vs_data:
        print(f"# {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, {platform.node()}, {os.cpu_count()} CPUs")
        auto_against_data(*args.auto_vs_data, args.memory_limit or "600MB")
        return
    if args.end_to_end:
        print(f"# {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, {platform.node()}, {os.cpu_count()} CPUs")
        end_to_end(*args.end_to_end, args.memory_limit or "2GB")
        return

    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    if args.plot:
        Path(args.plot).parent.mkdir(parents=True, exist_ok=True)
    print(f"# {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, {platform.node()}, {os.cpu_count()} CPUs, "
          f"Python {platform.python_version()}, threads={args.threads}")
    print("| network                | method             |   K |     volume | /random | max send  | imbal.  | seconds  |")
    print("|------------------------|--------------------|----:|-----------:|--------:|----------:|--------:|---------:|")
    rows: list[dict] = []
    net = read_network(args.data)
    if not args.no_real:
        run("n1024-l120", net.layers, args.parts, args.methods, args.threads, rows, args.plot)
    if not args.no_shuffled and not args.no_real:
        run("n1024-l120 shuffled", shuffled(net.layers, args.shuffle_seed), args.parts, args.methods, args.threads, rows, None)
    if args.generated:
        from dasknn import generate

        t0 = time.perf_counter()
        depth = args.generated_layers
        gen = generate.network(args.generated, depth, seed=0)
        print(f"# generated {args.generated} x {depth} in {time.perf_counter() - t0:.1f} s")
        run(f"generated {args.generated}x{depth}", gen.layers, [args.generated_parts], args.generated_methods,
            args.threads, rows, None)
    Path(args.json).write_text(json.dumps(rows, indent=1))
    print(f"# wrote {args.json}" + (f" and {args.plot}" if args.plot else ""))


if __name__ == "__main__":
    main()
