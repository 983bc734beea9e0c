"""GraphChallenge parsers and writers: correct on good input, one clear error on bad input."""

from __future__ import annotations

import gzip
import io as _io
import tarfile
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st

from dasknn import io
from dasknn.errors import DasknnError


def _layer_text(rows, cols, vals) -> bytes:
    return "".join(f"{r}\t{c}\t{v}\n" for r, c, v in zip(rows, cols, vals)).encode()


def test_real_slice_network_parses(slice_paths):
    net = io.read_network(slice_paths["network"])
    assert net.depth == 12 and net.neurons == 1024
    for w in net.layers:
        # the published layers: exactly 32 per row and per column, every value 1/16
        assert np.all(np.diff(w.indptr) == 32)
        assert np.all(np.bincount(w.indices, minlength=1024) == 32)
        assert np.all(w.data == 0.0625)


def test_layer_matches_numpy_loadtxt(slice_paths, tmp_path):
    with tarfile.open(slice_paths["network"]) as tar:
        data = tar.extractfile("neuron1024/n1024-l3.tsv").read()
    expected = np.loadtxt(_io.BytesIO(data))
    w = io.read_layer(data, 1024, source="l3")
    dense = np.zeros((1024, 1024))
    dense[expected[:, 0].astype(int) - 1, expected[:, 1].astype(int) - 1] = expected[:, 2]
    np.testing.assert_array_equal(w.toarray(), dense)


def test_images_and_categories(slice_paths):
    im = io.read_images(slice_paths["images"])
    assert im.shape == (1000, 1024)
    assert set(np.unique(im.data)) == {1.0}
    cats = io.read_categories(slice_paths["truth"])
    assert np.all(np.diff(cats) > 0) and cats.min() >= 0 and cats.max() < 1000


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(allow_nan=False, allow_infinity=False, width=64), min_size=1, max_size=20),
       st.sampled_from(["{!r}", "{:.6e}", "{:.17g}", "{:.3f}", "{:E}", "{:.20e}"]))
def test_float_column_parses_like_python(values, fmt):
    text = "".join(f"{k + 1}\t1\t{fmt.format(v)}\n" for k, v in enumerate(values))
    table = io.parse_table(text.encode(), "t", 2, True)
    expected = [float(line.split("\t")[2]) for line in text.splitlines()]
    np.testing.assert_array_equal(table.values, np.array(expected))


@settings(max_examples=50, deadline=None)
@given(n=st.integers(1, 40), seed=st.integers(0, 2**31), dtype=st.sampled_from([np.float32, np.float64]))
def test_layer_write_read_round_trip(n, seed, dtype, tmp_path_factory):
    rng = np.random.default_rng(seed)
    w = sp.random(n, n, density=0.3, random_state=rng, format="csc", dtype=dtype)
    w.data[w.data == 0] = 1.0
    w = w.tolil()
    w[0, 0] = 0.1  # at least one entry (an empty layer file is an error), and one not exact in float32
    w = w.tocsc()
    path = tmp_path_factory.mktemp("rt") / f"n{n}-l1.tsv"
    io.write_layer(path, w)
    back = io.read_layer(path, n)
    assert (back != w.astype(np.float64)).nnz == 0


def test_images_and_categories_round_trip(tmp_path):
    im = sp.random(50, 64, density=0.1, random_state=1, format="csr")
    im.data[:] = 1
    io.write_images(tmp_path / "sparse-images-64.tsv.gz", im)
    back = io.read_images(tmp_path / "sparse-images-64.tsv.gz", images=50)
    assert (back != im).nnz == 0
    io.write_categories(tmp_path / "c.tsv", np.array([0, 5, 49]))
    np.testing.assert_array_equal(io.read_categories(tmp_path / "c.tsv"), [0, 5, 49])
    assert (tmp_path / "c.tsv").read_text() == "1\n6\n50\n"


def test_crlf_and_blank_lines_are_accepted():
    w = io.read_layer(b"1\t1\t0.5\r\n\n2\t2\t0.25\r\n\n", 2, source="crlf")
    np.testing.assert_array_equal(w.toarray(), [[0.5, 0], [0, 0.25]])


# --- bad input: every case names the file (and line) in one line ---------------------------------------------

BAD_LAYERS = [
    ("1\t1\t0.5\n2\t2\n", 2, "too few columns"),
    ("1\t1\t0.5\n2\t2\t0.5\t7\n", 2, "too many columns"),
    ("1\t1\t0.5\nx\t2\t0.5\n", 2, "column 1 is not a positive integer"),
    ("1\t1\t0.5\n2\t2.5\t0.5\n", 2, "column 2 is not a positive integer"),
    ("1\t1\t0.5\n0\t2\t0.5\n", 2, "indices are 1-based"),
    ("1\t1\t0.5\n2\t9\t0.5\n", 2, r"output neuron 9 \(column 2\) is beyond the layer's 8 neurons"),
    ("1\t1\t0.5\n12\t2\t0.5\n", 2, r"input neuron 12 \(column 1\) is beyond the layer's 8 neurons"),
    ("1\t1\t0.5\n2\t2\tnan\n", 2, "not finite"),
    ("1\t1\t0.5\n2\t2\t-inf\n", 2, "not finite"),
    ("1\t1\t0.5\n2\t2\t1e999\n", 2, "not finite"),
    ("1\t1\t0.5\n2\t2\tabc\n", 2, "not a number"),
    ("1\t1\t0.5\n2\t2\t1.5x\n", 2, "not a number"),
    ("1\t1\t0.5\n2\t2\t1e\n", 2, "not a number"),
]


