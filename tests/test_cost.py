"""The cost model behind --mode auto: its arithmetic, its choice, and the engine's use of it."""

from __future__ import annotations

import time

import numpy as np
import pytest

from dasknn import cost, engine, rates


def _cal(**over) -> cost.Calibration:
    base = dict(kernel_rate=1e9, message_rate=1e8, transfer_rate=1e9, task_seconds=1e-3, read_rate=1e8,
                alive=[1.0, 0.5], message_factor=[1.0, 0.25], probe_layers=2, probe_images=64)
    base.update(over)
    return cost.Calibration(**base)


def _predict(cal, g, **over):
    args = dict(images=1000, layer_nnz=np.array([1000, 1000, 1000]), weight_bytes=24_000, memory=1e6, workers=2,
                threads=2, chunks=4, group_size=g, volumes=np.array([100, 100, 0]) if g > 1 else None, itemsize=4,
                weights_share=0.25, sync_every=2)
    args.update(over)
    return cost.predict(cal, **args)


def test_data_mode_is_the_multiply_adds_over_the_threads():
    p = _predict(_cal(), 1)
    # layers see 1000, 500, then (as the probe's last layer) 500 images
    assert p.compute == pytest.approx(1000 * (1000 + 500 + 500) / (1e9 * 2))
    assert p.exchange == 0 and p.read == 0 and p.fits and p.mode == "data"
    assert p.inference_seconds == pytest.approx(p.compute + p.tasks)
    # resident: each of the 2 workers reads the whole network first, the two reading at once
    assert p.load_seconds == pytest.approx(24_000 * 2 / (1e8 * 2))
    assert p.seconds == pytest.approx(p.compute + p.tasks + p.load_seconds)


def test_model_mode_adds_its_exchange_and_tasks():
    d, m = _predict(_cal(), 1), _predict(_cal(), 2)
    # model mode drops the images that died only after its sync layers (every 2nd): layer 2 runs layer 1's images
    assert m.mode == "model" and m.compute == pytest.approx(1000 * (1000 + 1000 + 500) / (1e9 * 2))
    entries = 1000 * (100 * 1.0 + 100 * 1.0)
    moved = 1000 * 4 * (100 * 1.0 * 1.0 + 100 * 1.0 * 0.25)
    assert m.exchange == pytest.approx(entries / (1e8 * 2) + moved / (1e9 * 2))
    assert m.tasks > d.tasks and m.seconds > d.seconds
    assert cost.cheapest([d, m]) is d
    # one step per part, layer and chunk (4 chunks, 3 layers, 2 parts) over 2 threads; data: a task per chunk
    assert m.tasks == pytest.approx(4 * 3 * 2 * 1e-3 / 2) and d.tasks == pytest.approx(4 * 1e-3 / 2)
    # more than two parts: each sender's share of a step's output is picked out by a task of its own, and after a
    # sync layer every other part gets the mask
    four = _predict(_cal(), 4, workers=4, threads=4)
    pairs = 2 / 3 * 4 * 3  # two of the three layers send, between every pair of parts
    assert four.tasks == pytest.approx(4 * 3 * (4 + pairs + 4 * 3 / 2) * 1e-3 / 4)


def test_p2p_trades_the_tasks_for_messages_sent_by_the_workers():
    from dasknn.runtime.exchange.choice import P2P_MESSAGE_SECONDS

    tasks, p2p = (_predict(_cal(), 4, workers=4, threads=4, transport=t) for t in ("tasks", "p2p"))
    assert (tasks.transport, p2p.transport) == ("tasks", "p2p") and p2p.compute == tasks.compute
    # a first send and a segment per part, and the categories, per chunk; not a task per layer
    assert p2p.tasks == pytest.approx(4 * (2 * 4 + 1) * 1e-3 / 4)
    pairs = 2 / 3 * 4 * 3
    per_part = pairs / 4 + 3 / 2  # a part's messages a layer: to the parts it sends to, and the masks
    # every layer of each chunk waits for its messages in turn: 4 chunks on the one group's single-threaded workers
    layer = cost.P2P_STEP_SECONDS + 2 * per_part * P2P_MESSAGE_SECONDS
    assert cost.p2p_layer_seconds(per_part) == pytest.approx(layer)
    assert p2p.exchange - tasks.exchange == pytest.approx(4 * 3 * layer)
    # two groups of two, each with two threads a worker: a part's thread runs one of its group's 4 chunks in turn
    hybrid = _predict(_cal(), 2, workers=4, threads=8, transport="p2p")
    plain = _predict(_cal(), 2, workers=4, threads=8, transport="tasks")
    per_part = 2 / 3 * 2 / 2 + 1 / 2
    assert hybrid.exchange - plain.exchange == pytest.approx(1 * 3 * cost.p2p_layer_seconds(per_part))
    assert p2p.tasks < tasks.tasks
    assert _predict(_cal(), 1, transport="p2p").transport == ""  # data mode exchanges nothing


def test_model_mode_counts_its_steps_at_the_rates_timed_on_its_blocks():
    # the messages at the rate timed on this mode's blocks (packed, encoded, decoded, unpacked), and after each sync
    # layer every part's rows of the images it computed marked
    plain = _predict(_cal(), 2, neurons=50)
    timed = _predict(_cal(message_rates={2: 5e7}, mark_rates={2: 1e8}), 2, neurons=50)
    entries = 1000 * (100 * 1.0 + 100 * 1.0)
    marked = 1000 * 50 * 1.0  # layer 2 is the sync layer; it runs layer 1's images (all of them)
    assert timed.exchange - plain.exchange == pytest.approx(entries / (5e7 * 2) - entries / (1e8 * 2)
                                                            + marked / (1e8 * 2))
    # a size not timed: the probe's message rate, and no marks
    assert _predict(_cal(message_rates={4: 5e7}, mark_rates={4: 1e8}), 2, neurons=50).exchange == plain.exchange


def test_loop_timing_is_kernel_rates_loop_with_its_first_call_apart(slice_store):
    timed = cost.loop_timing(str(slice_store), 5, "float32", width=300, seconds=0.05)
    assert timed.rate > 0 and timed.first_extra >= 0 and timed.layers == cost.LOOP_LAYERS
    # its thread's CPU seconds are at most the clock's (a little more where the two clocks tick apart)
    assert timed.cpu_rate >= 0.9 * timed.rate


def test_a_rate_on_the_clock_is_at_most_the_cpu_rate_times_the_core_share():
    # four workers' threads on two cores: half a core each, whatever the clock said
    assert rates.clock_rate(6e9, 8e9, 0.5) == 4e9
    # a core each: the clock's, which counts what else the worker's core did meanwhile
    assert rates.clock_rate(7e9, 8e9, 1.0) == 7e9
    assert rates.clock_rate(7e9, 0.0, 0.5) == 7e9  # (no CPU rate timed)
    assert _cal(cores=2).core_share(4) == 0.5 and _cal(cores=8).core_share(4) == _cal().core_share(4) == 1.0


def test_step_rates_are_shared_out_on_the_clock(slice_store):
    store = cost.open_store(str(slice_store), check="lazy")
    owners = np.random.default_rng(0).integers(0, 2, size=(2, store.neurons))
    timed = rates.step_rates(str(slice_store), 5, "float32", owners, 1, 300, seconds=0.05)
    assert timed.kernel > 0 and timed.kernel_cpu >= 0.9 * timed.kernel


