"""Pipeline mode (inference): each worker holds a stage of consecutive layers, chunks flow stage to stage."""

from __future__ import annotations

import importlib
import itertools
import json

import numpy as np
import pytest

from dasknn import cost, engine, generate, modes, store
from dasknn.cli import main
from dasknn.engine.sizing import pipeline_chunks, pipeline_prediction
from dasknn.stages import Stage, stage_cuts


@pytest.fixture(scope="module")
def client3():
    from dasknn.cluster import local_client

    with local_client(workers=3, threads_per_worker=1) as c:
        yield c


@pytest.fixture(scope="module")
def deep(tmp_path_factory):
    """A generated 1024 x 24 network with 300 images and their float64 truth."""
    return generate.write(tmp_path_factory.mktemp("pipeline") / "deep.zarr", 1024, 24, 300, seed=7, truth=True)


def _check_stages(stages, depth: int, k: int) -> None:
    # consecutive, non-empty, covering 1..depth, k of them
    assert len(stages) == k
    assert stages[0][0] == 1 and stages[-1][1] == depth
    for (a, b), (c, _) in zip(stages, stages[1:]):
        assert a <= b and c == b + 1


def _best_slowest(work: list[float], k: int) -> float:
    # the slowest stage of the best cut, by trying every cut
    best = float("inf")
    for cuts in itertools.combinations(range(1, len(work)), k - 1):
        edges = (0, *cuts, len(work))
        best = min(best, max(sum(work[a:b]) for a, b in zip(edges, edges[1:])))
    return best


@pytest.mark.parametrize("work", [[5, 1, 1, 1, 1, 1, 1, 1], [1] * 7, [8, 4, 2, 1, 1, 1, 0.5, 0.5, 0.2],
                                  [3, 9, 1, 1, 7, 2, 2, 6, 1, 4], [1, 1, 1, 100]])
@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_stage_cuts_are_consecutive_cover_every_layer_and_balance_the_slowest(work, k):
    cuts = stage_cuts(work, k)
    assert all(isinstance(s, Stage) for s in cuts)
    _check_stages([s.as_list() for s in cuts], len(work), k)
    slowest = max(sum(work[s.first - 1:s.last]) for s in cuts)
    assert slowest == pytest.approx(_best_slowest(work, k))


def _best_fitting(work, sizes, caps):
    # the smallest slowest stage among the cuts into len(caps) stages whose stage s's size is at most caps[s]
    # (brute force), or None where no cut fits
    best = None
    for cuts in itertools.combinations(range(1, len(work)), len(caps) - 1):
        edges = list(zip((0, *cuts), (*cuts, len(work))))
        if all(sum(sizes[a:b]) <= cap for (a, b), cap in zip(edges, caps)):
            slowest = max(sum(work[a:b]) for a, b in edges)
            best = slowest if best is None else min(best, slowest)
    return best


@pytest.mark.parametrize("seed", range(40))
def test_stages_cut_to_fit_their_workers_balance_the_slowest_among_the_cuts_that_fit(seed):
    rng = np.random.default_rng(seed)
    depth, k = int(rng.integers(3, 9)), int(rng.integers(2, 4))
    work, sizes = rng.integers(1, 20, depth).tolist(), rng.integers(1, 20, depth).tolist()
    cap = float(rng.integers(max(sizes), sum(sizes) + 1))
    cuts = stage_cuts(work, k, sizes, cap)
    _check_stages([s.as_list() for s in cuts], depth, k)
    best = _best_fitting(work, sizes, [cap] * k)
    if best is None:  # nothing fits: the cut by work alone (its stages stream)
        assert cuts == stage_cuts(work, k)
    else:
        assert all(sum(sizes[s.first - 1:s.last]) <= cap for s in cuts)
        assert max(sum(work[s.first - 1:s.last]) for s in cuts) == pytest.approx(best)


