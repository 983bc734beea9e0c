"""Streamed data, pipeline and model mode and ``--mode auto`` on a local store, two code versions alternated (issue 45).

Issue 45's last target: with the store local (in the page cache) and the challenge's constant weights, auto still
picks data mode, and no mode is slower than the code before the issue's work. Each version runs in a child process
of its own, its tree first on ``PYTHONPATH`` (so its workers import it too), on a fresh local cluster of
``--workers`` single-threaded workers of ``--memory-limit``; the versions alternate round by round (before, after,
before, after) so the machine's load, shared with other runs, falls on both alike.

Made before the clock: the partition, kept in the store (``dasknn partition STORE --parts K``: the same file for
both versions, whose partition format is the same), and model mode's part plan (the first child's warm-up makes it
under ``--plan``; later children reuse it: its name depends on the store's path and the owners only). Each child
warms its workers' kernels with a 20-image run of data mode and of model mode, then times each mode once with
``bench_rate_limited_store.run_mode`` (``local``: data mode streamed; ``model``: K = ``--workers`` parts streamed
from the part plan; ``auto`` with ``--explain``) and prints its rows as JSON for the parent's table.

    python benchmarks/bench_local_store.py STORE --tree before=/tmp/before --tree after=. [--rounds 2]
        [--modes local,pipeline,model,auto] [--plan STORE/plans/bench-k2]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from versions import add_tree_argument, named_trees, tree_env  # noqa: E402

MODES = "local,pipeline,model,auto"
ROW_MARK = "ROW "


class _NoLink:
    """``run_mode`` counts bytes over a link; a local store has none."""

    @staticmethod
    def bytes_in() -> int:
        return 0


def child(store: str, modes: list[str], workers: int, memory_limit: str, plan: str) -> None:
    """Warm up, then time each mode on one cluster of the tree this process imports; print each row as JSON."""
    import dasknn
    from bench_rate_limited_store import run_mode

    from dasknn import engine
    from dasknn.cluster import local_client

    with local_client(workers=workers, threads_per_worker=1, memory_limit=memory_limit) as client:
        on_workers = set(client.run(lambda: __import__("dasknn").__file__).values())
        print(f"dasknn from {dasknn.__file__}, on the workers from {', '.join(sorted(on_workers))}", flush=True)
        t0 = time.perf_counter()
        engine.infer(store, client=client, mode="data", images=20)
        engine.infer(store, client=client, mode="model", partition="hypergraph", resident=False, plan_store=plan,
                     images=20)
        print(f"warmed up in {time.perf_counter() - t0:.1f} s", flush=True)
        for mode in modes:
            row = run_mode(client, _NoLink(), store, mode, "hypergraph", plan, None)
            fields = {**asdict(row), "categories": row.categories.tolist(), "load_avg": os.getloadavg()[0]}
            print(ROW_MARK + json.dumps(fields, default=lambda v: v.item()), flush=True)  # numpy scalars


def run_child(tree: str, args) -> list[dict]:
    """One round of ``tree``: its rows, its output passed through."""
    cmd = [sys.executable, __file__, args.store, "--child", "--modes", args.modes, "--workers", str(args.workers),
           "--memory-limit", args.memory_limit, "--plan", args.plan]
    out = subprocess.run(cmd, env=tree_env(tree), stdout=subprocess.PIPE, text=True, check=True)
    rows = []
    for line in out.stdout.splitlines():
        if line.startswith(ROW_MARK):
            rows.append(json.loads(line[len(ROW_MARK):]))
        else:
            print(f"  {line}", flush=True)
    return rows


def table(results: list[tuple[str, int, list[dict]]]) -> str:
    """Every (version, round)'s rows as one Markdown table."""
    lines = ["| round | version | mode | ran | load s | inference s | wall s | categories | load avg | |",
             "|--:|---|---|---|--:|--:|--:|--:|--:|---|"]
    for version, rnd, rows in results:
        for r in rows:
            lines.append(f"| {rnd} | {version} | {r['mode']} | {r['ran']} | {r['load']:.2f} | {r['seconds']:.2f} | "
                         f"{r['wall']:.2f} | {len(r['categories'])} | {r['load_avg']:.1f} | {r['note']} |")
    return "\n".join(lines)


def ratios(results: list[tuple[str, int, list[dict]]], before: str, after: str) -> str:
    """Per mode: the wall seconds after over before, round by round, and of the sums over the rounds."""
    walls: dict[tuple[str, str], list[float]] = {}
    for version, _, rows in results:
        for r in rows:
            walls.setdefault((version, r["mode"]), []).append(r["wall"])
    lines = []
    for (version, mode), after_walls in walls.items():
        before_walls = walls.get((before, mode))
        if version != after or not before_walls:
            continue
        pairs = ", ".join(f"{a / b:.2f}" for a, b in zip(after_walls, before_walls))
        lines.append(f"  {mode}: wall {after}/{before} per round {pairs}; over the rounds "
                     f"{sum(after_walls) / sum(before_walls):.2f}")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("store")
    add_tree_argument(p)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--modes", default=MODES, help="local: data mode streamed")
    p.add_argument("--workers", type=int, default=2, help="workers, and model mode's parts K")
    p.add_argument("--memory-limit", default="2GB")
    p.add_argument("--plan", default=None, help="model mode's part plan (default: STORE/plans/bench-kK)")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    args.plan = args.plan or str(Path(args.store) / "plans" / f"bench-k{args.workers}")
    if args.child:
        child(args.store, args.modes.split(","), args.workers, args.memory_limit, args.plan)
        return
    trees = named_trees(args, "bench_local_store")
    started = datetime.now(timezone.utc)
    results = []
    for rnd in range(1, args.rounds + 1):
        for name, tree in trees:
            print(f"round {rnd}, {name} ({tree}), {datetime.now(timezone.utc):%H:%M:%S} UTC, load average "
                  f"{os.getloadavg()[0]:.1f}", flush=True)
            results.append((name, rnd, run_child(tree, args)))
            print(table(results), flush=True)  # so far: a run cut short still leaves its rows in the log
    print(f"\n{started:%Y-%m-%d %H:%M}-{datetime.now(timezone.utc):%H:%M} UTC, {platform.node()}, store {args.store}, "
          f"{args.workers} workers of {args.memory_limit}")
    print(table(results))
    cats = [np.asarray(r["categories"]) for _, _, rows in results for r in rows]
    print("categories equal across modes and versions:", all(np.array_equal(c, cats[0]) for c in cats))
    if len(trees) >= 2:
        print(ratios(results, trees[0][0], trees[-1][0]))


if __name__ == "__main__":
    main()
