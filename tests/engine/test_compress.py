"""Images that converge are computed once, through the engine: data mode (resident, streamed, in segments) and
pipeline mode fold them and give the categories, kept activations and results of every image, as with
``compress=False``; the counts per layer and the two rates in the result."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from dasknn import engine, generate, store

pytestmark = pytest.mark.cluster


def _both(client, path, **options):
    on = engine.infer(path, client=client, compress=True, **options)
    off = engine.infer(path, client=client, compress=False, **options)
    return on, off


@pytest.mark.parametrize("options", [
    {"mode": "data", "resident": True},
    {"mode": "data", "resident": False},
    {"mode": "data", "segment": 5, "chunks": 3},
    {"mode": "pipeline"},
    {"mode": "pipeline", "resident": False},
], ids=["data", "data-streamed", "data-segments", "pipeline", "pipeline-streamed"])
def test_folded_runs_give_every_images_category_and_count_fewer_columns(client, slice_store, slice_truth, options):
    on, off = _both(client, slice_store, dtype="float64", **options)
    np.testing.assert_array_equal(on.categories, slice_truth)
    np.testing.assert_array_equal(off.categories, slice_truth)
    # the same images alive after every layer; fewer columns computed where they fold
    assert on.layer_alive == off.layer_alive and len(on.layer_alive) == 12
    assert off.layer_columns[1:] == off.layer_alive[:-1]  # off: every alive image is a column of the next layer
    assert sum(on.layer_columns) < sum(off.layer_columns) and on.layer_columns[-1] < on.layer_alive[-2]
    s = store.open_store(slice_store)
    assert on.edges_multiplied == int(np.dot(on.layer_columns, s.layer_entries()))
    assert on.multiplied_per_second == pytest.approx(on.edges_multiplied / on.seconds)
    assert on.edges_per_second == pytest.approx(1000 * s.edges / on.seconds)


@pytest.fixture(scope="module")
def converging_store(tmp_path_factory):
    """A generated 1024 x 32 network whose images converge by its middle layers (the truth stored with them)."""
    return generate.write(tmp_path_factory.mktemp("converging") / "c.zarr", 1024, 32, images_count=600, seed=3,
                          truth=True)


def test_pipeline_hands_on_only_the_distinct_columns(client, converging_store):
    # two stages: the images that folded in the first cross to the second as one column each
    on, off = _both(client, converging_store, mode="pipeline", dtype="float64", chunks=2)
    truth = store.open_store(converging_store).inputs.truth("float64")
    np.testing.assert_array_equal(on.categories, truth)
    np.testing.assert_array_equal(off.categories, truth)
    assert on.stages == off.stages and len(on.stages) == 2
    first = on.stages[0][1]  # the first stage's last layer: what crosses is what it computed next
    assert on.layer_columns[first] < off.layer_columns[first] / 2
    assert 0 < on.bytes_sent < off.bytes_sent


@pytest.mark.parametrize("mode", ["data", "pipeline"])
def test_kept_activations_and_results_are_expanded_exactly(client, slice_store, tmp_path, mode):
    kept = {}
    for compress in (True, False):
        results = tmp_path / f"results-{compress}.zarr"
        r = engine.infer(slice_store, client=client, mode=mode, dtype="float32", compress=compress, chunks=2,
                         keep_activations=True)
        kept[compress] = r.activations.compute(scheduler=client)
        engine.infer(slice_store, client=client, mode=mode, dtype="float32", compress=compress, chunks=2,
                     results=str(results), activations=True)
        kept[compress, "stored"] = store.read_activations(results).toarray()
    np.testing.assert_array_equal(kept[True], kept[False])  # bit for bit, every image's row
    np.testing.assert_array_equal(kept[True, "stored"], kept[False, "stored"])
    np.testing.assert_array_equal(kept[True, "stored"], kept[True])
    assert np.count_nonzero(kept[True].any(axis=1)) > 200


def test_compress_must_be_a_bool(client, slice_store):
    from dasknn.errors import DasknnError

    with pytest.raises(DasknnError, match="compress must be True or False"):
        engine.infer(slice_store, client=client, compress="yes")


@pytest.mark.parametrize("options", [
    {"mode": "model", "partition": "block", "exchange": "tasks"},
    {"mode": "model", "partition": "hypergraph", "exchange": "p2p"},
    {"mode": "model", "partition": "block", "exchange": "tasks", "overlap": True},
], ids=["model-tasks", "model-p2p", "model-overlap"])
def test_model_mode_folds_images_equal_on_every_part(client, converging_store, options):
    # the parts agree on the columns to fold from each other's classes at the sync layers: the categories of every
    # image, the final activations bit for bit, and fewer bytes across
    kept = {}
    for compress in (True, False):
        r = engine.infer(converging_store, client=client, dtype="float64", compress=compress, keep_activations=True,
                         **options)
        kept[compress] = (r, r.activations.compute(scheduler=client))
    truth = store.open_store(converging_store).inputs.truth("float64")
    (on, on_rows), (off, off_rows) = kept[True], kept[False]
    np.testing.assert_array_equal(on.categories, truth)
    np.testing.assert_array_equal(off.categories, truth)
    np.testing.assert_array_equal(on_rows, off_rows)
    assert 0 < on.bytes_sent < off.bytes_sent * 0.75


def test_hybrid_mode_folds_in_each_group(client4, converging_store):
    on, off = (engine.infer(converging_store, client=client4, mode="hybrid", group_size=2, partition="block",
                            dtype="float64", compress=c) for c in (True, False))
    truth = store.open_store(converging_store).inputs.truth("float64")
    np.testing.assert_array_equal(on.categories, truth)
    np.testing.assert_array_equal(off.categories, truth)
    assert on.bytes_sent < off.bytes_sent


def test_hybrid_mode_counts_what_its_groups_steps_computed(client4, slice_store):
    # (on the real slice: its images that are equal in SciPy's order of additions are equal in the kernels')
    r = engine.infer(slice_store, client=client4, mode="hybrid", group_size=2, partition="block", dtype="float64",
                     chunks=4, compress=True)
    assert (r.layer_columns, r.layer_alive) == _replayed_counts(slice_store, r, True, 2, False)
    assert r.layer_columns[10] < r.layer_alive[9]  # layer 11 computes fewer columns than layer 10 left alive


@pytest.mark.parametrize("options", [
    {"partition": "block", "exchange": "tasks", "compress": True},
    {"partition": "block", "exchange": "tasks", "compress": False},
    {"partition": "hypergraph", "exchange": "p2p", "compress": True, "overlap": True, "sync_every": 3},
], ids=["tasks-on", "tasks-off", "p2p-overlap-on"])
def test_model_mode_counts_what_its_steps_computed(client, slice_store, options):
    # per layer: the images alive after it, and the columns the parts' steps ran over (each image until the first
    # compaction, then the images alive, or alive and distinct with compress, at the last sync layer compacted by)
    r = engine.infer(slice_store, client=client, mode="model", dtype="float64", chunks=2, **options)
    want = _replayed_counts(slice_store, r, options["compress"], options.get("sync_every", 2),
                            options.get("overlap", False))
    assert (r.layer_columns, r.layer_alive) == want
    s = store.open_store(slice_store)
    assert r.edges_multiplied == int(np.dot(want[0], s.layer_entries()))
    assert r.multiplied_per_second == pytest.approx(r.edges_multiplied / r.seconds)


def _replayed_counts(path, result, compress: bool, sync_every: int, overlap: bool) -> tuple[list[int], list[int]]:
    # model mode's counts replayed with the SciPy reference, chunk by chunk: its sync layers (every sync_every-th
    # and the last, compacted one layer on, two with overlap) fold the alive images and, with compress, the equal
    # ones; a layer's columns are the chunk's images as of the last compaction at or before it
    from dasknn import reference
    from dasknn.engine.sizing import chunk_bounds, sync_layers

    s = store.open_store(path)
    syncs = sync_layers(s.depth, sync_every, overlap)
    columns, alive = np.zeros(s.depth, dtype=np.int64), np.zeros(s.depth, dtype=np.int64)
    for a, b in chunk_bounds(result.images, result.chunks):
        y = s.inputs.rows(a, b).astype(np.float64)
        left = b - a  # the columns the steps run over
        for k, w in enumerate(s.iter_layers(), start=1):
            if any(k == sync + (2 if overlap else 1) for sync in syncs):
                left = after_sync
            y = reference.layer_step(y, w.astype(np.float64), s.bias, s.ymax)
            rows = y.toarray()
            live = rows[rows.any(axis=1)]
            columns[k - 1] += left
            alive[k - 1] += live.shape[0]
            if k in syncs:
                after_sync = np.unique(live, axis=0).shape[0] if compress else live.shape[0]
    return columns.tolist(), alive.tolist()


def test_the_cost_model_counts_the_collapse_where_images_fold(client, converging_store):
    on, off = (engine.infer(converging_store, client=client, mode="data", explain=True, compress=c)
               for c in (True, False))
    assert on.calibration.distinct and off.calibration.distinct == []
    assert sum(on.calibration.distinct) < sum(on.calibration.alive)
    # the work the predictions count: the distinct vectors with compression, every alive image without
    from dasknn import cost

    depth = store.open_store(converging_store).depth
    assert cost.computed_per_layer(on.calibration, depth).sum() < cost.alive_per_layer(on.calibration, depth).sum()
    np.testing.assert_array_equal(cost.computed_per_layer(off.calibration, depth),
                                  cost.alive_per_layer(off.calibration, depth))


@pytest.fixture(scope="module")
def deep_converging_store(tmp_path_factory):
    """A generated 1024 x 72 network with drawn weights: its images converge before layer 32, where a worker's
    chunks share ends (no layer has one weight, so the loop, not kernels.uniform, carries the converged vector)."""
    return generate.write(tmp_path_factory.mktemp("deep") / "d.zarr", 1024, 72, images_count=300, seed=3,
                          weights="random")


@pytest.fixture(scope="module")
def deep_uniform_store(tmp_path_factory):
    """The same network with the challenge's one weight: its images converge onto every neuron at ymax."""
    return generate.write(tmp_path_factory.mktemp("deep") / "u.zarr", 1024, 72, images_count=300, seed=3)


