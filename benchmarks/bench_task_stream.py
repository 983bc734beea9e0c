"""Where a streamed inference's time goes: Dask's task stream of one run, summed by task name and action.

Usage (from the repository root)::

    python benchmarks/bench_task_stream.py STORE --mode model [--images 500] [--chunks 2] [--keep-layers 3] \\
        [--memory-limit 2GB] [--overlap]

One untimed run of 100 images loads the code (and computes the partition, kept in the store). Then a timed run
of ``--images`` images, out of core, under ``distributed.get_task_stream``. It prints the run's seconds, the bytes
read from the store, and the task time per (task name, compute or transfer) summed over the workers. Compare the
task time with workers x seconds to see how much of the run the workers spent waiting.
"""

from __future__ import annotations

import argparse
import collections
import time


def main() -> None:
    from distributed import get_task_stream

    from dasknn import engine
    from dasknn.cluster import local_client

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("store")
    ap.add_argument("--mode", default="model", choices=["data", "model"])
    ap.add_argument("--images", type=int, default=500)
    ap.add_argument("--chunks", type=int, default=None)
    ap.add_argument("--keep-layers", type=int, default=2)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--memory-limit", default="2GB")
    ap.add_argument("--overlap", action="store_true", help="model mode: overlapped steps (infer(overlap=True))")
    args = ap.parse_args()
    run = dict(mode=args.mode, resident=False, chunks=args.chunks, keep_layers=args.keep_layers)
    if args.overlap:
        run["overlap"] = True
    with local_client(workers=args.workers, threads_per_worker=1, memory_limit=args.memory_limit) as client:
        engine.infer(args.store, client=client, images=100, **run)  # untimed: code loaded, partition kept
        with get_task_stream(client) as ts:
            t0 = time.perf_counter()
            r = engine.infer(args.store, client=client, images=args.images, **run)
            wall = time.perf_counter() - t0
    spent: dict[tuple[str, str], list] = collections.defaultdict(lambda: [0, 0.0])
    for rec in ts.data:
        key = rec["key"] if isinstance(rec["key"], str) else rec["key"][0]
        for s in rec["startstops"]:
            spent[(key.split("-")[0], s["action"])][0] += 1
            spent[(key.split("-")[0], s["action"])][1] += s["stop"] - s["start"]
    print(f"{args.mode} mode{' (overlap)' if args.overlap else ''}, {args.images} images, {r.chunks} chunk(s), keep {args.keep_layers}: {r.seconds:.1f} s "
          f"({wall:.1f} s in all) on {args.workers} workers, {r.bytes_read / 1e9:.2f} GB read")
    print("| task | action | count | seconds (all workers) |")
    print("|---|---|--:|--:|")
    for (name, action), (count, seconds) in sorted(spent.items(), key=lambda kv: -kv[1][1]):
        print(f"| {name} | {action} | {count} | {seconds:.2f} |")


if __name__ == "__main__":
    main()
