"""Cold start: a fresh cluster's first run against its second, with an empty Numba cache (issue 31, part 2).

For float32 and float64, data and model mode, runs ``dasknn infer`` on the default network (1024 x 120, 20,000
images, generated once under ~/.cache/dasknn) twice in a row, each in a fresh process with a fresh local cluster,
both with ``NUMBA_CACHE_DIR`` set to a new empty folder: Numba's user-provided locator comes first, so the first
run finds no kernel compiled (not even in the ``__pycache__`` beside the package) and writes them there, and the
second loads them. Reports the first run's edges/s over the second's (the target: at least 0.85 each) and the
first run's ``compile_seconds`` (absent before the warm-up existed). With ``--train``, also ``dasknn train`` (digits,
one epoch, a generated 1024 x 4 network) in data and model mode the same way: steps/s, first over second.

    python benchmarks/bench_cold_start.py [--batch 20000] [--workers 2] [--compare /path/to/other/checkout] [--train]

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


def command(checkout: Path, argv: list[str], cache: Path) -> dict:
    """One ``dasknn ... --json`` in a fresh process of ``checkout``'s dasknn, Numba caching into ``cache``."""
    env = {**os.environ, "NUMBA_CACHE_DIR": str(cache), "PYTHONPATH": str(checkout)}
    argv = [sys.executable, "-m", "dasknn", *argv, "--json"]
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=tempfile.gettempdir())
    if proc.returncode not in (0, 1) or not proc.stdout.strip():  # 1: a float32 image flipped, the figures stand
        raise SystemExit(f"{' '.join(argv)} failed ({proc.returncode}):\n{proc.stderr}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def infer_argv(dtype: str, mode: str, batch: int, workers: int) -> list[str]:
    """``dasknn infer`` on the default network (a hypergraph partition in model mode, kept in its store)."""
    return ["infer", "--mode", mode, "--dtype", dtype, "--batch", str(batch), "--workers", str(workers),
            *(["--partition", "hypergraph"] if mode == "model" else [])]


def train_argv(network: Path, mode: str, workers: int) -> list[str]:
    """``dasknn train`` on ``network``: digits, one epoch."""
    return ["train", "--network", str(network), "--data", "digits", "--epochs", "1", "--mode", mode,
            "--workers", str(workers), "--partition", "random"]


def pair(checkout: Path, case: tuple[str, str], argv: list[str]) -> dict:
    """The first and second run of one case, back to back, with a new empty cache folder: their rate (edges/s,
    or steps/s for training), seconds and compile_seconds."""
    with tempfile.TemporaryDirectory(prefix="numba-cold-") as cache:
        assert not any(Path(cache).iterdir())
        first = command(checkout, argv, Path(cache))
        written = len(list(Path(cache).rglob("*.nbi")))  # the first run cached its kernels there, cold
        second = command(checkout, argv, Path(cache))
    rate = "edges_per_second" if argv[0] == "infer" else "steps_per_second"
    return {"checkout": str(checkout), "dtype": case[0], "mode": case[1],
            "first_seconds": first["seconds"], "second_seconds": second["seconds"],
            "first_rate": first[rate], "second_rate": second[rate], "ratio": round(first[rate] / second[rate], 3),
            "first_compile_seconds": first.get("compile_seconds"),
            "second_compile_seconds": second.get("compile_seconds"), "cache_indexes_written": written}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=20000, help="images of the default network (default 20,000)")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--compare", type=Path, help="another checkout of dasknn, run pair by pair beside this one")
    p.add_argument("--train", action="store_true", help="also dasknn train, data and model mode")
    args = p.parse_args()
    # the default network is made once (untimed), before any pair
    subprocess.run([sys.executable, "-c", "from dasknn import generate; generate.default_store()"], check=True,
                   env={**os.environ, "PYTHONPATH": str(ROOT)})
    checkouts = [ROOT] + ([args.compare.resolve()] if args.compare else [])
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-cold-") as tmp:
        cases = [((dtype, mode), infer_argv(dtype, mode, args.batch, args.workers)) for dtype, mode in CASES]
        if args.train:
            network = Path(tmp) / "net4.zarr"
            subprocess.run([sys.executable, "-m", "dasknn", "generate", "--neurons", "1024", "--layers", "4",
                            "--out", str(network)], check=True, capture_output=True,
                           env={**os.environ, "PYTHONPATH": str(ROOT)})
            cases += [(("float64", f"train {mode}"), train_argv(network, mode, args.workers))
                      for mode in ("data", "model")]
        for case, argv in cases:
            for checkout in checkouts:
                rows.append(pair(checkout, case, argv))
                print(json.dumps(rows[-1]), flush=True)
    print("| checkout | dtype | mode | first run s | second run s | first / second rate | first run compile s |")
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
