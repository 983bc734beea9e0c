"""``dasknn bench-graphchallenge DIR``: every official network and input under DIR, run, checked, tabulated.

The published layout (https://graphchallenge.mit.edu/data-sets): a network is ``neuron{N}.tar.gz`` or a folder
``neuron{N}/`` of ``n{N}-l{k}.tsv`` files; its inputs ``sparse-images-{N}.tsv.gz`` (or ``.tsv``); and one truth
file ``neuron{N}-l{L}-categories.tsv`` per published depth L. Each (N, L) with a truth file is one run: the first L
layers, imported into a temporary store (not timed), inferred on the cluster (timed, as the challenge times it) and
compared with the truth. The table has the challenge's columns (neurons, layers, edges, time, rate, correct).
"""

from __future__ import annotations

import csv
import math
import os
import re
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .errors import DasknnError

COLUMNS = ("neurons", "layers", "edges", "time", "rate", "correct", "images", "mismatched", "dtype", "mode",
           "workers", "note")

_NETWORK = re.compile(r"^neuron(\d+)(\.tar\.gz)?$")
_TRUTH = re.compile(r"^neuron(\d+)-l(\d+)-categories\.tsv$")


@dataclass(frozen=True)
class Case:
    """One challenge run: the first ``layers`` layers of ``network`` on ``images``, checked against ``truth``."""

    neurons: int
    layers: int
    network: Path
    images: Path
    truth: Path

    @property
    def name(self) -> str:
        return f"{self.neurons} x {self.layers}"


def find_cases(root: str | os.PathLike[str]) -> tuple[list[Case], list[str]]:
    """The runs the published files under ``root`` allow, smallest first, and notes on what was left out.

    A folder ``neuron{N}/`` is preferred to ``neuron{N}.tar.gz`` when both exist (it reads faster); files are
    found at any depth below ``root``.
    """
    root = Path(root)
    if not root.is_dir():
        raise DasknnError("is not a directory", root)
    networks: dict[int, Path] = {}
    images: dict[int, Path] = {}
    truths: dict[tuple[int, int], Path] = {}
    for path in sorted(root.rglob("*")):
        name = path.name
        m = _NETWORK.match(name)
        if m and (path.is_dir() if m.group(2) is None else path.is_file()):
            n = int(m.group(1))
            if n not in networks or path.is_dir():
                networks[n] = path
            continue
        m = re.match(r"^sparse-images-(\d+)\.tsv(\.gz)?$", name)
        if m and path.is_file():
            n = int(m.group(1))
            if n not in images or not name.endswith(".gz"):  # plain TSV reads faster than gzip
                images[n] = path
            continue
        m = _TRUTH.match(name)
        if m and path.is_file():
            truths[(int(m.group(1)), int(m.group(2)))] = path
    cases, notes = [], []
    for (n, depth), truth in sorted(truths.items()):
        if n not in networks:
            notes.append(f"{truth.name}: no neuron{n}.tar.gz or neuron{n}/ under {root}")
        elif n not in images:
            notes.append(f"{truth.name}: no sparse-images-{n}.tsv[.gz] under {root}")
        else:
            cases.append(Case(n, depth, networks[n], images[n], truth))
    for n in sorted(set(networks) - {n for n, _ in truths}):
        notes.append(f"{networks[n].name}: no neuron{n}-l{{L}}-categories.tsv truth file under {root}")
    if not cases:
        raise DasknnError("no GraphChallenge network with inputs and truth found (expected neuron{N}.tar.gz or "
                          "neuron{N}/, sparse-images-{N}.tsv[.gz], neuron{N}-l{L}-categories.tsv)", root)
    return cases, notes


def run_case(case: Case, client, workdir: str | os.PathLike[str], *, dtype: str = "float64", mode: str = "auto",
             batch: int | None = None, chunks: int | None = None) -> dict:
    """Import, infer and check one case on ``client``; return its table row (a bad file ends as a row, with a note).

    The time is inference only (the import into ``workdir`` is not counted), as the challenge times it.
    """
    from . import engine, io
    from .cli import import_network

    row: dict = {"neurons": case.neurons, "layers": case.layers, "edges": None, "time": None, "rate": None,
                 "correct": False, "images": None, "mismatched": None, "dtype": dtype, "mode": None,
                 "workers": None, "note": ""}
    try:
        store = import_network(case.network, Path(workdir) / f"n{case.neurons}-l{case.layers}.zarr",
                               inputs=case.images, layers=case.layers, overwrite=True)
        result = engine.infer(store, store, client, mode=mode, images=batch, chunks=chunks, dtype=dtype)
        truth = io.read_categories(case.truth)
        truth = truth[truth < result.images]  # 0-based: only the images run
        mismatched = int(np.setxor1d(result.categories, truth).size)
    except DasknnError as e:
        row["note"] = str(e)
        return row
    rate = result.edges_per_second
    row.update(edges=result.edges, time=result.seconds, rate=rate if math.isfinite(rate) else None,
               correct=mismatched == 0, images=result.images, mismatched=mismatched, mode=result.mode,
               workers=result.workers)
    return row