@pytest.mark.parametrize("text, line, message", BAD_LAYERS)
def test_bad_layer_line_is_named(text, line, message, tmp_path):
    path = tmp_path / "n8-l1.tsv"
    path.write_text(text)
    with pytest.raises(DasknnError, match=message) as e:
        io.read_layer(path, 8)
    assert e.value.path == str(path) and e.value.line == line
    assert str(e.value).startswith(f"{path}:{line}: ") and "\n" not in str(e.value)


def test_duplicate_entry_is_named(tmp_path):
    path = tmp_path / "n8-l1.tsv"
    path.write_text("1\t1\t0.5\n3\t2\t0.5\n1\t1\t0.25\n")
    with pytest.raises(DasknnError, match=r"entry \(1, 1\) appears twice, first on line 1"):
        io.read_layer(path, 8)


def test_empty_file(tmp_path):
    path = tmp_path / "n8-l1.tsv"
    path.write_text("\n\n")
    with pytest.raises(DasknnError, match="empty"):
        io.read_layer(path, 8)


def _write_net(folder: Path, layers: dict[int, str], n: int = 8) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for k, text in layers.items():
        (folder / f"n{n}-l{k}.tsv").write_text(text)


GOOD = "1\t1\t0.5\n2\t2\t0.5\n"


def test_missing_layer_file(tmp_path):
    _write_net(tmp_path / "net", {1: GOOD, 2: GOOD, 4: GOOD})
    with pytest.raises(DasknnError, match=r"n8-l3.tsv is missing"):
        io.read_network(tmp_path / "net", bias=-0.1)


def test_extra_and_mixed_layer_files(tmp_path):
    _write_net(tmp_path / "mixed", {1: GOOD, 2: GOOD})
    (tmp_path / "mixed" / "n16-l3.tsv").write_text(GOOD)
    with pytest.raises(DasknnError, match="different widths"):
        io.read_network(tmp_path / "mixed", bias=-0.1)
    _write_net(tmp_path / "zero", {0: GOOD, 1: GOOD})
    with pytest.raises(DasknnError, match="numbered from 1"):
        io.read_network(tmp_path / "zero", bias=-0.1)
    _write_net(tmp_path / "twice", {1: GOOD, 2: GOOD})
    _write_net(tmp_path / "twice" / "sub", {2: GOOD})
    with pytest.raises(DasknnError, match="layer 2 is given twice"):
        io.read_network(tmp_path / "twice", bias=-0.1)


def test_no_layer_files(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(DasknnError, match="no layer files"):
        io.read_network(tmp_path / "empty")


def test_inconsistent_sizes(tmp_path):
    # the name says 8 neurons, a line says 12
    _write_net(tmp_path / "net", {1: GOOD, 2: "1\t12\t0.5\n"})
    with pytest.raises(DasknnError, match=r"n8-l2.tsv:1: output neuron 12 \(column 2\) is beyond the layer's 8 neurons"):
        io.read_network(tmp_path / "net", bias=-0.1)


def test_truncated_gzip(tmp_path):
    data = gzip.compress(("1\t1\t1\n" * 5000).encode())
    path = tmp_path / "sparse-images-8.tsv.gz"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(DasknnError, match="truncated"):
        io.read_images(path)


def test_truncated_tar(slice_paths, tmp_path):
    data = slice_paths["network"].read_bytes()
    path = tmp_path / "neuron1024.tar.gz"
    path.write_bytes(data[: len(data) // 3])
    with pytest.raises(DasknnError, match="neuron1024.tar.gz"):
        io.read_network(path)


def test_unknown_width_needs_bias(tmp_path):
    _write_net(tmp_path / "net", {1: GOOD})
    with pytest.raises(DasknnError, match="no GraphChallenge bias"):
        io.read_network(tmp_path / "net")
    assert io.read_network(tmp_path / "net", bias=-0.2).bias == -0.2


def test_image_pixel_out_of_range(tmp_path):
    path = tmp_path / "sparse-images-8.tsv"
    path.write_text("1\t1\t1\n2\t9\t1\n")
    with pytest.raises(DasknnError, match=r"sparse-images-8.tsv:2: pixel 9 is beyond the 8 neurons the file's name"):
        io.read_images(path)


def test_images_wider_than_the_network_say_the_pixel_and_the_width(tmp_path):
    # a 2048-wide batch into a 1024-wide network: the message says which pixel, and what it is beyond
    path = tmp_path / "wide2048.tsv.gz"
    path.write_bytes(gzip.compress(b"1\t5\t1\n1\t700\t1\n2\t1500\t1\n"))
    with pytest.raises(DasknnError) as e:
        io.read_images(path, neurons=1024)
    assert str(e.value) == f"{path}:3: pixel 1500 is beyond the network's 1024 neurons"


def test_a_truth_index_beyond_the_images_is_named(tmp_path):
    path = tmp_path / "c.tsv"
    path.write_text("1\n7\n")
    with pytest.raises(DasknnError) as e:
        io.read_categories(path, images=5)
    assert str(e.value) == f"{path}:2: image 7 is beyond the batch's 5 images"


def test_a_generic_table_names_the_column_and_the_value():
    with pytest.raises(DasknnError) as e:
        io.parse_table(b"1\t2\t0.5\n3\t99\t0.5\n", "t.tsv", 2, True, (12, 12))
    assert str(e.value) == "t.tsv:2: column 2 is 99, out of range (at most 12)"


def test_categories_bad_line(tmp_path):
    path = tmp_path / "c.tsv"
    path.write_text("1\n2\n-3\n")
    with pytest.raises(DasknnError, match=r"c.tsv:3: column 1 is not a positive integer"):
        io.read_categories(path)
    path.write_text("1\n2\n2\n")
    with pytest.raises(DasknnError, match="listed twice"):
        io.read_categories(path)
