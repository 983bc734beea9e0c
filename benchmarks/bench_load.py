"""Load: consecutive small inferences on one local cluster, every result checked against the SciPy reference.

Prints scheduler tasks, worker RSS (largest worker) and open files (workers and this client) before and after,
and fails if any grows past the bounds the test suite asserts for 50 runs.

    python benchmarks/bench_load.py [--runs 1000] [--workers 2]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from test_reliability import many_inferences  # noqa: E402  the very loop the test runs

from dasknn.cluster import local_client  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=1000)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--every", type=int, default=100, help="sample the state every this many runs")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp, local_client(workers=args.workers) as client:
        t0 = time.perf_counter()
        samples: list = []
        before, after = many_inferences(client, Path(tmp), args.runs, every=args.every, samples=samples)
        seconds = time.perf_counter() - t0
    report = {"runs": args.runs, "workers": args.workers, "seconds": round(seconds, 1),
              "seconds_per_run": round(seconds / args.runs, 4), "before": before, "after": after,
              "rss_growth_mib": round((after["rss"] - before["rss"]) / 2**20, 1)}
    print(json.dumps(report))
    print("| runs | scheduler tasks | largest worker RSS MiB | worker open files | client open files |")
    print("|---|---|---|---|---|")
    for row in [{"runs": 0, **before}] + samples:
        print(f"| {row['runs']} | {row['tasks']} | {row['rss'] / 2**20:.1f} | {row['fds']} | {row['client_fds']} |")
    # memory: what grows in the second half, once distributed's bounded logs and the allocator have settled
    half = [r for r in samples if r["runs"] >= args.runs // 2]
    late_growth = (after["rss"] - half[0]["rss"]) if half else 0
    print(f"RSS growth over the second half of the runs: {late_growth / 2**20:.1f} MiB")
    ok = (after["tasks"] <= before["tasks"] and late_growth < 16 * 2**20
          and after["fds"] - before["fds"] <= 4 and after["client_fds"] - before["client_fds"] <= 4)
    print("all results right; bounds held" if ok else "BOUNDS EXCEEDED", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
