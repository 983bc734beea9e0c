"""Training in pipeline mode: stage cuts, split and join, losses against one process to 1e-12 on the digits."""

from __future__ import annotations

import numpy as np
import pytest

from dasknn import train as tr
from dasknn.errors import DasknnError
from dasknn.train import pipeline_mode
from dasknn.train.pipeline_mode import (TRAIN_STAGE_SHARE, held_micro_batches, join_stages, place_train_stages,
                                        split_stages, stage_layer_bytes, train_stage_cuts)

from examples import C, random_layers, rel, toy_data

STEPS = 8


def test_stage_cuts_are_consecutive_balanced_and_leave_every_stage_a_layer():
    assert train_stage_cuts([10, 10, 10, 10], 2) == [(0, 2), (2, 4)]
    assert train_stage_cuts([30, 10, 10, 10], 2) == [(0, 1), (1, 4)]
    assert train_stage_cuts([1, 1, 1, 100], 4) == [(0, 1), (1, 2), (2, 3), (3, 4)]
    assert train_stage_cuts([5] * 7, 1) == [(0, 7)]
    cuts = train_stage_cuts([3, 9, 4, 4, 8, 1, 7], 3)
    assert cuts[0][0] == 0 and cuts[-1][1] == 7 and all(a < b for a, b in cuts)
    assert all(b == c for (_, b), (c, _) in zip(cuts, cuts[1:]))
    with pytest.raises(DasknnError, match="3 stages"):
        train_stage_cuts([1, 1], 3)


def test_stage_layer_bytes_count_state_gradients_and_activations():
    model = tr.init_model(random_layers(depth=3), C, seed=0, optimizer="adam")
    values, pattern = model.params[0].nbytes, sum(a.nbytes for a in model.patterns[0])
    # values, 2 Adam slots, 4 gradients' worth (a micro-batch's, its flat copy, the running sum, the total),
    # whatever the micro-batches; 8-byte activations of the micro-batches a stage holds at once: 2 of 3 images
    # (1F1B, 2 stages), or all 4, the share's 10 (GPipe)
    assert stage_layer_bytes(model, 4, 10, 2)[0] == values * 7 + pattern + model.neurons * 2 * 3 * 8
    assert stage_layer_bytes(model, 4, 10, 4)[0] == values * 7 + pattern + model.neurons * 10 * 8
    assert stage_layer_bytes(model, 1, 0, 1)[0] == values * 7 + pattern
    assert [held_micro_batches(s, 8, 3) for s in ("gpipe", "1f1b")] == [8, 3]
    assert [held_micro_batches(s, 2, 3) for s in ("gpipe", "1f1b")] == [2, 2]


def _memory_for(model, micro: int, images: int, layers: float) -> float:
    # a memory limit whose stage share holds ``layers`` of the model's (equal) layers
    return _memory_for_bytes(layers * stage_layer_bytes(model, micro, images, 2)[0])


def _memory_for_bytes(stage_bytes: float) -> float:
    # a memory limit whose stage share is ``stage_bytes``
    return stage_bytes / TRAIN_STAGE_SHARE


