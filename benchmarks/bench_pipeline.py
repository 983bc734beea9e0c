"""Pipeline mode against data and model mode, side by side in one run (issue 34, inference).

Generates a network with its float64 truth (kept under ``--dir``), starts one local cluster, and runs each mode on
it: first a warm-up run (untimed: the kernels compiled, the partition computed and kept in the store), then
``--repeats`` timed runs, the fastest kept. Prints one row per mode: inference seconds, edges/s, tasks, bytes sent
between workers, bytes read from the store (with ``--stream``), the stages (pipeline mode), and whether the
categories equal the truth; ``--json`` prints the rows as JSON.

    python benchmarks/bench_pipeline.py [--neurons 1024] [--depth 48] [--images 2000] [--workers 2]
        [--modes pipeline,data,model] [--stream | --memory-limit 300MB] [--repeats 2] [--dir /tmp/bench-pipeline]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np


def network(folder: Path, neurons: int, depth: int, images: int, seed: int) -> Path:
    """The generated store (made once, with its float64 truth)."""
    from dasknn import generate

    path = folder / f"n{neurons}-l{depth}-i{images}-s{seed}.zarr"
    if not path.exists():
        generate.write(path, neurons, depth, images, seed=seed, truth=True)
    return path


def run_mode(client, path: Path, mode: str, args: argparse.Namespace, truth: np.ndarray) -> dict:
    """One mode: a warm-up run, then the fastest of ``args.repeats`` timed runs, as a row."""
    from dasknn import engine

    options = dict(mode=mode, dtype="float64", resident=False if args.stream else None, chunks=args.chunks)
    if mode == "model":
        options["partition"] = args.partition
    engine.infer(path, client=client, images=min(200, args.images), **options)  # warm-up: not timed
    best = None
    for _ in range(args.repeats):
        result = engine.infer(path, client=client, **options)
        if best is None or result.seconds < best.seconds:
            best = result
    return {"mode": mode, "seconds": round(best.seconds, 3), "edges_per_second": float(f"{best.edges_per_second:.4g}"),
            "chunks": best.chunks, "tasks": best.tasks, "bytes_sent": best.bytes_sent, "bytes_read": best.bytes_read,
            "stages": best.stages, "streamed": not best.resident, "exact": bool(np.array_equal(best.categories, truth)),
            "compile_seconds": round(best.compile_seconds, 3)}


def table(rows: list[dict]) -> str:
    """The rows as a Markdown table."""
    lines = ["| mode | streamed | inference s | edges/s | chunks | tasks | bytes sent | bytes read | stages | exact |",
             "|---|---|---:|---:|---:|---:|---:|---:|---|---|"]
    for r in rows:
        stages = " ".join(f"{a}-{b}" for a, b in r["stages"]) or "-"
        lines.append(f"| {r['mode']} | {'yes' if r['streamed'] else 'no'} | {r['seconds']:.3f} | {r['edges_per_second']:.3g} | {r['chunks']} | "
                     f"{r['tasks']} | {r['bytes_sent']:,} | {r['bytes_read']:,} | {stages} | "
                     f"{'yes' if r['exact'] else 'NO'} |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--neurons", type=int, default=1024)
    p.add_argument("--depth", type=int, default=48)
    p.add_argument("--images", type=int, default=2000)
    p.add_argument("--seed", type=int, default=3)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--modes", default="pipeline,data,model")
    p.add_argument("--partition", default="hypergraph", help="model mode's partition (computed once, kept)")
    p.add_argument("--chunks", type=int, help="image chunks (default: each mode's own)")
    p.add_argument("--stream", action="store_true", help="every mode out of core (layers read as needed)")
    p.add_argument("--memory-limit", help="each worker's memory limit, e.g. 300MB (default: the machine's / workers): "
                   "without --stream each mode holds its weights where its share fits, else streams them")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--dir", default="/tmp/bench-pipeline")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    from dasknn import store
    from dasknn.cluster import local_client

    folder = Path(args.dir)
    folder.mkdir(parents=True, exist_ok=True)
    path = network(folder, args.neurons, args.depth, args.images, args.seed)
    truth = store.open_inputs(path).truth(np.float64)
    with local_client(workers=args.workers, threads_per_worker=1, memory_limit=args.memory_limit or "auto") as client:
        rows = [run_mode(client, path, mode, args, truth) for mode in args.modes.split(",")]
    print(json.dumps(rows, indent=1) if args.json else table(rows))


if __name__ == "__main__":
    main()
