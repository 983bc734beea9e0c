"""One value scattered to several workers (``runtime/scatter.py``): every worker holds it, a release frees every
copy, and a worker that fails to take its copy, as a worker lost during the copy does, is left out at once rather
than retried for ever (what ``client.scatter(..., broadcast=True)`` does: the scheduler's ``replicate``)."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from dasknn.errors import DasknnError
from dasknn.runtime.scatter import scatter_to_all

pytestmark = pytest.mark.cluster


@pytest.fixture
def three():
    """An in-process cluster of 3 single-threaded workers on TCP (a worker can stop listening) and a client; a
    connection attempt gives up after 1 s."""
    import dask
    from distributed import Client, LocalCluster

    with dask.config.set({"distributed.comm.timeouts.connect": "1s"}), \
            LocalCluster(n_workers=3, threads_per_worker=1, processes=False, protocol="tcp",
                         dashboard_address=None) as cluster, Client(cluster) as client:
        yield cluster, client


def _holders(cluster, key: str) -> list[str]:
    return sorted(w.address for w in cluster.workers.values() if key in w.data)


def test_every_worker_holds_the_value_under_one_key_and_a_release_frees_every_copy(three):
    cluster, client = three
    workers = sorted(client.nthreads())
    value = np.arange(100_000)
    future = scatter_to_all(client, value, workers, key="shared-test")
    assert future.key == "shared-test"
    assert _holders(cluster, future.key) == workers
    assert sorted(client.who_has([future])[future.key]) == workers  # the scheduler knows every copy
    # a task pinned to each worker uses its own copy: nothing crosses between workers
    sums = client.gather([client.submit(np.sum, future, workers=[w], pure=False) for w in workers])
    assert sums == [value.sum()] * 3
    key = future.key
    del future
    deadline = time.monotonic() + 10
    while _holders(cluster, key) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _holders(cluster, key) == []


def test_a_worker_that_cannot_be_reached_is_left_out_after_one_attempt(three):
    # the third worker stops listening, as a worker lost during the copy does, while the scheduler still counts it:
    # broadcast=True retries it for ever (a connection attempt each time) and never returns
    cluster, client = three
    workers = sorted(client.nthreads())
    next(w for w in cluster.workers.values() if w.address == workers[2]).listener.stop()
    box: dict = {}
    done = threading.Thread(target=lambda: box.update(future=scatter_to_all(client, np.ones(1000), workers)),
                            daemon=True)
    done.start()
    done.join(60)
    assert not done.is_alive(), "the scatter never returned"
    key = box["future"].key
    assert _holders(cluster, key) == workers[:2]
    assert sorted(client.who_has([box["future"]])[key]) == workers[:2]


def test_no_workers_is_one_clear_error(three):
    _, client = three
    with pytest.raises(DasknnError, match="no workers"):
        scatter_to_all(client, 1, [])
