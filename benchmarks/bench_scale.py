"""Model mode as the workers grow: the task exchange against the peer-to-peer one, K single-threaded workers on one
host under a real ``dask scheduler`` process (issue 33).

Usage (from the repository root, the shared data beside the checkout)::

    python benchmarks/bench_scale.py [--ks 2,4,8,16,32] [--exchanges tasks,p2p] [--images 2000] [--chunks 2]
                                     [--dtype float32] [--tasks-up-to 16]

For each K: the hypergraph partition for K parts (computed here once, kept in the store), a fresh cluster of K
workers (one thread, ``--memory-limit`` each), the real n1024-l120 network (imported once into ``--store``), a
warm-up run per exchange (the kernels compiled, the handlers installed), then the timed run per exchange, one after the other on the same cluster: tasks through the
scheduler, the scheduler process's CPU seconds during the run (user + system, psutil), inference seconds, bytes
sent against the plan's, and the categories against the truth. The task exchange runs up to ``--tasks-up-to``
workers only (its time grows with K squared). One row per (K, exchange), printed as a Markdown table and as JSON.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import time
from datetime import date
from pathlib import Path

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "graphchallenge"


def network_store(folder: Path) -> Path:
    """The real n1024-l120 network with its images and truth, imported once into ``folder``."""
    from dasknn.ingest import import_network

    out = folder / "n1024-l120.zarr"
    if not out.exists():
        import_network(DATA / "neuron1024.tar.gz", out, DATA / "sparse-images-1024.tsv.gz",
                       DATA / "neuron1024-l120-categories.tsv")
    return out


def scheduler_cpu(pid: int) -> float:
    import psutil

    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


def measure(store: Path, k: int, exchanges: list[str], args) -> list[dict]:
    """The rows of one K: a fresh cluster, a warm-up run and a timed run per exchange."""
    import dasknn
    from distributed import Client

    from dasknn.testing import process_cluster

    from dasknn.engine import resolve_partition

    resolve_partition(str(store), "hypergraph", k)  # here, once, kept in the store: the runs plan and load only
    rows = []
    t0 = time.perf_counter()
    with process_cluster(k, args.memory_limit, timeout=600) as cluster, Client(cluster.address) as client:
        started = time.perf_counter() - t0
        options = dict(mode="model", partition="hypergraph", chunks=args.chunks, dtype=args.dtype)
        for exchange in exchanges:  # untimed: the partition kept, the kernels compiled, the handlers installed
            dasknn.infer(str(store), None, client, batch=min(args.images, 200), exchange=exchange, **options)
        for exchange in exchanges:
            cpu0 = scheduler_cpu(cluster.processes[0].pid)
            wall0 = time.perf_counter()
            result = dasknn.infer(str(store), None, client, batch=args.images, exchange=exchange, **options)
            wall = time.perf_counter() - wall0
            cpu = scheduler_cpu(cluster.processes[0].pid) - cpu0
            rows.append({"k": k, "exchange": exchange, "tasks": result.tasks,
                         "tasks_per_chunk": result.tasks / args.chunks, "inference_s": round(result.seconds, 3),
                         "wall_s": round(wall, 3), "scheduler_cpu_s": round(cpu, 3), "bytes_sent": result.bytes_sent,
                         "message_bytes": int(sum(result.message_bytes)), "plan_bytes": result.plan_bytes,
                         "mismatched": result.mismatched, "cluster_start_s": round(started, 1)})
            print(json.dumps(rows[-1]), flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ks", default="2,4,8,16,32")
    ap.add_argument("--exchanges", default="tasks,p2p")
    ap.add_argument("--tasks-up-to", type=int, default=16, help="run the task exchange up to this many workers")
    ap.add_argument("--images", type=int, default=2000)
    ap.add_argument("--chunks", type=int, default=2)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--memory-limit", default="700MB")
    ap.add_argument("--store", default=str(Path.home() / ".cache" / "dasknn" / "bench"))
    args = ap.parse_args()
    folder = Path(args.store)
    folder.mkdir(parents=True, exist_ok=True)
    store = network_store(folder)
    rows = []
    for k in [int(x) for x in args.ks.split(",")]:
        exchanges = [e for e in args.exchanges.split(",") if e != "tasks" or k <= args.tasks_up_to]
        rows += measure(store, k, exchanges, args)
    print(f"\n{date.today()} {platform.node()} ({platform.processor() or platform.machine()}), {args.images} images, "
          f"{args.chunks} chunks, {args.dtype}, K single-threaded workers of {args.memory_limit}\n")
    print("| K | exchange | tasks | tasks/chunk | inference s | scheduler CPU s | bytes sent / built | mismatched |")
    print("|---|---|--:|--:|--:|--:|--:|--:|")
    for r in rows:
        ratio = r["bytes_sent"] / r["message_bytes"] if r["message_bytes"] else math.nan
        print(f"| {r['k']} | {r['exchange']} | {r['tasks']:,} | {r['tasks_per_chunk']:,.0f} | {r['inference_s']} | "
              f"{r['scheduler_cpu_s']} | {ratio:.3f} | {r['mismatched']} |")
    by = {(r["k"], r["exchange"]): r for r in rows}
    for k in sorted({r["k"] for r in rows}):
        if (k, "tasks") in by and (k, "p2p") in by:
            t, p = by[(k, "tasks")], by[(k, "p2p")]
            print(f"K = {k}: p2p / tasks inference {p['inference_s'] / t['inference_s']:.3f}, scheduler CPU "
                  f"{p['scheduler_cpu_s'] / max(t['scheduler_cpu_s'], 1e-9):.3f}")


if __name__ == "__main__":
    main()
