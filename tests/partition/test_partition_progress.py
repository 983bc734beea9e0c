"""Partitioning reports its progress row by row: a bar on a terminal, nothing under --json or in a pipe."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import numpy as np
import pytest

from dasknn import generate
from dasknn import partition as P
from dasknn.cli.main import main

LAYERS = 5


class _Terminal(io.StringIO):
    """A stderr that says it is a terminal and keeps what is written to it."""

    def isatty(self) -> bool:
        return True


@pytest.fixture(scope="module")
def net_store(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("progress") / "net.zarr"
    assert main(["generate", "--neurons", "64", "--layers", str(LAYERS), "--bias", "-0.3", "--out", str(out), "--json"]) == 0
    return out


@pytest.mark.parametrize("method, sweeps", [("hypergraph", None), ("hypergraph-layered", 1), ("fast", None)])
def test_partition_network_reports_every_row(method: str, sweeps: int | None) -> None:
    ws = generate.network(64, LAYERS, seed=0, bias=-0.3).layers
    calls: list[tuple[int, int]] = []
    P.partition_network(ws, 2, method, sweeps=sweeps, progress=lambda done, total: calls.append((done, total)))
    done = [d for d, _ in calls]
    totals = {t for _, t in calls}
    assert len(totals) == 1 and done == sorted(done)
    total = totals.pop()
    assert done[-1] == total and total >= LAYERS + 1
    assert len(calls) >= LAYERS  # one step per layer at least, not a jump from 0 to the end


def test_partition_shows_a_bar_on_a_terminal(net_store: Path, monkeypatch, capsys) -> None:
    term = _Terminal()
    monkeypatch.setattr(sys, "stderr", term)
    assert main(["partition", str(net_store), "--parts", "2"]) == 0
    shown = term.getvalue()
    assert "partition (hypergraph, K = 2)" in shown
    assert f"{LAYERS + 1}/{LAYERS + 1}" in shown and "100%" in shown
    assert "volume" in capsys.readouterr().out  # the report itself still goes to stdout


def test_partition_json_prints_no_bar_even_on_a_terminal(net_store: Path, monkeypatch, capsys) -> None:
    term = _Terminal()
    monkeypatch.setattr(sys, "stderr", term)
    assert main(["partition", str(net_store), "--parts", "2", "--json"]) == 0
    assert term.getvalue() == ""
    report = json.loads(capsys.readouterr().out)
    assert report["layers"] == LAYERS and np.isfinite(report["volume_total"])


def test_partition_in_a_pipe_prints_no_bar(net_store: Path, capsys) -> None:
    assert main(["partition", str(net_store), "--parts", "2"]) == 0
    assert "partition (" not in capsys.readouterr().err  # capsys's stderr is no terminal
