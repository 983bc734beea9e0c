"""What ``dasknn generate --truth`` costs: the reference's truth (float64 and float32) of generated images, three ways.

* ``serial``: the whole batch through each layer in this thread, as ``generate --truth`` did before 2026-12-04;
* ``threads``: :func:`dasknn.generate.reference_categories`, row chunks of every layer on a pool of threads (what
  ``generate --truth`` runs now);
* ``processes``: row chunks on a pool of processes, each running :func:`dasknn.reference.infer` through layers it
  generates again itself (nothing shared, nothing but the chunk and its categories pickled).

All three give the same categories (checked). The variants run interleaved, ``--repeats`` times each, so a busy
shared machine weighs on all alike; the table gives each one's best and median wall time and its CPU time.

With ``--cli``, instead: ``dasknn generate`` itself, with and without ``--truth``, as a user runs it (the README's
figure).

Usage (from the repository root)::

    python benchmarks/bench_truth.py [--neurons 16384] [--layers 120] [--images 200] [--repeats 2]
    python benchmarks/bench_truth.py --cli --images 1000
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from datetime import date
from typing import TypeVar

import numpy as np
import scipy.sparse as sp

from dasknn import generate, reference

DTYPES = (np.float64, np.float32)
T = TypeVar("T")


def serial(neurons: int, layers: int, seed: int, batch: sp.csr_matrix, bias: float) -> dict:
    """The truth as ``generate --truth`` computed it before: the whole batch, one layer at a time, one thread."""
    ys = {dt: sp.csr_matrix(batch, dtype=dt) for dt in DTYPES}
    for w in generate.iter_layers(neurons, layers, seed):
        for dt, y in ys.items():
            ys[dt] = reference.layer_step(y, w.astype(dt), bias, 32.0)
    return {dt: reference.categories(y) for dt, y in ys.items()}


def threads(neurons: int, layers: int, seed: int, batch: sp.csr_matrix, bias: float) -> dict:
    """What ``generate --truth`` runs now."""
    return generate.reference_categories(neurons, layers, seed, batch, bias, DTYPES)


def _chunk_truth(neurons: int, layers: int, seed: int, rows: sp.csr_matrix, bias: float, dtype: type) -> np.ndarray:
    return reference.infer_categories(generate.iter_layers(neurons, layers, seed), rows, bias, 32.0, dtype)


def processes(neurons: int, layers: int, seed: int, batch: sp.csr_matrix, bias: float) -> dict:
    """Row chunks on processes (one per core), each through layers it generates itself."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    edges = np.linspace(0, batch.shape[0], cores + 1).astype(int)
    with ProcessPoolExecutor(cores) as pool:
        parts = {(dt, a): pool.submit(_chunk_truth, neurons, layers, seed, batch[a:b], bias, dt)
                 for dt in DTYPES for a, b in zip(edges[:-1], edges[1:])}
        return {dt: np.concatenate([f.result() + a for (d, a), f in sorted(parts.items(), key=lambda kv: kv[0][1])
                                    if d == dt]) for dt in DTYPES}


def timed(fn: Callable[[], T]) -> tuple[T, float, float]:
    """``fn()``, its wall seconds and the CPU seconds of this process and its children."""
    c0, t0 = os.times(), time.perf_counter()
    out = fn()
    wall, c1 = time.perf_counter() - t0, os.times()
    cpu = sum(getattr(c1, f) - getattr(c0, f) for f in ("user", "system", "children_user", "children_system"))
    return out, wall, cpu


def command_line(args: argparse.Namespace) -> None:
    """Time ``dasknn generate`` with and without ``--truth`` in a subprocess, as a user runs it."""
    argv = [sys.executable, "-m", "dasknn", "generate", "--neurons", str(args.neurons), "--layers", str(args.layers),
            "--images", str(args.images), "--seed", str(args.seed)]
    print(f"# dasknn generate --neurons {args.neurons} --layers {args.layers} --images {args.images}; {date.today()}, "
          f"{platform.node()}, {os.cpu_count()} cores")
    print("| command | wall s | CPU s | load average before-after |")
    print("|---|--:|--:|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for extra in ([], ["--truth"]):
            load = os.getloadavg()[0]
            out = f"{tmp}/g{len(extra)}.zarr"
            _, wall, cpu = timed(lambda: subprocess.run([*argv, *extra, "--out", out], check=True, capture_output=True))
            print(f"| generate {' '.join(extra) or '(no truth)'} | {wall:.1f} | {cpu:.1f} | "
                  f"{load:.1f}-{os.getloadavg()[0]:.1f} |", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--neurons", type=int, default=16384)
    ap.add_argument("--layers", type=int, default=120)
    ap.add_argument("--images", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--cli", action="store_true", help="time dasknn generate itself, with and without --truth")
    args = ap.parse_args()
    if args.cli:
        command_line(args)
        return
    batch = generate.images(args.images, args.neurons, args.seed)
    bias = generate.challenge_bias(args.neurons)
    variants = {"serial": serial, "threads": threads, "processes": processes}
    walls: dict[str, list[float]] = {name: [] for name in variants}
    cpus: dict[str, list[float]] = {name: [] for name in variants}
    answers = {}
    loads = []
    for _ in range(args.repeats):
        for name, fn in variants.items():  # interleaved: a busy machine weighs on every variant alike
            answers[name], wall, cpu = timed(lambda: fn(args.neurons, args.layers, args.seed, batch, bias))
            walls[name].append(wall)
            cpus[name].append(cpu)
            loads.append(os.getloadavg()[0])
    for name, got in answers.items():
        assert all(np.array_equal(got[dt], answers["serial"][dt]) for dt in DTYPES), f"{name} differs"
    print(f"# {args.neurons} x {args.layers}, {args.images} images, float64 and float32 truths "
          f"({answers['serial'][np.float64].size} categories in float64); {date.today()}, {platform.node()}, "
          f"{os.cpu_count()} cores, load average during the runs {min(loads):.1f}-{max(loads):.1f}")
    print("| variant | best wall s | median wall s | CPU s | best vs serial |")
    print("|---|--:|--:|--:|--:|")
    best_serial = min(walls["serial"])
    for name in variants:
        print(f"| {name} | {min(walls[name]):.1f} | {statistics.median(walls[name]):.1f} | "
              f"{statistics.median(cpus[name]):.1f} | {best_serial / min(walls[name]):.2f}x |")


if __name__ == "__main__":
    main()
