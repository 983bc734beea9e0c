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


#: Seconds a worker may stay paused for memory, running nothing, before :func:`watch` gives up on the run.
STUCK_SECONDS = 30.0
#: Seconds between :func:`watch`'s looks at the workers' states (a full identity is heavier than a thread count).
_STATE_EVERY = 5.0


def watch(client, futures: list, workers: list[str] | set[str], on_done: Callable | None = None,
          stuck_seconds: float = STUCK_SECONDS) -> None:
    """Wait for ``futures``, calling ``on_done(future)`` as each finishes.

    Raises :class:`WorkersLost` as soon as one of ``workers`` leaves the cluster (tasks pinned to it would wait
    for it for ever: a nanny restarts a killed worker at a new address), cancelling the futures still pending.
    Raises a DasknnError, cancelling them too, when one of ``workers`` stays paused for memory with nothing
    running for ``stuck_seconds``: Dask pauses a worker whose process is over its pause share of the memory limit
    and waits for the memory to fall, which memory no task holds (compiled code, the heap) never does.
    A task's own error is raised as it comes (a DasknnError names the store and layer).
    """
    from distributed import wait
    from distributed.scheduler import KilledWorker

    pending = set(futures)
    paused_since: dict[str, float] = {}
    looked = time.monotonic()
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
            error = WorkersLost(sorted(gone)) if gone else None
            if error is None and time.monotonic() - looked >= min(_STATE_EVERY, stuck_seconds / 2):
                looked = time.monotonic()
                error = _stuck_worker(workers_info(client), workers, paused_since, stuck_seconds)
            if error is not None:
                for fut in pending:
                    fut.cancel()
                raise error


def _stuck_worker(info: dict, workers, paused_since: dict[str, float], stuck_seconds: float):
    # the error for the first of ``workers`` paused with nothing running since stuck_seconds ago, or None;
    # paused_since keeps when each was first seen so
    from ..errors import DasknnError

    now = time.monotonic()
    for w in workers:
        identity = info.get(w, {})
        metrics = identity.get("metrics", {})
        if identity.get("status") != "paused" or metrics.get("task_counts", {}).get("executing", 0):
            paused_since.pop(w, None)
            continue
        if now - paused_since.setdefault(w, now) >= stuck_seconds:
            mb = 1 << 20
            limit = identity.get("memory_limit") or 0
            return DasknnError(
                f"worker {w} has been paused for {stuck_seconds:.0f} s with nothing running: its process holds "
                f"{metrics.get('memory', 0) / mb:,.0f} MiB of its {limit / mb:,.0f} MiB limit, over the share at "
                f"which Dask pauses a worker, in memory no task holds; give the workers more memory "
                f"(--memory-limit)")
    return None


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