def test_loop_timing_on_the_batch_counts_the_columns_its_layers_computed(slice_store, monkeypatch):
    # each call "takes" 1 s (its first 2 s): the rate is then the multiply-adds the chunk's layers did
    monkeypatch.setattr(rates, "_timed_calls", lambda call, seconds: call() and rates.CallTimes(2.0, 1.0, 1.0))
    store = cost.open_store(str(slice_store))
    width = 200
    timed = rates.loop_timing(str(slice_store), 1, "float32", width=width, inputs=str(slice_store))
    entries = store.layer_entries()[:timed.layers].astype(float)
    # the images of the slice die and fold through its first layers: fewer than every image on every layer,
    # more than the share below which the synthetic images are timed instead
    full = width * entries.sum()
    assert rates.LIVELY_SHARE * full <= timed.rate < full
    assert timed.first_extra == 1.0
    # the count is the columns each layer computed, as the loop records them
    from dasknn import kernels
    from dasknn.kernels.folds import Folds

    yt = rates.batch_sample(str(slice_store), width, np.dtype("float32"))
    layers = [rates._layer_arrays(store, k, np.dtype("float32")) for k in range(1, timed.layers + 1)]
    columns = kernels.run_layers(yt, layers, store.bias, store.ymax, np.arange(width), folds=Folds())[2].columns
    assert timed.rate == pytest.approx(float(np.dot(columns, entries[:columns.size])))


def test_loop_timing_of_a_wide_chunk_times_its_first_images(slice_store, monkeypatch):
    # the loop's rate a multiply-add is the same at any width: a 15,000-image chunk is not timed whole (2.7 s on
    # every worker), its first LOOP_RATE_IMAGES images are; what its first call takes beyond the others scales to
    # the chunk's width (each timed call "takes" 1 s, the first 2 s)
    from dasknn import kernels

    monkeypatch.setattr(rates, "_timed_calls", lambda call, seconds: call() and rates.CallTimes(2.0, 1.0, 1.0))
    monkeypatch.setattr(rates, "LOOP_RATE_IMAGES", 64)
    calls = []
    run_layers = kernels.run_layers

    def recording(yt, *args, **kwargs):
        out = run_layers(yt, *args, **kwargs)
        calls.append((yt.shape[1], out[2].columns.copy()))
        return out

    monkeypatch.setattr(kernels, "run_layers", recording)
    timed = rates.loop_timing(str(slice_store), 1, "float32", width=300, inputs=str(slice_store))
    entries = cost.open_store(str(slice_store)).layer_entries()[:timed.layers].astype(float)
    assert [w for w, _ in calls] == [64, 64]  # counted, timed
    assert timed.rate == pytest.approx(float(np.dot(calls[0][1], entries[:calls[0][1].size])))
    assert timed.first_extra == pytest.approx(300 / 64)
    calls.clear()
    rates.loop_timing(str(slice_store), 1, "float32", width=128, inputs=str(slice_store))
    assert [w for w, _ in calls] == [128, 128]  # (not twice as wide: timed whole)


def test_loop_timing_on_the_batch_leaves_it_where_not_one_tile_fits_the_memory(slice_store, monkeypatch):
    synthetic = []
    real_timing = rates._kernel_timing
    monkeypatch.setattr(rates, "_kernel_timing", lambda *a: synthetic.append(a) or real_timing(*a))
    rates.loop_timing(str(slice_store), 1, "float32", width=300, seconds=0.05, memory=1e3, inputs=str(slice_store))
    assert len(synthetic) == 1  # (which then times one step: test_the_loop_is_timed_only_where_...)


def test_loop_timing_on_a_batch_that_dies_at_once_times_images_at_the_clamp(slice_store, monkeypatch):
    # a batch of empty images: nothing is left after the first layer to time the multiply-adds by
    store = cost.open_store(str(slice_store))
    empty = np.zeros((300, store.neurons), dtype=np.float32)
    synthetic = []
    real_timing = rates._kernel_timing
    monkeypatch.setattr(rates, "_kernel_timing", lambda *a: synthetic.append(a) or real_timing(*a))
    timed = rates.loop_timing(str(slice_store), 1, "float32", width=300, seconds=0.05, inputs=empty)
    assert len(synthetic) == 1 and timed.rate > 0

def test_step_rates_time_a_parts_step_at_a_chunks_width(slice_store):
    # any owners: the rates of part 1's block of layer 5 under a random partition of the slice
    store = cost.open_store(str(slice_store), check="lazy")
    owners = np.random.default_rng(0).integers(0, 2, size=(store.depth + 1, store.neurons))
    rates = cost.step_rates(str(slice_store), 5, "float32", owners[4:6], 1, width=300, seconds=0.02)
    assert rates.kernel > 0 and rates.message > 0 and rates.marks > 0
    assert all(np.isfinite([rates.kernel, rates.message, rates.marks]))


def test_what_does_not_fit_is_not_chosen():
    # the weights take more than a quarter of a worker: data mode must stream, and pays the reads
    small = dict(memory=60_000)
    d, m = _predict(_cal(read_rate=1e3), 1, **small), _predict(_cal(read_rate=1e3), 2, **small)
    assert not d.resident and d.read > 0 and d.fits
    assert m.fits  # half the weights fit
    assert cost.cheapest([d, m]) is m
    # held in memory where it does not fit: never chosen
    tiny = dict(memory=1_000)
    d, m = _predict(_cal(), 1, **tiny), _predict(_cal(), 2, resident=True, **tiny)
    assert not m.fits and cost.cheapest([d, m]) is d


def test_streaming_model_mode_reads_each_parts_share():
    # neither fits: data mode streams the network once per chunk on each worker (2 chunks over 2 workers), model
    # mode's one chunk has each of the 2 parts read half of it
    tiny, slow = dict(memory=1_000), _cal(read_rate=1e3)
    d, m = _predict(slow, 1, chunks=2, **tiny), _predict(slow, 2, chunks=1, **tiny)
    assert d.fits and m.fits and not d.resident and not m.resident
    assert d.read == pytest.approx(24_000 * 2 / (1e3 * 2) - d.compute)
    assert m.read == pytest.approx(24_000 / 2 / 1e3 - m.compute)
    assert m.read < d.read
    # slow reads: reading half the weights wins over the exchange; fast reads: it does not
    assert cost.cheapest([d, m]) is m
    fast = _cal(read_rate=1e12)
    assert cost.cheapest([_predict(fast, 1, chunks=2, **tiny), _predict(fast, 2, chunks=1, **tiny)]).mode == "data"


@pytest.mark.cluster
def test_auto_runs_what_the_model_predicts_cheapest(client, slice_store, slice_truth):
    engine.resolve_partition(str(slice_store), "hypergraph", 2)  # kept in the store: predicted from it
    result = engine.infer(slice_store, client=client, mode="auto", explain=True, dtype="float64")
    np.testing.assert_array_equal(result.categories, slice_truth)
    modes = {p.mode: p for p in result.predictions}
    assert set(modes) == {"data", "model"}
    best = min((p for p in result.predictions if p.fits), key=lambda p: p.seconds)
    assert (result.mode, result.group_size) == (best.mode, best.group_size)
    cal = result.calibration
    assert cal.kernel_rate > 0 and cal.transfer_rate > 0 and cal.task_seconds > 0
    assert len(cal.alive) == cal.probe_layers and 0 < cal.alive[0] <= 1
    import os

    assert cal.cores == os.cpu_count()  # a local cluster: one machine, counted once
    # the kernel measured on each mode's blocks, all workers at once
    assert set(cal.kernel_rates) == {1, 2} and all(r > 0 for r in cal.kernel_rates.values())


