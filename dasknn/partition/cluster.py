"""Partitioning work that runs on the Dask workers: each task reads the layers it needs from the store, so the
client holds owners arrays and summaries, never the layers."""

from __future__ import annotations

import numpy as np

from ..store import open_store
from .methods import partition_network
from .metrics import layer_volumes

#: Consecutive layers a sample partition covers (:func:`sample_volumes`).
SAMPLE_LAYERS = 4


def sample_window(depth: int, layers: int = SAMPLE_LAYERS) -> tuple[int, int]:
    """The layers ``first .. last`` (1-based, inclusive) a sample covers: up to ``layers`` around the middle one."""
    n = min(depth, layers)
    middle = max(1, depth // 2)
    first = max(1, min(middle - 1, depth - n + 1))
    return first, first + n - 1


def sample_volumes(path: str, parts: int, method: str, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A cheap estimate of the exchange a partition by ``method`` would need (a task: it reads the layers).

    The layers of :func:`sample_window` are partitioned on their own, by ``method`` where that is cheap
    (``block``, ``random``, ``fast``, ``fast-segments``) and by ``fast`` otherwise (the hypergraph methods send
    less, so the estimate errs towards a larger exchange).

    Returns
    -------
    tuple
        The sample's entries sent per image per layer divided by the layer's entries (one value per sampled
        layer), and the owners rows ``middle - 1`` and ``middle`` of the network's middle layer.
    """
    store = open_store(path, check="lazy")
    first, last = sample_window(store.depth)
    layers = [store.layer(k) for k in range(first, last + 1)]
    cheap = method if method in ("block", "random", "fast", "fast-segments") else "fast"
    owners = partition_network(layers, parts, "fast" if cheap == "fast-segments" else cheap, seed=seed)
    per_entry = layer_volumes(layers, owners, parts=parts) / np.array([max(1, w.nnz) for w in layers], dtype=float)
    i = max(1, store.depth // 2) - first  # the middle layer's input row, in the sample's rows
    return per_entry, owners[i:i + 2]
