"""The Python entry point, :func:`infer`: any network and any batch of images, in memory or stored, to categories.

Importing this module imports neither Dask nor Zarr: they load when :func:`infer` runs.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import scipy.sparse as sp

from .errors import DasknnError
from .network import Network

if TYPE_CHECKING:
    from .engine import InferenceResult
    from .engine.inputs import InputSource
    from .store import NetworkStore


def infer(
    network: str | os.PathLike[str] | Network | NetworkStore,
    images: Any = None,
    client: Any = None,
    *,
    truth: np.ndarray | str | os.PathLike[str] | None = None,
    dtype: str = "float64",
    mode: str = "auto",
    batch: int | None = None,
    keep_activations: bool = False,
    tmpdir: str | os.PathLike[str] | None = None,
    **options: Any,
) -> InferenceResult:
    """Run a sparse network on a batch of images on a Dask cluster; return the categories (0-based).

    ``dasknn.infer(network, images, client, truth=..., mode="model", partition="block")``: the first three
    positional, everything else by keyword; the engine's tuning options
    (:class:`~dasknn.engine.options.InferenceOptions`) are at the end.

    Parameters
    ----------
    network
        A dasknn store (a path or a URL), a published GraphChallenge network (``neuron{N}.tar.gz`` or a directory
        of ``n{N}-l{k}.tsv`` layers, imported into a temporary store first), or an in-memory
        :class:`dasknn.Network` (written to a temporary store first; see :func:`dasknn.store.write_network`), or a
        store opened with :func:`dasknn.store.open_store` (its metadata not read again, unless opened ``"lazy"``).
        Temporary stores live under ``tmpdir`` for the call: the workers must be able to read that folder.
    images
        The batch, rows are images: None (the inputs stored with the network), a path (an inputs store or a
        ``sparse-images-{N}.tsv[.gz]`` file), a ``scipy.sparse`` matrix or a NumPy array (scattered to the workers
        once, each chunk sliced from it there), or a ``dask.array`` whose chunks are NumPy, ``scipy.sparse`` or
        CuPy arrays. A dask.array is persisted on the workers and consumed chunk by chunk there (its row chunks
        are the inference's chunks); it is never gathered on the client.
    client
        A ``distributed.Client``. When None, a local cluster is started for the call and closed after it.
    truth
        The expected categories: an array of **0-based** image indices (as :attr:`categories` holds them and
        :func:`dasknn.io.read_categories` returns them), or a ``neuron{N}-l{L}-categories.tsv`` file (**1-based**,
        as published). By default, the truth stored with stored inputs, if any. The result's ``matches_truth``
        and ``mismatched`` (images in one and not the other) then say how they compare.
    dtype
        ``"float64"`` (the published truth is exact in it) or ``"float32"`` (faster; may differ on a few images).
    mode
        ``"data"``, ``"model"``, ``"hybrid"`` or ``"auto"`` (see :func:`dasknn.engine.infer`). The cost model's
        probe samples the batch's first images wherever they are: stored, scattered, or a dask.array's first
        chunk.
    batch
        Use only the first ``batch`` images.
    keep_activations
        Keep the final activations on the workers: the result's ``activations`` is then a ``dask.array``
        (images x neurons, chunked like the batch's rows, each chunk dense NumPy rows, dead images all zero),
        persisted on the workers, so it composes with ``dask.array`` code and ``to_zarr``. Needs ``client``
        (a cluster started for the call would take them with it). A worker lost after the call loses the
        chunks it held: where the images come from a store, computing them runs them again from the stores (time
        only); for images given as arrays it raises a :class:`~dasknn.errors.DasknnError` that says so.
    tmpdir
        Where temporary stores are written (the system's temporary folder by default).
    **options
        The engine's tuning options, by keyword (:class:`~dasknn.engine.options.InferenceOptions`):
        ``partition``, ``group_size``, ``chunks`` (fixed by a dask.array's row chunks), ``segment``,
        ``sync_every``, ``backend``, ``resident``, ``keep_layers``, ``results``, ``resume``, ``progress``,
        ``messages``, ``explain``, ``activations``, ``plan_store``, ``overlap``, ``exchange``, ``compress`` (images
        that converge computed once; on by default, exact).

    Returns
    -------
    dasknn.engine.InferenceResult
        ``categories``: the sorted **0-based** indices of the images whose final activations are not all zero
        (the published files count from 1); the timings; ``matches_truth`` and ``mismatched`` when there is a
        truth; ``activations`` with ``keep_activations``.

    Examples
    --------
    >>> result = dasknn.infer(network, scipy.sparse.csr_matrix(images))  # doctest: +SKIP
    >>> result.categories  # doctest: +SKIP
    """
    from .engine import infer as run
    from .engine.options import options_with
    from .runtime.recovery import ensure_client
    from .store import NetworkStore

    tuning = options_with(None, {**options, "mode": mode, "dtype": dtype, "keep_activations": keep_activations})
    if keep_activations and client is None:
        raise DasknnError("keep_activations needs a client: the activations stay on its workers")
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="dasknn-", dir=tmpdir)))
        path = _network_store(network, tmp)
        stored = _stored_inputs(images, path, tmp)
        expected = _truth(truth, stored, images, path, dtype)  # before a cluster: a wrong truth costs no run
        client = stack.enter_context(ensure_client(client))
        inputs = stored if stored is not None else _in_memory_source(images, client, batch)
        # a store opened already goes to the engine as it is: its metadata is not read again
        result = run(network if isinstance(network, NetworkStore) else path, inputs, client,
                     options_with(tuning, {"images": None if stored is None else batch}))
    if expected is not None:  # (the one comparison with the truth: the command line's and the challenge's too)
        expected = expected[expected < result.images]
        result.mismatched = int(np.setxor1d(result.categories, expected).size)
        result.matches_truth = result.mismatched == 0
    return result


def _network_store(network: str | os.PathLike[str] | Network | NetworkStore, tmp: Path) -> str:
    # the network as a store the workers read (its path): as it is, or written into the call's temporary folder
    from .ingest import import_network
    from .store import NetworkStore, is_store, location, write_network

    if isinstance(network, NetworkStore):
        return str(network.path)
    if isinstance(network, Network):
        return str(write_network(tmp / "network.zarr", network))
    if is_store(network):
        return str(location(network))
    return str(import_network(network, tmp / "network.zarr"))


def _stored_inputs(images: Any, network: str, tmp: Path) -> str | None:
    # the inputs as a store the workers read (a TSV file written into the call's temporary folder), or None for a
    # batch in memory
    from . import io
    from .store import is_store, location, open_store, write_inputs_store

    if images is None:
        return network
    if not isinstance(images, (str, os.PathLike)):
        return None
    if is_store(images):
        return str(location(images))
    rows = io.read_images(images, neurons=open_store(network, check="lazy").neurons)  # (the engine checks it)
    return str(write_inputs_store(tmp / "inputs.zarr", rows, source=os.fspath(images)))


def _in_memory_source(images: Any, client: Any, batch: int | None) -> InputSource:
    # a batch in memory as the engine's inputs: a dask.array's chunks, or an array scattered to the workers
    if hasattr(images, "__dask_graph__"):
        return _dask_source(images, client, batch)
    return _scattered_source(images, client)


def _scattered_source(images: Any, client: Any) -> InputSource:
    # an in-memory batch: scattered to the workers once, each chunk's task slices its rows there
    from .engine.inputs import InputSource, ScatteredRows
    from .kernels import rows_on_host
    from .runtime.scatter import scatter_to_all

    images = rows_on_host(images)  # a CuPy array or cupyx sparse matrix: host memory is what scatters
    if sp.issparse(images):
        images = sp.csr_matrix(images)  # row slices are cheap in CSR
    else:
        images = np.asarray(images)
    if images.ndim != 2 or images.shape[0] == 0:
        raise DasknnError(f"images must be a non-empty 2-D batch (images x neurons), not of shape {images.shape}")
    data = scatter_to_all(client, images, sorted(client.nthreads()))
    return InputSource(ScatteredRows(), int(images.shape[0]), int(images.shape[1]), data=data,
                       label=f"{type(images).__name__} {images.shape[0]} x {images.shape[1]}")


def _dask_source(images: Any, client: Any, batch: int | None) -> InputSource:
    # a dask.array: persisted on the workers, one row chunk per inference chunk; the client holds only futures
    from distributed import futures_of

    from .engine.inputs import ChunkRows, InputSource

    if images.ndim != 2 or images.shape[0] == 0:
        raise DasknnError(f"images must be a non-empty 2-D batch (images x neurons), not of shape {images.shape}")
    if batch is not None:
        images = images[:batch]
    arr = client.persist(images.rechunk({1: -1}))  # whole rows per chunk; a persisted array is kept as it is
    by_key = {f.key: f for f in futures_of(arr)}
    data = [by_key[row[0]] for row in arr.__dask_keys__()]
    edges = np.cumsum((0, *arr.chunks[0]))
    bounds = [(int(a), int(b)) for a, b in zip(edges[:-1], edges[1:])]
    return InputSource(ChunkRows(), int(arr.shape[0]), int(arr.shape[1]), data=data, bounds=bounds,
                       label=f"dask.array {arr.shape[0]} x {arr.shape[1]}")


def _truth(truth: Any, stored: str | None, images: Any, network: str, dtype: str) -> np.ndarray | None:
    # the expected categories as sorted 0-based indices: given (array 0-based, file 1-based), checked against the
    # network and the batch, or stored with the inputs
    from . import io
    from .store import open_inputs, open_store

    inputs = None if stored is None else open_inputs(stored)
    if truth is None:
        return None if inputs is None else inputs.truth(dtype)
    shape = open_store(network, check="lazy")  # (its shape: the engine checks its layers)
    rows = inputs.images if inputs is not None else _rows(images)
    return io.checked_truth(truth, rows, shape.neurons, shape.depth)


def _rows(images: Any) -> int | None:
    # the images of a batch in memory; None where not known (a dask.array of unknown chunks, something not 2-D)
    shape = getattr(images, "shape", None)
    shape = np.shape(images) if shape is None else shape
    return int(shape[0]) if len(shape) == 2 and not np.isnan(shape[0]) else None