def test_model_modes_layers_run_the_images_of_its_last_sync_layer():
    # parts drop dead images (and fold equal ones) only after every sync_every-th layer
    assert cost.synced_layers(7, 2).tolist() == [0, 0, 2, 2, 4, 4, 6]
    assert cost.synced_layers(4, 1).tolist() == [0, 1, 2, 3]
    assert cost.synced_layers(5, 3).tolist() == [0, 0, 0, 3, 3]


def test_a_measured_kernel_rate_is_the_one_the_mode_uses():
    slow_model = _cal(kernel_rates={1: 1e9, 2: 5e8}, alive=[1.0, 1.0])  # (no image dies: no sync lag either)
    d, m = _predict(slow_model, 1), _predict(slow_model, 2)
    assert m.compute == pytest.approx(2 * d.compute)
    fallback = _predict(_cal(kernel_rates={2: 5e8}, alive=[1.0, 1.0]), 1)  # data mode: kernel_rate
    assert fallback.compute == pytest.approx(d.compute)


@pytest.mark.parametrize("parts", [None, 2, 3])
def test_kernel_rate_runs_the_blocks_a_mode_runs(slice_store, monkeypatch, parts):
    from dasknn import kernels, partition, store

    s = store.open_store(slice_store)
    owners = None if parts is None else partition.partition_network(s.network().layers, parts, "random")[4:6]
    seen = []
    step = kernels.layer_step

    def counting(yt, indptr, indices, data, bias, ymax, extra=None):
        seen.append((yt.shape, None if extra is None else extra.shape, indices.size))
        return step(yt, indptr, indices, data, bias, ymax, extra=extra)

    monkeypatch.setattr(kernels, "layer_step", counting)
    rate = cost.kernel_rate(str(slice_store), 5, "float32", owners, part=parts - 1 if parts else 0, width=300,
                            seconds=0.05)
    assert rate > 0
    (first, _, _), (shape, extra, nnz) = seen[0], seen[-1]
    # one untimed call, then at least KERNEL_CALLS timed ones, all over the timed width
    assert first[1] == 300 and shape[1] == 300 and len(seen) >= 1 + cost.KERNEL_CALLS
    w = s.layer(5)
    if parts is None:
        assert shape[0] == 1024 and extra is None and nnz == w.nnz
    else:
        mine = owners[1] == parts - 1
        assert nnz == w[:, mine].nnz  # only the part's columns
        assert shape[0] == (owners[0] == parts - 1).sum() and extra[0] > 0  # own rows, received rows beside


def test_resident_weights_are_read_once_a_group_before_the_run():
    data, model = _predict(_cal(), 1), _predict(_cal(), 2)
    assert model.load_seconds == pytest.approx(data.load_seconds / 2)  # one group of 2 reads the network once
    streamed = _predict(_cal(cores=2), 1, resident=False)  # (no core spare: the reads add to the time)
    assert streamed.load_seconds == 0 and streamed.read == pytest.approx(24_000 * 4 / (1e8 * 2))
    pipeline = cost.predict_pipeline(_cal(), images=1000, layer_nnz=np.array([1000, 1000, 1000]),
                                     weight_bytes=24_000, memory=1e6, workers=2, threads=2, chunks=4, stages=2,
                                     neurons=100, itemsize=4, weights_share=0.25)
    assert pipeline.load_seconds == pytest.approx(model.load_seconds)  # one pipeline: the network read once


def test_a_shared_link_to_the_store_makes_the_modes_that_read_less_win():
    # 4 workers: a local store in the page cache (fast, each worker reading alike) or behind one slow link that
    # all of them share (readers=1)
    def modes(read_rate: float, readers: int) -> dict:
        cal = _cal(read_rate=read_rate, readers=readers)
        return {g: _predict(cal, g, workers=4, threads=4, volumes=np.array([1, 1, 0]) if g > 1 else None)
                for g in (1, 2, 4)}

    local, shared = modes(1e8, 0), modes(1e5, 1)
    for g in (1, 2, 4):
        # each group reads the network once, 4 / g copies in all: 4 readers at once locally, one at a time shared
        assert local[g].load_seconds == pytest.approx(24_000 * 4 / g / (1e8 * 4))
        assert shared[g].load_seconds == pytest.approx(24_000 * 4 / g / 1e5)
    assert cost.cheapest(list(local.values())).group_size == 1  # the reads cost little: data mode's fewer tasks win
    assert cost.cheapest(list(shared.values())).group_size == 4  # each worker reading a quarter of it wins
    slow = _cal(read_rate=1e5, readers=1, cores=4)
    streamed = _predict(slow, 1, workers=4, threads=4, resident=False)
    assert streamed.read == pytest.approx(cost.read_seconds(slow, 24_000 * 4, 4)) == pytest.approx(24_000 * 4 / 1e5)


def test_explain_compares_the_measured_inference_with_the_predicted_inference():
    from dasknn.cli.common import explain_table

    p = cost.Prediction(mode="model", group_size=2, fits=True, resident=True, seconds=5.5, compute=1.0,
                        exchange=0.25, tasks=0.125, read=0.0, setup_seconds=3.0, load_seconds=1.125)
    line = explain_table([p], "model", 2, measured=1.4).splitlines()[1]
    # the predicted inference (without the setup and load the engine times apart) beside the measured inference
    assert p.inference_seconds == pytest.approx(1.375)
    assert line.split()[3] == "1.375" and "+ 1.125  + 3.000  = 5.500" in line and line.endswith("measured 1.400 s")


def test_explain_prints_every_prediction(slice_store, capsys):
    from dasknn.cli import main

    assert main(["infer", "--network", str(slice_store), "--workers", "2", "--mode", "model", "--explain",
                 "--batch", "200"]) == 0
    out = capsys.readouterr().out
    assert "predicted s" in out and "data" in out and "<- ran: measured" in out
    ran = [line for line in out.splitlines() if "<- ran" in line]
    assert len(ran) == 1 and ran[0].startswith("model")
    # the collapse the predictions count, over every layer (the probe stops once its images are one vector)
    probe = [line for line in out.splitlines() if line.startswith("probe: ")]
    assert len(probe) == 1 and "over the network's 12 layers" in probe[0], probe


@pytest.mark.parametrize(("cores", "hidden"), [(0, 1.0), (2, 0.0), (3, 0.5), (4, 1.0), (16, 1.0)])
def test_reads_hide_behind_compute_only_on_spare_cores(cores, hidden):
    # 2 workers of 1 thread: a read-ahead thread has a core of its own only where the kernels leave one
    p = _predict(_cal(read_rate=1e3, cores=cores), 1, chunks=2, memory=1_000)
    read_total = 24_000 * 2 / (1e3 * 2)
    assert p.read == pytest.approx((1 - hidden) * read_total + hidden * max(0.0, read_total - p.compute))
    assert p.seconds == pytest.approx(p.compute + p.tasks + p.read)