def test_train_stages_are_cut_and_placed_by_each_workers_memory():
    model = tr.init_model(random_layers(depth=8), C, seed=0)
    # equal limits, room for 5 layers a stage: the cut by entries (4 + 4) as train_stage_cuts gives it
    roomy = _memory_for(model, 2, 16, 5.5)
    placed = place_train_stages(model, [["a", "b"]], {"a": roomy, "b": roomy}, 2, 16).placement
    assert placed.fits and placed.groups == [["a", "b"]]
    assert [(s.first - 1, s.last) for s in placed.stages] == train_stage_cuts([p.size for p in model.params[:8]], 2)
    # a worker with room for 3 layers: placed first, holding 3; the other the 5 left
    small = _memory_for(model, 2, 16, 3.5)
    placed = place_train_stages(model, [["big", "small"]], {"big": roomy * 2, "small": small}, 2, 16).placement
    assert placed.fits and placed.groups == [["small", "big"]]
    assert [s.as_list() for s in placed.stages] == [[1, 3], [4, 8]]
    # one worker holding both places splits its memory between them: 2 x 3.5 layers hold no cut of 8
    placed = place_train_stages(model, [["a", "a"]], {"a": small * 2}, 2, 16).placement
    assert not placed.fits
    assert place_train_stages(model, [["a", "a"]], {"a": roomy * 2}, 2, 16).placement.fits
    # activations count: the same limit with 1,000 images a replica fits no cut
    assert not place_train_stages(model, [["a", "b"]], {"a": roomy, "b": roomy}, 2, 1000).placement.fits
    # auto: GPipe where its activations fit, else 1F1B. 8 micro-batches of 64 images: 8 held against 2, room for
    # 4.5 layers as 1F1B counts them (2.2 as GPipe does)
    one_f_one_b = stage_layer_bytes(model, 8, 512, 2)[0]
    assert stage_layer_bytes(model, 8, 512, 8)[0] > 2 * one_f_one_b
    tight = {"a": _memory_for_bytes(4.5 * one_f_one_b), "b": _memory_for_bytes(4.5 * one_f_one_b)}
    plan = place_train_stages(model, [["a", "b"]], tight, 8, 512)
    assert plan.pipeline_schedule == "1f1b" and plan.placement.fits
    assert not place_train_stages(model, [["a", "b"]], tight, 8, 512, "gpipe").placement.fits
    plenty = {w: limit * 3 for w, limit in tight.items()}
    assert place_train_stages(model, [["a", "b"]], plenty, 8, 512).pipeline_schedule == "gpipe"
    assert place_train_stages(model, [["a", "b"]], plenty, 8, 512, "1f1b").pipeline_schedule == "1f1b"


def test_pipeline_training_follows_and_refuses_by_the_workers_memory(client, monkeypatch):
    # the limits the runner asks the scheduler for, replaced: the first worker with room for 1.5 layers of the
    # 4, the second for 3.5; the stages are 1 and 3 layers, the small worker first, and the losses those of one
    # process. Then room for 1.5 layers each: no cut, one line.
    x, y = toy_data(60)
    kw = dict(epochs=2, batch=16, lr=0.05, optimizer="momentum", seed=5, max_steps=4)
    model = tr.init_model(random_layers(depth=4), C, seed=5, optimizer="momentum")
    one = stage_layer_bytes(model, 2, 16, 2)
    assert np.ptp(one) == 0  # (equal layers: the limits below count in layers)
    roomy, tight = sorted(client.nthreads())
    limits = {tight: _memory_for(model, 2, 16, 1.5), roomy: _memory_for(model, 2, 16, 3.5)}
    monkeypatch.setattr(pipeline_mode, "memory_of", lambda client, workers: {w: limits[w] for w in workers})
    single = tr.train(random_layers(depth=4), (x, y), mode="single", **kw)
    run = tr.train(random_layers(depth=4), (x, y), mode="pipeline", workers=2, micro_batches=2, client=client, **kw)
    assert run.stages == 2 and run.stage_layers == [[1, 1], [2, 4]]
    np.testing.assert_allclose(run.losses, single.losses, rtol=1e-12)
    limits[roomy] = limits[tight]
    with pytest.raises(DasknnError, match="fits no cut into 2 stages") as refused:
        tr.train(random_layers(depth=4), (x, y), mode="pipeline", workers=2, micro_batches=2, client=client, **kw)
    assert "\n" not in str(refused.value)


def test_a_stages_gradients_are_summed_in_micro_batch_order_whatever_order_they_end_in():
    from dasknn.train.pipeline_mode import MicroTask, PipeRun

    rng = np.random.default_rng(0)
    flats = [rng.standard_normal(1000) * 10.0 ** rng.integers(-8, 8) for _ in range(5)]
    expected = flats[0].copy()
    for g in flats[1:]:
        expected += g
    for order in ([0, 1, 2, 3, 4], [4, 2, 0, 3, 1], [1, 0, 3, 2, 4]):
        run = PipeRun()
        for m in order:
            run.add_gradients(MicroTask("r", 7, 0, 1, m), flats[m].copy())
        acc = run.sums[(7, 0, 1)]
        assert acc.added == 5 and not acc.waiting
        np.testing.assert_array_equal(acc.total, expected)  # to the last bit
    # one still missing: the sum stops before it, and the others wait
    run = PipeRun()
    for m in (0, 2, 3):
        run.add_gradients(MicroTask("r", 7, 0, 1, m), flats[m].copy())
    assert run.sums[(7, 0, 1)].added == 1 and sorted(run.sums[(7, 0, 1)].waiting) == [2, 3]