@pytest.mark.parametrize("resident", [True, False], ids=["resident", "streamed"])
def test_a_converged_chunk_runs_on_without_the_loop_through_layers_of_one_weight(client, deep_uniform_store,
                                                                                  resident):
    # after layer 32 every chunk's columns hold ymax in every row: kernels.uniform takes them through the other
    # 40 layers without the loop, and the categories and per-layer alive counts are compression off's
    on, off = _both(client, deep_uniform_store, mode="data", chunks=2, resident=resident)
    np.testing.assert_array_equal(on.categories, off.categories)
    assert on.categories.size > 0 and on.layer_alive == off.layer_alive
    assert sum(on.layer_columns[:32]) > 0 and sum(on.layer_columns[32:]) == 0


def test_a_workers_later_chunks_take_the_ends_its_earlier_chunks_found(client, deep_converging_store):
    # the same 300 images four times over, four chunks on two workers: after layer 32 (kernels.ends.ENDS_EVERY)
    # each worker's later chunks take the ends its first found, so the last layers compute each worker's columns
    # once, and every image's category and the per-layer alive counts are as computed image by image
    import dasknn

    images = store.open_store(deep_converging_store).inputs.rows()
    once = dasknn.infer(deep_converging_store, images, client, mode="data", chunks=1, compress=True)
    four = sp.vstack([images] * 4).tocsr()
    on = dasknn.infer(deep_converging_store, four, client, mode="data", chunks=4, compress=True)
    off = dasknn.infer(deep_converging_store, four, client, mode="data", chunks=4, compress=False)
    n = images.shape[0]
    want = np.concatenate([once.categories + i * n for i in range(4)])
    np.testing.assert_array_equal(off.categories, want)
    np.testing.assert_array_equal(on.categories, want)
    assert on.layer_alive == off.layer_alive and on.layer_alive[-1] == 4 * once.layer_alive[-1] > 0
    assert 0 < once.layer_columns[-1] <= 8  # converged: one chunk's last layer computes a few columns
    assert on.layer_columns[:32] == [4 * c for c in once.layer_columns[:32]]  # before layer 32: every chunk
    assert sum(on.layer_columns[32:]) <= 2 * sum(once.layer_columns[32:])  # after: once per worker