def test_each_chunks_images_are_read_before_it_computes():
    # 1,000 images at 1e5 a second on 2 threads: by the worker of each chunk in data mode, by both parts in model
    assert _predict(_cal(image_rate=1e5), 1).compute == pytest.approx(_predict(_cal(), 1).compute + 1000 / 2e5)
    assert _predict(_cal(image_rate=1e5), 2).compute == pytest.approx(_predict(_cal(), 2).compute + 2 * 1000 / 2e5)


def _no_partitioning(monkeypatch):
    # the client may not compute a partition (the sample runs on a worker, another process)
    from dasknn import partition

    def refuse(*args, **kwargs):
        raise AssertionError("the partitioner was called")

    monkeypatch.setattr(partition, "partition_network", refuse)


@pytest.mark.cluster
def test_predicting_model_mode_estimates_its_exchange_from_a_sample(client, fresh_store, monkeypatch):
    _no_partitioning(monkeypatch)
    # a setup cheaper than data mode (on this small network it is not): the exchange is estimated. Cheaper than
    # data mode's task overhead too (a few milliseconds on a fast machine, where rates of 1e-8 s per entry, a
    # 6 ms setup, made model mode a bound and this test fail)
    monkeypatch.setitem(cost.PARTITION_RATES, "hypergraph", 1e-12)
    monkeypatch.setattr(cost, "PLAN_RATE", 1e-12)
    result = engine.infer(fresh_store, client=client, mode="data", explain=True, images=200)
    model = [p for p in result.predictions if p.mode == "model"][0]
    assert model.volumes_from == "sample" and model.exchange > 0
    # the setup this run would pay first is counted in the prediction
    setup = cost.setup_seconds(12 * 1024 * 32, 2, "hypergraph", True, 2)
    assert setup > 0 and model.setup_seconds == pytest.approx(setup, abs=1e-4)  # (rounded in the result)
    assert model.seconds >= model.compute + model.exchange + model.setup_seconds
    assert not (fresh_store / "partitions").exists() and result.partition_seconds == 0


@pytest.mark.cluster
def test_auto_does_not_partition_for_a_mode_it_does_not_run(client, fresh_store, monkeypatch):
    _no_partitioning(monkeypatch)
    monkeypatch.setitem(cost.PARTITION_RATES, "hypergraph", 1.0)  # a partition would take days: data mode wins
    result = engine.infer(fresh_store, client=client, mode="auto", explain=True, images=200)
    assert result.mode == "data"
    model = [p for p in result.predictions if p.mode == "model"][0]
    assert model.volumes_from == "bound" and model.exchange == 0 and model.seconds > 1e5
    assert not (fresh_store / "partitions").exists()


@pytest.mark.cluster
def test_a_stored_partition_is_used_not_recomputed(client, fresh_store, slice_truth, monkeypatch):
    from dasknn import partition, store

    s = store.open_store(fresh_store)
    owners = partition.partition_network(s.network().layers, 2, "block")
    store.save_partition(fresh_store, store.partition_name("hypergraph", 2), owners, {})
    _no_partitioning(monkeypatch)
    result = engine.infer(fresh_store, client=client, mode="model", explain=True)
    np.testing.assert_array_equal(result.categories, slice_truth)
    model = [p for p in result.predictions if p.mode == "model"][0]
    assert model.volumes_from == "partition" and result.partition_seconds == 0
    want = partition.layer_volumes(s.network().layers, owners, parts=2)
    assert result.plan_volume == want.tolist()


@pytest.mark.cluster
def test_a_stored_partitions_report_gives_the_volumes_without_reading_the_layers(client, fresh_store, monkeypatch):
    # behind a slow link the client reading every layer to count them cost seconds: the report kept with the
    # partition has them
    from dasknn import partition, store
    from dasknn.engine import sizing

    s = store.open_store(fresh_store)
    layers = s.network().layers
    owners = partition.partition_network(layers, 2, "block")
    report = partition.partition_report(layers, owners, "block", 0.0)
    store.save_partition(fresh_store, store.partition_name("hypergraph", 2), owners, report)
    _no_partitioning(monkeypatch)

    def counted(*args, **kwargs):
        raise AssertionError("the volumes were counted from the layers")

    monkeypatch.setattr(sizing, "layer_volumes", counted)
    result = engine.infer(fresh_store, client=client, mode="data", explain=True, images=200)
    model = [p for p in result.predictions if p.mode == "model"][0]
    assert model.volumes_from == "partition" and model.exchange > 0
    assert report["volume_per_layer"] == partition.layer_volumes(layers, owners, parts=2).tolist()


def test_an_array_equal_to_a_kept_partition_gives_its_reports_volumes(fresh_store):
    # the rate-limited store's benchmark passes the stored partition as an array: behind the link, counting its
    # volumes read every layer on the client (3.7 GB at 65,536 x 480); the kept report has them
    from dasknn import partition, store
    from dasknn.engine import sizing

    s = store.open_store(fresh_store)
    layers = s.network().layers
    owners = partition.partition_network(layers, 2, "block")
    report = partition.partition_report(layers, owners, "block", 0.0)
    store.save_partition(fresh_store, store.partition_name("hypergraph", 2), owners, report)
    got, kept = sizing._partition_and_report(str(fresh_store), owners.astype(np.int64), 2)
    assert np.array_equal(got, owners) and kept["volume_per_layer"] == report["volume_per_layer"]
    other = owners.copy()
    other[1] = 1 - other[1]  # the parts swapped on one layer: another partition, counted from the layers
    assert sizing._partition_and_report(str(fresh_store), other, 2)[1] == {}


@pytest.mark.cluster
def test_model_modes_step_is_timed_over_the_images_a_chunk_computes(client, fresh_store, monkeypatch):
    # a step over many of the kernel's tiles runs at a fraction of one tile's rate: model mode's step is timed over
    # a chunk's images where its multiply-adds are (each synced layer's computed images, alive or distinct,
    # weighted by its multiply-adds), not over one tile, and its rates are those the prediction uses
    from dasknn import partition, store
    from dasknn.engine import sizing

    s = store.open_store(fresh_store)
    store.save_partition(fresh_store, store.partition_name("hypergraph", 2),
                         partition.partition_network(s.network().layers, 2, "block"), {})
    _no_partitioning(monkeypatch)
    timed = []
    real = sizing._step_rates

    def spy(client, workers, path, dtype, k, owners, width, share):
        timed.append(width)
        return real(client, workers, path, dtype, k, owners, width, share)

    monkeypatch.setattr(sizing, "_step_rates", spy)
    result = engine.infer(fresh_store, client=client, mode="model", explain=True, images=600, chunks=2)
    nnz = s.layer_entries()
    computed = cost.computed_per_layer(result.calibration, s.depth)[cost.synced_layers(s.depth, 2)] * nnz
    want = round(600 / 2 * float(np.dot(computed, computed / nnz) / computed.sum()))
    assert timed == [want] and 16 < want <= 300
    cal = result.calibration
    assert set(cal.kernel_rates) == {1, 2} and set(cal.message_rates) == set(cal.mark_rates) == {2}


