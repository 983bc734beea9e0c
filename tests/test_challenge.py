"""``dasknn bench-graphchallenge``: the published layout found, each run checked, the table and the plot written."""

from __future__ import annotations

import csv
import gzip
import json
import shutil
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest

from dasknn import generate, io
from dasknn.challenge import COLUMNS, find_cases, rates_figure
from dasknn.cli import main
from dasknn.errors import DasknnError


@pytest.fixture(scope="module")
def published(tmp_path_factory) -> Path:
    """A tiny published layout: neuron1024/ (truth at 4 and 6 layers), neuron4096.tar.gz (truth at 3 layers)."""
    root = tmp_path_factory.mktemp("published")
    generate.write(root, 1024, 6, images_count=120, seed=3, truth=True)
    # the first 4 layers of the same seed are the same layers: their truth is a second published depth
    four = generate.write(root.parent / "four", 1024, 4, images_count=120, seed=3, truth=True)
    shutil.copy(four / "neuron1024-l4-categories.tsv", root)
    wide = generate.write(root.parent / "wide", 4096, 3, images_count=60, seed=5, truth=True)
    with tarfile.open(root / "neuron4096.tar.gz", "w:gz") as tar:
        tar.add(wide / "neuron4096", arcname="neuron4096")
    with open(wide / "sparse-images-4096.tsv", "rb") as src, gzip.open(root / "sparse-images-4096.tsv.gz", "wb") as dst:
        shutil.copyfileobj(src, dst)
    shutil.copy(wide / "neuron4096-l3-categories.tsv", root)
    return root


def _rows(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_finds_the_published_layout(published):
    cases, notes = find_cases(published)
    assert [(c.neurons, c.layers) for c in cases] == [(1024, 4), (1024, 6), (4096, 3)]
    assert cases[0].network.is_dir() and cases[2].network.name == "neuron4096.tar.gz"
    assert cases[2].images.name == "sparse-images-4096.tsv.gz" and cases[0].images.name == "sparse-images-1024.tsv"
    assert notes == []


def test_nothing_found_is_one_clear_error(tmp_path):
    (tmp_path / "neuron1024").mkdir()
    with pytest.raises(DasknnError, match="no GraphChallenge network with inputs and truth"):
        find_cases(tmp_path)


@pytest.mark.cluster
def test_bench_runs_checks_and_tabulates(published, client, tmp_path, capsys):
    out = tmp_path / "table.csv"
    code = main(["bench-graphchallenge", str(published), "--out", str(out), "--scheduler", client.scheduler.address,
                 "--json"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    rows = _rows(out)
    assert list(rows[0]) == list(COLUMNS)
    assert [(int(r["neurons"]), int(r["layers"])) for r in rows] == [(1024, 4), (1024, 6), (4096, 3)]
    for r in rows:
        n, depth = int(r["neurons"]), int(r["layers"])
        assert r["correct"] == "True" and int(r["mismatched"]) == 0
        assert int(r["edges"]) == 32 * n * depth  # every published layer has 32 nonzeros per column
        assert float(r["rate"]) == pytest.approx(int(r["images"]) * int(r["edges"]) / float(r["time"]), rel=1e-3)
    assert int(rows[2]["images"]) == 60
    png = out.with_suffix(".png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    report = json.loads(captured.out)
    assert report["csv"] == str(out) and len(report["rows"]) == 3


def test_wrong_truth_is_a_wrong_row_not_a_crash(published, client, tmp_path, capsys):
    root = tmp_path / "wrong"
    shutil.copytree(published / "neuron1024", root / "neuron1024")
    shutil.copy(published / "sparse-images-1024.tsv", root)
    truth = io.read_categories(published / "neuron1024-l6-categories.tsv")
    assert truth.size > 1, "the tiny network should leave some images alive"
    io.write_categories(root / "neuron1024-l6-categories.tsv", truth[1:])  # one category dropped
    (root / "neuron1024-l4-categories.tsv").write_text("1\tnot-a-number\n")  # a malformed truth file
    out = tmp_path / "wrong.csv"
    code = main(["bench-graphchallenge", str(root), "--out", str(out), "--scheduler", client.scheduler.address])
    captured = capsys.readouterr()
    assert code == 1
    rows = {int(r["layers"]): r for r in _rows(out)}
    assert rows[6]["correct"] == "False" and int(rows[6]["mismatched"]) == 1
    assert rows[4]["correct"] == "False" and "neuron1024-l4-categories.tsv" in rows[4]["note"]
    assert "WRONG" in captured.out
    assert out.with_suffix(".png").exists()


def test_batch_limits_the_images(published, client, tmp_path, capsys):
    out = tmp_path / "b.csv"
    code = main(["bench-graphchallenge", str(published), "--out", str(out), "--batch", "30", "--dtype", "float32",
                 "--scheduler", client.scheduler.address])
    assert code in (0, 1)
    rows = _rows(out)
    assert all(int(r["images"]) == 30 for r in rows)
    # float32 may flip an image that sits on the threshold, but no more than a handful
    assert all(int(r["mismatched"]) <= 2 for r in rows)
    assert np.all([r["dtype"] == "float32" for r in rows])


def test_rates_are_drawn_on_a_linear_axis_with_units():
    pytest.importorskip("matplotlib", reason="matplotlib is not installed: pip install 'dasknn[plot]'")
    import matplotlib.pyplot as plt

    rows = [{"neurons": 1024, "layers": 120, "rate": 1.5e10, "correct": True},
            {"neurons": 4096, "layers": 120, "rate": 2.5e10, "correct": True},
            {"neurons": 16384, "layers": 120, "rate": None, "correct": False}]
    fig = rates_figure(rows)
    try:
        (ax,) = fig.axes
        assert ax.get_yscale() == "linear" and ax.get_ylim()[0] == 0
        assert "edges / s" in ax.get_ylabel() and "neurons x layers" in ax.get_xlabel()
        heights = [bar.get_height() for bar in ax.patches]
        assert heights[0] / heights[1] == pytest.approx(0.6)
    finally:
        plt.close(fig)


@pytest.mark.cluster
def test_without_matplotlib_the_table_is_still_written(published, client, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as after a plain pip install .
    out = tmp_path / "t.csv"
    argv = ["bench-graphchallenge", str(published), "--out", str(out), "--batch", "20", "--scheduler",
            client.scheduler.address]
    code = main(argv + ["--plot", str(tmp_path / "t.png")])  # asked for: refused before any run, one line
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and 'pip install "dasknn[plot]"' in err and not out.exists()
    code = main(argv)  # the default plot: skipped with a note
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "Traceback" not in captured.err and 'no plot drawn' in captured.err
    assert 'pip install "dasknn[plot]"' in captured.err
    assert len(_rows(out)) == 3 and not out.with_suffix(".png").exists()
