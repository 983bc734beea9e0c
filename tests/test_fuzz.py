"""Property-based fuzzing of every parser and of store validation.

Any input either loads as an independent, deliberately simple parser says it should, or raises DasknnError with
a one-line message: never another exception, a hang or a partial write.
"""

from __future__ import annotations

import gzip
import json
import math
import re
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from dasknn import generate, io, store
from dasknn.errors import DasknnError

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
FEW = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# --- an independent parser: regular expressions and Python's float() ------------------------------------------

_INT = re.compile(rb"[0-9]{1,18}")
_FLOAT = re.compile(rb"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")


def simple_parse(data: bytes, int_columns: int, with_values: bool, limits: tuple[int, ...]):
    """Rows of (ints, value) as the format describes them, or None where the file is not valid."""
    rows = []
    for line in data.split(b"\n"):
        fields = [f for f in re.split(rb"[ \t\r]+", line) if f]
        if not fields:
            continue
        if len(fields) != int_columns + with_values:
            return None
        ints = []
        for f, limit in zip(fields[:int_columns], limits):
            if not _INT.fullmatch(f) or int(f) == 0 or (limit and int(f) > limit):
                return None
            ints.append(int(f))
        value = None
        if with_values:
            if not _FLOAT.fullmatch(fields[-1]) or not math.isfinite(float(fields[-1])):
                return None
            value = float(fields[-1])
        rows.append((ints, value))
    return rows or None


def one_line_error(e: DasknnError) -> None:
    assert "\n" not in str(e) and str(e).strip()


def loaded_or_refused(load, expected, what: str):
    """What ``load()`` returns, or None when it refused with one line: only an invalid input (``expected`` None)
    may be refused."""
    try:
        return load()
    except DasknnError as e:
        one_line_error(e)
        assert expected is None, f"rejected {what}: {e}"
        return None


# --- inputs: mostly well-formed tables, with damage ----------------------------------------------------------

def _float_text() -> st.SearchStrategy[str]:
    f = st.floats(allow_nan=True, allow_infinity=True, width=64)
    return st.one_of(f.map(repr), f.map("{:.6e}".format), f.map("{:.17g}".format), f.map("{:.3f}".format),
                     st.sampled_from(["1", "-0", ".5", "5.", "1e", "e5", "+", "-.e1", "1e400", "0e999999", "nan",
                                      "inf", "-Infinity", "1_0", "0x10", "1.2.3", "١", "0.0000000000000000000001",
                                      "123456789012345678901234567890", "9" * 400]))


def _int_text(limit: int) -> st.SearchStrategy[str]:
    return st.one_of(st.integers(1, limit).map(str), st.integers(-2, limit + 2).map(str),
                     st.sampled_from(["0", "01", "1.0", "+1", "x", "9" * 19, "0" * 18 + "1", " "]))


@st.composite
def tables(draw, int_columns: int, with_values: bool, limit: int) -> bytes:
    if draw(st.integers(0, 9)) == 0:
        return draw(st.binary(max_size=200))  # sometimes anything at all
    lines = []
    for _ in range(draw(st.integers(0, 12))):
        fields = [draw(_int_text(limit)) for _ in range(int_columns)]
        if with_values:
            fields.append(draw(_float_text()))
        cut = draw(st.integers(0, 20))  # now and then a missing or extra field
        if cut == 0:
            fields = fields[:-1]
        elif cut == 1:
            fields.append("7")
        sep = draw(st.sampled_from(["\t", " ", "\t\t", " \t ", "\t\r", "\x0b"]))
        lines.append(sep.join(fields) + draw(st.sampled_from(["", "\r", " ", "\t"])))
        if draw(st.integers(0, 8)) == 0:
            lines.append(draw(st.sampled_from(["", "   ", "\r", "# comment"])))
    return "\n".join(lines).encode("utf-8") + draw(st.sampled_from([b"", b"\n", b"\n\n"]))


