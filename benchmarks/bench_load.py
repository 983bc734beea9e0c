"""Load: consecutive small inferences on one local cluster, every result checked against the SciPy reference.

Prints scheduler tasks, worker RSS (largest worker) and open files (workers and this client) before and after,
and fails if any grows past the bounds the test suite asserts for 50 runs.

    python benchmarks/bench_load.py [--runs 1000] [--workers 2] [--short-histories]

A worker's memory grows, by design, until two of Dask's bounded records are full: its profile history (one
snapshot a second, ``distributed.admin.low-level-log-length`` = 1,000 of them: ~1,000 s, about 80 KiB each in
memory here, twice: the history and the per-key history) and ``dask.utils.key_split``'s LRU cache (one entry per
distinct task key, 100,000 of them, ~190 bytes each). ``--short-histories`` caps Dask's histories (and the system
monitor's) at 20 entries for this cluster, so that the memory bound can be checked in a run of minutes; without
it the cluster keeps Dask's defaults, and the memory bound is checked only if the histories were full half-way
through the runs (so a run must last more than twice ~1,000 s).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import dask

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from test_reliability import many_inferences  # noqa: E402  the very loop the test runs

from dasknn.cluster import local_client  # noqa: E402

#: entries kept by Dask's histories with --short-histories (profile, per-key profile, transfer and state logs,
#: system monitor samples)
SHORT = 20
HISTORY_KEYS = ("distributed.admin.low-level-log-length", "distributed.admin.system-monitor.log-length")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=1000)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--every", type=int, default=100, help="sample the state every this many runs")
    p.add_argument("--short-histories", action="store_true",
                   help=f"cap Dask's diagnostic histories at {SHORT} entries (default: Dask's own lengths)")
    args = p.parse_args()
    config = {k: SHORT for k in HISTORY_KEYS} if args.short_histories else {}
    # set before the cluster starts: the nannies hand this process's config to the worker processes
    with dask.config.set(config), tempfile.TemporaryDirectory() as tmp, \
            local_client(workers=args.workers) as client:
        lengths = set(client.run(lambda: tuple(dask.config.get(k) for k in HISTORY_KEYS)).values())
        assert len(lengths) == 1, lengths
        history_cap, monitor_cap = lengths.pop()
        if args.short_histories:
            assert (history_cap, monitor_cap) == (SHORT, SHORT), (history_cap, monitor_cap)  # took effect
        t0 = time.perf_counter()
        samples: list = []
        before, after = many_inferences(client, Path(tmp), args.runs, every=args.every, samples=samples)
        seconds = time.perf_counter() - t0
    report = {"runs": args.runs, "workers": args.workers, "seconds": round(seconds, 1),
              "seconds_per_run": round(seconds / args.runs, 4), "history_length": history_cap,
              "monitor_length": monitor_cap, "before": before, "after": after,
              "rss_growth_mib": round((after["rss"] - before["rss"]) / 2**20, 1)}
    print(json.dumps(report))
    print("| runs | seconds | scheduler tasks | largest worker RSS MiB | profile history entries "
          "| key_split cache entries | worker open files | client open files |")
    print("|---|---|---|---|---|---|---|---|")
    for row in [{"runs": 0, "seconds": 0.0, **before}] + samples:
        print(f"| {row['runs']} | {row['seconds']:.0f} | {row['tasks']} | {row['rss'] / 2**20:.1f} "
              f"| {row['history']} | {row['key_cache']} | {row['fds']} | {row['client_fds']} |")
    ok = (after["tasks"] <= before["tasks"] and after["fds"] - before["fds"] <= 4
          and after["client_fds"] - before["client_fds"] <= 4)
    # memory: what grows in the second half, once Dask's bounded histories are full (the allocator settled too)
    half = [r for r in samples if r["runs"] >= args.runs // 2]
    if half and half[0]["history"] >= history_cap:
        late_growth = after["rss"] - half[0]["rss"]
        print(f"RSS growth over the second half of the runs: {late_growth / 2**20:.1f} MiB (bound 16 MiB)")
        ok = ok and late_growth < 16 * 2**20
    else:
        print(f"memory bound NOT CHECKED: the workers' profile histories were not full half-way through the runs "
              f"({half[0]['history'] if half else before['history']} of {history_cap} entries, one a second); "
              f"use --short-histories, or runs lasting more than {2 * history_cap} s", file=sys.stderr)
        ok = False
    print("all results right; bounds held" if ok else "BOUNDS EXCEEDED OR NOT CHECKED", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
