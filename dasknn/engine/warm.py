"""The kernels' warm-up on the workers: one ``warm-w{i}`` task per worker, pinned to it, before any clock starts.

A worker process compiles each kernel signature (or loads it from Numba's cache) on its first call; in a timed
phase that made a fresh cluster's first run 4-5 times slower than its second. Inference puts these tasks in its
untimed load phase (:mod:`.execute`), training runs them before its steps' clock, ``dasknn warm`` on every worker
of a cluster so that its nodes fill their caches once. What each kernel call is made on:
:func:`dasknn.kernels.warm.warm_kernels`.
"""

from __future__ import annotations

import os
import pickle
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

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
    """Warm the kernels of every spec in this process (a worker's ``warm-w{i}`` task, or the client), compiled in a
    child process first where Numba's cache holds none of them (:func:`compiled_apart`)."""
    t0 = time.perf_counter()
    compiled_apart(specs)
    seconds = time.perf_counter() - t0 + sum(warm_kernels(spec) for spec in specs)
    return WarmReport(socket.gethostname(), os.getpid(), seconds, tuple(cache_locations()))


#: Seconds a child process may take compiling the kernels (:func:`compiled_apart`); past that, this process does.
APART_SECONDS = 600.0


def compiled_apart(specs: tuple[WarmSpec, ...]) -> bool:
    """Where this process's Numba cache holds none of the kernels yet (a fresh checkout, an empty
    ``NUMBA_CACHE_DIR``), compile those of ``specs`` in a child process, which writes them to the cache, so that
    this process loads them; return whether it did.

    Compiling holds on to memory a process never gives back: a process that compiled every float64 kernel held
    319 MB, one that loaded them 218 MB (malloc_trim gave back 2 MB). On workers of 600 MB that was the
    difference between a run and a worker paused for good (issue 42). Where the child fails, this process
    compiles them as before.
    """
    if any(any(Path(c.path).glob("*.nbi")) for c in cache_locations()):
        return False
    code = ("import pickle, sys; from dasknn.kernels.warm import warm_kernels\n"
            "for spec in pickle.loads(sys.stdin.buffer.read()): warm_kernels(spec)")
    try:
        done = subprocess.run([sys.executable, "-c", code], input=pickle.dumps(specs), capture_output=True,
                              timeout=APART_SECONDS, check=False)
    except subprocess.TimeoutExpired:
        return False
    return done.returncode == 0


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
