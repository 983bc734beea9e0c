"""The exchange's shared tests: every transport of :mod:`dasknn.runtime.exchange` runs model- and hybrid-mode inference
and training to the same results. One suite (:class:`ExchangeChecks`), subclassed per transport: the task exchange
(``tasks``), the peer-to-peer exchange (``p2p``) and, in the tests only, a toy that passes messages as files
(``tests/support/toy_exchange.py``)."""

from __future__ import annotations

import numpy as np
import pytest

import toy_exchange
from dasknn import engine, generate, store
from dasknn.runtime.exchange import EXCHANGES

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def train_network(tmp_path_factory):
    pytest.importorskip("sklearn")  # the digits
    return generate.write(tmp_path_factory.mktemp("net") / "net4.zarr", 1024, 4, seed=1)


class ExchangeChecks:
    """What every transport must do; a subclass names it in ``exchange``."""

    exchange = ""

    @pytest.fixture(autouse=True)
    def _registered(self, tmp_path):
        toy_exchange.register(tmp_path)
        yield
        EXCHANGES.pop("folder", None)

    def test_model_mode_gives_the_truth_and_counts_what_crossed(self, client, slice_store, slice_truth):
        result = engine.infer(slice_store, client=client, mode="model", partition="random", exchange=self.exchange)
        np.testing.assert_array_equal(result.categories, slice_truth)
        crossed = np.array(result.exchange_bytes)
        volume = np.array(result.plan_volume)
        assert crossed[volume > 0].min() > 0 and crossed[volume == 0].max(initial=0) == 0

    @pytest.mark.parametrize("messages", ["dense", "compact"])
    def test_what_crossed_is_what_was_built_and_the_plan(self, client, slice_store, messages):
        result = engine.infer(slice_store, client=client, mode="model", partition="random", sync_every=3, chunks=3,
                              messages=messages, exchange=self.exchange)
        assert sum(result.dense_message_bytes) == result.plan_bytes > 0
        assert result.bytes_sent == pytest.approx(sum(result.message_bytes), rel=0.10)
        for k, (crossed, built) in enumerate(zip(result.exchange_bytes, result.message_bytes), start=1):
            assert crossed == pytest.approx(built, rel=0.10, abs=200 * 3), k

    def test_parts_sending_to_several_and_overlapped_steps(self, client4, slice_store, slice_truth):
        for overlap in (False, True):
            result = engine.infer(slice_store, client=client4, mode="model", partition="random",
                                  exchange=self.exchange, overlap=overlap, sync_every=3, chunks=2)
            np.testing.assert_array_equal(result.categories, slice_truth)
        hybrid = engine.infer(slice_store, client=client4, mode="hybrid", group_size=2, partition="block",
                              exchange=self.exchange, chunks=4)
        np.testing.assert_array_equal(hybrid.categories, slice_truth)

    def test_many_chunks_on_one_thread_workers_finish(self, client, slice_store, slice_truth):
        # more chunks than a worker has threads: a part waiting for a message must not starve the one sending it
        result = engine.infer(slice_store, client=client, mode="model", partition="random", exchange=self.exchange,
                              chunks=12)
        np.testing.assert_array_equal(result.categories, slice_truth)

    def test_kept_activations_equal_the_reference(self, client, slice_store):
        from dasknn import reference

        net = store.open_store(slice_store).network()
        images = store.open_inputs(slice_store).rows(0, 200)
        expected = reference.infer(net.layers, images, net.bias, net.ymax, np.float64)
        result = engine.infer(slice_store, client=client, mode="model", partition="random", images=200, chunks=2,
                              exchange=self.exchange, keep_activations=True)
        np.testing.assert_array_equal(result.activations.compute(scheduler=client), expected.toarray())

    @pytest.mark.parametrize("mode,workers,group_size", [("model", 2, None), ("model", 4, None), ("hybrid", 4, 2)])
    def test_training_gives_the_single_process_losses(self, client4, train_network, mode, workers, group_size):
        from dasknn.train import train

        kw = dict(epochs=1, batch=64, max_steps=8, chunk=4, optimizer="adam", lr=1e-3, seed=3)
        single = train(str(train_network), "digits", mode="single", **kw)
        run = train(str(train_network), "digits", mode=mode, workers=workers, group_size=group_size, client=client4,
                    partition="random", exchange=self.exchange, **kw)
        np.testing.assert_allclose(run.losses, single.losses, rtol=1e-12, atol=0)
        for a, b in zip(run.model.params, single.model.params):
            np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-15)


    def test_a_task_runs_a_segment_of_layers_where_the_transport_allows(self, client4, slice_store, slice_truth):
        # a transport that delivers messages itself: K tasks per segment of layers, K sends and a categories task
        # per chunk; a transport whose messages are task results: a task per part and layer at least
        depth, parts, chunks = store.open_store(slice_store).depth, 4, 2
        result = engine.infer(slice_store, client=client4, mode="model", partition="random", exchange=self.exchange,
                              segment=5, chunks=chunks)
        np.testing.assert_array_equal(result.categories, slice_truth)
        per_chunk = result.tasks / chunks
        if EXCHANGES[self.exchange]((None,) * parts).carries_messages:
            assert per_chunk >= parts * depth
        else:
            assert per_chunk <= parts * -(-depth // 5) + 4 * parts


class TestTaskExchange(ExchangeChecks):
    exchange = "tasks"


class TestPeerExchange(ExchangeChecks):
    exchange = "p2p"


class TestFolderExchange(ExchangeChecks):
    exchange = "folder"


def test_a_peer_that_never_sends_ends_the_wait_with_one_line():
    from dasknn.errors import DasknnError
    from dasknn.runtime.exchange import Endpoint, ExchangeFailed

    endpoint = Endpoint()
    endpoint.deliver("l3", 2, 0, "rows")
    with pytest.raises(DasknnError, match=r"part 0 waited 0 s for the message l3 from part 1, which never came"):
        endpoint.take("l3", 0, (1, 2), timeout=0.2)
    assert endpoint.take("l3", 0, (2,)) == ["rows"]  # what did come is still there, taken once
    assert not endpoint.deliver("l3", 2, 0, "rows")  # a retried send's duplicate is dropped
    endpoint.fail("a worker was lost")
    with pytest.raises(ExchangeFailed, match="a worker was lost"):
        endpoint.take("l4", 0, (1,))


@pytest.mark.parametrize("depth", [1, 12])
def test_auto_runs_the_transport_the_plan_predicts_cheaper(client, slice_store, slice_truth, slice_paths, tmp_path,
                                                          depth):
    from dasknn import store
    from dasknn.runtime.exchange.choice import choose_exchange

    path = slice_store
    if depth == 1:  # the slice's first layer alone, with its images: two tasks a chunk beat p2p's five
        from dasknn import io
        from dasknn.network import Network

        s = store.open_store(slice_store)
        path = store.write_network(tmp_path / "one.zarr", Network([s.layer(1)], bias=s.bias, ymax=s.ymax),
                                   images=io.read_images(slice_paths["images"], neurons=1024))
    result = engine.infer(path, client=client, mode="model", partition="random", chunks=2, dtype="float64")
    plan = engine.infer(path, client=client, mode="model", partition="random", chunks=2, dtype="float64",
                        exchange="tasks")
    counts = np.zeros((depth, 2, 2), dtype=np.int64)
    counts[:, 0, 1], counts[:, 1, 0] = 1, 1  # a random partition of 1024 neurons: both parts send every layer
    assert np.array_equal(np.array(plan.exchange_pairs) > 0, ~np.eye(2, dtype=bool))
    want = choose_exchange(counts, 2, 2, 2).transport
    assert result.exchange == want == ("tasks" if depth == 1 else "p2p")
    assert plan.exchange == "tasks"
    if depth == 12:
        np.testing.assert_array_equal(result.categories, slice_truth)
    np.testing.assert_array_equal(result.categories, plan.categories)


def test_training_counts_what_p2p_moves_past_dask(client):
    # a transport that pushes its own messages is not in Dask's transfer counters: training adds what it counted,
    # so the bytes a step sends are about the task exchange's (which also moves the losses and a few results)
    from examples import random_layers, toy_data

    from dasknn import train as tr

    sent = {ex: tr.train(random_layers(), toy_data(60), epochs=1, batch=16, lr=0.05, mode="model", workers=2,
                         client=client, seed=5, max_steps=4, partition="random", exchange=ex).bytes_sent
            for ex in ("tasks", "p2p")}
    assert 0.8 * sent["tasks"] <= sent["p2p"] <= 1.05 * sent["tasks"], sent


def _unreachable_send() -> str:
    # in a task on a worker: a message for a part on a worker that is not there (nothing listens on port 9)
    import dask

    from dasknn.runtime.exchange import Endpoint, PeerUnreachable
    from dasknn.runtime.exchange.p2p import PeerExchange
    from distributed import get_worker

    endpoint = Endpoint()
    exchange = PeerExchange((get_worker().address, "tcp://127.0.0.1:9"))
    with dask.config.set({"distributed.comm.timeouts.connect": "1s"}):
        exchange.post(endpoint, "l2", 0, (1,), {1: np.ones(3)})  # (returns at once: the event loop writes it)
        try:
            endpoint.take("l3", 0, (1,), timeout=60)
        except PeerUnreachable as error:
            try:
                exchange.post(endpoint, "l3", 0, (1,), {1: np.ones(3)})
            except PeerUnreachable:
                return f"unreachable: {error}"
            return "the next post went on"
    return "the wait ended without the failure"


def test_a_message_that_cannot_be_written_fails_its_run_on_the_sender(client):
    # the sending task does not wait for its writes: a write that fails must stop the run's parts on the sending
    # worker (at their next wait, and at their next post), as a connection error the recovery policy looks into
    outcome = client.submit(_unreachable_send, pure=False).result(timeout=120)
    assert outcome.startswith("unreachable: could not send to tcp://127.0.0.1:9"), outcome


def test_a_full_outbox_makes_the_sender_wait_and_the_run_still_finishes(monkeypatch, slice_store, slice_truth):
    # an outbox of 1 byte: every sending task waits until the messages before it are written (back-pressure on
    # the sender), several chunks on one-thread workers, and the run still ends with the truth
    from dasknn.cluster import local_client

    monkeypatch.setenv("DASKNN_EXCHANGE_OUTBOX", "1")  # (read by the worker processes as they import dasknn)
    with local_client(workers=2, threads_per_worker=1) as small:
        result = engine.infer(slice_store, client=small, mode="model", chunks=3, exchange="p2p")
    np.testing.assert_array_equal(result.categories, slice_truth)
