"""Connecting to Dask: a local cluster bound to this machine, or an existing scheduler."""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator

from .errors import DasknnError


@contextlib.contextmanager
def local_client(
    workers: int | None = None,
    threads_per_worker: int = 1,
    scheduler: str | None = None,
    memory_limit: str | int | None = "auto",
    gpu: bool = False,
) -> Iterator:
    """Yield a ``distributed.Client``: connected to ``scheduler``, or to a new local cluster closed on exit.

    A local cluster listens on 127.0.0.1 only (nothing is opened to the network), runs one worker process per
    core by default, each with ``threads_per_worker`` threads; its HTTP routes and dashboard listen on a free
    port of 127.0.0.1 (``client.dashboard_link``). With
    ``gpu``, it is a ``dask_cuda.LocalCUDACluster``: one worker per visible GPU.
    """
    from distributed import Client, LocalCluster

    if gpu and not scheduler:
        try:
            from dask_cuda import LocalCUDACluster
        except ImportError:
            raise DasknnError("--gpu needs CuPy and dask-cuda: pip install 'dasknn[gpu]'") from None
        with LocalCUDACluster(host="127.0.0.1", dashboard_address="127.0.0.1:0",
                              CUDA_VISIBLE_DEVICES=None if workers is None else list(range(workers)),
                              silence_logs=logging.ERROR) as cluster, Client(cluster) as client:
            yield client
        return
    if scheduler:
        try:
            client = Client(scheduler, timeout="20s")
        except OSError as e:
            raise DasknnError(f"cannot reach the Dask scheduler at {scheduler} ({e})") from None
        with client:
            yield client
        return
    n = workers or max(1, (os.cpu_count() or 1) // max(1, threads_per_worker))
    if n < 1 or threads_per_worker < 1:
        raise DasknnError("--workers and --threads-per-worker must be at least 1")
    with LocalCluster(
        n_workers=n,
        threads_per_worker=threads_per_worker,
        processes=True,
        host="127.0.0.1",
        # the scheduler's HTTP routes (and the dashboard, where bokeh is installed) on a free local port: a
        # fixed 8787 collides with any other cluster on the machine
        dashboard_address="127.0.0.1:0",
        memory_limit=memory_limit,
        silence_logs=logging.ERROR,
    ) as cluster, Client(cluster) as client:
        yield client
