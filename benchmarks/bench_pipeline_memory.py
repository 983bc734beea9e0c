"""Pipeline mode on workers of different memory: the stages held, placed by each worker's limit, against the same
pipeline streamed (what a cut for the smallest worker alone gives where no such cut fits), in one run (issue 34).

Generates a network with its float64 truth (kept under ``--dir``), starts one cluster of two nanny workers whose
memory limits differ (``--small``, ``--large``; one thread each), and runs pipeline mode on it three ways, each
after a warm-up run: streamed (``resident=False``: the stages cut by work alone, each streaming its layers),
held (``resident=True``: the smaller worker holds the first stage, each stage within its own worker's share of
memory), and as the engine decides with a calibration (``explain=True``: held only where the cost model predicts
that faster than streaming). Prints one row each: the stages, inference seconds, bytes read from the store,
the predictions, and whether the categories equal the truth.

    python benchmarks/bench_pipeline_memory.py [--neurons 16384] [--depth 120] [--images 1000]
        [--small 1.2GB] [--large 4GB] [--dir /tmp/bench-pipeline]
"""

from __future__ import annotations

import argparse
import os
import platform
from datetime import datetime, timezone
from pathlib import Path

import numpy as np


def run(client, path: Path, truth: np.ndarray, name: str, **options) -> dict:
    """One way of running pipeline mode: a warm-up run on a few images, then the timed run, as a row."""
    from dasknn import engine

    engine.infer(path, client=client, mode="pipeline", dtype="float64", images=100, **options)  # warm-up
    result = engine.infer(path, client=client, mode="pipeline", dtype="float64", **options)
    predicted = [p for p in result.predictions if p.mode == "pipeline"]
    return {"run": name, "held": result.resident, "stages": result.stages, "seconds": result.seconds,
            "bytes_read": result.bytes_read, "exact": bool(np.array_equal(result.categories, truth)),
            "predicted": predicted[0].seconds if predicted else None}


def main() -> None:
    from dask.utils import parse_bytes
    from distributed import Client, Nanny, Scheduler, SpecCluster

    from dasknn import generate, store

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--neurons", type=int, default=16384)
    ap.add_argument("--depth", type=int, default=120)
    ap.add_argument("--images", type=int, default=1000)
    ap.add_argument("--small", default="1.2GB")
    ap.add_argument("--large", default="4GB")
    ap.add_argument("--dir", default="/tmp/bench-pipeline")
    args = ap.parse_args()
    path = Path(args.dir) / f"n{args.neurons}-l{args.depth}-i{args.images}-s3.zarr"
    if not path.exists():
        generate.write(path, args.neurons, args.depth, args.images, seed=3, truth=True)
    truth = store.open_inputs(path).truth(np.float64)
    s = store.open_store(path)
    print(f"dasknn pipeline on workers of different memory, {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, "
          f"{platform.node()}, {os.cpu_count()} cores; generated {args.neurons} x {args.depth}, "
          f"{s.edges * 12 / 1e9:.2f} GB as float64 CSR, {args.images} images; workers of {args.small} and "
          f"{args.large}, one thread each")
    spec = {name: {"cls": Nanny, "options": {"nthreads": 1, "memory_limit": parse_bytes(limit)}}
            for name, limit in (("small", args.small), ("large", args.large))}
    with SpecCluster(scheduler={"cls": Scheduler, "options": {"dashboard_address": ":0"}}, workers=spec) as cluster, \
            Client(cluster) as client:
        rows = [run(client, path, truth, "streamed", resident=False),
                run(client, path, truth, "held, placed by memory", resident=True),
                run(client, path, truth, "the engine's choice, calibrated", explain=True)]
    print("| run | held | stages | inference s | read from the store | predicted s | exact |")
    print("|---|---|---|--:|--:|--:|---|")
    for r in rows:
        stages = " ".join(f"{a}-{b}" for a, b in r["stages"])
        predicted = "-" if r["predicted"] is None else f"{r['predicted']:.2f}"
        print(f"| {r['run']} | {'yes' if r['held'] else 'no'} | {stages} | {r['seconds']:.2f} | "
              f"{r['bytes_read'] / 1e9:.2f} GB | {predicted} | {'yes' if r['exact'] else 'NO'} |")


if __name__ == "__main__":
    main()