def test_split_and_join_stages_give_the_model_back():
    model = tr.init_model(random_layers(depth=5), C, seed=3, optimizer="adam")
    model.slots = [[s + i + 1 for s in slot] for i, slot in enumerate(model.slots)]  # (not zeros: seen joined)
    stages = split_stages(model, train_stage_cuts([p.size for p in model.params[:5]], 3))
    assert [len(st.params) for st in stages][:2] == [st.hi - st.lo for st in stages[:2]]
    assert len(stages[-1].params) == stages[-1].hi - stages[-1].lo + 2  # (the head)
    back = join_stages(model, stages)
    for a, b in zip(back.params + back.slots[0] + back.slots[1], model.params + model.slots[0] + model.slots[1]):
        np.testing.assert_array_equal(a, b)


def test_toy_network_with_replicas_matches_single_process(client):
    # 2 replicas x 2 stages (4 workers round-robin on 2), 3 micro-batches of each replica's share; momentum
    x, y = toy_data(60)
    kw = dict(epochs=4, batch=16, lr=0.05, optimizer="momentum", seed=5, max_steps=6)
    single = tr.train(random_layers(depth=4), (x, y), mode="single", **kw)
    run = tr.train(random_layers(depth=4), (x, y), mode="pipeline", workers=4, group_size=2, micro_batches=3,
                   client=client, **kw)
    assert run.stages == 2 and run.micro_batches == 3 and run.group_size == 2
    assert set(run.stage_busy_seconds) == {"r0-s0", "r0-s1", "r1-s0", "r1-s1"}
    np.testing.assert_allclose(run.losses, single.losses, rtol=1e-12)
    for a, b in zip(run.model.params, single.model.params):
        assert rel(a, b) < 1e-12


def test_more_micro_batches_than_images_and_uneven_batches_match_single_process(client):
    # batches of 15 (the last of an epoch shorter), 2 replicas x 1 stage, 12 micro-batches of 7 or 8 images: the
    # empty ones are left out; and 3 stages of a 3-layer network
    x, y = toy_data(50)
    kw = dict(epochs=2, batch=15, lr=0.05, optimizer="adam", seed=5)
    single = tr.train(random_layers(), (x, y), mode="single", **kw)
    for workers, micro, g in [(2, 12, 1), (3, 5, None)]:
        run = tr.train(random_layers(), (x, y), mode="pipeline", workers=workers, micro_batches=micro, group_size=g,
                       client=client, **kw)
        np.testing.assert_allclose(run.losses, single.losses, rtol=1e-12)
    # a batch of one image on 2 replicas: one replica's share is empty every step (its stages sum no gradient)
    kw = dict(epochs=1, batch=1, lr=0.05, optimizer="adam", seed=5, max_steps=4)
    single = tr.train(random_layers(), (x, y), mode="single", **kw)
    run = tr.train(random_layers(), (x, y), mode="pipeline", workers=4, group_size=2, micro_batches=2,
                   client=client, **kw)
    np.testing.assert_allclose(run.losses, single.losses, rtol=1e-12)


@pytest.fixture(scope="module")
def digits_network():
    pytest.importorskip("sklearn")
    from dasknn import generate

    return generate.network(1024, 4, seed=0)


@pytest.fixture(scope="module")
def digits_single(digits_network):
    return {opt: tr.train(digits_network, "digits", batch=64, lr=1e-3, optimizer=opt, mode="single", seed=0,
                          max_steps=STEPS) for opt in ("sgd", "adam")}


@pytest.mark.parametrize("stages,micro,order", [(2, 4, "auto"), (4, 8, "auto"), (2, 4, "1f1b"), (4, 8, "1f1b")])
@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_digits_losses_equal_single_process(client, digits_network, digits_single, stages, micro, order, optimizer):
    run = tr.train(digits_network, "digits", batch=64, lr=1e-3, optimizer=optimizer, mode="pipeline",
                   workers=stages, micro_batches=micro, client=client, seed=0, max_steps=STEPS,
                   pipeline_schedule=order)
    single = digits_single[optimizer]
    assert run.steps == STEPS and run.stages == stages and run.micro_batches == micro
    np.testing.assert_allclose(run.losses, single.losses, rtol=1e-12)
    for a, b in zip(run.model.params, single.model.params):
        assert rel(a, b) < 1e-10
    assert run.summary()["stages"] == stages and run.bytes_sent_per_step > 0
    # auto picks GPipe where its activations fit (they do here); 1F1B's stage s holds at most stages - s
    # micro-batches' activations (GPipe's stage 0 held all of them on this cluster)
    summary = run.summary()
    assert summary["pipeline_schedule"] == ("gpipe" if order == "auto" else order)
    held = summary["stage_held_micro_batches"]
    assert set(held) == {f"r0-s{s}" for s in range(stages - 1)}
    most = [micro if order == "auto" else stages - s for s in range(stages - 1)]
    assert all(1 <= held[f"r0-s{s}"] <= most[s] for s in range(stages - 1)), held