def test_a_partition_that_does_not_match_the_network_is_refused(fresh_store):
    from dasknn.errors import DasknnError

    wrong = np.zeros((11, 1024), dtype=np.int32)
    wrong[:, 1::2] = 1
    with pytest.raises(DasknnError, match=r"^the partition's shape 11 x 1024 does not match the network: it has "
                                          r"layers 10 where the network has 12; partition this network again$"):
        engine.resolve_partition(str(fresh_store), wrong, 2)
    with pytest.raises(DasknnError, match="neurons 512 where the network has 1024"):
        engine.resolve_partition(str(fresh_store), wrong[:, :512], 2)
    three = np.resize(np.arange(3, dtype=np.int32), (13, 1024))
    with pytest.raises(DasknnError, match="has 3 parts but each group has 2 workers"):
        engine.resolve_partition(str(fresh_store), three, 2)


def test_data_mode_kernel_rate_times_its_loop_over_layers_and_counts_the_live_images(slice_store, monkeypatch):
    from dasknn import kernels, store

    s = store.open_store(slice_store)
    seen = []
    loop = kernels.run_layers

    def counting(yt, layers, bias, ymax, ids, compact_every=None):
        seen.append((yt.shape[1], [indices.size for _, indices, _ in layers]))
        time.sleep(0.01)  # every call takes at least this: the rate is at most a call's counted work over it
        return loop(yt, layers, bias, ymax, ids, compact_every)

    monkeypatch.setattr(kernels, "run_layers", counting)
    macs = []
    monkeypatch.setattr(rates, "_loop_macs", lambda yt, layers, st: macs.append(yt.shape[1]) or 1e6)
    monkeypatch.setattr(rates, "LOOP_LAYERS", 3)
    rate = cost.kernel_rate(str(slice_store), 5, "float32", width=300, seconds=0.05, loop=True)
    # one untimed call, then at least KERNEL_CALLS timed ones, all over the timed width
    assert len(seen) >= 1 + cost.KERNEL_CALLS and {width for width, _ in seen} == {300}
    assert seen[-1][1] == [s.layer(k).nnz for k in (5, 6, 7)]
    assert macs == [300]
    assert 1e6 / 1.0 < rate <= 1e6 / 0.01  # the counted work over the median call (at least 0.01 s, under 1 s)


@pytest.mark.parametrize("memory,layers", [(None, 3), (1e9, 3), (1e3, 0)])
def test_the_loop_is_timed_only_where_its_layers_and_tiles_fit_the_memory_given(slice_store, monkeypatch,
                                                                               memory, layers):
    from dasknn import kernels

    loops, steps = [], []
    run_layers, layer_step = kernels.run_layers, kernels.layer_step
    monkeypatch.setattr(kernels, "run_layers", lambda yt, ls, *a, **k: loops.append(len(ls)) or run_layers(yt, ls, *a, **k))
    monkeypatch.setattr(kernels, "layer_step", lambda *a, **k: steps.append(1) or layer_step(*a, **k))
    monkeypatch.setattr(rates, "LOOP_LAYERS", 3)
    rate = cost.kernel_rate(str(slice_store), 5, "float32", width=300, seconds=0.05, loop=True, memory=memory)
    assert rate > 0
    if layers:  # the loop over LOOP_LAYERS layers (and _loop_macs's steps to count the live images)
        assert loops and set(loops[1:]) == {layers}
    else:  # one step timed instead: no loop, no extra layer read
        assert not loops and len(steps) >= 2


def test_the_loop_runs_as_many_whole_tiles_of_a_chunk_as_the_memory_given_holds(slice_store, monkeypatch):
    from dasknn import kernels, store

    widths = []
    run_layers = kernels.run_layers
    monkeypatch.setattr(kernels, "run_layers", lambda yt, ls, *a, **k: widths.append(yt.shape[1]) or run_layers(yt, ls, *a, **k))
    monkeypatch.setattr(rates, "LOOP_LAYERS", 3)
    w = store.open_store(slice_store).layer(5)
    layer_bytes = w.indptr.nbytes + w.indices.nbytes + w.data.astype(np.float32).nbytes
    tile = kernels.tile_for(1024, 4)  # 256 images
    # room for two tiles' images and not for the chunk's 700 (nor three tiles)
    memory = cost.loop_bytes(layer_bytes, 1024 * 2 * tile * 4) + 1
    assert cost.loop_bytes(layer_bytes, 1024 * 3 * tile * 4) > memory
    cost.kernel_rate(str(slice_store), 5, "float32", width=700, seconds=0.01, loop=True, memory=memory)
    assert set(widths) == {2 * tile}


def test_the_loops_timed_on_a_worker_read_the_metadata_of_the_layers_they_hold_only(slice_store, monkeypatch):
    # a worker opens the store lazily: sizing the loop by the network's largest layer read every layer's metadata
    # (480 of a 65,536 x 480 network, 1.4 s a timing on the 2-core VM; one request after another behind a URL)
    from dasknn.store import NetworkStore

    opened = set()
    meta = NetworkStore._layer_meta
    monkeypatch.setattr(NetworkStore, "_layer_meta", lambda self, k: opened.add(k) or meta(self, k))
    rates.loop_timing(str(slice_store), 1, "float32", width=64, seconds=0.01, inputs=str(slice_store))
    rates.layer_seconds(str(slice_store), 3, "float32", width=16, seconds=0.01)
    assert opened and max(opened) <= 3 + rates.LOOP_LAYERS - 1 < 12  # (the slice has 12 layers)


def test_the_loop_runs_the_layers_it_holds_over_again_where_fewer_than_loop_layers_fit(slice_store, monkeypatch):
    # a call of the loop pays for its outputs' memory once: it is timed over LOOP_LAYERS layers, as a run's
    # segment is over many, even where only two layers' arrays may be held
    from dasknn import kernels, store

    s = store.open_store(slice_store)
    seen = []
    run_layers = kernels.run_layers
    monkeypatch.setattr(kernels, "run_layers",
                        lambda yt, ls, *a, **k: seen.append([ix.size for _, ix, _ in ls]) or run_layers(yt, ls, *a, **k))
    monkeypatch.setattr(rates, "LOOP_LAYERS", 6)
    monkeypatch.setattr(rates, "LOOP_BYTES", 1)  # two layers held
    cost.kernel_rate(str(slice_store), 5, "float32", width=300, seconds=0.01, loop=True)
    assert seen and all(layers == [s.layer(5).nnz, s.layer(6).nnz] * 3 for layers in seen)


def test_the_probe_samples_two_tiles_at_least_and_steps_into_two_buffers(slice_store, monkeypatch):
    # a sample narrower than TWIN_MIN_IMAGES runs the kernel without its twins, and a fresh output per step
    # pays for fresh pages: neither is what a run's chunks see
    from dasknn import kernels

    monkeypatch.setattr(cost, "PROBE_ACTIVATIONS", 1 << 10)  # one image's worth
    monkeypatch.setattr(cost, "PROBE_BUDGET", 1e12)
    outs = []
    step = kernels.layer_step

    def recording(yt, *args, out=None, **kwargs):
        outs.append(None if out is None else out.__array_interface__["data"][0])
        return step(yt, *args, out=out, **kwargs)

    monkeypatch.setattr(kernels, "layer_step", recording)
    figures = cost.probe(str(slice_store), str(slice_store), 10_000, "float32")
    assert figures["probe_images"] == 2 * kernels.tile_for(1024, 4)
    timed = outs[-(figures["probe_layers"] - 1):]  # the warm-up's steps come first
    assert None not in timed and len(set(timed)) <= 2


