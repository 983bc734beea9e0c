"""Partitioning work that runs on the Dask workers: each task reads the layers it needs from the store, so the
client holds owners arrays and summaries, never the layers."""

from __future__ import annotations

import numpy as np

from ..store import open_store
from .methods import partition_network
from .metrics import layer_volumes

#: Consecutive layers a sample partition covers (:func:`sample_volumes`).
SAMPLE_LAYERS = 3


def sample_window(depth: int, layers: int = SAMPLE_LAYERS) -> tuple[int, int]:
    """The layers ``first .. last`` (1-based, inclusive) a sample covers: up to ``layers`` around the middle one."""
    n = min(depth, layers)
    middle = max(1, depth // 2)
    first = max(1, min(middle - 1, depth - n + 1))
    return first, first + n - 1


def sample_volumes(path: str, parts: int, method: str, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A cheap estimate of the exchange a partition by ``method`` would need (it reads the layers it samples).

    The layers of :func:`sample_window` are partitioned on their own, by ``method`` where that is cheap
    (``block``, ``random``, ``fast``, ``fast-segments``) and by ``fast`` otherwise (the hypergraph methods send
    less, so the estimate errs towards a larger exchange).

    Returns
    -------
    tuple
        The sample's entries sent per image per layer divided by the layer's entries (one value per sampled
        layer after its first), and the owners rows ``middle - 1`` and ``middle`` of the network's middle layer.
    """
    store = open_store(path, check="lazy")
    first, last = sample_window(store.depth)
    layers = [store.layer(k) for k in range(first, last + 1)]
    cheap = method if method in ("block", "random", "fast", "fast-segments") else "fast"
    owners = partition_network(layers, parts, "fast" if cheap == "fast-segments" else cheap, seed=seed)
    per_entry = layer_volumes(layers, owners, parts=parts) / np.array([max(1, w.nnz) for w in layers], dtype=float)
    # the sample's first layer has its inputs free to follow its outputs (sends nothing): not like the network's
    per_entry = per_entry[1:] if per_entry.size > 1 else per_entry
    i = max(1, store.depth // 2) - first  # the middle layer's input row, in the sample's rows
    return per_entry, owners[i:i + 2]


def partition_task(path: str, parts: int, method: str, epsilon: float = 0.03, seed: int = 0,
                   threads: int | None = None) -> tuple[np.ndarray, dict]:
    """Partition the network stored at ``path`` on this worker (a task): its owners and report.

    The worker reads the layers from the store (a layer or two at a time for a large network) and gives
    Mt-KaHyPar ``threads`` threads (by default the CPUs it may use), so the client holds only the owners.
    """
    import time

    from .metrics import partition_report

    layers = open_store(path, check="metadata").partition_layers()
    t0 = time.perf_counter()
    owners = partition_network(layers, parts, method, epsilon=epsilon, seed=seed, threads=threads)
    seconds = time.perf_counter() - t0
    return owners, partition_report(layers, owners, method, seconds)


def partition_on_cluster(client, path: str, parts: int, method: str, epsilon: float = 0.03,
                         seed: int = 0) -> tuple[np.ndarray, dict]:
    """:func:`partition_task` on the worker of ``client``'s cluster with the most threads, given all of them."""
    info = client.scheduler_info()["workers"]
    worker = max(info, key=lambda w: info[w].get("nthreads", 1))
    future = client.submit(partition_task, path, parts, method, epsilon, seed, info[worker].get("nthreads", 1),
                           workers=[worker], allow_other_workers=True, pure=False)
    return future.result()
