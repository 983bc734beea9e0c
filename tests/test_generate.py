"""The generator: RadiX-Net-style invariants, sizes, determinism by seed, synthetic images."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from dasknn import generate, io, reference, store
from dasknn.cli import main
from dasknn.errors import DasknnError


@pytest.mark.parametrize("neurons", [1024, 4096, 16384, 65536])
@pytest.mark.parametrize("k", [1, 2, 7])
def test_32_per_row_and_column_with_diagonal(neurons, k):
    w = generate.butterfly_layer(neurons, k, generate.relabelling(neurons, 5))
    assert w.shape == (neurons, neurons) and w.nnz == 32 * neurons
    assert np.all(np.diff(w.indptr) == 32)  # per column
    assert np.all(np.bincount(w.indices, minlength=neurons) == 32)  # per row
    assert np.all(w.diagonal() == 1 / 16)
    assert np.all(w.data == np.float32(1 / 16))
    assert w.has_canonical_format


def test_every_input_reaches_every_output():
    # after b - 4 layers (b = log2 N) the product of the patterns is full
    neurons = 256  # b = 8: 4 layers
    reach = sp.identity(neurons, format="csr")
    for k in range(1, 5):
        reach = (reach @ generate.butterfly_layer(neurons, k, generate.relabelling(neurons, 1))).tocsr()
        reach.data[:] = 1
    assert reach.nnz == neurons * neurons


def test_deterministic_by_seed():
    a = generate.network(1024, 3, seed=7)
    b = generate.network(1024, 3, seed=7)
    c = generate.network(1024, 3, seed=8)
    assert all((x != y).nnz == 0 for x, y in zip(a.layers, b.layers))
    assert any((x != y).nnz > 0 for x, y in zip(a.layers, c.layers))
    assert (generate.images(20, 1024, seed=7) != generate.images(20, 1024, seed=7)).nnz == 0
    assert (generate.images(20, 1024, seed=7) != generate.images(20, 1024, seed=8)).nnz > 0


@pytest.mark.parametrize("neurons", [1024, 4096])
def test_images_are_about_ten_percent_set_and_some_survive(neurons):
    im = generate.images(500, neurons, seed=2)
    density = im.nnz / im.shape[0] / neurons
    assert 0.05 < density < 0.15
    net = generate.network(neurons, 40, seed=2)
    cats = reference.infer_categories(net.layers, im, net.bias, net.ymax, np.float64)
    # neither all nor none: the check against a truth means something
    assert 0.05 * 500 < cats.size < 0.9 * 500


@pytest.mark.parametrize("bad", [0, 1000, 48, -4])
def test_bad_width(bad):
    with pytest.raises(DasknnError, match="power of two"):
        generate.butterfly_layer(bad, 1)


def test_generate_store_and_tsv_agree(tmp_path, capsys):
    assert main(["generate", "--neurons", "1024", "--layers", "4", "--images", "100", "--truth",
                 "--out", str(tmp_path / "g.zarr")]) == 0
    assert main(["generate", "--neurons", "1024", "--layers", "4", "--images", "100", "--truth",
                 "--out", str(tmp_path / "tsv")]) == 0
    s = store.open_store(tmp_path / "g.zarr")
    net = io.read_network(tmp_path / "tsv" / "neuron1024")
    assert s.depth == net.depth == 4
    assert all((s.layer(k) != net.layers[k - 1]).nnz == 0 for k in range(1, 5))
    assert (s.inputs.rows() != io.read_images(tmp_path / "tsv" / "sparse-images-1024.tsv")).nnz == 0
    np.testing.assert_array_equal(s.inputs.truth(), io.read_categories(tmp_path / "tsv" / "neuron1024-l4-categories.tsv"))
    expected = reference.infer_categories(net.layers, s.inputs.rows(), s.bias, s.ymax, np.float64)
    np.testing.assert_array_equal(s.inputs.truth(), expected)


@pytest.mark.parametrize("neurons, layers, count, seed", [(1024, 30, 300, 0), (4096, 8, 51, 3)])
def test_the_truth_in_chunks_on_threads_is_the_whole_batch_loop(neurons, layers, count, seed):
    # the truth as generate computed it before (the whole batch through each layer, one thread), in both dtypes
    batch = generate.images(count, neurons, seed)
    bias = generate.challenge_bias(neurons)
    expected = {dt: reference.infer_categories(generate.iter_layers(neurons, layers, seed), batch, bias, 32.0, dt)
                for dt in (np.float64, np.float32)}
    for threads in (1, 2, 3):
        done: list[int] = []
        got = generate.reference_categories(neurons, layers, seed, batch, bias, threads=threads, progress=done.append)
        assert set(got) == set(expected) and done == list(range(1, layers + 1))
        for dt in expected:
            np.testing.assert_array_equal(got[dt], expected[dt])


@pytest.mark.parametrize("truth", [True, False])
def test_generate_says_each_stage_in_a_pipe(truth, tmp_path, capsys):
    argv = ["generate", "--neurons", "1024", "--layers", "3", "--images", "20", "--out", str(tmp_path / "g.zarr")]
    assert main(argv + (["--truth"] if truth else [])) == 0
    err = capsys.readouterr().err  # capsys's stderr is no terminal
    stages = [generate.LAYERS_STAGE] + ([generate.TRUTH_STAGE] if truth else [])
    assert err == "".join(f"dasknn: {name} ...\n" for name in stages)
    assert (store.open_store(tmp_path / "g.zarr").inputs.truth() is not None) is truth


def test_generate_shows_a_bar_per_stage_on_a_terminal(tmp_path, monkeypatch, capsys):
    import io as _io
    import sys

    class Terminal(_io.StringIO):
        def isatty(self) -> bool:
            return True

    term = Terminal()
    monkeypatch.setattr(sys, "stderr", term)
    assert main(["generate", "--neurons", "1024", "--layers", "3", "--images", "20", "--truth",
                 "--out", str(tmp_path / "g.zarr")]) == 0
    shown = term.getvalue()
    assert generate.LAYERS_STAGE in shown and generate.TRUTH_STAGE in shown and "3/3" in shown
    assert "dasknn: " not in shown  # bars, not lines


def test_random_weights_keep_the_wiring_and_are_drawn_once_per_seed_and_layer():
    constant = generate.network(1024, 3, seed=4)
    drawn = generate.network(1024, 3, seed=4, weights="random")
    again = list(generate.iter_layers(1024, 3, seed=4, dtype=np.float64, weights="random"))
    for c, r, r64 in zip(constant.layers, drawn.layers, again):
        np.testing.assert_array_equal(r.indptr, c.indptr)
        np.testing.assert_array_equal(r.indices, c.indices)
        assert r.dtype == np.float32 and np.unique(r.data).size > 0.99 * r.nnz  # no two values alike, or nearly
        assert 1 / 32 <= r.data.min() and r.data.max() < 3 / 32 and abs(r.data.mean() - 1 / 16) < 1e-3
        np.testing.assert_array_equal(r64.data, r.data.astype(np.float64))  # every precision sees the stored values
    assert not np.array_equal(drawn.layers[0].data, drawn.layers[1].data)
    with pytest.raises(DasknnError, match="--weights must be one of constant, random"):
        generate.network(1024, 1, weights="gaussian")


def test_a_random_weights_store_does_not_compress(tmp_path, capsys):
    sizes = {}
    for weights in generate.WEIGHTS:
        out = tmp_path / f"{weights}.zarr"
        assert main(["generate", "--neurons", "1024", "--layers", "4", "--weights", weights, "--out", str(out)]) == 0
        sizes[weights] = store.open_store(out).nbytes_on_disk()
        values = sum(f.stat().st_size for f in out.glob("layers/*/values/**/*") if f.is_file())
        raw = 4 * 32 * 1024 * 4  # float32 values of 4 layers
        sizes[f"{weights} values"] = values / raw
    assert sizes["random"] > 8 * sizes["constant"]
    # drawn float32 values: only their sign and exponent bits are alike (a byte in four), which Zstandard finds
    assert sizes["random values"] > 0.8 and sizes["constant values"] < 0.1


@pytest.mark.parametrize("neurons, layers", [(1024, 60), (4096, 24)])
def test_random_weights_neither_kill_nor_keep_every_image(neurons, layers):
    net = generate.network(neurons, layers, seed=1, weights="random")
    cats = reference.infer_categories(net.layers, generate.images(300, neurons, seed=1), net.bias, net.ymax,
                                      np.float64)
    assert 0.05 * 300 < cats.size < 0.9 * 300


@pytest.mark.cluster
@pytest.mark.parametrize("mode", ["data", "model"])
def test_a_random_weights_store_infers_the_reference_categories(mode, tmp_path, client, capsys):
    import json

    out = tmp_path / "r.zarr"
    assert main(["generate", "--neurons", "1024", "--layers", "30", "--images", "200", "--truth", "--weights", "random",
                 "--out", str(out)]) == 0
    s = store.open_store(out)
    expected = reference.infer_categories(s.network().layers, s.inputs.rows(), s.bias, s.ymax, np.float32)
    assert 0 < expected.size < 200
    capsys.readouterr()
    categories = tmp_path / "categories.tsv"
    assert main(["infer", "--network", str(out), "--mode", mode, "--scheduler", client.scheduler.address,
                 "--out", str(categories), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["matches_truth"] is True
    np.testing.assert_array_equal(io.read_categories(categories), expected)
