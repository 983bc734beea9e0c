"""Losing workers: watching futures for a loss, waiting for workers after one, and "ensure a client".

The policies stay with their callers: inference re-runs the chunks a loss left unfinished, training restarts
from its last checkpoint. Both ask the same questions here.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator


class WorkersLost(Exception):
    """Workers the run's tasks are pinned to have left the cluster.

    Parameters
    ----------
    lost
        The addresses of the workers lost.
    partial
        What the caller had done when they were lost (inference: the pass with its finished chunks), or None.
    """

    def __init__(self, lost: list[str], partial: object = None):
        super().__init__(f"lost workers {lost}")
        self.lost = lost
        self.partial = partial


def watch(client, futures: list, workers: list[str] | set[str], on_done: Callable | None = None) -> None:
    """Wait for ``futures``, calling ``on_done(future)`` as each finishes.

    Raises :class:`WorkersLost` as soon as one of ``workers`` leaves the cluster (tasks pinned to it would wait
    for it for ever: a nanny restarts a killed worker at a new address), cancelling the futures still pending.
    A task's own error is raised as it comes (a DasknnError names the store and layer).
    """
    from distributed import wait
    from distributed.scheduler import KilledWorker

    pending = set(futures)
    while pending:
        try:
            done, pending = wait(pending, timeout=0.5, return_when="FIRST_COMPLETED")
        except TimeoutError:
            done = set()
        for fut in done:
            if fut.status == "error":
                exc = fut.exception()
                if isinstance(exc, KilledWorker):
                    raise WorkersLost([str(getattr(exc, "last_worker", "?"))])
                fut.result()  # re-raise the worker's error
            if on_done is not None:
                on_done(fut)
        if pending:
            now = set(client.nthreads())
            gone = [w for w in workers if w not in now]
            if gone:
                for fut in pending:
                    fut.cancel()
                raise WorkersLost(sorted(gone))


def worker_lost(client, workers: set[str], error: Exception) -> bool:
    """Whether ``error`` comes from losing one of ``workers`` (rather than from a fault a retry would repeat)."""
    from distributed import KilledWorker

    if isinstance(error, (WorkersLost, KilledWorker)):
        return True
    try:
        return not workers <= set(client.nthreads())
    except Exception:  # the scheduler itself is unreachable: nothing to recover onto
        return False


def workers_info(client) -> dict:
    """Every worker's identity (address: nthreads, memory_limit, ...), asked of the scheduler now.

    Not ``client.scheduler_info(n_workers=-1)``: that refreshes the client's cached identity and returns the cache,
    which distributed's periodic refresh (every ``distributed.client.scheduler-info-interval``, 2 s, made without
    the workers) can overwrite in between, so a cluster with workers sometimes looked empty."""
    return client.sync(client.scheduler.identity, n_workers=-1)["workers"]


def smallest_memory_limit(info: dict) -> float:
    """The smallest memory limit among the workers of ``info`` (:func:`workers_info`), in bytes; a worker without a
    limit counts as its share of this machine's memory."""
    import psutil

    return min((w.get("memory_limit") or psutil.virtual_memory().total / len(info)) for w in info.values())


def await_workers(client, expected: int, timeout: float) -> list[str]:
    """The workers after a loss, sorted.

    Waits (up to ``timeout`` seconds) for as many as ``expected`` (a nanny restarts a killed worker at a new
    address), then takes what there is: an empty list when none came back.
    """
    deadline = time.monotonic() + timeout
    while True:
        workers = sorted(workers_info(client))
        if len(workers) >= expected or time.monotonic() > deadline:
            return workers
        time.sleep(0.2)


@contextlib.contextmanager
def ensure_client(client=None, **cluster: object) -> Iterator:
    """``client``, or (when None) a client of a local cluster started for the block and closed after it.

    ``cluster`` is passed to :func:`dasknn.cluster.local_client`.
    """
    if client is not None:
        yield client
        return
    from ..cluster import local_client

    with local_client(**cluster) as c:
        yield c