@FUZZ
@given(data=tables(2, True, 12))
def test_table_parser_agrees_with_a_simple_parser(data):
    expected = simple_parse(data, 2, True, (12, 12))
    t = loaded_or_refused(lambda: io.parse_table(data, "f.tsv", 2, True, (12, 12)), expected, "a valid table")
    if t is None:
        return
    assert expected is not None, "accepted an invalid table"
    assert t.ints.tolist() == [r[0] for r in expected]
    assert t.values.tolist() == [r[1] for r in expected]  # exactly: correctly rounded like float()


@FUZZ
@given(data=tables(2, True, 6))
def test_layer_reader(data):
    expected = simple_parse(data, 2, True, (6, 6))
    if expected is not None:
        keys = [tuple(r[0]) for r in expected]
        if len(set(keys)) != len(keys):
            expected = None  # an entry given twice
    w = loaded_or_refused(lambda: io.read_layer(data, 6, source="n6-l1.tsv"), expected, "a valid layer")
    if w is None:
        return
    assert expected is not None
    dense = np.zeros((6, 6))
    for (r, c), v in expected:
        dense[r - 1, c - 1] = v
    assert isinstance(w, sp.csc_matrix) and w.nnz == len(expected)
    np.testing.assert_array_equal(w.toarray(), dense)


@FEW
@given(entries=st.lists(st.tuples(st.integers(1, 6), st.integers(1, 6)), min_size=1, max_size=8, unique=True),
       data=st.data(), big=st.integers(7, 10**17), column=st.integers(0, 1))
def test_an_index_beyond_the_layer_names_the_neuron_and_the_width(entries, data, big, column):
    # one index of an otherwise valid layer beyond its 6 neurons: the message says which neuron, and the width
    bad = data.draw(st.integers(0, len(entries) - 1))
    fields = [list(e) for e in entries]
    fields[bad][column] = big
    text = "".join(f"{r}\t{c}\t0.5\n" for r, c in fields).encode()
    with pytest.raises(DasknnError) as e:
        io.read_layer(text, 6, source="n6-l1.tsv")
    side = ("input", "output")[column]
    assert str(e.value) == (f"n6-l1.tsv:{bad + 1}: {side} neuron {big} (column {column + 1}) "
                            f"is beyond the layer's 6 neurons")


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


@FUZZ
@given(data=tables(2, True, 8), compress=st.booleans())
def test_images_reader(folder, data, compress):
    path = folder / ("sparse-images-8.tsv.gz" if compress else "sparse-images-8.tsv")
    path.write_bytes(gzip.compress(data) if compress else data)
    expected = simple_parse(data, 2, True, (0, 8))
    if expected is not None:
        keys = [tuple(r[0]) for r in expected]
        if len(set(keys)) != len(keys):
            expected = None
    m = loaded_or_refused(lambda: io.read_images(path), expected, "valid images")
    if m is None:
        return
    assert expected is not None
    dense = np.zeros((max(r[0][0] for r in expected), 8))
    for (i, p), v in expected:
        dense[i - 1, p - 1] = v
    assert m.shape == dense.shape
    np.testing.assert_array_equal(m.toarray(), dense)


@FUZZ
@given(data=st.one_of(tables(1, False, 30), st.binary(max_size=60)))
def test_categories_reader(folder, data):
    path = folder / "neuron8-l2-categories.tsv"
    path.write_bytes(data)
    expected = [] if not data.strip() else simple_parse(data, 1, False, (0,))
    if expected:
        ids = [r[0][0] for r in expected]
        expected = None if len(set(ids)) != len(ids) else sorted(i - 1 for i in ids)
    cats = loaded_or_refused(lambda: io.read_categories(path), expected, "a valid truth file")
    if cats is None:
        return
    assert expected is not None
    assert cats.tolist() == expected


