"""Losing workers: watching futures for a loss, waiting for workers after one, the policy a workflow runs its phases
under (:class:`Recovery`), and "ensure a client".

What to redo stays with the callers: inference re-runs the chunks a loss left unfinished, training restarts from
its last checkpoint. Both ask the same questions here, and both run every phase (setup included) under one
:class:`Recovery`, which tells a lost worker from a fault, waits for workers, and gives up with one line.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TypeVar

T = TypeVar("T")


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
                    raise WorkersLost([_address(exc)])
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


def gather_watched(client, futures: list, workers: list[str] | set[str]) -> list:
    """The results of ``futures`` (tasks pinned to ``workers``), brought to the client, in order.

    :func:`watch` while they run, and the gather watched too: a finished task whose worker is lost before its
    result reaches the client is never run again elsewhere when it is pinned (Dask leaves it in ``no-worker``), so
    a plain ``client.gather`` or ``future.result()`` would wait for it for ever. Raises :class:`WorkersLost` then,
    cancelling the futures.
    """
    watch(client, futures, workers)
    return client.sync(_gather_while_there, client, list(futures), sorted(workers))


async def _gather_while_there(client, futures: list, workers: list[str]) -> list:
    # the gather, and a look at the workers every half second while it lasts (as watch does)
    import asyncio
    import contextlib

    gathering = asyncio.ensure_future(client.gather(futures, asynchronous=True))
    while True:
        done, _ = await asyncio.wait({gathering}, timeout=0.5)
        if done:
            return gathering.result()
        there = await client.scheduler.ncores()
        gone = [w for w in workers if w not in there]
        if gone:
            # the futures cancelled first, so that the gather ends with their cancellation (cancelling the gather
            # itself would leave its inner waits to log a traceback when the futures go)
            await client.cancel(futures, asynchronous=True)
            await asyncio.wait({gathering}, timeout=10)
            if gathering.done():
                with contextlib.suppress(BaseException):
                    gathering.result()
            else:
                gathering.cancel()
            raise WorkersLost(gone)


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
    return min(memory_limits(info).values())


def memory_of(client, workers: list[str]) -> dict[str, float]:
    """The memory limits of ``workers`` (:func:`memory_limits`), in their order, asked of the scheduler now; for one
    that has left since it was counted, the smallest of those there are (the pass that counts on it fails as a
    loss, and the recovery policy sizes the next for the workers there are then)."""
    limits = memory_limits(workers_info(client))
    smallest = min(limits.values(), default=0.0)
    return {w: limits.get(w, smallest) for w in workers}


def memory_limits(info: dict) -> dict[str, float]:
    """Each worker's memory limit (of ``info``, :func:`workers_info`), in bytes, by address; a worker without a
    limit counts as its share of this machine's memory."""
    import psutil

    return {address: float(w.get("memory_limit") or psutil.virtual_memory().total / len(info))
            for address, w in info.items()}


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



#: Seconds a fault that may come from a worker just lost (a closed connection, a key the scheduler no longer has)
#: waits for the scheduler to notice the loss before it counts as a fault of its own.
NOTICE_SECONDS = 3.0


@dataclass(frozen=True)
class Loss:
    """One loss of workers a workflow survived: who, in which phase, how long it waited, the workers after, and
    what the workflow kept and redid (``details``, its own words)."""

    lost: tuple[str, ...]
    phase: str
    waited_seconds: float
    workers_now: int
    details: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {"lost": list(self.lost), "phase": self.phase, **self.details,
                "waited_seconds": self.waited_seconds, "workers_now": self.workers_now}


