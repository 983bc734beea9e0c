"""The kernels' warm-up on the workers: one ``warm-w{i}`` task per worker, pinned to it, before any clock starts.

A worker process compiles each kernel signature (or loads it from Numba's cache) on its first call; in a timed
phase that made a fresh cluster's first run 4-5 times slower than its second. Inference puts these tasks in its
untimed load phase (:mod:`.execute`), training runs them before its steps' clock, ``dasknn warm`` on every worker
of a cluster so that its nodes fill their caches once. What each kernel call is made on:
:func:`dasknn.kernels.warm.warm_kernels`.
"""

from __future__ import annotations

import os
import socket
import uuid
from dataclasses import dataclass

from ..kernels.warm import CacheLocation, WarmSpec, cache_locations, warm_kernels
from ..runtime.graph import PinnedGraph
from ..runtime.recovery import gather_watched


@dataclass(frozen=True)
class WarmReport:
    """One process's warm-up: where it ran, how long it took, and where its Numba cache lives."""

    host: str
    pid: int
    seconds: float
    caches: tuple[CacheLocation, ...]

    def as_dict(self) -> dict:
        """The report as plain values (``dasknn warm --json``)."""
        return {"host": self.host, "pid": self.pid, "seconds": round(self.seconds, 3),
                "caches": [{"path": c.path, "loaded": c.loaded, "compiled": c.compiled} for c in self.caches]}


def every_kernel(dtypes: tuple[str, ...], backend: str) -> tuple[WarmSpec, ...]:
    """The warm-up of every kernel a run may call in ``dtypes`` on ``backend``: inference in every mode (compact
    messages: dense ones call no compiled code; overlapped steps on the CPU only), and training (float64)."""
    return (*(WarmSpec(dtype=d, backend=backend, loop=True, steps=True, overlap=backend == "cpu") for d in dtypes),
            WarmSpec(backend=backend, training=True))


def warm(specs: tuple[WarmSpec, ...]) -> WarmReport:
    """Warm the kernels of every spec in this process (a worker's ``warm-w{i}`` task, or the client)."""
    seconds = sum(warm_kernels(spec) for spec in specs)
    return WarmReport(socket.gethostname(), os.getpid(), seconds, tuple(cache_locations()))


def add_warm_tasks(graph: PinnedGraph, workers: list[str], specs: tuple[WarmSpec, ...]) -> list[str]:
    """Add one ``warm-w{i}`` task per worker (``i``: its place in ``workers``) to ``graph``; return their keys."""
    return [graph.add(w, f"warm-w{i}", (warm, specs)) for i, w in enumerate(workers)]


def warm_workers(client, workers: list[str], specs: tuple[WarmSpec, ...]) -> dict[str, WarmReport]:
    """Run the warm-up of ``specs`` on every one of ``workers`` at once; each worker's report.

    Raises :class:`~dasknn.runtime.recovery.WorkersLost` if one of them leaves meanwhile.
    """
    graph = PinnedGraph(uuid.uuid4().hex[:8])
    futures = graph.submit(client, add_warm_tasks(graph, workers, specs))
    reports = dict(zip(workers, gather_watched(client, futures, workers)))
    for f in futures:
        f.release()
    return reports


def longest(reports) -> float:
    """Seconds of the longest warm-up among ``reports`` (0 for none): what a run waited for before its clock."""
    return max((r.seconds for r in reports), default=0.0)