@FUZZ
@given(data=tables(2, True, 8), where=st.integers(0, 10_000), how=st.sampled_from(["flip", "cut", "append"]))
def test_damaged_gzip_is_caught_or_harmless(folder, data, where, how):
    packed = bytearray(gzip.compress(data))
    at = where % len(packed)
    if how == "flip":
        packed[at] ^= 0xFF
    elif how == "cut":
        del packed[at:]
    else:
        packed += b"\x1f\x8b garbage"
    path = folder / "x.tsv.gz"
    path.write_bytes(bytes(packed))
    try:
        out = io.read_bytes(path)
    except DasknnError as e:
        one_line_error(e)
        return
    # a flip in the header's free fields (time, flags the reader ignores) changes nothing; the CRC guards the rest
    assert out == data


@FEW
@given(where=st.integers(0, 100_000), how=st.sampled_from(["flip", "cut"]))
@example(where=10895, how="flip")  # changed layer 1's values silently until the index pass checked gzip's CRC
def test_damaged_network_archive_is_caught_or_harmless(tmp_path_factory, where, how):
    original = Path(__file__).parent / "data" / "neuron1024-l12.tar.gz"
    raw = bytearray(original.read_bytes())
    at = where % len(raw)
    if how == "flip":
        raw[at] ^= 0x5A
    else:
        del raw[at:]
    path = tmp_path_factory.mktemp("tar") / "neuron1024.tar.gz"
    path.write_bytes(bytes(raw))
    try:
        net = io.read_network(path, layers=2)
    except DasknnError as e:
        one_line_error(e)
        return
    good = io.read_network(original, layers=2)
    for a, b in zip(net.layers, good.layers):
        assert (a != b).nnz == 0


# --- writers: round trips, and failures that leave nothing behind --------------------------------------------

@st.composite
def sparse_layers(draw) -> sp.csc_matrix:
    n = draw(st.integers(1, 12))
    cells = draw(st.sets(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)), min_size=1, max_size=n * n))
    vals = draw(st.lists(st.one_of(st.floats(allow_nan=False, allow_infinity=False, width=32),
                                   st.floats(allow_nan=False, allow_infinity=False)),
                         min_size=len(cells), max_size=len(cells)))
    r, c = zip(*sorted(cells))
    return sp.csc_matrix((np.array(vals, dtype=np.float64), (r, c)), shape=(n, n))


@FUZZ
@given(w=sparse_layers())
def test_layer_written_reads_back_exactly(folder, w):
    path = folder / "n-l1.tsv"
    io.write_layer(path, w)
    back = io.read_layer(path, w.shape[0])
    assert back.nnz == w.nnz
    np.testing.assert_array_equal(back.toarray(), w.toarray())


def _listing(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in d.iterdir() if p.is_file()}


@FEW
@given(w=sparse_layers(), fail_after=st.integers(0, 50), gz=st.booleans())
def test_failed_write_leaves_the_old_file_and_no_partial(w, fail_after, gz):
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        path = d / ("n-l1.tsv.gz" if gz else "n-l1.tsv")
        path.write_bytes(b"old contents\n")
        before = _listing(d)

        def lines():  # the disk fills up part way
            for k, line in enumerate(io._format_values(w.data)):
                if k == fail_after:
                    raise OSError(28, "No space left on device")
                yield f"1\t1\t{line}\n"
            raise OSError(28, "No space left on device")

        with pytest.raises(DasknnError, match="cannot write: No space left") as e:
            io._write_lines(path, lines())
        one_line_error(e.value)
        assert _listing(d) == before  # the old file whole, no .partial file


def test_write_into_a_missing_folder_or_onto_a_folder(tmp_path):
    w = sp.csc_matrix(np.eye(3))
    with pytest.raises(DasknnError, match="cannot write"):
        io.write_layer(tmp_path / "missing" / "n3-l1.tsv", w)
    (tmp_path / "n3-l1.tsv").mkdir()
    with pytest.raises(DasknnError, match="cannot write"):
        io.write_layer(tmp_path / "n3-l1.tsv", w)
    with pytest.raises(DasknnError, match="cannot write"):
        io.write_categories(tmp_path / "n3-l1.tsv", np.array([1, 2]))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["n3-l1.tsv"]  # the folder, and nothing partial


