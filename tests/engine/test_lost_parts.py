"""After a lost worker the survivors keep what they loaded: in model and hybrid modes their parts (the partition and
its plan kept, the lost worker's parts planned and loaded again on a new worker or on a survivor), in data mode the
network. Workers run in this process (no nanny): a closed one stays gone unless the test starts another."""

from __future__ import annotations

import sys
import threading
import time

import numpy as np
import pytest

from dasknn import engine, generate, store
from dasknn.engine.places import keep_places, most_parts

#: the tasks that plan a part or load a worker's weights (model and hybrid modes: a part's; data mode: the network)
LOADS = ("plan-g", "weights-")


@pytest.fixture(scope="module")
def net(tmp_path_factory):
    """A generated 1024 x 24 network with 600 images and their truth."""
    return generate.write(tmp_path_factory.mktemp("lost") / "net.zarr", 1024, 24, 600, seed=5, truth=True)


def _loads_plugin():
    from distributed.diagnostics.plugin import SchedulerPlugin

    class Loads(SchedulerPlugin):
        """Every plan and weights task that finished, with its worker; and, once a task whose key starts with
        ``trigger`` is sent to its worker, ``ready`` set (the inference phase is under way: the time to lose a
        worker)."""

        def __init__(self, trigger: str) -> None:
            self.trigger, self.ready, self.done = trigger, threading.Event(), []

        def transition(self, key, start, finish, *args, **kwargs) -> None:
            if not isinstance(key, str):
                return
            if finish == "memory" and key.startswith(LOADS):
                self.done.append((key, kwargs.get("worker")))
            elif finish == "processing" and key.startswith(self.trigger):
                self.ready.set()

    return Loads


def _infer_losing_one(path, workers: int, replace: bool, monkeypatch, trigger: str = "spmm-l5-", **options):
    # engine.infer on ``workers`` in-process workers, one of them closed once a ``trigger`` task is sent (and,
    # with ``replace``, a new one started in its place); returns the result, the victim, the new worker (or None)
    # and each plan or weights task finished after the loss, with its worker
    from distributed import Client, LocalCluster, Worker

    monkeypatch.setattr(sys.modules["dasknn.engine.infer"], "AWAIT_WORKERS_SECONDS", 1.0)
    with LocalCluster(n_workers=workers, threads_per_worker=1, processes=False, dashboard_address=None) as cluster, \
            Client(cluster) as client:
        loads = _loads_plugin()(trigger)
        cluster.scheduler.add_plugin(loads)
        victim = cluster.workers[sorted(cluster.workers)[-1]]
        box: dict = {"new": None}

        def lose_one() -> None:
            if not loads.ready.wait(120):
                return
            box["before"] = len(loads.done)
            box["victim"] = victim.address
            client.sync(victim.close)
            if replace:
                box["new"] = client.sync(_started, Worker, cluster.scheduler_address)

        t = threading.Thread(target=lose_one)
        t.start()
        try:
            result = engine.infer(path, client=client, **options)
        finally:
            t.join(30)
            if box["new"] is not None:
                client.sync(box["new"].close)
        assert "victim" in box, "the run ended before the loss"
        after = loads.done[box["before"]:]
    return result, box["victim"], box["new"] and box["new"].address, after


async def _started(worker_class, address: str):
    return await worker_class(address, nthreads=1)


def _truth(path) -> np.ndarray:
    return store.open_inputs(path).truth(np.float64)


def test_the_parts_of_a_lost_worker_go_to_a_new_worker_else_to_the_survivor_holding_fewest():
    places = {(0, 0): "a", (0, 1): "b", (0, 2): "c"}
    assert keep_places(places, ["a", "b", "d"]) == {(0, 0): "a", (0, 1): "b", (0, 2): "d"}
    assert keep_places(places, ["a", "b"]) == {(0, 0): "a", (0, 1): "b", (0, 2): "a"}
    # hybrid: two groups of two; "b" and "c" lost, one new worker: it takes the first part left, "a" the other
    two = {(0, 0): "a", (0, 1): "b", (1, 0): "c", (1, 1): "d"}
    kept = keep_places(two, ["a", "d", "e"])
    assert kept == {(0, 0): "a", (0, 1): "e", (1, 0): "a", (1, 1): "d"} and most_parts(kept) == 2
    # a survivor holding two parts already is the last to take a third
    assert keep_places({(0, 0): "a", (0, 1): "a", (0, 2): "b", (0, 3): "c"}, ["a", "b"])[(0, 3)] == "b"
    assert keep_places(places, ["x", "y"]) is None  # nobody holds a part: the partition is made again
    assert keep_places(places, ["a", "b", "c", "d"]) is None  # more workers than parts: the same
    assert keep_places({}, ["a"]) is None


@pytest.mark.cluster
@pytest.mark.parametrize("replace,exchange", [(False, "tasks"), (True, "tasks"), (False, "p2p")],
                         ids=["not-replaced", "replaced", "not-replaced-p2p"])
def test_model_mode_after_a_lost_worker_plans_and_loads_only_its_part(net, monkeypatch, replace, exchange):
    # (p2p: a task per part and chunk, the two parts on one worker waiting for each other's messages out of its one
    # thread's slot)
    trigger = "spmm-l5-" if exchange == "tasks" else "spmm-l1-24-p0-c1-"
    result, victim, new, after = _infer_losing_one(net, 3, replace, monkeypatch, trigger, mode="model", chunks=6,
                                                   exchange=exchange)
    np.testing.assert_array_equal(result.categories, _truth(net))
    [loss] = result.recoveries
    assert loss["lost"] == [victim] and loss["phase"] == "inference"
    # the partition of 3 parts is kept (not made again for the workers left): one part planned and loaded again
    assert result.group_size == 3 and result.workers == (3 if replace else 2)
    assert (loss["parts_kept"], loss["parts_reloaded"]) == (2, 1), loss
    assert sorted(key.split("-")[0] for key, _ in after) == ["plan", "weights"], after
    if replace:  # on the new worker; else on a survivor, which hosts two parts
        assert {w for _, w in after} == {new}
    else:
        assert victim not in {w for _, w in after}


@pytest.mark.cluster
def test_hybrid_mode_after_a_lost_worker_not_replaced_loads_only_its_part(net, monkeypatch):
    result, victim, _, after = _infer_losing_one(net, 4, False, monkeypatch, mode="hybrid", group_size=2, chunks=4,
                                                 exchange="tasks")
    np.testing.assert_array_equal(result.categories, _truth(net))
    [loss] = result.recoveries
    assert loss["phase"] == "inference" and loss["workers_now"] == 3
    assert result.group_size == 2 and (loss["parts_kept"], loss["parts_reloaded"]) == (3, 1), loss
    assert sorted(key.split("-")[0] for key, _ in after) == ["plan", "weights"], after


@pytest.mark.cluster
@pytest.mark.parametrize("replace", [False, True], ids=["not-replaced", "replaced"])
def test_data_mode_after_a_lost_worker_the_survivors_keep_the_network(net, monkeypatch, replace):
    result, victim, new, after = _infer_losing_one(net, 2, replace, monkeypatch, trigger="spmm-l5-5-", mode="data",
                                                   chunks=4, segment=1)
    np.testing.assert_array_equal(result.categories, _truth(net))
    [loss] = result.recoveries
    assert loss["phase"] == "inference"
    assert (loss["networks_kept"], loss["networks_reloaded"]) == (1, int(replace)), loss
    assert after == ([(after[0][0], new)] if replace else []), after
    assert all(key.startswith("weights-") for key, _ in after)
