"""Running inference on a Dask cluster.

Data-parallel for now: the batch is cut into chunks of images; every worker loads the layers once, straight
from the store, and each chunk runs through all layers in one task on the worker that holds its images. Nothing
but the store's path, block bounds and the category indices passes through the client.

Timing follows the challenge: the clock starts when the weights and inputs sit in the workers' memory and
stops when the categories are back on the client.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from . import reference
from .errors import DasknnError
from .store import open_inputs, open_store


@dataclass
class InferenceResult:
    """What an inference run produced and how long it took."""

    categories: np.ndarray
    images: int
    neurons: int
    layers: int
    edges: int
    seconds: float
    workers: int
    chunks: int
    load_seconds: float = 0.0
    extra: dict = field(default_factory=dict)

    @property
    def edges_per_second(self) -> float:
        """The challenge's rate: images x edges / inference seconds."""
        return self.images * self.edges / self.seconds if self.seconds > 0 else float("nan")


def _load_weights(path: str, dtype: str) -> list[sp.csr_matrix]:
    # Runs on a worker: the layers come from the store, never through the client. CSR because the
    # reference product is row-major over images.
    store = open_store(path, check="metadata")
    return [w.astype(dtype).tocsr() for w in store.iter_layers()]


def _load_images(path: str, start: int, stop: int, dtype: str) -> sp.csr_matrix:
    return open_inputs(path).rows(start, stop).astype(dtype)


def _run_chunk(weights: list[sp.csr_matrix], images: sp.csr_matrix, start: int, bias: float, ymax: float) -> np.ndarray:
    y = reference.infer(weights, images, bias, ymax, images.dtype)
    return reference.categories(y) + start


def chunk_bounds(images: int, chunks: int) -> list[tuple[int, int]]:
    """Split ``images`` into ``chunks`` contiguous, nearly equal ranges."""
    edges = np.linspace(0, images, max(1, min(chunks, images)) + 1).round().astype(int)
    return [(int(a), int(b)) for a, b in zip(edges[:-1], edges[1:]) if b > a]


def infer(
    network: str | os.PathLike[str],
    inputs: str | os.PathLike[str] | None = None,
    client=None,
    *,
    images: int | None = None,
    chunks: int | None = None,
    dtype: str = "float32",
    progress: Callable[[int, int], None] | None = None,
) -> InferenceResult:
    """Run batch inference of a stored network on stored inputs, on a Dask cluster.

    Parameters
    ----------
    network
        A dasknn store (see :mod:`dasknn.store`).
    inputs
        A store holding inputs; the network store itself by default.
    client
        A ``distributed.Client``; a local cluster is started (and closed) when None.
    images
        Use only the first ``images`` inputs.
    chunks
        Number of image chunks (tasks); 4 per worker thread by default, for balance.
    dtype
        ``"float32"`` or ``"float64"``.
    progress
        Called as ``progress(done, total)`` as chunks finish.
    """
    if dtype not in ("float32", "float64"):
        raise DasknnError(f"--dtype must be float32 or float64, not {dtype}")
    path = str(Path(network).resolve())
    store = open_store(path)
    in_path = path if inputs is None else str(Path(inputs).resolve())
    batch = open_inputs(in_path)
    if batch.neurons != store.neurons:
        raise DasknnError(f"the inputs have {batch.neurons} pixels per image, the network {store.neurons} neurons",
                          in_path)
    count = batch.images if images is None else images
    if not 1 <= count <= batch.images:
        raise DasknnError(f"--batch must be between 1 and {batch.images} (the stored images), not {count}")
    if client is None:
        from .cluster import local_client

        with local_client() as c:
            return infer(path, in_path, c, images=count, chunks=chunks, dtype=dtype, progress=progress)

    from distributed import wait

    workers = sorted(client.scheduler_info(n_workers=-1)["workers"])
    if not workers:
        raise DasknnError("the Dask cluster has no workers")
    threads = sum(w["nthreads"] for w in client.scheduler_info(n_workers=-1)["workers"].values())
    bounds = chunk_bounds(count, chunks or 4 * threads)
    run = uuid.uuid4().hex[:8]

    t0 = time.perf_counter()
    weights = {
        w: client.submit(_load_weights, path, dtype, key=f"load-weights-w{i}-{run}", workers=[w],
                         allow_other_workers=False, pure=False)
        for i, w in enumerate(workers)
    }
    placed = [workers[c % len(workers)] for c in range(len(bounds))]
    blocks = [
        client.submit(_load_images, in_path, a, b, dtype, key=f"load-images-c{c}-{run}", workers=[w],
                      allow_other_workers=False, pure=False)
        for c, ((a, b), w) in enumerate(zip(bounds, placed))
    ]
    wait(list(weights.values()) + blocks)
    for f in list(weights.values()) + blocks:
        if f.status == "error":
            f.result()  # re-raise the worker's DasknnError here
    load_seconds = time.perf_counter() - t0

    t0 = time.perf_counter()
    futures = [
        client.submit(_run_chunk, weights[w], blk, a, store.bias, store.ymax, key=f"infer-l1-{store.depth}-c{c}-{run}",
                      workers=[w], allow_other_workers=False, pure=False)
        for c, ((a, _), w, blk) in enumerate(zip(bounds, placed, blocks))
    ]
    from distributed import as_completed

    found = []
    for done, fut in enumerate(as_completed(futures), start=1):
        found.append(fut.result())
        if progress is not None:
            progress(done, len(futures))
    seconds = time.perf_counter() - t0
    cats = np.sort(np.concatenate(found)) if found else np.empty(0, dtype=np.int64)
    client.cancel(list(weights.values()) + blocks + futures)
    return InferenceResult(
        categories=cats, images=count, neurons=store.neurons, layers=store.depth, edges=store.edges,
        seconds=seconds, workers=len(workers), chunks=len(bounds), load_seconds=load_seconds,
    )