def test_digits_deeper_network_losses_equal_single_process(client):
    # 1024 x 16, 4 stages of 4 layers, 4 micro-batches, Adam
    pytest.importorskip("sklearn")
    from dasknn import generate

    net = generate.network(1024, 16, seed=1)
    kw = dict(batch=64, lr=1e-3, optimizer="adam", seed=0, max_steps=4)
    single = tr.train(net, "digits", mode="single", **kw)
    run = tr.train(net, "digits", mode="pipeline", workers=4, micro_batches=4, client=client, **kw)
    np.testing.assert_allclose(run.losses, single.losses, rtol=1e-12)


@pytest.mark.cluster
def test_pipeline_refuses_more_stages_than_layers_and_no_micro_batches():
    x, y = toy_data()
    with pytest.raises(DasknnError, match="4 stages"):
        tr.train(random_layers(depth=3), (x, y), mode="pipeline", workers=4)
    with pytest.raises(DasknnError, match="micro-batches"):
        tr.train(random_layers(depth=3), (x, y), mode="pipeline", workers=2, micro_batches=0)
    with pytest.raises(DasknnError, match="group-size"):
        tr.train(random_layers(depth=3), (x, y), mode="pipeline", workers=4, group_size=3)


def test_cli_trains_in_pipeline_mode(tmp_path, capsys, client):
    import argparse
    import json

    from dasknn import store
    from dasknn.cli import train as cli_train
    from dasknn.network import Network

    x, y = toy_data(60)
    np.savez(tmp_path / "d.npz", x=x, y=y)
    store.write_network(tmp_path / "n.zarr", Network(random_layers(), 0.0))
    p = argparse.ArgumentParser()
    cli_train.add_train_parser(p.add_subparsers(dest="command"))
    args = p.parse_args(["train", "--network", str(tmp_path / "n.zarr"), "--data", str(tmp_path / "d.npz"),
                         "--epochs", "1", "--batch", "16", "--mode", "pipeline", "--workers", "2",
                         "--micro-batches", "2", "--pipeline-schedule", "1f1b", "--scheduler",
                         client.scheduler.address, "--json"])
    assert args.func(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["mode"] == "pipeline" and out["stages"] == 2 and out["micro_batches"] == 2 and out["steps"] == 3
    assert out["pipeline_schedule"] == "1f1b" and out["stage_layers"] == [[1, 2], [3, 3]]
    assert 1 <= out["stage_held_micro_batches"]["r0-s0"] <= 2
    assert "compile_seconds" in out


def test_killed_stage_worker_run_resumes_from_checkpoint(client, tmp_path):
    # as data and model mode (tests/test_train.py): a worker killed after step 6, the last checkpoint at step 4;
    # the stages are rebuilt on the workers there are and the run ends as an uninterrupted one
    import os
    import signal

    x, y = toy_data(60)
    kw = dict(epochs=4, batch=16, lr=0.05, optimizer="adam", seed=5, max_steps=12, mode="pipeline", workers=2,
              micro_batches=2, client=client)
    whole = tr.train(random_layers(), (x, y), **kw)
    pids = client.run(os.getpid)
    killed = []

    def kill_one(step):
        if step == 6 and not killed:
            victim = sorted(pids)[-1]
            os.kill(pids[victim], signal.SIGKILL)
            killed.append(victim)

    run = tr.train(random_layers(), (x, y), checkpoint=tmp_path / "ck.zarr", checkpoint_every=4, chunk=2,
                   progress=kill_one, **kw)
    assert killed and run.restarts == 1 and run.steps == 12
    for a, b in zip(run.model.params + run.model.slots[1], whole.model.params + whole.model.slots[1]):
        assert np.array_equal(a, b)
    assert run.losses == whole.losses