# --- store validation: mangled metadata, attributes and chunks -----------------------------------------------

@pytest.fixture(scope="module")
def good_store(tmp_path_factory) -> tuple[Path, dict]:
    net = generate.network(64, 2, seed=5, bias=-0.3)
    im = generate.images(12, 64, seed=5)
    path = store.write_network(tmp_path_factory.mktemp("good") / "g.zarr", net, im, np.array([0, 3, 11]))
    return path, {"layers": net.layers, "images": im, "truth": [0, 3, 11]}


def _files(path: Path) -> list[Path]:
    return sorted(p for p in path.rglob("*") if p.is_file())


json_values = st.recursive(st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats() | st.text(max_size=8),
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner,
                                                                                       max_size=3),
                           max_leaves=6)


def _mutate_json(doc, path_choice: int, value):
    """Replace (or delete, when value is the sentinel) one node of a JSON document, chosen by index."""
    nodes = []

    def walk(node):
        if isinstance(node, dict):
            for k in node:
                nodes.append((node, k))
                walk(node[k])
        elif isinstance(node, list):
            for i in range(len(node)):
                nodes.append((node, i))
                walk(node[i])

    walk(doc)
    if not nodes:
        return value
    parent, key = nodes[path_choice % len(nodes)]
    if value == "<delete>" and isinstance(parent, dict):
        del parent[key]
    else:
        parent[key] = value
    return doc


def _open_and_read(path: Path):
    s = store.open_store(path, check="full")
    return ([s.layer(k) for k in range(1, s.depth + 1)], s.inputs.rows() if s.inputs is not None else None,
            s.inputs.truth() if s.inputs is not None else None)


def _same_as_good(loaded, good: dict) -> None:
    layers, images, truth = loaded
    assert len(layers) == len(good["layers"])
    for a, b in zip(layers, good["layers"]):
        assert a.shape == b.shape and (a != b).nnz == 0
    assert images is not None and (images != good["images"]).nnz == 0 and images.shape == good["images"].shape
    assert truth is not None and truth.tolist() == good["truth"]


@FEW
@given(pick=st.integers(0, 10_000), node=st.integers(0, 10_000),
       value=st.one_of(json_values, st.just("<delete>")), raw=st.booleans(), junk=st.binary(max_size=30))
def test_mangled_metadata_is_refused_or_harmless(good_store, pick, node, value, raw, junk):
    good, expected = good_store
    metas = [p for p in _files(good) if p.name == "zarr.json"]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "s.zarr"
        shutil.copytree(good, path)
        target = path / metas[pick % len(metas)].relative_to(good)
        if raw:
            target.write_bytes(junk)
        else:
            doc = _mutate_json(json.loads(target.read_text()), node, value)
            target.write_text(json.dumps(doc))
        try:
            loaded = _open_and_read(path)
        except DasknnError as e:
            one_line_error(e)
            return
        _same_as_good(loaded, expected)  # what still opens must read exactly the stored numbers


@FEW
@given(pick=st.integers(0, 10_000), where=st.integers(0, 10_000),
       how=st.sampled_from(["flip", "cut", "delete", "junk"]), junk=st.binary(max_size=40))
def test_damaged_chunks_are_refused(good_store, pick, where, how, junk):
    good, expected = good_store
    chunks = [p for p in _files(good) if p.name != "zarr.json"]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "s.zarr"
        shutil.copytree(good, path)
        target = path / chunks[pick % len(chunks)].relative_to(good)
        data = bytearray(target.read_bytes())
        if how == "flip":
            data[where % len(data)] ^= 1 << (where % 8)
        elif how == "cut":
            del data[where % len(data):]
        elif how == "junk":
            data = bytearray(junk)
        if how == "delete":
            target.unlink()
        else:
            target.write_bytes(bytes(data))
        try:
            loaded = _open_and_read(path)
        except DasknnError as e:
            one_line_error(e)
            return
        _same_as_good(loaded, expected)