def write_csv(rows: list[dict], path: str | os.PathLike[str]) -> None:
    """The table, one row per case, in :data:`COLUMNS` order."""
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        for row in rows:
            w.writerow({k: ("" if row[k] is None else f"{row[k]:.6g}" if k in ("time", "rate") else row[k])
                        for k in COLUMNS})


def plot_rates(rows: list[dict], path: str | os.PathLike[str]) -> None:
    """A bar chart of edges/s by network (log scale); bars of wrong results hatched and labelled."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{r['neurons']} x {r['layers']}" for r in rows]
    rates = [r["rate"] if r["rate"] and math.isfinite(r["rate"]) else 0.0 for r in rows]
    fig, ax = plt.subplots(figsize=(max(4.0, 1.1 * len(rows) + 2), 3.6))
    bars = ax.bar(labels, rates, color=["tab:blue" if r["correct"] else "tab:red" for r in rows])
    for bar, r in zip(bars, rows):
        if not r["correct"]:
            bar.set_hatch("//")
        text = f"{r['rate']:.2e}" if r["rate"] else "failed"
        ax.annotate(text if r["correct"] else f"{text}\nwrong", (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                    ha="center", va="bottom", fontsize=8)
    if any(rates):
        ax.set_yscale("log")
    ax.set_xlabel("network (neurons x layers)")
    ax.set_ylabel("edges / s (images x edges / time)")
    ax.set_title("GraphChallenge inference rate")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def cmd_bench(args) -> int:
    """``dasknn bench-graphchallenge``: run every case, write the CSV and the PNG; exit 1 if any is not correct."""
    from .cli import _emit, check_report, performance_report
    from .cluster import local_client

    cases, notes = find_cases(args.dir)
    for note in notes:
        print(f"dasknn: skipped {note}", file=sys.stderr)
    out = Path(args.out)
    plot = Path(args.plot) if args.plot else out.with_suffix(".png")
    for p in (out, plot):
        if not p.resolve().parent.is_dir():
            raise DasknnError("the folder to write into does not exist", p)
    check_report(args.report)
    rows = []
    with tempfile.TemporaryDirectory(prefix="dasknn-bench-") as tmp, \
            local_client(args.workers, args.threads_per_worker, args.scheduler,
                         memory_limit=args.memory_limit or "auto") as client, \
            performance_report(args.report, client):
        for case in cases:
            row = run_case(case, client, tmp, dtype=args.dtype, mode=args.mode, batch=args.batch, chunks=args.chunks)
            rows.append(row)
            if not args.json:
                verdict = ("correct" if row["correct"] else
                           f"WRONG ({row['note'] or str(row['mismatched']) + ' images differ from the truth'})")
                rate = f"{row['rate']:.3e} edges/s" if row["rate"] else "-"
                print(f"{case.name}: {row['time'] or float('nan'):.3f} s, {rate}, {verdict}",
                      flush=True)
            write_csv(rows, out)  # after every case: a long run stopped midway keeps what it measured
    plot_rates(rows, plot)
    _emit(args, {"csv": str(out), "plot": str(plot), "rows": rows, "skipped": notes},
          f"wrote {out} and {plot}: {sum(r['correct'] for r in rows)} of {len(rows)} correct")
    return 0 if all(r["correct"] for r in rows) else 1


def add_bench_parser(subparsers) -> None:
    """Add ``dasknn bench-graphchallenge`` to an argparse subparsers object."""
    p = subparsers.add_parser(
        "bench-graphchallenge", help="run every GraphChallenge network under DIR, check it, tabulate and plot",
        description="Find the published files under DIR (neuron{N}.tar.gz or neuron{N}/, sparse-images-{N}.tsv[.gz], "
                    "neuron{N}-l{L}-categories.tsv); run each network and depth that has a truth file, check its "
                    "categories, and write a CSV (neurons, layers, edges, time, rate, correct, ...) and a PNG of "
                    "edges/s by network. Exit status 1 when any result is not correct.")
    p.add_argument("dir", metavar="DIR", help="the folder holding the published files (searched recursively)")
    p.add_argument("--out", default="graphchallenge.csv", metavar="CSV", help="the CSV to write (default graphchallenge.csv)")
    p.add_argument("--plot", metavar="PNG", help="the PNG to draw (default: the CSV's name with .png)")
    p.add_argument("--dtype", choices=("float32", "float64"), default="float64",
                   help="arithmetic (default float64, in which the published truth is exact)")
    p.add_argument("--mode", choices=("auto", "data", "model", "hybrid"), default="auto",
                   help="as for dasknn infer (default auto)")
    p.add_argument("--batch", type=int, help="use only the first BATCH images of each input")
    p.add_argument("--chunks", type=int,
                   help="image chunks per run (default: the engine's, see dasknn infer --help)")
    p.add_argument("--workers", type=int, help="local worker processes (default: one per core)")
    p.add_argument("--threads-per-worker", type=int, default=1, help="threads per local worker (default 1)")
    p.add_argument("--memory-limit", help="local workers' memory limit, e.g. 2GB")
    p.add_argument("--scheduler", help="address of a running Dask scheduler (instead of a local cluster)")
    p.add_argument("--report", metavar="PATH.html", help="write Dask's performance report of all runs to this file")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=cmd_bench)
