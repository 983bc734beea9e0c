"""Model mode across real network interfaces against one host, and the projection of what the links add (issue 33).

Runs the same model-mode inference (p2p exchange, the real n1024-l120 network) on three clusters of ``--workers``
single-threaded nanny workers, one after the other: every process on 127.0.0.1 (the baseline); every process in its
own network namespace, each link a veth limited to ``--rate`` both ways (``tests/support/netns.py``); the same with
every byte to and from worker 1 held ``--delay`` seconds by a relay. Each cluster gets a warm-up run (kernels
compiled, the partition computed once and kept) and ``--repeats`` timed runs; the fastest is kept.

The projection is the one BENCHMARKS.md makes for more workers on real hosts, with the link as a parameter:

* the links' bandwidth adds the bytes of the busiest link over its rate (each worker's messages leave by its link
  and arrive by another: at most the larger of a worker's bytes out and in);
* latency on a worker's link adds at least ``layers x delay`` (a chunk's layer waits for its peers' messages of the
  layer before; the chunks a worker runs side by side wait together) and at most ``chunks x layers x delay`` (the
  chunks one after the other).

The measured additions must fall inside those bounds; the script prints them side by side.

    sudo python benchmarks/bench_netns.py [--workers 2] [--images 2000] [--chunks 2] [--rate 1gbit]
        [--delay 0.001] [--repeats 2] [--store ~/.cache/dasknn/bench]
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import subprocess
import sys
from datetime import date
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests" / "support"))  # the namespaced cluster's harness
sys.path.insert(0, str(HERE))


def infer(run_client, scheduler: str, store: Path, args) -> dict:
    """A warm-up run, then the fastest of ``args.repeats`` timed runs: the last's JSON report."""
    command = ["-m", "dasknn", "infer", "--scheduler", scheduler, "--network", str(store), "--mode", "model",
               "--exchange", "p2p", "--chunks", str(args.chunks), "--dtype", args.dtype, "--json"]
    run_client([*command, "--batch", "200"])
    best = None
    for _ in range(args.repeats):
        report = json.loads(run_client([*command, "--batch", str(args.images)]).stdout)
        if best is None or report["seconds"] < best["seconds"]:
            best = report
    return best


def _checked(done: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    if done.returncode:
        raise SystemExit(f"a run failed: {done.stderr[-3000:]}")
    return done


def rate_bytes_per_second(rate: str) -> float:
    """``tc``'s rate (``1gbit``, ``100mbit``) in bytes a second."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([kmg]?)bit", rate.lower())
    if not m:
        raise SystemExit(f"--rate {rate}: give bits a second as tc does, e.g. 1gbit or 100mbit")
    return float(m.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[m.group(2)] / 8


def busiest_link_bytes(pairs: list[list[int]]) -> int:
    """The most bytes one worker's link carries one way: its bytes out (a row of ``exchange_pairs``) or in (a
    column), whichever is larger, over the workers."""
    out = [sum(row) for row in pairs]
    into = [sum(row[q] for row in pairs) for q in range(len(pairs))]
    return max(max(out), max(into))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--images", type=int, default=2000)
    p.add_argument("--chunks", type=int, default=2)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--rate", default="1gbit")
    p.add_argument("--delay", type=float, default=0.001)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--store", default=str(Path.home() / ".cache" / "dasknn" / "bench"))
    args = p.parse_args()

    import chaos
    import netns
    from bench_scale import network_store

    from dasknn.testing import process_cluster

    netns.require()
    folder = Path(args.store)
    folder.mkdir(parents=True, exist_ok=True)
    store = network_store(folder)
    env = chaos.environment()
    rows = {}
    with process_cluster(args.workers, env=env) as cluster:
        def local(command: list[str]) -> subprocess.CompletedProcess:
            return _checked(subprocess.run([sys.executable, *command], capture_output=True, text=True, env=env,
                                           timeout=900))
        rows["one host (127.0.0.1)"] = infer(local, cluster.address, store, args)
    for name, delay in ((f"namespaces, {args.rate} links", None),
                        (f"namespaces, {args.rate} links, +{args.delay * 1e3:g} ms on worker 1", args.delay)):
        options = {} if delay is None else {"delay_worker": 1, "delay_seconds": delay}
        with netns.namespaced_cluster(workers=args.workers, rate=args.rate, env=env, **options) as cluster:
            rows[name] = infer(lambda c, cl=cluster: _checked(cl.run_client(c, env)), cluster.scheduler, store, args)

    (base_name, base), (link_name, link), (slow_name, slow) = rows.items()
    link_bytes = busiest_link_bytes(link["exchange_pairs"])
    layers = base["layers"]
    projected_link = base["seconds"] + link_bytes / rate_bytes_per_second(args.rate)
    low = link["seconds"] + layers * args.delay
    high = link["seconds"] + args.chunks * layers * args.delay
    print(f"{date.today()}, {platform.node()}, {args.workers} workers, {args.images} images in {args.chunks} chunks, "
          f"{args.dtype}, n1024-l{layers}, p2p")
    print("| cluster | inference s | projected s | message bytes | busiest link bytes | matches truth |")
    print("|---|--:|--:|--:|--:|---|")
    for name, row, projected in ((base_name, base, "-"), (link_name, link, f"{projected_link:.2f}"),
                                 (slow_name, slow, f"{low:.2f} to {high:.2f}")):
        print(f"| {name} | {row['seconds']:.2f} | {projected} | {row['message_bytes']:,} | "
              f"{busiest_link_bytes(row['exchange_pairs']):,} | {row['matches_truth']} |")
    print(json.dumps({name: {k: row[k] for k in ("seconds", "message_bytes", "bytes_sent", "tasks", "matches_truth")}
                      for name, row in rows.items()}))


if __name__ == "__main__":
    main()
