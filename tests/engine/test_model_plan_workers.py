"""Model mode's exchange plan: timed in every mode, built by the workers, and auto's partition on the cluster."""

from __future__ import annotations

import json

import numpy as np
import pytest
import scipy.sparse as sp

from dasknn import engine, partition, plan, store
from dasknn.engine import exchange_plan
from dasknn.cli import main


@pytest.mark.cluster
def test_resident_model_mode_reports_its_plan_seconds(client, slice_store, slice_truth, capsys):
    # the plan is built in resident model mode too: its time is reported, not 0
    result = engine.infer(slice_store, client=client, mode="model", partition="block", chunks=1, dtype="float64")
    np.testing.assert_array_equal(result.categories, slice_truth)
    assert result.resident and result.plan_seconds > 0
    code = main(["infer", "--network", str(slice_store), "--mode", "model", "--partition", "block", "--workers", "2",
                 "--dtype", "float64", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0 and report["streamed"] is False and report["plan_seconds"] > 0
    # data mode builds no plan
    data = engine.infer(slice_store, client=client, mode="data", chunks=1, dtype="float64")
    assert data.plan_seconds == 0


def _same_part_layer(mine, theirs) -> None:
    for a, b in [(mine.outputs, theirs.outputs), (mine.inputs, theirs.inputs), *zip(mine.local, theirs.local)]:
        np.testing.assert_array_equal(a, b)
        assert a.dtype == b.dtype
    for got, want in ((mine.recv, theirs.recv), (mine.send, theirs.send)):
        assert list(got) == list(want)
        for p in want:
            np.testing.assert_array_equal(got[p], want[p])
            assert got[p].dtype == want[p].dtype


@pytest.mark.parametrize("parts", [1, 2, 3, 5])
@pytest.mark.parametrize("density", [0.0, 0.02, 0.3])
def test_a_parts_plan_is_its_share_of_the_whole_plan(parts, density):
    # what a worker makes for its part is exactly the whole plan's row for it (empty parts and layers included)
    rng = np.random.default_rng(parts * 100 + int(density * 100))
    n = 60
    w = sp.random(n, n, density=density, format="csc", random_state=rng)
    before, after = rng.integers(0, parts, n), rng.integers(0, parts, n)
    after[after == parts - 1] = 0  # the last part owns no outputs
    whole = plan.plan_layer(w, before, after, parts)
    for q in range(parts):
        _same_part_layer(exchange_plan.part_plan_layer(w, before, after, parts, q), whole[q])


@pytest.mark.cluster
def test_resident_model_mode_reads_no_layer_on_the_client(client, slice_store, slice_truth, monkeypatch):
    # the client holds the owners and the counts; each worker makes its part's plan from the layers it reads
    owners = partition.partition_network(store.open_store(slice_store).network().layers, 2, "random", seed=1)
    whole = plan.build_plan(store.open_store(slice_store).network().layers, owners)

    def no_layers(*args, **kwargs):
        raise AssertionError("the client read a layer")

    for name in ("layer", "network", "iter_layers", "partition_layers", "lazy_layers", "columns"):
        monkeypatch.setattr(store.NetworkStore, name, no_layers)
    result = engine.infer(slice_store, client=client, mode="model", partition=owners, chunks=2, dtype="float64")
    np.testing.assert_array_equal(result.categories, slice_truth)
    assert result.resident and result.plan_volume == whole.volumes().tolist()
    assert sum(result.dense_message_bytes) == result.plan_bytes > 0


def _auto_chooses_model_and_the_client_cannot_partition(monkeypatch):
    # auto picks model mode whatever the predictions say (with explain, model mode is predicted though the slice
    # fits in a worker); the client may not partition (the workers are other processes: there it is not refused)
    from dasknn import cost

    def refuse(*args, **kwargs):
        raise AssertionError("the client partitioned")

    monkeypatch.setattr(partition, "partition_network", refuse)
    monkeypatch.setattr(cost, "cheapest", lambda predictions: [p for p in predictions if p.mode == "model"][0])


@pytest.mark.cluster
def test_auto_partitions_on_the_cluster_and_keeps_it(client, fresh_store, slice_truth, monkeypatch):
    _auto_chooses_model_and_the_client_cannot_partition(monkeypatch)
    first = engine.infer(fresh_store, client=client, mode="auto", partition="block", dtype="float64",
                          explain=True)
    np.testing.assert_array_equal(first.categories, slice_truth)
    assert first.mode == "model" and first.partition_seconds > 0
    saved = store.load_partition(fresh_store, store.partition_name("block", 2))
    assert saved is not None
    layers = store.open_store(fresh_store).network().layers
    assert partition.layer_volumes(layers, saved[0], parts=2).tolist() == first.plan_volume
    # the next run uses the stored partition
    again = engine.infer(fresh_store, client=client, mode="auto", partition="block", dtype="float64",
                          explain=True)
    np.testing.assert_array_equal(again.categories, slice_truth)
    assert again.mode == "model" and again.partition_seconds == 0
    assert again.plan_volume == first.plan_volume


@pytest.mark.cluster
def test_auto_keeps_no_partition_in_a_read_only_store_or_one_given(client, fresh_store, slice_truth, monkeypatch):
    import os

    owners = partition.partition_network(store.open_store(fresh_store).network().layers, 2, "random", seed=1)
    _auto_chooses_model_and_the_client_cannot_partition(monkeypatch)
    access = os.access
    with monkeypatch.context() as m:
        m.setattr(os, "access", lambda p, mode, **kw: mode != os.W_OK and access(p, mode, **kw))
        result = engine.infer(fresh_store, client=client, mode="auto", partition="block", dtype="float64",
                              explain=True)
    np.testing.assert_array_equal(result.categories, slice_truth)
    assert result.mode == "model" and result.partition_seconds > 0
    assert store.load_partition(fresh_store, store.partition_name("block", 2)) is None
    given = engine.infer(fresh_store, client=client, mode="auto", partition=owners, dtype="float64",
                         explain=True)
    np.testing.assert_array_equal(given.categories, slice_truth)
    assert given.mode == "model" and given.partition_seconds == 0
    assert not (fresh_store / "partitions").exists() or not any((fresh_store / "partitions").iterdir())


@pytest.mark.cluster
@pytest.mark.parametrize("worker_memory, on_cluster", [(None, True), (1e6, False)])
def test_model_mode_partitions_on_a_worker_that_has_the_memory(client, fresh_store, slice_truth, monkeypatch,
                                                               worker_memory, on_cluster):
    # an explicit --mode model computes its partition where auto's does: on a worker, unless a worker's memory
    # is too small for it (then the client computes it, as before)
    import importlib

    from dasknn.partition import cluster as cluster_mod

    infer_mod = importlib.import_module("dasknn.engine.infer")  # the module: the package exports the function

    where = []
    on_worker = cluster_mod.partition_on_cluster
    monkeypatch.setattr(cluster_mod, "partition_on_cluster",
                        lambda *a, **k: where.append("cluster") or on_worker(*a, **k))
    if worker_memory is not None:
        fits = infer_mod.partition_fits_worker
        monkeypatch.setattr(infer_mod, "partition_fits_worker", lambda neurons, memory: fits(neurons, worker_memory))
    result = engine.infer(fresh_store, client=client, mode="model", partition="block", dtype="float64")
    np.testing.assert_array_equal(result.categories, slice_truth)
    assert result.partition_seconds > 0
    assert where == (["cluster"] if on_cluster else [])
    assert store.load_partition(fresh_store, store.partition_name("block", 2)) is not None


def test_a_partition_fits_a_worker_by_the_network_width():
    from dasknn.engine.sizing import PARTITION_NEURON_BYTES, WEIGHTS_SHARE, partition_fits_worker

    assert partition_fits_worker(65536, 2e9) and not partition_fits_worker(65536, 600e6)
    width = 1024
    assert partition_fits_worker(width, PARTITION_NEURON_BYTES * width / WEIGHTS_SHARE)
    assert not partition_fits_worker(width, 0.99 * PARTITION_NEURON_BYTES * width / WEIGHTS_SHARE)


def test_the_plan_task_keeps_the_parts_blocks_for_its_weights_task(slice_store, monkeypatch):
    # the worker reads each layer once: the weights' task takes the blocks its plan task made from the layers it
    # read, the same blocks as when read from the store (what it still does when none are kept)
    from dasknn.engine import tasks
    from dasknn.engine.worker_run import inference_run
    from dasknn.runtime.worker_runs import close_run

    layers = store.open_store(slice_store).network().layers
    owners = partition.partition_network(layers, 2, "random", seed=1)
    held = ("test-run", 0, 1)
    run = inference_run("test-run")  # this process's object of the run (a worker's, on a cluster)
    try:
        exchange_plan.plan_part(str(slice_store), owners, 2, held)
        first_rows = int(np.count_nonzero(owners[0] == 1))
        reads = []
        layer = store.NetworkStore.layer
        monkeypatch.setattr(store.NetworkStore, "layer", lambda self, k: reads.append(k) or layer(self, k))
        kept = tasks.load_part_layers(str(slice_store), held, first_rows, "float64", "cpu")
        assert reads == [] and (0, 1) not in run.blocks and (0, 1) in run.plans
        again = tasks.load_part_layers(str(slice_store), held, first_rows, "float64", "cpu")
        assert reads == list(range(1, len(layers) + 1))
        for (pl, block), (pl2, block2) in zip(kept, again):
            assert pl is pl2
            for a, b in zip(block, block2):
                np.testing.assert_array_equal(a, b)
                assert a.dtype == b.dtype
    finally:
        close_run("test-run")
    assert not run.plans and not run.blocks and inference_run("test-run") is not run  # closed: a new run's is new
    close_run("test-run")