def test_the_probe_stops_reading_a_slow_store_after_its_read_budget(slice_store, monkeypatch):
    # behind a slow link the read rate is known long before the multiply-adds' budget is spent
    import time as clock

    from dasknn import store

    monkeypatch.setattr(cost, "PROBE_BUDGET", 1e12)
    monkeypatch.setattr(cost, "PROBE_READ_SECONDS", 0.05)
    monkeypatch.setattr(cost, "PROBE_MIN_LAYERS", 3)
    read = store.LayerStream.layer

    def slow(self, k):
        clock.sleep(0.02)  # a layer's worth of a slow link
        return read(self, k)

    monkeypatch.setattr(store.LayerStream, "layer", slow)
    local = cost.probe(str(slice_store), str(slice_store), 200, "float32")
    assert local["probe_layers"] == 12  # a local store's reads are decoding: never cut short
    monkeypatch.setattr(cost, "is_url", lambda path: True)  # the same store behind a URL
    figures = cost.probe(str(slice_store), str(slice_store), 200, "float32")
    # 3 layers at least, then as many as 0.05 s of reads allow: far fewer than the slice's 12
    assert 3 <= figures["probe_layers"] <= 4 and figures["read_rate"] > 0
    # and PROBE_READ_SHARE of the layers at least, where that is more: the images' collapse seen
    monkeypatch.setattr(cost, "PROBE_READ_SHARE", 0.5)
    assert 6 <= cost.probe(str(slice_store), str(slice_store), 200, "float32")["probe_layers"] <= 7


def test_the_probe_carries_a_few_images_through_the_layers_past_its_budget(slice_store, monkeypatch):
    # the collapse often comes after the budget's first layers: a tail of the sample carries on to the last layer,
    # each of its columns standing for its share of the images alive when the budget ran out
    whole = cost.probe(str(slice_store), str(slice_store), 1000, "float64")
    monkeypatch.setattr(cost, "PROBE_BUDGET", 1.0)  # spent by the first layer
    monkeypatch.setattr(cost, "PROBE_TAIL_IMAGES", 200)
    tail = cost.probe(str(slice_store), str(slice_store), 1000, "float64")
    assert whole["probe_layers"] == tail["probe_layers"] == 12  # (it stopped after the first before)
    assert tail["alive"][0] == whole["alive"][0] == 1.0  # (the first layer: all of them; the tail from the second)
    np.testing.assert_allclose(tail["alive"], whole["alive"], atol=0.12)
    assert all(d <= a + 1e-12 for d, a in zip(tail["distinct"], tail["alive"]))


def test_data_mode_pays_its_loops_cost_a_layer_on_every_chunk():
    # the live images' multiply-adds, and on each of the 4 chunks' 3 layers the loop's own cost, over the 2 threads
    cal = _cal(alive=[1.0, 0.6, 0.6])
    plain, paid = _predict(cal, 1), _predict(_cal(alive=[1.0, 0.6, 0.6], layer_seconds=1e-3), 1)
    assert plain.compute == pytest.approx(1000 * 1000 * 2.2 / (1e9 * 2))
    assert paid.compute - plain.compute == pytest.approx(4 * 3 * 1e-3 / 2)
    # model mode's steps are timed as they run (their rates): no loop a layer
    assert _predict(_cal(layer_seconds=1e-3), 2).compute == pytest.approx(_predict(_cal(), 2).compute)


def test_layer_seconds_times_the_loop_on_a_chunk_of_equal_images(slice_store):
    costs = cost.layer_seconds(str(slice_store), 3, "float32", seconds=0.02, layers=8)
    assert 0 < costs.every_chunk < 0.1 and costs.first_chunk >= 0
    # the loop folds the equal images: a chunk of 64 costs about what a chunk of 1 does, not 64 times it
    one = cost.layer_seconds(str(slice_store), 3, "float32", width=1, seconds=0.02, layers=8)
    assert one.every_chunk > costs.every_chunk / 8


def test_a_workers_first_chunk_pays_what_the_loop_learns_of_each_layer_once():
    plain = _predict(_cal(), 1)
    setup = _predict(_cal(layer_setup_seconds=1e-3), 1)
    assert setup.compute - plain.compute == pytest.approx(3 * 1e-3)  # 3 layers, once (the workers at once)
    fresh = _predict(_cal(first_chunk_seconds=0.5), 1)
    assert fresh.compute - plain.compute == pytest.approx(0.5)  # the first chunk's memory, once
    # a run's graph there and back, once, in every mode
    for g in (1, 2):
        assert (_predict(_cal(round_trip_seconds=0.05), g).tasks - _predict(_cal(), g).tasks
                == pytest.approx(0.05))
    two = _predict(_cal(step_setup_seconds={2: 1e-3}), 2)
    assert two.compute - _predict(_cal(), 2).compute == pytest.approx(3 * 1e-3)


def test_a_streaming_worker_learns_its_layers_again_on_every_chunk():
    # 4 chunks over 2 workers, streamed: each worker's 2 chunks decode the 3 layers afresh, and learn them again
    tiny = dict(memory=1_000)
    plain, setup = _predict(_cal(), 1, **tiny), _predict(_cal(layer_setup_seconds=1e-3), 1, **tiny)
    assert not setup.resident and setup.compute - plain.compute == pytest.approx(2 * 3 * 1e-3)
    steps = _predict(_cal(step_setup_seconds={2: 1e-3}), 2, **tiny)
    assert steps.compute - _predict(_cal(), 2, **tiny).compute == pytest.approx(4 * 3 * 1e-3)  # (one group)


def test_a_streaming_workers_later_chunks_decode_what_it_kept():
    # 4 chunks over 2 workers: each streams the network (24,000 bytes decoded) twice. Kept whole (2,400 stored
    # bytes, 0.1 of a decoded byte), the second pass only decodes, each worker its own at once
    tiny = dict(memory=1_000)
    cal = _cal(read_rate=1e3, decode_rate=4e3, stored_share=0.1)
    fetched = _predict(cal, 1, **tiny)
    assert not fetched.resident
    assert fetched.read == pytest.approx(24_000 * 4 / (1e3 * 2) - fetched.compute)  # every pass fetched
    held = _predict(cal, 1, hold_bytes=2_400, **tiny)
    assert held.read == pytest.approx(24_000 * 2 / (1e3 * 2) + 24_000 / 4e3 - held.compute)
    assert cost.stream_read_seconds(cal, 24_000, 2, 2, 2_400) == pytest.approx(24 + 6)
    # half of it kept: the rest fetched again
    assert cost.stream_read_seconds(cal, 24_000, 2, 2, 1_200) == pytest.approx(72_000 / (1e3 * 2) + 3)
    assert held.read < _predict(cal, 1, hold_bytes=1_200, **tiny).read < fetched.read
    # one chunk a worker fetches once whatever it keeps; without a measured decode rate every pass fetches
    assert cost.stream_read_seconds(cal, 24_000, 1, 2, 2_400) == pytest.approx(24_000 * 2 / (1e3 * 2))
    assert _predict(_cal(read_rate=1e3), 1, hold_bytes=2_400, **tiny).read == pytest.approx(fetched.read)
    # a pipeline's streamed stage keeps its layers alike (each stage worker its largest stage's share)
    stage = dict(images=1000, layer_nnz=np.array([1000, 1000, 1000, 1000]), weight_bytes=48_000, memory=1_000,
                 workers=2, threads=2, chunks=4, stages=2, neurons=100, itemsize=8, weights_share=0.25)
    kept, again = (cost.predict_pipeline(cal, **stage, hold_bytes=h) for h in (2_400, 0))
    assert not kept.resident and kept.read < again.read


