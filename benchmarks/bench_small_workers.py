"""The default run on small workers (issue 42, item 1): ``dasknn infer`` (auto mode) on a generated 65,536 x 120
store with 200 images, 2 workers of 600 MB, against the same run without a memory limit.

Each run is a fresh process (``python -m dasknn``, its local cluster its children); the resident memory of the
whole process tree is sampled every 0.2 s (psutil) and its peak reported, and each process's own, with the wall
time, the exit status, the mode the run took, the losses of workers it survived and whether its categories are
the unconstrained run's.

    python benchmarks/bench_small_workers.py [--store /tmp/g65k.zarr] [--memory-limit 600MB] [--checkout DIR]
                                             [--cold] [--runs 1]

``--checkout DIR`` runs another checkout's dasknn (``PYTHONPATH=DIR``, which the workers inherit), e.g. the commit
before a change; ``--cold`` gives each constrained run an empty ``NUMBA_CACHE_DIR`` (a first run's compiling).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]


def tree_rss(root: psutil.Process, each: dict[int, int]) -> int:
    """The resident bytes of ``root`` and all its children now; each one's peak so far kept in ``each`` by pid."""
    total = 0
    for proc in [root, *root.children(recursive=True)]:
        try:
            rss = proc.memory_info().rss
        except psutil.Error:
            continue
        total += rss
        each[proc.pid] = max(each.get(proc.pid, 0), rss)
    return total


def measured(argv: list[str], env: dict) -> dict:
    """Run ``argv``; its exit status, wall seconds, the peak RSS of its process tree, its JSON (if any), stderr."""
    t0 = time.perf_counter()
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(argv, stdout=out, stderr=err, env=env, cwd=tempfile.gettempdir())
        root, peak, each = psutil.Process(proc.pid), 0, {}
        while proc.poll() is None:
            try:
                peak = max(peak, tree_rss(root, each))
            except psutil.NoSuchProcess:
                break
            time.sleep(0.2)
        out.seek(0), err.seek(0)
        text, lines = out.read().strip(), err.read().strip().splitlines()
    report = json.loads(text.splitlines()[-1]) if text else {}
    return {"rc": proc.returncode, "wall_s": round(time.perf_counter() - t0, 1), "peak_mb": round(peak / 1e6),
            # each process's own peak (the client, the workers, a child compiling), over 100 MB, largest first
            "each_mb": sorted((round(b / 1e6) for b in each.values() if b > 100e6), reverse=True),
            "report": report, "stderr": [line for line in lines if line.startswith("dasknn:")]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--store", default=str(Path(tempfile.gettempdir()) / "g65k.zarr"))
    parser.add_argument("--memory-limit", default="600MB")
    parser.add_argument("--checkout", default=str(ROOT))
    parser.add_argument("--cold", action="store_true")
    parser.add_argument("--runs", type=int, default=1)
    args = parser.parse_args()
    env = {**os.environ, "PYTHONPATH": args.checkout}
    dasknn = [sys.executable, "-m", "dasknn"]
    if not Path(args.store).exists():
        subprocess.run([*dasknn, "generate", "--neurons", "65536", "--layers", "120", "--images", "200", "--seed",
                        "3", "--out", args.store], check=True, env=env)
    infer = [*dasknn, "infer", "--network", args.store, "--workers", "2", "--json"]
    free = measured([*infer, "--out", str(Path(tempfile.gettempdir()) / "free.tsv")], env)
    print(json.dumps({"run": "no limit", "rc": free["rc"], "wall_s": free["wall_s"], "peak_mb": free["peak_mb"],
                      "mode": free["report"].get("mode"), "categories": free["report"].get("categories")}))
    truth = (Path(tempfile.gettempdir()) / "free.tsv").read_text()
    for i in range(args.runs):
        out = Path(tempfile.gettempdir()) / f"limited-{i}.tsv"
        out.unlink(missing_ok=True)
        run_env = {**env, "NUMBA_CACHE_DIR": tempfile.mkdtemp(prefix="bench-numba-")} if args.cold else env
        got = measured([*infer, "--memory-limit", args.memory_limit, "--out", str(out)], run_env)
        if args.cold:
            shutil.rmtree(run_env["NUMBA_CACHE_DIR"], ignore_errors=True)
        r = got["report"]
        print(json.dumps({"run": f"--memory-limit {args.memory_limit}" + (" (cold cache)" if args.cold else ""),
                          "rc": got["rc"], "wall_s": got["wall_s"], "peak_mb": got["peak_mb"],
                          # the run's named parts (the JSON's timings) together, against the wall above
                          "timings_s": round(sum(r.get("timings", {}).values()), 1),
                          "each_mb": got["each_mb"], "mode": r.get("mode"), "streamed": r.get("streamed"), "chunks": r.get("chunks"),
                          "probe_images": r.get("calibration", {}).get("probe_images"),
                          "losses": [(x["phase"], len(x["lost"])) for x in r.get("recoveries", [])],
                          "same_categories": out.exists() and out.read_text() == truth,
                          "stderr": got["stderr"][-1:]}))


if __name__ == "__main__":
    main()
