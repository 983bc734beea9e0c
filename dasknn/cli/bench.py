"""``dasknn bench-graphchallenge DIR``: the command around :mod:`dasknn.challenge` (find, run, tabulate, plot)."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from ..challenge import find_cases, plot_rates, run_case, write_csv
from ..errors import DasknnError
from ..modes import INFERENCE
from .common import (PLOT_EXTRA, check_report, emit, has_matplotlib, local_argument, mismatch_line,
                     performance_report, positive_int, require_matplotlib)


def cmd_bench(args) -> int:
    """``dasknn bench-graphchallenge``: run every case, write the CSV and the PNG; exit 1 if any is not correct."""
    from ..cluster import local_client

    cases, notes = find_cases(args.dir)
    for note in notes:
        print(f"dasknn: skipped {note}", file=sys.stderr)
    out = Path(args.out)
    if args.plot:
        require_matplotlib("--plot")
    plot = Path(args.plot) if args.plot else out.with_suffix(".png")
    for p in (out, plot):
        if not p.resolve().parent.is_dir():
            raise DasknnError("the folder to write into does not exist", p)
    if not has_matplotlib():  # the default plot is a bonus: the table is the result
        print(f"dasknn: no plot drawn: matplotlib is not installed ({PLOT_EXTRA})", file=sys.stderr)
        plot = None
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
                           f"WRONG ({row['note'] or mismatch_line(row['mismatched'], row['images'], args.dtype)})")
                rate = f"{row['rate']:.3e} edges/s" if row["rate"] else "-"
                print(f"{case.name}: {row['time'] or float('nan'):.3f} s, {rate}, {verdict}",
                      flush=True)
            write_csv(rows, out)  # after every case: a long run stopped midway keeps what it measured
    if plot is not None:
        plot_rates(rows, plot)
    emit(args, {"csv": str(out), "plot": None if plot is None else str(plot), "rows": rows, "skipped": notes},
         f"wrote {out}{'' if plot is None else f' and {plot}'}: {sum(r['correct'] for r in rows)} of {len(rows)} "
         f"correct")
    return 0 if all(r["correct"] for r in rows) else 1


def add_bench_parser(subparsers) -> None:
    """Add ``dasknn bench-graphchallenge`` to an argparse subparsers object."""
    p = subparsers.add_parser(
        "bench-graphchallenge", help="run every GraphChallenge network under DIR, check it, tabulate and plot",
        description="Find the published files under DIR (neuron{N}.tar.gz or neuron{N}/, sparse-images-{N}.tsv[.gz], "
                    "neuron{N}-l{L}-categories.tsv); run each network and depth that has a truth file, check its "
                    "categories, and write a CSV (neurons, layers, edges, time, rate, correct, ...) and a PNG of "
                    "edges/s by network. Exit status 1 when any result is not correct.")
    p.add_argument("dir", metavar="DIR", type=local_argument("DIR"),
                   help="the folder holding the published files (searched recursively)")
    p.add_argument("--out", default="graphchallenge.csv", metavar="CSV", type=local_argument("--out"),
                   help="the CSV to write (default graphchallenge.csv)")
    p.add_argument("--plot", metavar="PNG", type=local_argument("--plot"),
                   help="the PNG to draw (default: the CSV's name with .png; needs matplotlib, "
                        f"{PLOT_EXTRA}: without it the default plot is skipped with a note)")
    p.add_argument("--dtype", choices=("float32", "float64"), default="float64",
                   help="arithmetic (default float64, in which the published truth is exact)")
    p.add_argument("--mode", choices=INFERENCE, default="auto",
                   help="as for dasknn infer (default auto)")
    p.add_argument("--batch", type=int, help="use only the first BATCH images of each input")
    p.add_argument("--chunks", type=int,
                   help="image chunks per run (default: the engine's, see dasknn infer --help)")
    p.add_argument("--workers", type=positive_int, help="local worker processes (default: one per core)")
    p.add_argument("--threads-per-worker", type=positive_int, default=1, help="threads per local worker (default 1)")
    p.add_argument("--memory-limit", help="local workers' memory limit, e.g. 2GB")
    p.add_argument("--scheduler", help="address of a running Dask scheduler (instead of a local cluster)")
    p.add_argument("--report", metavar="PATH.html", type=local_argument("--report"),
                   help="write Dask's performance report of all runs to this file")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=cmd_bench)
