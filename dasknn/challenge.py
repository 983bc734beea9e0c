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
from dataclasses import dataclass
from pathlib import Path

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
    from .api import infer
    from .ingest import import_network

    row: dict = {"neurons": case.neurons, "layers": case.layers, "edges": None, "time": None, "rate": None,
                 "correct": False, "images": None, "mismatched": None, "dtype": dtype, "mode": None,
                 "workers": None, "note": ""}
    try:
        store = import_network(case.network, Path(workdir) / f"n{case.neurons}-l{case.layers}.zarr",
                               inputs=case.images, layers=case.layers, overwrite=True)
        # the one way in, as the command line's and Python's: it checks the truth before the run (a truth that
        # cannot be this batch's is a row with a note, not a run's worth of mismatches) and compares with it after
        result = infer(store, store, client, truth=case.truth, mode=mode, batch=batch, chunks=chunks, dtype=dtype)
        mismatched = result.mismatched
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


def rates_figure(rows: list[dict]):
    """A bar chart of edges/s by network, on a linear axis (rates compare by ratio: 1.5e10 looks 60 % of 2.5e10).

    Bars of wrong results are red, hatched and labelled. Returns the matplotlib ``Figure`` (drawn with the Agg
    backend, not shown); :func:`plot_rates` saves and closes it.
    """
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
    ax.set_yscale("linear")
    ax.set_ylim(0, 1.15 * max(rates, default=0.0) or 1.0)  # from zero, with room for the labels
    ax.set_xlabel("network (neurons x layers)")
    ax.set_ylabel("rate (edges / s = images x edges / seconds)")
    ax.set_title("GraphChallenge inference rate")
    fig.tight_layout()
    return fig


def plot_rates(rows: list[dict], path: str | os.PathLike[str]) -> None:
    """Draw :func:`rates_figure` of ``rows`` to the PNG ``path``."""
    import matplotlib.pyplot as plt

    fig = rates_figure(rows)
    fig.savefig(path, dpi=120)
    plt.close(fig)