@pytest.mark.parametrize("seed", range(60))
def test_stages_cut_to_fit_workers_of_different_memory_balance_the_slowest_among_the_cuts_that_fit(seed):
    rng = np.random.default_rng(seed)
    depth, k = int(rng.integers(3, 9)), int(rng.integers(2, 4))
    work, sizes = rng.integers(1, 20, depth).tolist(), rng.integers(1, 20, depth).tolist()
    caps = rng.integers(max(sizes) // 2, sum(sizes) + 1, k).astype(float).tolist()
    cuts = stage_cuts(work, k, sizes, caps)
    _check_stages([s.as_list() for s in cuts], depth, k)
    best = _best_fitting(work, sizes, caps)
    if best is None:
        assert cuts == stage_cuts(work, k)
    else:
        assert all(sum(sizes[s.first - 1:s.last]) <= cap for s, cap in zip(cuts, caps))
        assert max(sum(work[s.first - 1:s.last]) for s in cuts) == pytest.approx(best)


def test_workers_of_different_memory_are_placed_smallest_first_and_each_stage_fits_its_own():
    from dasknn.stages import place_stages

    # work falls as images die; entries do not: a balanced cut gives the later stages more entries
    work, sizes = [8, 4, 2, 1, 1, 1], [4] * 6
    memory = {"a": 20.0, "b": 20.0, "c": 4.0, "d": 4.0}  # entries a worker may hold: its memory x 1
    placed = place_stages(work, sizes, [["a", "b"], ["c", "d"]], memory, 1.0)
    assert placed.groups == [["c", "a"], ["d", "b"]]  # the small workers hold the first stage in each pipeline
    assert placed.stages == [Stage(1, 1), Stage(2, 6)] and placed.fits
    # the same limits for every worker: the pipelines as given, the cut within the smallest cap
    same = place_stages(work, sizes, [["a", "b"]], {"a": 12.0, "b": 12.0}, 1.0)
    assert same.groups == [["a", "b"]] and same.stages == [Stage(1, 3), Stage(4, 6)] and same.fits
    # nothing fits the small workers' 2 entries: by work alone, streamed
    small = place_stages(work, sizes, [["a", "c"]], {"a": 16.0, "c": 2.0}, 1.0)
    assert small.stages == stage_cuts(work, 2) and not small.fits


def test_a_stage_cut_by_work_alone_that_would_not_fit_is_cut_to_fit():
    # the first layer is most of the work (its images are all alive), the last three most of the entries: by work
    # alone stage 2 holds 15 entries, more than a worker's 10; cut to fit, each stage holds at most 10
    work, sizes = [10, 1, 1, 1], [1, 5, 5, 5]
    assert stage_cuts(work, 2) == [Stage(1, 1), Stage(2, 4)]
    assert stage_cuts(work, 2, sizes, 10) == [Stage(1, 2), Stage(3, 4)]
    assert stage_cuts(work, 2, sizes, 4) == [Stage(1, 1), Stage(2, 4)]  # a layer alone over the cap: by work


def test_after_a_loss_the_workers_left_keep_their_stages_and_the_new_ones_fill_the_places_left():
    from dasknn.engine.pipeline_mode import keep_stage_places

    stages = stage_cuts(np.ones(12), 3)
    # worker "b" held stage 2 and "d" stage 0 before the loss; "a" and "c" are new (sorted order puts them first)
    assert keep_stage_places([["a", "b", "c"]], stages, {"b": stages[2], "d": stages[0]}) == [["a", "c", "b"]]
    assert keep_stage_places([["a", "b", "c"]], stages, {"c": stages[0]}) == [["c", "a", "b"]]
    # two replicas: both holders of stage 0 keep it, one in each pipeline
    two = keep_stage_places([["a", "b", "c"], ["x", "y", "z"]], stages, {"y": stages[0], "z": stages[0]})
    assert two == [["y", "a", "b"], ["z", "c", "x"]]
    # a stage cut differently now (fewer workers) is held by nobody: the order stays
    assert keep_stage_places([["a", "b"]], stage_cuts(np.ones(12), 2), {"a": stages[1]}) == [["a", "b"]]


def test_pipeline_chunks_are_two_per_stage_unless_that_makes_them_narrower_than_the_kernels_twins():
    from dasknn.kernels.cpu import TWIN_MIN_IMAGES

    assert TWIN_MIN_IMAGES == 128
    assert pipeline_chunks(1000, 2, 1, 1) == 4  # 250 images each
    assert pipeline_chunks(1000, 4, 1, 1) == 7  # not 8 of 125: 7 of 142 or 143
    assert pipeline_chunks(1000, 2, 2, 1) == 7  # two pipelines of two stages alike
    assert pipeline_chunks(300, 4, 1, 1) == 4  # a chunk a stage at least, however narrow
    assert pipeline_chunks(60_000, 4, 1, 1) == 8
    assert pipeline_chunks(1000, 2, 1, 20) == 20  # what fits the workers' memory comes first
    assert pipeline_chunks(3, 4, 1, 1) == 3  # at most one per image


def test_stage_cuts_refuse_more_stages_than_layers():
    with pytest.raises(ValueError, match="3 stages cannot cut 2 layers"):
        stage_cuts([1, 1], 3)


def test_pipeline_is_a_mode_of_inference_and_training_but_not_a_group_size_mode():
    assert modes.PIPELINE in modes.INFERENCE and modes.PIPELINE in engine.MODES
    from dasknn.train import MODES as TRAINING

    assert modes.PIPELINE in TRAINING and modes.PIPELINE not in modes.DISTRIBUTED
    assert modes.group_size_of(modes.PIPELINE, 4, None) == 4
    assert modes.group_size_of(modes.PIPELINE, 4, 2) == 2


@pytest.mark.cluster
@pytest.mark.parametrize("k", [2, 3, 4])
def test_pipeline_matches_the_truth_with_k_stages(request, slice_store, slice_truth, k):
    client = request.getfixturevalue({2: "client", 3: "client3", 4: "client4"}[k])
    result = engine.infer(slice_store, client=client, mode="pipeline", dtype="float64")
    np.testing.assert_array_equal(result.categories, slice_truth)
    assert result.mode == "pipeline" and result.group_size == k and result.workers == k
    _check_stages(result.stages, 12, k)
    # by default two chunks per stage, so every stage has work once the pipeline is full, but none narrower than the
    # kernel's twins (the slice's 1,000 images: 7 chunks for 4 stages)
    assert result.chunks == pipeline_chunks(1000, k, 1, 1) >= min(2 * k, 1000 // 128)
    # one task per stage and chunk (no splitting tasks between them): the scheduler's load is K per chunk
    assert result.tasks == result.chunks * k
    # the activations crossed the stage boundaries as Dask transfers (counted by their arrays' bytes)
    assert result.bytes_sent > 0
    assert result.exchange == "" and result.plan_bytes == 0


@pytest.mark.cluster
def test_pipeline_replicas_with_group_size(client4, slice_store, slice_truth):
    # two pipelines of two stages each, the chunks going round them
    result = engine.infer(slice_store, client=client4, mode="pipeline", group_size=2, dtype="float64", chunks=8)
    np.testing.assert_array_equal(result.categories, slice_truth)
    assert result.group_size == 2 and result.workers == 4 and result.chunks == 8
    _check_stages(result.stages, 12, 2)
    assert result.tasks == 8 * 2


def _network_bytes(path) -> int:
    # the bytes a stream reads for every layer once (indptr, indices, float64 values)
    s = store.open_store(path)
    return sum(w.indptr.nbytes + w.indices.nbytes + w.data.astype(np.float64).nbytes for w in s.iter_layers())


@pytest.mark.cluster
@pytest.mark.parametrize("resident", [True, False])
def test_pipeline_on_a_deeper_generated_network(client4, deep, resident):
    result = engine.infer(deep, client=client4, mode="pipeline", dtype="float64", resident=resident)
    np.testing.assert_array_equal(result.categories, store.open_inputs(deep).truth(np.float64))
    _check_stages(result.stages, 24, 4)
    if not resident:  # streamed stages hold a few layers however long: cut by work alone (entries, unprobed)
        assert result.stages == [s.as_list() for s in stage_cuts(store.open_store(deep).layer_entries(), 4)]
    assert result.tasks == result.chunks * 4
    if not resident:
        # each worker streamed its stage's layers only (nothing read past its stage), fetching them from the store
        # for its first chunk and decoding them from the bytes it kept for the others: the workers together read
        # the network once, not once per chunk (nor once per chunk and worker, as data mode would)
        assert result.chunks > 1 and result.bytes_read == _network_bytes(deep)


@pytest.mark.cluster
def test_cli_infer_pipeline_json_and_explain(slice_store, capsys):
    code = main(["infer", "--network", str(slice_store), "--mode", "pipeline", "--workers", "2", "--chunks", "4",
                 "--dtype", "float64", "--json", "--explain"])
    out = capsys.readouterr()
    assert code == 0, out.err
    report = json.loads(out.out)
    assert report["mode"] == "pipeline" and report["matches_truth"] is True and report["mismatched"] == 0
    assert report["group_size"] == 2 and report["tasks"] == 8
    _check_stages(report["stages"], 12, 2)
    # the cost model predicted the pipeline beside the other modes
    predicted = {p["mode"]: p for p in report["predictions"]}
    assert predicted["pipeline"]["group_size"] == 2 and predicted["pipeline"]["seconds"] > 0
    assert "data" in predicted
    # --explain: the probe's figures a layer too
    assert len(report["calibration"]["alive"]) == len(report["calibration"]["message_factor"]) == 12


@pytest.mark.cluster
def test_other_modes_report_no_stages(slice_store, capsys):
    code = main(["infer", "--network", str(slice_store), "--mode", "data", "--workers", "1", "--batch", "100",
                 "--json"])
    out = capsys.readouterr()
    assert code == 0, out.err
    assert "stages" not in json.loads(out.out)


def _cal(**over) -> cost.Calibration:
    base = dict(kernel_rate=1e9, message_rate=1e8, transfer_rate=1e9, task_seconds=1e-3, read_rate=1e8,
                alive=[1.0, 1.0, 1.0, 1.0], message_factor=[1.0] * 4, probe_layers=4, probe_images=64)
    base.update(over)
    return cost.Calibration(**base)


def _predict(cal, **over) -> cost.Prediction:
    args = dict(images=1000, layer_nnz=np.array([1000, 1000, 1000, 1000]), weight_bytes=48_000, memory=1e6,
                workers=2, threads=2, chunks=4, stages=2, neurons=100, itemsize=8, weights_share=0.25)
    args.update(over)
    return cost.predict_pipeline(cal, **args)


def test_pipeline_prediction_fill_drain_boundary_and_memory():
    p = _predict(_cal())
    assert p.mode == "pipeline" and p.group_size == 2 and p.fits and p.resident
    # each stage: 2 layers x 1000 entries x 250 images per chunk at 1e9 = 5e-4 s; 4 chunks + 1 to fill and drain
    assert p.compute == pytest.approx(5e-4 * (4 + 1))
    # 1000 images alive x 100 neurons x 8 bytes cross the one boundary, at 1e9 B/s on each of 2 workers
    assert p.exchange == pytest.approx(1000 * 100 * 8 / 2e9)
    assert p.tasks == pytest.approx(4 * 2 * 1e-3 / 2)
    # one pipeline reads the network once before the run, its 2 workers at once
    assert p.load_seconds == pytest.approx(48_000 / (1e8 * 2))
    assert p.seconds == pytest.approx(p.compute + p.exchange + p.tasks + p.load_seconds)
    # images dead after the first layers: the later layers are cheaper, and the cut follows the work
    lighter = _predict(_cal(alive=[1.0, 0.5, 0.25, 0.25]))
    assert lighter.compute < p.compute
    # the loop's cost a layer, on every chunk: a stage's 2 layers, 5 stage times
    assert _predict(_cal(layer_seconds=1e-4)).compute == pytest.approx((5e-4 + 2e-4) * (4 + 1))
    # the first stage reads each chunk's 250 images (at 1e6 a second) before its layers
    assert _predict(_cal(image_rate=1e6)).compute == pytest.approx((5e-4 + 2.5e-4) * (4 + 1))
    # 4 stages' threads on 2 cores: a stage alone (the fill, the drain) runs at twice the rate timed with every
    # worker running, the 8 chunks' steady state at that rate (4 stages of 1 layer, 125-image chunks: 1.25e-4 s a
    # chunk each); the stages' work together is what the cores do (8 chunks of all 4 stages on 4 threads)
    shared = _predict(_cal(cores=2), workers=4, threads=4, stages=4, chunks=8)
    assert shared.compute == pytest.approx(max(1.25e-4 * (3 / 2 + 8), 4 * 1.25e-4 * 8 / 4))
    one_core_each = _predict(_cal(cores=4), workers=4, threads=4, stages=4, chunks=8)
    assert one_core_each.compute == pytest.approx(1.25e-4 * (8 + 3))
    # the largest stage (half the weights) must fit a quarter of the memory
    assert not _predict(_cal(), memory=4 * 24_000 - 1, resident=True).fits
    assert _predict(_cal(), memory=4 * 24_000).fits


def test_auto_weighs_the_pipeline_only_where_data_mode_cannot_hold_the_weights(client, slice_store, slice_truth):
    # the weights fit: auto (with explain) predicts data and model mode as before, not the pipeline
    fits = engine.infer(slice_store, client=client, mode="auto", explain=True, images=200, dtype="float64")
    assert "pipeline" not in {p.mode for p in fits.predictions}
    # streamed: the pipeline is a candidate, and auto runs the cheapest that fits, whichever it is
    result = engine.infer(slice_store, client=client, mode="auto", explain=True, resident=False, dtype="float64")
    np.testing.assert_array_equal(result.categories, slice_truth)
    predicted = {p.mode: p for p in result.predictions}
    assert predicted["pipeline"].group_size == 2 and not predicted["pipeline"].resident
    best = cost.cheapest(result.predictions)
    assert (result.mode, result.group_size) == (best.mode, best.group_size)
    if result.mode == "pipeline":
        _check_stages(result.stages, 12, 2)


def test_more_stages_than_layers_is_refused_in_one_line(client, tmp_path):
    from dasknn.errors import DasknnError

    one_layer = generate.write(tmp_path / "one.zarr", 1024, 1, 20, seed=1)
    with pytest.raises(DasknnError, match="each of its 2 workers a stage of at least one layer, and the network "
                                          "has 1"):
        engine.infer(one_layer, client=client, mode="pipeline")


def test_a_pipeline_worker_must_hold_its_largest_stage(slice_store):
    from dasknn.engine.infer import _shares

    s = store.open_store(slice_store)
    nnz = np.array([s.layer_nnz(k) for k in range(1, 13)], dtype=float)  # 32,768 entries each
    # the images die after layer 1: the work cut gives layer 1 a stage alone, and the other 11 layers to the second
    work = nnz * np.array([1.0] + [0.05] * 11)
    even = {"a": 1e9, "b": 1e9, "c": 1e9}
    assert _shares(s, work, True, 1.0, 2, dict(list(even.items())[:2])) == [(12, 1e9), (pytest.approx(12 / 11), 1e9)]
    assert _shares(s, nnz, True, 1.0, 3, even) == [(3, 1e9)] * 3  # even work: a third each
    assert _shares(s, work, False, 1.0, 2, {"a": 1e9, "b": 5e8}) == [(1, 5e8)]  # streaming: whole layers, as data mode
    assert _shares(s, None, True, None, 4, {"a": 1e9, "b": 2e9}) == [(4, 1e9)]  # other modes: their group size
    # limits that differ: each stage is weighed against the workers placed at it, the smaller one first; 5 of 12
    # layers fit the small one (20 entries a byte: 163,840 entries of 8 kB), the rest the large one
    uneven = _shares(s, nnz, True, 20.0, 2, {"a": 32e3, "b": 8.2e3})
    assert uneven == [(pytest.approx(12 / 5), 8.2e3), (pytest.approx(12 / 7), 32e3)]


def test_pipeline_keeps_the_final_activations_on_the_last_stage(client, slice_store, slice_truth):
    result = engine.infer(slice_store, client=client, mode="pipeline", dtype="float64", keep_activations=True)
    np.testing.assert_array_equal(result.categories, slice_truth)
    rows = result.activations.compute(scheduler=client)
    assert rows.shape == (1000, 1024)
    # the images with a nonzero final row are the categories (both 0-based)
    np.testing.assert_array_equal(np.flatnonzero(rows.any(axis=1)), slice_truth)


@pytest.mark.cluster
def test_workers_of_different_memory_hold_stages_cut_to_each_ones_memory(slice_store, slice_truth, monkeypatch):
    # a worker of 1.5 GB and one of 3 GB, and a share of memory for weights so small that 4 of the slice's 12
    # layers fit the first and 9 the second: cut for the smaller worker alone, no cut fits (they would stream);
    # placed by each one's memory, the small worker holds layers 1-4 and the large one 5-12, resident
    from distributed import Client, Nanny, Scheduler, SpecCluster, futures_of

    infer_module = importlib.import_module("dasknn.engine.infer")
    weights = store.open_store(slice_store).edges * 12  # float64 values and int32 indices
    share = 4.5 / 12 * weights / 1.5e9
    monkeypatch.setattr(infer_module, "WEIGHTS_SHARE", share)
    monkeypatch.setattr(importlib.import_module("dasknn.engine.sizing"), "WEIGHTS_SHARE", share)
    spec = {name: {"cls": Nanny, "options": {"nthreads": 1, "memory_limit": limit}}
            for name, limit in (("large", 3e9), ("small", 1.5e9))}
    with SpecCluster(scheduler={"cls": Scheduler, "options": {"dashboard_address": ":0"}}, workers=spec,
                     asynchronous=False) as cluster, Client(cluster) as client:
        result = engine.infer(slice_store, client=client, mode="pipeline", dtype="float64", keep_activations=True)
        np.testing.assert_array_equal(result.categories, slice_truth)
        assert result.resident and result.stages == [[1, 4], [5, 12]]
        names = {w["name"]: address for address, w in client.scheduler_info()["workers"].items()}
        holders = client.who_has(futures_of(result.activations))
        assert {w for ws in holders.values() for w in ws} == {names["large"]}  # the last stage's worker
        # calibrated, a cut that fits is held only where the cost model predicts that faster than streaming the cut
        # by work alone
        explained = engine.infer(slice_store, client=client, mode="pipeline", dtype="float64", explain=True)
        np.testing.assert_array_equal(explained.categories, slice_truth)
        held, streamed = (pipeline_prediction(explained.calibration, store.open_store(slice_store), 1000, 2, 2, 2,
                                              None, "float64", 1.5e9, weights, r, [1.5e9, 3e9]) for r in (True, False))
        assert held.resident and held.fits and not streamed.resident
        assert explained.resident == (held.seconds <= streamed.seconds)
        if not explained.resident:
            assert explained.stages == [s.as_list() for s in stage_cuts(_probed_work(slice_store, explained), 2)]


def _probed_work(path, result) -> np.ndarray:
    # each layer's work as a calibrated run weighs it: its entries x the share of images the probe saw alive
    s = store.open_store(path)
    return s.layer_entries() * cost.alive_per_layer(result.calibration, s.depth)


def test_streamed_stages_are_cut_by_their_reads_as_well_as_their_multiply_adds():
    # 100 layers whose images fold onto one vector after the fourth: cut by multiply-adds alone, the first stage
    # is a few layers and the second reads the other 96; each layer's read (1e-4 s) counted, the cut is near half
    from dasknn.stages import stage_cuts

    cal = _cal(alive=[1.0] * 100, distinct=[1.0] * 4 + [0.001] * 96, message_factor=[1.0] * 100, probe_layers=100)
    nnz = np.full(100, 1000)
    alone = stage_cuts(cost.stage_work(cal, nnz, 100), 2)
    assert alone[0].last <= 4
    read = stage_cuts(cost.stage_work(cal, nnz, 100, np.full(100, 1e4)), 2)
    assert 45 <= read[0].last <= 55
    # nothing probed: each layer's entries
    assert list(cost.stage_work(None, nnz, 100)) == [1000.0] * 100
