"""The Zarr layer store: round trips, lazy block reads, validation that names the layer, atomic writes."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
import zarr

from dasknn import generate, io, store
from dasknn.cli import main
from dasknn.errors import DasknnError


@pytest.fixture()
def small_store(tmp_path) -> tuple[Path, object, sp.csr_matrix]:
    net = generate.network(64, 5, seed=3, bias=-0.3)
    im = generate.images(40, 64, seed=3)
    path = store.write_network(tmp_path / "s.zarr", net, im, np.array([1, 7, 39]))
    return path, net, im


def test_tsv_zarr_tsv_round_trip(slice_paths, tmp_path, capsys):
    assert main(["import", str(slice_paths["network"]), "--inputs", str(slice_paths["images"]),
                 "--truth", str(slice_paths["truth"]), "--out", str(tmp_path / "s.zarr"), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["layers"] == 12 and report["edges"] == 12 * 32 * 1024 and report["images"] == 1000
    assert main(["export", str(tmp_path / "s.zarr"), "--out", str(tmp_path / "back")]) == 0
    original = io.read_network(slice_paths["network"])
    back = io.read_network(tmp_path / "back" / "neuron1024")
    for a, b in zip(original.layers, back.layers):
        assert (a != b).nnz == 0
    assert (io.read_images(tmp_path / "back" / "sparse-images-1024.tsv") != io.read_images(slice_paths["images"])).nnz == 0
    np.testing.assert_array_equal(io.read_categories(tmp_path / "back" / "neuron1024-l12-categories.tsv"),
                                  io.read_categories(slice_paths["truth"]))


def test_layout_and_attributes(small_store):
    path, net, _ = small_store
    root = zarr.open_group(path, mode="r")
    attrs = root.attrs["dasknn"]
    assert attrs["complete"] and attrs["neurons"] == 64 and attrs["layers"] == 5 and attrs["bias"] == net.bias
    desc = root["layers/1"].attrs["binsparse"]
    assert desc["format"] == "CSC" and desc["shape"] == [64, 64] and desc["number_of_stored_values"] == 64 * 32
    assert root["inputs"].attrs["binsparse"]["format"] == "CSR"
    assert root["layers/1/values"].dtype == np.float32  # 1/16 is exact in float32: stored compactly


@pytest.mark.parametrize("start, stop", [(0, 64), (0, 1), (10, 11), (5, 40), (63, 64), (20, 20)])
def test_column_blocks_read_only_what_they_need(small_store, start, stop):
    path, net, _ = small_store
    s = store.open_store(path)
    for k in (1, 5):
        assert (s.columns(k, start, stop) != net.layers[k - 1][:, start:stop]).nnz == 0


def test_row_blocks_are_separate_chunks(tmp_path, monkeypatch):
    # a small chunk size: a block of columns must then read only some chunks of the layer
    monkeypatch.setattr(store.common, "CHUNK_ENTRIES", 256)  # read from common when written
    monkeypatch.setattr(store.common, "CHUNK_ROWS", 16)
    net = generate.network(64, 2, seed=1, bias=-0.3)
    path = store.write_network(tmp_path / "c.zarr", net)
    chunks = sorted(p.name for p in (path / "layers" / "1" / "indices_1" / "c").iterdir())
    assert len(chunks) == 64 * 32 // 256
    s = store.open_store(path)
    assert (s.columns(1, 16, 24) != net.layers[0][:, 16:24]).nnz == 0


def test_inputs_rows_and_truth(small_store):
    path, _, im = small_store
    s = store.open_store(path)
    assert (s.inputs.rows(5, 17) != im[5:17]).nnz == 0
    np.testing.assert_array_equal(s.inputs.truth(), [1, 7, 39])


def _corrupt(path: Path, array: str, data: np.ndarray) -> None:
    arr = zarr.open_array(path / array, mode="r+")
    arr[:] = data


def _swap_pointers(p: np.ndarray) -> None:
    p[10], p[11] = p[11], p[10]


def _index_out_of_range(i: np.ndarray) -> None:
    i[5] = 64


def _nan_value(v: np.ndarray) -> None:
    v[3] = np.nan


@pytest.mark.parametrize("k, array, attr, damage, message", [
    (3, "pointers_to_1", "indptr", _swap_pointers, "layer 3: pointers_to_1 is not monotone"),
    (2, "indices_1", "indices", _index_out_of_range, "layer 2: an index is outside 0..63"),
    (5, "values", "data", _nan_value, "layer 5: a value is NaN"),
])
def test_damaged_layer_is_named(small_store, k, array, attr, damage, message):
    path, net, _ = small_store
    data = getattr(net.layers[k - 1], attr).copy()
    damage(data)
    _corrupt(path, f"layers/{k}/{array}", data)
    with pytest.raises(DasknnError, match=message):
        store.open_store(path)


def test_lazy_open_checks_a_layer_when_it_is_read(small_store):
    path, net, _ = small_store
    meta = path / "layers" / "3" / "values" / "zarr.json"
    meta.write_text(meta.read_text().replace('"float32"', '"object"', 1))
    with pytest.raises(DasknnError, match="layer 3"):
        store.open_store(path, check="metadata")
    lazy = store.open_store(path, check="lazy")  # a worker's one-layer task: only what it reads is opened
    assert (lazy.layer(2) != net.layers[1]).nnz == 0
    with pytest.raises(DasknnError, match="layer 3"):
        lazy.layer(3)


def test_flipped_byte_is_caught_by_the_checksum(small_store):
    path, _, _ = small_store
    chunk = next((path / "layers" / "4" / "indices_1" / "c").iterdir())
    data = bytearray(chunk.read_bytes())
    data[len(data) // 2] ^= 0xFF
    chunk.write_bytes(bytes(data))
    with pytest.raises(DasknnError, match=r"layer 4: cannot read entries .*damaged"):
        store.open_store(path)


def test_wrong_shape_and_missing_layer(small_store):
    path, _, _ = small_store
    root = zarr.open_group(path, mode="r+")
    del root["layers/2"]
    with pytest.raises(DasknnError, match="layer 2 is missing"):
        store.open_store(path)


def test_not_a_store(tmp_path):
    with pytest.raises(DasknnError, match="no such store"):
        store.open_store(tmp_path / "nothing.zarr")
    (tmp_path / "plain").mkdir()
    with pytest.raises(DasknnError, match="not a Zarr v3 group|not a dasknn store"):
        store.open_store(tmp_path / "plain")
    zarr.open_group(tmp_path / "other.zarr", mode="w")
    with pytest.raises(DasknnError, match="not a dasknn store"):
        store.open_store(tmp_path / "other.zarr")


def test_interrupted_write_leaves_no_valid_store(tmp_path):
    path = tmp_path / "x.zarr"
    with pytest.raises(RuntimeError):
        with store.StoreWriter(path, 64, 3, -0.3) as w:
            w.write_layer(1, generate.butterfly_layer(64, 1))
            raise RuntimeError("killed")
    assert not path.exists()
    assert list(tmp_path.iterdir()) == []  # the temporary folder is gone too


def test_missing_layer_is_not_written(tmp_path):
    path = tmp_path / "x.zarr"
    with pytest.raises(DasknnError, match="layer 2 was never given"):
        with store.StoreWriter(path, 64, 2, -0.3) as w:
            w.write_layer(1, generate.butterfly_layer(64, 1))
    assert not path.exists()


def test_incomplete_store_does_not_open(small_store):
    path, _, _ = small_store
    root = zarr.open_group(path, mode="r+")
    attrs = dict(root.attrs["dasknn"])
    attrs["complete"] = False
    root.attrs["dasknn"] = attrs
    with pytest.raises(DasknnError, match="incomplete"):
        store.open_store(path)


def test_failed_import_keeps_the_old_store(slice_paths, tmp_path, capsys):
    # a bad network must not destroy a good store of the same name, even with --overwrite
    good = tmp_path / "s.zarr"
    assert main(["import", str(slice_paths["network"]), "--out", str(good)]) == 0
    capsys.readouterr()
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "n1024-l1.tsv").write_text("1\t1\t0.5\n")
    (bad / "n1024-l2.tsv").write_text("1\t1\tnan\n")
    assert main(["import", str(bad), "--out", str(good), "--overwrite"]) == 2
    *progress, err = capsys.readouterr().err.splitlines()  # the stages it began, then one line for the error
    assert all(line.startswith("dasknn: importing") for line in progress)
    assert err.startswith("dasknn: error: ") and "n1024-l2.tsv:1: column 3 is not finite" in err
    assert store.open_store(good).depth == 12
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad", "s.zarr"]


def test_refuses_to_overwrite_without_flag(small_store):
    path, net, _ = small_store
    with pytest.raises(DasknnError, match="already exists"):
        store.write_network(path, net)


def test_precision_is_kept(tmp_path):
    # values that float32 cannot hold are stored as float64: an import loses nothing
    w = sp.csc_matrix(np.array([[0.1, 0.0], [0.0, 1.0 / 3.0]]))
    net = generate.Network([w], bias=-0.1)
    s = store.open_store(store.write_network(tmp_path / "p.zarr", net))
    assert s.layer(1).dtype == np.float64 and (s.layer(1) != w).nnz == 0


# --- part plans (model mode out of core) ---------------------------------------------------------------------


def _write_part_plan(net_path: Path, plan_path: Path, owners: np.ndarray) -> None:
    from dasknn import engine

    store.create_plan_store(plan_path, str(net_path), owners)
    parts = int(owners.max()) + 1
    # the very task the workers run, one layer at a time
    counts = [engine._write_part_plan_layer(str(net_path), str(plan_path), k, parts) for k in range(1, len(owners))]
    assert store.open_plan_store(plan_path, str(net_path), owners) is None  # not complete yet: never used
    store.finish_plan_store(plan_path, np.stack(counts))
    assert all(c.shape == (parts, parts) for c in counts)


@pytest.mark.parametrize("method", ["block", "random"])
@pytest.mark.parametrize("parts", [2, 3])
def test_part_plan_reads_back_the_plan_and_blocks(small_store, tmp_path, method, parts):
    from dasknn import partition, plan

    path, net, _ = small_store
    owners = partition.partition_network(net.layers, parts, method, seed=2)
    _write_part_plan(path, tmp_path / "plan", owners)
    found = store.open_plan_store(tmp_path / "plan", str(path), owners)
    full = plan.build_plan(net.layers, owners)
    np.testing.assert_array_equal(found.counts(), full.outline().counts)
    np.testing.assert_array_equal(found.owners(), owners)
    rows = [np.count_nonzero(owners[0] == q) for q in range(parts)]
    for k, layer in enumerate(full.layers, start=1):
        for q, want in enumerate(layer):
            got, block = found.part_layer(q, k, "float64")
            for name in ("outputs", "inputs"):
                np.testing.assert_array_equal(getattr(got, name), getattr(want, name))
            for a, b in zip(got.local, want.local):
                np.testing.assert_array_equal(a, b)
            for mine, theirs in ((got.recv, want.recv), (got.send, want.send)):
                assert sorted(mine) == sorted(theirs)
                for p in mine:
                    np.testing.assert_array_equal(mine[p], theirs[p])
            for a, b in zip(block, plan.local_block(net.layers[k - 1], want, rows[q])):
                np.testing.assert_array_equal(a, b)
            assert block[2].dtype == np.float64
        rows = [pl.outputs.size for pl in layer]
    # made for another network or another partition: not this plan
    assert store.open_plan_store(tmp_path / "plan", str(path) + "x", owners) is None
    other = owners.copy()
    other[1] = (other[1] + 1) % parts
    assert store.open_plan_store(tmp_path / "plan", str(path), other) is None


def test_a_part_plan_layer_a_lost_task_left_half_written_is_written_again_whole(small_store, tmp_path):
    # a writing continued after a lost worker writes again the layers not marked complete: what the lost task left
    # there (some of a part's arrays, no mark) goes, and the layer reads back as the whole plan's
    from dasknn import engine, partition

    path, net, _ = small_store
    owners = partition.partition_network(net.layers, 2, "random", seed=1)
    _write_part_plan(path, tmp_path / "whole", owners)
    _write_part_plan(path, tmp_path / "plan", owners)
    root = zarr.open_group(tmp_path / "plan", mode="r+")
    root.attrs["dasknn"] = {**dict(root.attrs)["dasknn"], "complete": False}  # its writing interrupted
    del root["l3"].attrs["complete"]
    (tmp_path / "plan" / "l3" / "p1" / "block" / "values" / "zarr.json").unlink()
    assert set(store.resume_plan_store(tmp_path / "plan", str(path), owners)) == set(range(1, len(owners))) - {3}
    engine._write_part_plan_layer(str(path), str(tmp_path / "plan"), 3, 2)
    assert set(store.resume_plan_store(tmp_path / "plan", str(path), owners)) == set(range(1, len(owners)))
    store.finish_plan_store(tmp_path / "plan", store.open_plan_store(tmp_path / "whole", str(path), owners).counts())
    again, whole = (store.open_plan_store(tmp_path / name, str(path), owners) for name in ("plan", "whole"))
    for q in range(2):
        (got, block), (want, expected) = again.part_layer(q, 3, "float64"), whole.part_layer(q, 3, "float64")
        np.testing.assert_array_equal(got.outputs, want.outputs)
        assert sorted(got.send) == sorted(want.send) and sorted(got.recv) == sorted(want.recv)
        for a, b in zip(block, expected):
            np.testing.assert_array_equal(a, b)


def test_nodes_created_together_parents_first_and_an_existing_one_refused(tmp_path):
    from dasknn.store.common import NewArray, create_together

    root = zarr.open_group(tmp_path / "g.zarr", mode="w")
    data = np.arange(10, dtype=np.int64)
    create_together(root, {"a": {"x": 1}, "a/b": {"y": 2}},
                    [NewArray("a/b/v", data, 4), NewArray("a/w", np.zeros(0, dtype=np.float32), 1)])
    again = zarr.open_group(tmp_path / "g.zarr", mode="r")
    assert dict(again["a"].attrs) == {"x": 1} and dict(again["a/b"].attrs) == {"y": 2}
    np.testing.assert_array_equal(again["a/b/v"][:], data)
    assert again["a/w"].shape == (0,)
    # every chunk written (a missing chunk file means damage), even one of zeros
    create_together(root, {}, [NewArray("z", np.zeros(8), 4)])
    assert sorted(p.name for p in (tmp_path / "g.zarr" / "z" / "c").iterdir()) == ["0", "1"]
    with pytest.raises(Exception, match="exists"):
        create_together(root, {"a": {}}, [])


def test_a_plan_writing_task_asks_for_the_owners_chunk_files_it_reads(small_store, tmp_path, monkeypatch):
    # a task per layer reads two rows of the plan's owners (a chunk a row): behind a URL, asking for every row's
    # chunk file each layer was a wave of requests per layer for nothing
    from dasknn import partition
    from dasknn.store import common

    path, net, _ = small_store
    owners = partition.partition_network(net.layers, 2, "block")
    store.create_plan_store(tmp_path / "plan", str(path), owners)
    asked = []
    are_files = common.are_files
    monkeypatch.setattr(common, "are_files", lambda where, keys, *a: asked.extend(keys) or are_files(where, keys, *a))
    np.testing.assert_array_equal(store.read_plan_owners(tmp_path / "plan", 2, 4), owners[2:4])
    assert sorted(asked) == ["owners/c/2/0", "owners/c/3/0"]
    (tmp_path / "plan" / "owners" / "c" / "3" / "0").unlink()
    with pytest.raises(DasknnError, match="owners: chunk 3/0 is missing"):
        store.read_plan_owners(tmp_path / "plan", 2, 4)


def test_damaged_part_plan_is_named(small_store, tmp_path):
    from dasknn import partition

    path, net, _ = small_store
    owners = partition.partition_network(net.layers, 2, "block")
    _write_part_plan(path, tmp_path / "plan", owners)
    chunk = next((tmp_path / "plan" / "l3" / "p1" / "block" / "indices_1" / "c").iterdir())
    data = bytearray(chunk.read_bytes())
    data[len(data) // 2] ^= 0xFF
    chunk.write_bytes(bytes(data))
    found = store.open_plan_store(tmp_path / "plan", str(path), owners)
    found.part_layer(1, 2, "float32")  # the others still read
    with pytest.raises(DasknnError, match=r"part plan layer 3 part 1: block: cannot read entries .*damaged"):
        found.part_layer(1, 3, "float32")


@pytest.mark.parametrize("lost, message", [
    ("lists/c/0", r"part plan layer 3 part 1: lists: chunk 0 is missing"),
    ("block/values/zarr.json", r"part plan layer 3 part 1: block is missing or incomplete \('values'\)"),
    ("block/zarr.json", r"part plan layer 3 part 1: missing or damaged \(KeyError: 'block'\)"),
])
def test_a_part_layer_missing_a_piece_is_named(small_store, tmp_path, lost, message):
    # a part layer's nodes are opened, and its chunk files asked for, side by side: what is missing is still named
    from dasknn import partition

    path, net, _ = small_store
    owners = partition.partition_network(net.layers, 2, "block")
    _write_part_plan(path, tmp_path / "plan", owners)
    (tmp_path / "plan" / "l3" / "p1" / lost).unlink()
    found = store.open_plan_store(tmp_path / "plan", str(path), owners)
    found.part_layer(1, 2, "float32")  # the others still read
    with pytest.raises(DasknnError, match=message):
        found.part_layer(1, 3, "float32")


def test_a_part_layers_lists_are_read_in_the_call_that_reads_its_block(small_store, tmp_path, monkeypatch):
    # behind a URL each call into Zarr waits for its answers: the lists read apart from the block's three arrays
    # were a fourth wait in a row for every part layer
    from dasknn import partition
    from dasknn.store import sparse

    path, net, _ = small_store
    owners = partition.partition_network(net.layers, 2, "block")
    _write_part_plan(path, tmp_path / "plan", owners)
    found = store.open_plan_store(tmp_path / "plan", str(path), owners)
    expected = found.part_layer(1, 3, "float32")
    calls = []
    read_together = sparse.read_together
    monkeypatch.setattr(sparse, "read_together",
                        lambda reads, **kwargs: calls.append(len(reads)) or read_together(reads, **kwargs))
    pl, block = found.part_layer(1, 3, "float32")
    assert calls == [4]  # pointers, indices, values and the lists, in one call
    np.testing.assert_array_equal(pl.outputs, expected[0].outputs)
    for got, want in zip(block, expected[1]):
        np.testing.assert_array_equal(got, want)


def test_a_chunk_half_written_by_a_killed_writer_is_computed_again(tmp_path):
    path = tmp_path / "run.zarr"
    run = {"network": "n", "inputs": "i", "images": 30, "dtype": "float32", "chunks": [[0, 10], [10, 20], [20, 30]]}
    store.open_results(path, run, resume=False)
    store.write_chunk_result(str(path), 0, np.array([1, 4]))
    store.write_chunk_result(str(path), 1, np.array([12]))
    meta = path / "chunk-1" / "zarr.json"
    meta.write_text(meta.read_text()[: len(meta.read_text()) // 2])  # killed while rewriting its metadata
    (path / "chunk-2").mkdir()  # killed before anything of chunk 2 was written
    assert set(store.read_results(path)) == {0}
    bounds, done = store.open_results(path, run, resume=True)
    assert done == {0} and len(bounds) == 3
    store.write_chunk_result(str(path), 1, np.array([13, 14]))  # the rerun writes over what was left
    np.testing.assert_array_equal(store.read_results(path)[1], [13, 14])


def _write_activations_at(path: str, c: int, start: float) -> str:
    time.sleep(max(0.0, start - time.time()))  # the workers finishing their chunks at the same moment
    rows = sp.random(8, 16, density=0.3, format="csr", random_state=1)
    try:
        store.write_chunk_result(path, c, np.arange(8 * c, 8 * c + 8), rows)
        return "ok"
    except Exception as e:  # the race this test is about: a worker finding the group another just made
        return f"{type(e).__name__}: {e}"


@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_workers_write_activations_of_their_chunks_at_once(tmp_path):
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    chunks = 8
    run = {"network": "n", "inputs": "i", "images": 8 * chunks, "dtype": "float32",
           "chunks": [[8 * c, 8 * c + 8] for c in range(chunks)]}
    rows = sp.random(8, 16, density=0.3, format="csr", random_state=1)
    # processes, as on a cluster: before the group was made up front, 11 of 80 such writes failed
    with ProcessPoolExecutor(chunks, mp_context=multiprocessing.get_context("fork")) as pool:
        for trial in range(3):
            path = tmp_path / f"run{trial}.zarr"
            store.open_results(path, run, resume=False, activations=True)
            start = time.time() + 0.3
            outcomes = list(pool.map(_write_activations_at, [str(path)] * chunks, range(chunks), [start] * chunks))
            assert outcomes == ["ok"] * chunks
            np.testing.assert_array_equal(store.read_activations(path).toarray(), np.vstack([rows.toarray()] * chunks))


@pytest.mark.parametrize("keep", [1, 2, 3, 4])
def test_a_stream_keeps_its_window_for_a_chunk_a_few_layers_behind(keep):
    from dasknn.store.streams import ReadAhead

    reads = []
    stream = ReadAhead(lambda k: reads.append(k) or [np.zeros(k)], depth=10, keep=keep)
    try:
        # two chunks on one worker, the second a layer behind the first: 1, 2, 1, 3, 2, 4, 3, ...
        order = [1] + [j for k in range(2, 11) for j in (k, k - 1)] + [10]
        for k in order:
            assert stream.layer(k)[0].size == k  # always the layer asked for
        for fut in list(stream._cache.values()):
            fut.result()  # (one reading thread, first in first out: every read asked for is done)
        if keep >= 3:  # the layer behind the front is still there: every layer read once
            assert sorted(reads) == list(range(1, 11))
        else:  # a window of the front (and the one read ahead): the chunk behind reads its layers again
            assert len(reads) > 10
        assert len(stream._cache) <= max(2, keep)  # never more than keep layers held (the front and one ahead)
        # a new pass from the first layer starts the window again
        assert stream.layer(1)[0].size == 1 and set(stream._cache) <= {1, 2}
    finally:
        stream.close()


def test_a_stream_shared_by_two_threads_gives_each_the_layer_it_asks_for():
    import threading

    from dasknn.store.streams import ReadAhead

    stream = ReadAhead(lambda k: [np.full(3, k)], depth=200, keep=3)
    errors = []

    def chunk(lag: int) -> None:
        try:
            for k in range(1, 201):
                if stream.layer(max(1, k - lag))[0][0] != max(1, k - lag):
                    errors.append(k)
        except Exception as e:  # noqa: BLE001 - any error of one thread is the test's failure
            errors.append(e)

    threads = [threading.Thread(target=chunk, args=(lag,)) for lag in (0, 1)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        stream.close()
    assert errors == []


@pytest.mark.parametrize("by", ["path", "url"])
def test_held_reads_fetch_a_layer_once_and_give_the_same_layer_from_memory(small_store, by):
    path, net, _ = small_store
    s = store.open_store(path if by == "path" else Path(path).resolve().as_uri(), check="metadata",
                         hold_bytes=1 << 30)
    first = [s.layer(k) for k in range(1, 6)]
    fetched = s.held.fetched
    assert fetched > 0 and s.held.held == fetched  # everything it fetched, kept
    again = [s.layer(k) for k in range(1, 6)]
    assert s.held.fetched == fetched  # nothing fetched again
    for a, b, w in zip(first, again, net.layers):
        assert (a != b).nnz == 0 and (b != w).nnz == 0


def test_held_reads_keep_no_more_than_their_limit_and_fetch_the_rest_again(small_store):
    path, net, _ = small_store
    whole = store.open_store(path, check="metadata", hold_bytes=1 << 30)
    [whole.layer(k) for k in range(1, 6)]
    limit = whole.held.fetched // 2
    s = store.open_store(path, check="metadata", hold_bytes=limit)
    [s.layer(k) for k in range(1, 6)]
    assert 0 < s.held.held <= limit
    fetched = s.held.fetched
    layers = [s.layer(k) for k in range(1, 6)]
    assert 0 < s.held.fetched - fetched < fetched  # what was not kept, fetched again; what was, not
    for a, w in zip(layers, net.layers):
        assert (a != w).nnz == 0
    assert store.open_store(path, check="metadata").held is None  # without hold_bytes: plain reads


def test_a_stream_that_holds_its_reads_counts_each_layer_read_from_the_store_once(small_store):
    from dasknn.store.streams import LayerStream

    path, net, _ = small_store
    passes = 3  # a pipeline stage's stream, once per chunk, from its first layer to its last
    for hold, reads in ((1 << 30, 1), (0, passes)):
        stream = LayerStream(path, "float64", keep=2, last=4, hold_bytes=hold)
        try:
            layer_bytes = {}
            for _ in range(passes):
                for k in range(2, 5):
                    arrays = stream.layer(k)
                    w = net.layers[k - 1].tocsc()
                    np.testing.assert_array_equal(arrays[1], w.indices)
                    np.testing.assert_array_equal(arrays[2], w.data)
                    layer_bytes[k] = sum(a.nbytes for a in arrays)
            for fut in list(stream._cache.values()):
                fut.result()
            assert stream.bytes_read == reads * sum(layer_bytes.values())
        finally:
            stream.close()
