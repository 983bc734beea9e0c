"""Harnesses for the tests and the benchmarks (knowing no layers): a real Dask cluster of separate processes on
this machine, a ``dask scheduler`` and ``dask worker`` processes under nannies, as a cluster of several machines
runs them."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Cluster:
    """A running scheduler and its nanny-managed workers (:func:`process_cluster`): the scheduler's process first."""

    address: str
    processes: list[subprocess.Popen]


@contextlib.contextmanager
def process_cluster(workers: int = 2, memory_limit: str = "2GB", timeout: float = 60.0,
                    env: dict[str, str] | None = None) -> Iterator[Cluster]:
    """A ``dask scheduler`` and ``workers`` ``dask worker`` processes (one thread each, under nannies) on
    127.0.0.1, in the environment ``env`` (this one by default); every process is ended on exit."""
    from distributed import Client

    port = _free_port()
    address = f"tcp://127.0.0.1:{port}"
    env = dict(os.environ) if env is None else env
    dask = [sys.executable, "-m", "dask"]  # this interpreter's dask, whatever PATH says
    procs = [subprocess.Popen([*dask, "scheduler", "--host", "127.0.0.1", "--port", str(port),
                               "--dashboard-address", "127.0.0.1:0", "--no-show"],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)]
    try:
        for _ in range(workers):
            procs.append(subprocess.Popen([*dask, "worker", address, "--nthreads", "1", "--nworkers", "1",
                                           "--memory-limit", memory_limit, "--host", "127.0.0.1", "--nanny",
                                           "--no-dashboard"],
                                          env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                          start_new_session=True))
        deadline = time.monotonic() + timeout
        while True:
            try:
                with Client(address, timeout="5s") as c:
                    c.wait_for_workers(workers, timeout=max(1.0, deadline - time.monotonic()))
                break
            except (OSError, TimeoutError):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        yield Cluster(address, procs)
    finally:
        stop_process_groups(procs, 10.0)


def stop_process_groups(procs: list[subprocess.Popen], wait_seconds: float) -> None:
    """End each process's group (each was started as a group's leader): SIGTERM to all of them, then SIGKILL to a
    group whose leader has not ended within ``wait_seconds``."""
    for p in procs:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGTERM)
    for p in procs:
        try:
            p.wait(wait_seconds)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait(wait_seconds)