def test_a_later_chunk_runs_its_layers_up_to_the_stop_that_finds_its_ends():
    # 200 images that fold onto one vector from layer 21 on, 2 chunks of 100: the first stop, after layer 32 (the
    # loop stops every ENDS_EVERY layers), finds the ends the worker's first chunk left there
    collapsed = _cal(distinct=[1.0] * 20 + [1 / 200] * 80)
    assert cost.later_pass_share(collapsed, 100, 1, 100, 200) == pytest.approx(32 / 100)
    # a pipeline's second stage, layers 51-100: its chunks stop after layer 64
    assert cost.later_pass_share(collapsed, 100, 51, 100, 200) == pytest.approx(14 / 50)
    # the collapse after layer 70: the stops back off while they find nothing (32, then 96)
    late = _cal(distinct=[1.0] * 70 + [1 / 200] * 30)
    assert cost.later_pass_share(late, 100, 1, 100, 200) == pytest.approx(96 / 100)
    # nothing collapses, or images do not fold: every layer
    assert cost.later_pass_share(_cal(distinct=[1.0] * 100), 100, 1, 100, 200) == 1.0
    assert cost.later_pass_share(_cal(), 100, 1, 100, 200) == 1.0
    # streamed: each worker's second chunk reads a third of the network (4 chunks over 2 workers)
    tiny, slow = dict(memory=1_000, layer_nnz=np.full(100, 10)), dict(read_rate=1e3)
    whole = _predict(_cal(**slow, distinct=[1.0] * 100), 1, **tiny)
    short = _predict(_cal(**slow, distinct=[1.0] * 20 + [1 / 200] * 80, alive=[1.0] * 100), 1, images=200, **tiny)
    assert short.read + short.compute == pytest.approx(24_000 * 2 * (1 + 0.32) / (1e3 * 2))
    assert whole.read + whole.compute == pytest.approx(24_000 * 2 * 2 / (1e3 * 2))
    # the loop's cost a layer: each worker's first chunk all 100 layers, its second 32 of them (2 threads)
    deep = dict(layer_nnz=np.full(100, 10), images=200)
    fold = dict(distinct=[1.0] * 20 + [1 / 200] * 80, alive=[1.0] * 100)
    paid = _predict(_cal(**fold, layer_seconds=1e-3), 1, **deep).compute - _predict(_cal(**fold), 1, **deep).compute
    assert paid == pytest.approx(100 * (2 + 2 * 0.32) * 1e-3 / 2)
    # a pipeline's later chunks (one vector from the first layer on: the stages cut at layer 50): stage 1 (layers
    # 1-50) up to layer 32, stage 2 (51-100) up to 64
    stage = dict(images=200, layer_nnz=np.full(100, 10), weight_bytes=48_000, memory=1e6, workers=2, threads=2,
                 chunks=4, stages=2, neurons=100, itemsize=8, weights_share=0.25)
    cost_a_layer = _cal(kernel_rate=1e30, layer_seconds=1e-3, distinct=[1 / 200] * 100, alive=[1.0] * 100)
    p = cost.predict_pipeline(cost_a_layer, **stage)
    assert p.compute == pytest.approx(max(50e-3 * 2 + 32e-3 * 3, (100e-3 + (32e-3 + 14e-3) * 3) / 2))


def test_the_probes_distinct_share_counts_one_vector_where_its_tail_collapsed():
    # each column one image of a 100-image sample: the count itself
    assert cost.distinct_share(5, 1 / 100, 100) == pytest.approx(0.05)
    # a tail's columns each standing for 10 images: one class is one vector, each further class its column's images
    assert cost.distinct_share(1, 0.1, 100) == pytest.approx(0.01)
    assert cost.distinct_share(3, 0.1, 100) == pytest.approx(0.01 + 2 * 0.1)
    assert cost.distinct_share(0, 0.1, 100) == 0.0


def test_the_probe_times_decoding_its_first_layer_again_from_what_it_kept(slice_store):
    figures = cost.probe(str(slice_store), str(slice_store), 200, "float64")
    assert figures["decode_rate"] > 0
    # the stored bytes of a decoded byte: the slice's layers compress (values float32 decoded as float64)
    assert 0 < figures["stored_share"] < 1
    assert cost.Calibration(**{**dict(kernel_rate=1e9, message_rate=1e8, transfer_rate=1e9, task_seconds=1e-3,
                                      probe_layers=1, probe_images=1), **figures}).decode_rate == figures["decode_rate"]


def test_loop_bytes_counts_the_layers_and_the_activations_tiles():
    # a 65,536-wide float64 layer (25 MB) over a 128-image tile (67 MB): 2 layers within LOOP_BYTES
    assert cost.loop_bytes(25 << 20, 67 << 20) == 2 * (25 << 20) + 7 * (67 << 20)
    assert cost.loop_bytes(1 << 20, 1 << 20) == cost.LOOP_LAYERS * (1 << 20) + 7 * (1 << 20)


@pytest.mark.cluster
def test_a_calibration_task_whose_worker_dies_is_a_loss_not_a_hang():
    # (the inference's recovery policy then measures again on the workers there are)
    import os

    from dasknn.cluster import local_client
    from dasknn.runtime.recovery import WorkersLost, gather_watched

    with local_client(workers=1, threads_per_worker=1) as client:
        w = sorted(client.nthreads())
        fut = client.submit(os._exit, 1, workers=w, allow_other_workers=False, pure=False)
        with pytest.raises(WorkersLost) as lost:
            gather_watched(client, [fut], w)  # (how sizing gathers its calibration tasks)
        assert lost.value.lost == w


def test_loop_multiply_adds_count_only_the_images_alive_at_each_layer():
    from dasknn import kernels

    class Rule:
        bias, ymax = -0.3, 32.0

    kill = (np.array([0, 0, 0]), np.zeros(0, dtype=np.int32), np.zeros(0))  # two outputs with no inputs: all die
    keep = (np.array([0, 1, 2]), np.array([0, 1], dtype=np.int32), np.array([1.0, 1.0]))
    yt = np.full((2, 5), 4.0)
    assert rates._loop_macs(yt, [keep, keep, kill, keep], Rule) == 2 * 5 + 2 * 5 + 0 * 5
    assert kernels.alive(kernels.layer_step(yt, *kill, -0.3, 32.0)).sum() == 0


def test_a_partition_in_segments_is_predicted_to_take_a_share_of_the_time():
    one = cost.setup_seconds(10**9, 2, "hypergraph", False, 2)
    assert cost.setup_seconds(10**9, 2, "hypergraph", False, 2, segments=2) == pytest.approx(one / 2)
    # the plan is the workers' already, and a stored partition costs nothing however it was made
    plan = cost.setup_seconds(10**9, 2, None, True, 2)
    assert cost.setup_seconds(10**9, 2, None, True, 2, segments=4) == pytest.approx(plan)


