"""What ``--mode auto`` costs before its run: the command line's phases, two code versions alternated.

``dasknn infer`` (whose mode is ``auto`` by default) runs the cost model's calibration before the inference: a probe
of the batch on one worker, then data mode's loop and its cost a layer timed on every worker (and model mode's step
where it is weighed). This runs the whole command as a user does, ``dasknn infer --network STORE --explain --json``
with the given workers, once per version and round, each version's tree first on ``PYTHONPATH`` (so its workers
import it too), the versions alternating round by round so the machine's load falls on both alike; a first untimed
run of each version fills its kernels' compiled cache. It reports the phases the JSON's ``timings`` name (the store
read on the client: ``reading``; the calibration: ``probe``; ``inference``), the wall seconds of the process, the
mode auto chose and each mode's predicted seconds, and whether the categories agree. ``--plain`` runs it without
``--explain``, as a default run does.

    python benchmarks/bench_calibration.py STORE --tree before=/tmp/before --tree after=. [--rounds 3]
        [--workers 2] [--memory-limit 2GB] [--batch N] [--plain]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from versions import add_tree_argument, named_trees, tree_env  # noqa: E402

PHASES = ("reading", "probe", "inference")


def run_once(tree: str, args) -> dict:
    """One ``dasknn infer`` of ``tree``: its JSON, with the process's wall seconds and the load average after."""
    cmd = [sys.executable, "-m", "dasknn", "infer", "--network", args.store, "--workers", str(args.workers),
           "--threads", "1", "--memory-limit", args.memory_limit, "--json", *([] if args.plain else ["--explain"])]
    if args.batch:
        cmd += ["--batch", str(args.batch)]
    t0 = time.perf_counter()
    # (run from the tree: ``python -m`` puts the working folder first on the path, before PYTHONPATH)
    out = subprocess.run(cmd, env=tree_env(tree), cwd=tree, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    wall = time.perf_counter() - t0
    if out.returncode != 0:
        raise SystemExit(f"bench_calibration: {tree} exited {out.returncode}: {out.stderr.strip()[-2000:]}")
    figures = json.loads(out.stdout)
    figures["wall"] = wall
    figures["load_avg"] = os.getloadavg()[0]
    return figures


def row(version: str, rnd: int, f: dict) -> str:
    phases = " | ".join(f"{f['timings'].get(name, 0.0):.2f}" for name in PHASES)
    predicted = ", ".join(f"{p['mode']}{'' if p['group_size'] <= 1 else ' K=' + str(p['group_size'])} "
                          f"{p['seconds']:.1f}" for p in f.get("predictions", []))
    return (f"| {rnd} | {version} | {phases} | {f['wall']:.2f} | {f['mode']} | {predicted} | "
            f"{f['categories'] if isinstance(f['categories'], int) else len(f['categories'])} | {f['load_avg']:.1f} |")


def table(results: list[tuple[str, int, dict]]) -> str:
    lines = ["| round | version | " + " s | ".join(PHASES) + " s | wall s | auto chose | predicted s | categories | "
             "load avg |", "|--:|---|" + "--:|" * (len(PHASES) + 1) + "---|---|--:|--:|"]
    lines += [row(version, rnd, f) for version, rnd, f in results]
    return "\n".join(lines)


def ratios(results: list[tuple[str, int, dict]], before: str, after: str) -> str:
    """After over before, per phase and for the wall: round by round, and of the sums over the rounds."""
    lines = []
    for name in (*PHASES, "wall"):
        def of(version):
            return [f["wall"] if name == "wall" else f["timings"].get(name, 0.0) for v, _, f in results if v == version]

        b, a = of(before), of(after)
        if not b or not a or not sum(b):
            continue
        pairs = ", ".join(f"{x / y:.2f}" if y else "-" for x, y in zip(a, b))
        lines.append(f"  {name}: {after}/{before} per round {pairs}; over the rounds {sum(a) / sum(b):.2f}")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("store")
    add_tree_argument(p)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--memory-limit", default="2GB")
    p.add_argument("--batch", type=int, default=None, help="images to run (default: all stored)")
    p.add_argument("--plain", action="store_true",
                   help="run the command without --explain, as a default run does (auto calibrates only where it "
                        "weighs more than one mode)")
    args = p.parse_args()
    trees = named_trees(args, "bench_calibration")
    if "://" not in args.store:
        args.store = str(Path(args.store).resolve())  # (each run's working folder is its tree)
    started = datetime.now(timezone.utc)
    for name, tree in trees:  # each tree's compiled kernels cached before the clock
        t0 = time.perf_counter()
        run_once(tree, args)
        print(f"warm-up of {name}: {time.perf_counter() - t0:.1f} s", flush=True)
    results = []
    for rnd in range(1, args.rounds + 1):
        for name, tree in trees:
            results.append((name, rnd, run_once(tree, args)))
            print(row(name, rnd, results[-1][2]), flush=True)
    print(f"\n{started:%Y-%m-%d %H:%M}-{datetime.now(timezone.utc):%H:%M} UTC, {platform.node()}, store {args.store}, "
          f"{args.workers} workers of {args.memory_limit}")
    print(table(results))
    cats = [f["categories"] for _, _, f in results]
    print("categories equal across rounds and versions:", all(c == cats[0] for c in cats))
    if len(trees) >= 2:
        print(ratios(results, trees[0][0], trees[-1][0]))


if __name__ == "__main__":
    main()