class Recovery:
    """A workflow's policy for lost workers, for every phase it runs on the cluster.

    :meth:`run` calls an attempt with the workers there are; when a worker those workers name leaves (whatever the
    attempt was doing: a scatter, a pinned task, a gather), the policy waits up to ``wait_seconds`` for as many
    workers as there were before the loss (a nanny restarts a killed one at a new address), then calls the attempt
    again with the workers there are then, fewer where one was not replaced (the run goes on on those, and the
    :class:`Loss` says so): the attempt redoes only what the loss left unfinished. It gives up with one line naming
    the lost workers and the phase (:attr:`phase`, which the workflow sets as it goes) after ``max_losses`` losses,
    when no worker is left, or when the work no longer fits the workers left.

    Parameters
    ----------
    client
        The ``distributed.Client``.
    workflow
        What the policy guards, for its messages ("inference", "training", ...).
    workers
        The workers the workflow starts on.
    max_losses
        Losses survived before giving up.
    wait_seconds
        How long to wait for workers after a loss.
    advice
        Appended to the line that gives up after too many losses (what to check).
    """

    def __init__(self, client, workflow: str, workers: list[str], *, max_losses: int, wait_seconds: float,
                 advice: str = "see the workers' logs"):
        self.client, self.workflow = client, workflow
        self.workers = sorted(workers)
        #: how many workers the workflow started on, and how many a loss waits for: as many as there were before
        #: it (fewer once one was not replaced: a later loss does not wait again for a worker that never came)
        self.started = self.expected = len(self.workers)
        self.max_losses, self.wait_seconds, self.advice = max_losses, wait_seconds, advice
        self.losses: list[Loss] = []
        #: the phase running now, named by the workflow (``"partition"``, ``"plan"``, ...)
        self.phase = "setup"

    def enter(self, phase: str) -> None:
        """Name the phase that runs from now on (the one a loss is reported in, and the one the command's
        timings count from now on)."""
        from ..timings import enter

        self.phase = phase
        enter(phase)

    def run(self, attempt: Callable[[list[str]], T], on_loss: Callable[[WorkersLost], dict | None] | None = None
            ) -> T:
        """``attempt(workers)``, again after each loss of workers until it finishes.

        ``on_loss(lost)`` is called before the wait with the :class:`WorkersLost` (its ``partial`` is what the
        attempt had finished, where it said); what it returns goes into the :class:`Loss` record."""
        while True:
            try:
                return attempt(list(self.workers))
            except Exception as error:
                lost = self.lost_in(error)
                if lost is None:
                    if self._shrunk(error):
                        raise self._after_shrinking(error) from None
                    raise
                details = on_loss(lost) if on_loss is not None else None
                self._recover(lost, details or {})

    def lost_in(self, error: BaseException) -> WorkersLost | None:
        """The loss ``error`` comes from, or None when it is a fault of its own (a retry would repeat it)."""
        from distributed import KilledWorker

        if isinstance(error, WorkersLost):
            return error
        if isinstance(error, KilledWorker):
            return WorkersLost([_address(error)])
        deadline = time.monotonic() + (NOTICE_SECONDS if _may_come_from_a_loss(error) else 0.0)
        while True:
            try:
                gone = sorted(set(self.workers) - set(workers_info(self.client)))
            except Exception:  # the scheduler itself is unreachable: nothing to recover onto
                return None
            if gone:
                return WorkersLost(gone)
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.1)

    def _recover(self, lost: WorkersLost, details: dict) -> None:
        from ..errors import DasknnError

        names = ", ".join(lost.lost)
        if len(self.losses) >= self.max_losses:
            raise DasknnError(f"workers were lost {len(self.losses) + 1} times during {self.workflow} (the last, "
                              f"{names}, in its {self.phase} phase); giving up: {self.advice}")
        t0 = time.perf_counter()
        workers = await_workers(self.client, self.expected, self.wait_seconds)
        if not workers:
            raise DasknnError(f"worker {names} left during the {self.phase} phase of {self.workflow} and no worker "
                              f"came back within {self.wait_seconds:.0f} s; start workers and run again")
        self.losses.append(Loss(tuple(lost.lost), self.phase, round(time.perf_counter() - t0, 3), len(workers),
                                details))
        self.workers, self.expected = workers, len(workers)

    def _shrunk(self, error: BaseException) -> bool:
        # a check that failed because the workflow goes on with fewer workers than it started with
        from ..errors import DasknnError

        return isinstance(error, DasknnError) and bool(self.losses) and len(self.workers) < self.started

    def _after_shrinking(self, error: BaseException) -> BaseException:
        from ..errors import DasknnError

        last, n = self.losses[-1], len(self.workers)
        return DasknnError(f"worker {', '.join(last.lost)} left during the {last.phase} phase of {self.workflow} "
                           f"and was not replaced within {self.wait_seconds:.0f} s; on the {n} "
                           f"worker{'s' if n != 1 else ''} left: {error}")


def _address(killed: BaseException) -> str:
    # the address of the worker a KilledWorker names (distributed gives its WorkerState, or an address)
    last = getattr(killed, "last_worker", None)
    return str(getattr(last, "address", last or "?"))


def _may_come_from_a_loss(error: BaseException) -> bool:
    """Whether ``error`` is what a worker lost a moment ago looks like before the scheduler has removed it."""
    from asyncio import CancelledError

    from distributed import CancelledError as FutureCancelled
    from distributed.comm import CommClosedError

    return isinstance(error, (OSError, KeyError, CommClosedError, CancelledError, FutureCancelled, TimeoutError))