def test_the_exchange_is_chosen_by_its_predicted_overhead():
    from dasknn.runtime.exchange.choice import choose_exchange, exchange_overheads

    rng = np.random.default_rng(0)
    for parts in (2, 4, 16):
        # a deep plan where most pairs exchange: a task per part and layer costs more than a message per pair
        counts = rng.integers(0, 3, size=(120, parts, parts)) * (1 - np.eye(parts, dtype=np.int64))
        seconds = exchange_overheads(counts, chunks=2, workers=parts, sync_every=2)
        assert seconds["tasks"] > seconds["p2p"] > 0
        assert choose_exchange(counts, 2, parts, 2).transport == "p2p"
    # one layer between two parts: two tasks a chunk against p2p's five (first sends, segments, categories)
    one = np.array([[[0, 5], [5, 0]]])
    assert choose_exchange(one, 4, 2, 2).transport == "tasks"
    # the task exchange's overhead grows with the pairs (picks beyond two parts), p2p's tasks do not
    few, many = (exchange_overheads(np.ones((10, k, k)) - np.eye(k), 1, k, 2) for k in (4, 8))
    assert many["tasks"] / few["tasks"] > 2


# issue 42: the probe sized to its worker's memory limit. Two tiles (256 images) of a 65,536-wide float64 network
# took 0.6 GB in one task, and a worker of 600 MB was lost to it four times over
WIDE_LAYER = 65_536 * 32 * (8 + 8) + 65_537 * 8  # a generated 65,536-wide layer as the probe holds it


def test_the_probe_samples_as_many_images_as_a_small_workers_memory_holds():
    from dasknn.engine.sizing import probe_memory

    room = probe_memory(600e6)
    width = cost.probe_width(65_536, 8, 200, WIDE_LAYER, room)
    assert cost.PROBE_MIN_IMAGES <= width < 200 and width % 16 == 0
    assert cost.PROBE_LAYERS * WIDE_LAYER + cost.PROBE_COPIES * 65_536 * 8 * width <= room
    assert cost.probe_width(65_536, 8, 200, WIDE_LAYER) == 200  # no limit: the whole sample, as before
    assert cost.probe_width(65_536, 8, 200, WIDE_LAYER, probe_memory(8e9)) == 200
    # in less than its smallest sample takes, it cannot run at all
    assert cost.probe_width(65_536, 8, 200, WIDE_LAYER, probe_memory(300e6)) == 0
    # a batch smaller than the least sample is sampled whole where it fits
    assert cost.probe_width(1024, 8, 5, 0, 1e6) == 5


def test_the_probe_runs_within_the_memory_it_is_given(slice_store):
    from dasknn import store

    s = store.open_store(slice_store)
    layer = cost.probe_layer_bytes(s, 8)
    assert layer >= max(s.layer(k).nnz for k in range(1, s.depth + 1)) * 12
    memory = cost.PROBE_LAYERS * layer + cost.PROBE_COPIES * 1024 * 8 * 100
    figures = cost.probe(str(slice_store), str(slice_store), 1000, "float64", memory=memory)
    assert figures["probe_images"] == 96  # 100 images' room, in whole vectors
    assert cost.probe(str(slice_store), str(slice_store), 1000, "float64")["probe_images"] == 1000
    with pytest.raises(MemoryError, match="cannot sample"):
        cost.probe(str(slice_store), str(slice_store), 1000, "float64", memory=layer)


def test_a_probe_that_keeps_losing_its_worker_is_not_run_again(monkeypatch):
    # auto then runs without the cost model: the probe's losses end at PROBE_LOSSES, not at MAX_RECOVERIES
    import importlib

    from dasknn.engine.options import InferenceOptions
    from dasknn.engine.sizing import ProbeUnfit
    from dasknn.runtime.recovery import Loss

    engine_infer = importlib.import_module("dasknn.engine.infer")  # the module (the package exports the function)
    measured = []
    monkeypatch.setattr(engine_infer, "_cluster", lambda client, workers: (workers, 2, 1e9))
    monkeypatch.setattr(engine_infer, "predict_modes", lambda *a, **k: measured.append(a) or ("cal", []))

    class Recovering:
        client, phase = None, "setup"

        def __init__(self, losses: int):
            self.losses = [Loss(("tcp://w",), "probe", 0.1, 2) for _ in range(losses)]

        def enter(self, phase):
            self.phase = phase

        def run(self, attempt):
            return attempt(["tcp://a", "tcp://b"])

    options = InferenceOptions()
    assert engine_infer.PROBE_LOSSES < engine_infer.MAX_RECOVERIES + 1
    assert engine_infer._probe(Recovering(engine_infer.PROBE_LOSSES - 1), None, "p", "p", 10, 1, options, None) \
        == ("cal", [])
    with pytest.raises(ProbeUnfit, match=f"lost a worker {engine_infer.PROBE_LOSSES} times"):
        engine_infer._probe(Recovering(engine_infer.PROBE_LOSSES), None, "p", "p", 10, 1, options, None)
    assert len(measured) == 1


def test_folding_runs_are_predicted_on_the_distinct_vectors():
    # images that converge computed once: a layer's work (and model mode's messages) counts the distinct vectors
    # the probe found among the alive images; a calibration without them (compress off) counts every alive image
    every, folded = _cal(), _cal(distinct=[1.0, 0.05])
    for g in (1, 2):  # (model mode syncing every layer: it folds after each, as data mode does)
        assert _predict(folded, g, sync_every=1).compute < _predict(every, g, sync_every=1).compute * 0.6
    assert _predict(folded, 2, sync_every=1).exchange < _predict(every, 2, sync_every=1).exchange
    assert cost.computed_per_layer(folded, 3).tolist() == [1.0, 0.05, 0.05]
    assert cost.computed_per_layer(every, 3).tolist() == [1.0, 0.5, 0.5]


def test_the_calibration_as_plain_values_with_or_without_its_lists_a_layer():
    cal = _cal(distinct=[1.0, 0.5])
    assert cal.as_dict()["alive"] == [1.0, 0.5] and cal.as_dict()["distinct"] == [1.0, 0.5]
    rates = cal.as_dict(per_layer=False)
    assert rates["kernel_rate"] == 1e9 and not set(cost.PER_LAYER) & set(rates)
    assert set(cal.as_dict()) - set(rates) == set(cost.PER_LAYER)


def test_a_part_plan_made_where_the_run_keeps_it_is_not_setup_to_pay(fresh_store, tmp_path, monkeypatch):
    # out of core, model mode reads its part plan from --plan-store where one is given: the estimate looks there
    # too (it looked only inside the store, and charged 191 s for a plan already made at 65,536 x 480)
    from dasknn import partition, store
    from dasknn.engine import sizing

    s = store.open_store(fresh_store)
    owners = partition.partition_network(s.network().layers, 2, "block")
    store.save_partition(fresh_store, store.partition_name("hypergraph", 2), owners, {})
    made = str(tmp_path / "plans-elsewhere")
    asked = []

    def open_plan_store(path, network, owners):
        asked.append(str(path))
        return object() if str(path) == made else None

    monkeypatch.setattr(store, "open_plan_store", open_plan_store)
    nnz = s.layer_entries()
    args = (["w1", "w2"], s, str(fresh_store), "hypergraph", 2, nnz, False, None, 1e9)
    kept = sizing._exchange_estimate(*args, plan_store=made)
    default = sizing._exchange_estimate(*args)
    assert asked[0] == made and asked[1] != made
    assert kept[2] == pytest.approx(0.0) and default[2] == pytest.approx(cost.setup_seconds(s.edges, 2, None, True, 2))
