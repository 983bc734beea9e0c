"""The state a run keeps on each worker, in one object per run, owned by one registry per worker (after distributed's
P2P shuffle: a run object made from a frozen spec, held by the worker's shuffle extension, closed once).

A task finds its run's object with :func:`worker_run`: on a Dask worker the registry is one of the worker's
``extensions`` (made by the first task that asks; the worker closes its extensions, and so every run object, when it
closes); in a process with no Dask worker (a task function called directly) one registry of this process does.
Either way the object is made by its spec's ``open()`` the first time a task of the run asks, and closed once: by
:func:`close_run` as the run ends, or with the worker. What the object holds is its workflow's business: this
module knows no layers.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Any, Protocol

#: Runs a registry remembers as closed (late messages for them are dropped, not made into a new run).
CLOSED_KEPT = 1024
#: The registry's name among a worker's extensions.
RUNS_EXTENSION = "dasknn-runs"


class RunObject(Protocol):
    """What a run object must do: let go of everything it holds, once."""

    def close(self) -> None: ...


class RunSpec(Protocol):
    """A frozen description of a run (hashable, picklable): its id, and how to make its object on a worker."""

    run: str

    def open(self) -> RunObject: ...


class Runs:
    """The run objects of one process, by run id (thread-safe: a worker's threads share it)."""

    def __init__(self) -> None:
        self._runs: dict[str, RunObject] = {}
        #: the runs closed here lately (a late message for one must not bring it back)
        self._closed: deque[str] = deque()
        self._closed_ids: set[str] = set()  # the same, to look up (every message that arrives asks)
        self._lock = threading.Lock()

    def get(self, spec: RunSpec) -> Any:
        """The object of ``spec.run``, made by ``spec.open()`` if this process has none yet."""
        with self._lock:
            found = self._runs.get(spec.run)
            if found is None:
                found = self._runs[spec.run] = spec.open()
            return found

    def get_open(self, spec: RunSpec) -> Any | None:
        """:meth:`get`, but None for a run closed here already."""
        with self._lock:
            if spec.run in self._closed_ids:
                return None
        return self.get(spec)

    def find(self, run: str) -> Any | None:
        """The object of ``run`` if this process has one."""
        with self._lock:
            return self._runs.get(run)

    def close_run(self, run: str) -> Any | None:
        """Close the object of ``run`` (if any) and forget it; return it, closed."""
        with self._lock:
            found = self._runs.pop(run, None)
            if run not in self._closed_ids:
                self._closed.append(run)
                self._closed_ids.add(run)
                if len(self._closed) > CLOSED_KEPT:
                    self._closed_ids.discard(self._closed.popleft())
        if found is not None:
            found.close()
        return found

    def close(self) -> None:
        """Close every run object (the worker calls this as it closes, as it does for every extension)."""
        with self._lock:
            runs, self._runs = list(self._runs.values()), {}
        for found in runs:
            found.close()

    def __len__(self) -> int:
        return len(self._runs)


#: The registry of a process with no Dask worker (tasks called directly, single-process runs).
_PROCESS_RUNS = Runs()
_ATTACH = threading.Lock()


def runs_of(worker=None) -> Runs:
    """The registry of ``worker`` (by default the worker running this task; made on first use, in its
    ``extensions``), or of this process where there is no Dask worker."""
    if worker is None:
        try:
            from distributed import get_worker

            worker = get_worker()
        except (ImportError, ValueError):
            return _PROCESS_RUNS
    with _ATTACH:
        return worker.extensions.setdefault(RUNS_EXTENSION, Runs())


def worker_run(spec: RunSpec) -> Any:
    """The object of the run ``spec`` describes in this process (made on first use)."""
    return runs_of().get(spec)


def close_run(run: str, dask_worker=None) -> None:
    """Close run ``run``'s object here (run with ``client.run`` on every worker as the run ends)."""
    runs_of(dask_worker).close_run(run)


def run_figures(run: str, dask_worker=None) -> dict:
    """What run ``run``'s object here measured (its ``figures()``; empty where it has none): run with
    ``client.run`` before :func:`close_run`."""
    found = runs_of(dask_worker).find(run)
    return {} if found is None or not hasattr(found, "figures") else found.figures()
