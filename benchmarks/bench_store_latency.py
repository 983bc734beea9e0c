"""Reading layers and part layers through a URL whose server waits before each answer, two code versions
alternated (an object store's latency; issue 45).

An object store answers each request after a wait (S3: tens of milliseconds before the first byte), whatever its
size. What a read asks for one request at a time then costs a wait each: a streamed layer's three arrays, and a
model-mode part layer's nodes, checks and chunks. ``--tree`` versions each run in a child process of their own, their
tree first on ``PYTHONPATH``; each child serves ``STORE``'s folder over HTTP on 127.0.0.1
(``tests/support/http_files.py``, answering each request after ``--delay-ms``), times opening the store (every
layer's metadata read and checked, as a worker's stream does), reads layer 1 and part layer 1, then times
``--layers`` layers and part layers from layer 2 on. The rounds alternate the versions (before, after, before,
after) so the machine's load falls on both alike.

    python benchmarks/bench_store_latency.py STORE --plan STORE/plans/bench-k2 --tree before=/tmp/before
        --tree after=. [--delay-ms 0,10,30] [--layers 10] [--rounds 2]
"""

from __future__ import annotations

import argparse
import functools
import json
import platform
import subprocess
import sys
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from versions import add_tree_argument, median, named_trees, ratios_to, tree_env  # noqa: E402

ROW_MARK = "ROW "


def child(store: Path, plan: Path, delays: list[float], layers: int) -> None:
    """Per delay: the milliseconds a layer and a part layer take to read through the served store."""
    sys.path.insert(0, str(HERE.parent / "tests" / "support"))
    import http_files

    import dasknn
    from dasknn.store import PlanStore, open_store

    print(f"dasknn from {dasknn.__file__}", flush=True)
    for delay in delays:
        class Waiting(http_files.FilesHandler):
            def send_head(self):
                time.sleep(delay / 1e3)  # the store's wait before it answers
                return super().send_head()

        served = store.parent
        server = http_files.FilesServer(("127.0.0.1", 0), functools.partial(Waiting, directory=str(served)))
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            root = f"http://127.0.0.1:{server.server_address[1]}"
            t0 = time.perf_counter()
            network = open_store(f"{root}/{store.name}", check="metadata")  # every layer's metadata, checked
            open_s = time.perf_counter() - t0
            parts = PlanStore(f"{root}/{plan.relative_to(served)}")
            network.layer(1), parts.part_layer(0, 1, "float32")  # the connections opened, the roots read
            t0 = time.perf_counter()
            for k in range(2, 2 + layers):
                network.layer(k)
            layer_ms = (time.perf_counter() - t0) / layers * 1e3
            t0 = time.perf_counter()
            for k in range(2, 2 + layers):
                parts.part_layer(0, k, "float32")
            part_ms = (time.perf_counter() - t0) / layers * 1e3
        finally:
            server.shutdown()
            server.server_close()
        print(ROW_MARK + json.dumps({"delay": delay, "open_s": open_s, "layer_ms": layer_ms,
                                            "part_ms": part_ms}), flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("store")
    p.add_argument("--plan", required=True, help="a part plan of the store, in the store's folder or beside it")
    add_tree_argument(p)
    p.add_argument("--delay-ms", default="0,10,30")
    p.add_argument("--layers", type=int, default=10)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    store, plan = Path(args.store).resolve(), Path(args.plan).resolve()
    delays = [float(d) for d in args.delay_ms.split(",")]
    if args.child:
        child(store, plan, delays, args.layers)
        return
    if not plan.is_relative_to(store.parent):
        raise SystemExit("bench_store_latency: the plan must be under the store's folder (one server serves both)")
    trees = named_trees(args, "bench_store_latency")
    started = datetime.now(timezone.utc)
    rows: dict[tuple[str, float], list[tuple[float, float]]] = {}
    for _ in range(args.rounds):
        for name, tree in trees:
            cmd = [sys.executable, __file__, str(store), "--plan", str(plan), "--child", "--delay-ms", args.delay_ms,
                   "--layers", str(args.layers)]
            out = subprocess.run(cmd, env=tree_env(tree), stdout=subprocess.PIPE, text=True, check=True).stdout
            for line in out.splitlines():
                if line.startswith(ROW_MARK):
                    r = json.loads(line[len(ROW_MARK):])
                    rows.setdefault((name, r["delay"]), []).append((r["open_s"], r["layer_ms"], r["part_ms"]))
                else:
                    print(f"  {name}: {line}", flush=True)
    print(f"\n{started:%Y-%m-%d %H:%M}-{datetime.now(timezone.utc):%H:%M} UTC, {platform.node()}, store {store}, "
          f"{args.layers} layers a round, {args.rounds} rounds (medians)")
    print("| delay a request, ms | version | open the store, s | layer, ms | part layer, ms | each / the first "
          "version's |")
    print("|--:|---|--:|--:|--:|---|")
    for delay in delays:
        first = None
        for name, _ in trees:
            got = [median([g[i] for g in rows[(name, delay)]]) for i in range(3)]
            first = first or got
            print(f"| {delay:g} | {name} | {got[0]:.2f} | {got[1]:.1f} | {got[2]:.1f} | "
                  f"{ratios_to(got, first)} |")

if __name__ == "__main__":
    main()
