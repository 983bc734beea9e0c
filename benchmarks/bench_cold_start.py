"""Cold start: a fresh cluster's first run against its second, with an empty Numba cache (issue 31, part 2).

For float32 and float64, data and model mode, runs ``dasknn infer`` on the default network (1024 x 120, 20,000
images, generated once under ~/.cache/dasknn) twice in a row, each in a fresh process with a fresh local cluster,
both with ``NUMBA_CACHE_DIR`` set to a new empty folder: Numba's user-provided locator comes first, so the first
run finds no kernel compiled (not even in the ``__pycache__`` beside the package) and writes them there, and the
second loads them. Reports the first run's edges/s over the second's (the target: at least 0.85 each) and the
first run's ``compile_seconds`` (absent before the warm-up existed).

    python benchmarks/bench_cold_start.py [--batch 20000] [--workers 2] [--compare /path/to/other/checkout]

``--compare DIR`` runs every pair with the dasknn of another checkout too (``PYTHONPATH=DIR``, which the workers
inherit), right after this checkout's pair of the same case, so that both see the same machine load.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CASES = [(dtype, mode) for dtype in ("float32", "float64") for mode in ("data", "model")]
TARGET = 0.85


def infer(checkout: Path, dtype: str, mode: str, batch: int, workers: int, cache: Path) -> dict:
    """One ``dasknn infer --json`` in a fresh process of ``checkout``'s dasknn, Numba caching into ``cache``."""
    env = {**os.environ, "NUMBA_CACHE_DIR": str(cache), "PYTHONPATH": str(checkout)}
    argv = [sys.executable, "-m", "dasknn", "infer", "--mode", mode, "--dtype", dtype, "--batch", str(batch),
            "--workers", str(workers), "--json"]
    if mode == "model":
        argv += ["--partition", "hypergraph"]
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=tempfile.gettempdir())
    if proc.returncode not in (0, 1) or not proc.stdout.strip():  # 1: a float32 image flipped, the figures stand
        raise SystemExit(f"{' '.join(argv)} failed ({proc.returncode}):\n{proc.stderr}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def pair(checkout: Path, dtype: str, mode: str, batch: int, workers: int) -> dict:
    """The first and second run of one case, back to back, with a new empty cache folder."""
    with tempfile.TemporaryDirectory(prefix="numba-cold-") as cache:
        assert not any(Path(cache).iterdir())
        first = infer(checkout, dtype, mode, batch, workers, Path(cache))
        written = len(list(Path(cache).rglob("*.nbi")))  # the first run cached its kernels there, cold
        second = infer(checkout, dtype, mode, batch, workers, Path(cache))
    return {"checkout": str(checkout), "dtype": dtype, "mode": mode, "images": first["images"],
            "first_seconds": first["seconds"], "second_seconds": second["seconds"],
            "first_rate": first["edges_per_second"], "second_rate": second["edges_per_second"],
            "ratio": round(first["edges_per_second"] / second["edges_per_second"], 3),
            "first_compile_seconds": first.get("compile_seconds"),
            "second_compile_seconds": second.get("compile_seconds"), "cache_indexes_written": written}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=20000, help="images of the default network (default 20,000)")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--compare", type=Path, help="another checkout of dasknn, run pair by pair beside this one")
    args = p.parse_args()
    # the default network is made once (untimed), before any pair
    subprocess.run([sys.executable, "-c", "from dasknn import generate; generate.default_store()"], check=True,
                   env={**os.environ, "PYTHONPATH": str(ROOT)})
    checkouts = [ROOT] + ([args.compare.resolve()] if args.compare else [])
    rows = []
    for dtype, mode in CASES:
        for checkout in checkouts:
            rows.append(pair(checkout, dtype, mode, args.batch, args.workers))
            print(json.dumps(rows[-1]), flush=True)
    print("| checkout | dtype | mode | first run s | second run s | first / second edges/s | first run compile s |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        compiled = "-" if r["first_compile_seconds"] is None else f"{r['first_compile_seconds']:.1f}"
        name = "this" if r["checkout"] == str(ROOT) else Path(r["checkout"]).name
        print(f"| {name} | {r['dtype']} | {r['mode']} | {r['first_seconds']:.2f} | {r['second_seconds']:.2f} "
              f"| {r['ratio']:.2f} | {compiled} |")
    met = all(r["ratio"] >= TARGET for r in rows if r["checkout"] == str(ROOT))
    print(f"this checkout: every first run at least {TARGET} of its second's rate: {met}")
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
