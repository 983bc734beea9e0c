"""Batch inference (:func:`infer`) and its result: argument checks, mode choice, recovery from lost workers."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import DasknnError
from ..modes import AUTO, DATA, HYBRID, MODEL
from ..runtime.recovery import WorkersLost, await_workers, ensure_client, smallest_memory_limit, workers_info
from ..store import location, open_results, open_store, read_results
from .execute import Job, Pass, execute
from .groups import check_mode
from .inputs import InputSource, stored_source
from .sizing import (WEIGHTS_SHARE, check_memory, chunk_bounds, default_chunks, fits, part_stream_keep,
                     partition_fits_worker, predict_modes)


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
    mode: str = "data"
    group_size: int = 1
    #: loading the weights and the images onto the workers, with the kernels' warm-up (untimed)
    load_seconds: float = 0.0
    #: compiling the kernels (or loading them from Numba's cache) before the clock: the longest warm-up among the
    #: workers, in the load phase; ``seconds`` is inference alone
    compile_seconds: float = 0.0
    #: computing the partition a model-mode run uses (0 when one was given or already kept in the store)
    partition_seconds: float = 0.0
    #: making the exchange plan of a model-mode run: every part's plan (resident), or the part plan it streams
    #: from out of core (then 0 when one was reused); 0 in data mode
    plan_seconds: float = 0.0
    tasks: int = 0
    plan_volume: list[int] = field(default_factory=list)
    bytes_sent: int = 0
    plan_bytes: int = 0
    #: per layer: bytes of the boundary messages as dense rows, and as built (measured on the workers)
    dense_message_bytes: list[int] = field(default_factory=list)
    message_bytes: list[int] = field(default_factory=list)
    #: per layer: the boundary messages' sizes as Dask's scheduler recorded them (what crossed)
    exchange_bytes: list[int] = field(default_factory=list)
    bytes_read: int = 0
    resident: bool = True
    computed_chunks: list[int] = field(default_factory=list)

    images_computed: int | None = None
    #: the cost model's predictions (``--mode auto`` or ``explain``) and the rates it used
    predictions: list[dict] = field(default_factory=list)
    calibration: dict | None = None
    #: each loss of workers the run survived: who, chunks kept and re-run, seconds waited for workers
    recoveries: list[dict] = field(default_factory=list)
    #: with ``keep_activations``: the final activations, a dask.array (images x neurons) chunked like the
    #: batch's rows and persisted on the workers (each chunk dense NumPy rows, the dead images' rows all zero). Its
    #: chunks live on the client that ran the inference: with several clients open, compute it with that one
    #: (``activations.compute(scheduler=client)``), since dask computes on the newest
    activations: object = None
    #: with a truth to compare (:func:`dasknn.infer`'s ``truth``): whether the categories match it, and how
    #: many images are in one and not the other
    matches_truth: bool | None = None
    mismatched: int | None = None

    @property
    def edges_per_second(self) -> float:
        """The challenge's rate: images x edges / inference seconds (images computed in this run, when resumed)."""
        n = self.images if self.images_computed is None else self.images_computed
        return n * self.edges / self.seconds if self.seconds > 0 and n > 0 else float("nan")


def infer(
    network: str | os.PathLike[str],
    inputs: str | os.PathLike[str] | InputSource | None = None,
    client=None,
    *,
    mode: str = "auto",
    partition: str | np.ndarray = "hypergraph",
    group_size: int | None = None,
    images: int | None = None,
    chunks: int | None = None,
    segment: int | None = None,
    sync_every: int = 2,
    dtype: str = "float64",
    backend: str = "cpu",
    resident: bool | None = None,
    keep_layers: int = 2,
    results: str | os.PathLike[str] | None = None,
    resume: bool = False,
    progress: Callable[[int, int], None] | None = None,
    messages: str = "compact",
    explain: bool = False,
    activations: bool = False,
    plan_store: str | os.PathLike[str] | None = None,
    keep_activations: bool = False,
    overlap: bool = False,
) -> InferenceResult:
    """Run batch inference of a stored network on stored inputs, on a Dask cluster.

    Parameters
    ----------
    network
        A dasknn store (see :mod:`dasknn.store`).
    inputs
        A store holding inputs (the network store itself by default), or an :class:`~dasknn.engine.inputs.InputSource`
        (arrays scattered to the workers, a dask.array's chunks: see :func:`dasknn.infer`).
    client
        A ``distributed.Client``; a local cluster is started (and closed) when None.
    mode
        ``"data"``, ``"model"`` or ``"hybrid"`` (see the module's description), or ``"auto"``: the mode the
        cost model (:mod:`dasknn.cost`) predicts fastest among those whose share of the weights fits.
    partition
        For model and hybrid modes: a method of :mod:`dasknn.partition`, a ``.npy`` owners file, or an array.
        A method's partition is computed once and kept in the store (when it is writable) for the next run. It is
        computed on a worker of the cluster, not the client, where a worker has the memory for it
        (:func:`~dasknn.engine.sizing.partition_fits_worker`).
    group_size
        Workers per group in hybrid mode (2 by default where the workers divide evenly).
    images
        Use only the first ``images`` inputs.
    chunks
        Number of image chunks (fixed by a dask.array's row chunks when the inputs are one). By default (:func:`default_chunks`) 2 per worker thread in data mode, so chunks
        pipeline through the layers, 1 per thread of a group in model and hybrid mode; more where a chunk's
        activations would not fit in a worker's memory.
    segment
        Data mode: layers per task (all by default: no exchange is needed between them).
    sync_every
        Model mode: layers between alive-mask exchanges that drop dead images.
    dtype
        ``"float64"`` (the default, as on the command line: the published truth is exact in it) or
        ``"float32"`` (faster; may differ from the truth on a few images that sit on the threshold).
    backend
        ``"cpu"`` (NumPy blocks, the Numba kernel) or ``"gpu"`` (CuPy blocks on each worker's GPU, the cuSPARSE
        kernel; run one worker per GPU, e.g. ``dask_cuda.LocalCUDACluster``). The kernels are chosen by the
        blocks' array type.
    resident
        Hold every layer (data mode) or every layer's share of a part (model and hybrid modes) in each worker's
        memory (fast when it fits), or stream them from the store as they are needed, at most ``keep_layers``
        at once with the next read ahead (out of core: the weights never all load). Default: resident when a
        worker's weights take at most a quarter of its memory. Model mode out of core streams each part's
        columns from a *part plan* (see ``plan_store``), so each worker reads only its share.
    keep_layers
        Layers a streaming worker holds at once (the one computing and the one being read ahead). Model and
        hybrid modes keep one more for each further chunk of a worker where that fits
        (:func:`~dasknn.engine.sizing.part_stream_keep`), so no chunk reads its part's layers again.
    results
        A Zarr results store: each chunk's categories are written there by its worker as it finishes.
    resume
        Continue the run that wrote ``results``: chunks already written are read back, not recomputed.
    progress
        Called as ``progress(done, total)`` as chunks finish.
    messages
        Model mode: ``"compact"`` boundary messages (a nonzero bitmap and the nonzero values, or one value when
        they are all equal, whichever is smallest) or ``"dense"`` rows.
    activations
        Also write each chunk's final activations (the surviving images' last rows) into ``results``, chunk by
        chunk (read them with :func:`dasknn.store.read_activations`).
    plan_store
        Model and hybrid modes out of core: where the part plan is kept (each part's blocks of every layer,
        indexed into the rows it reads, and its exchange lists), written by the workers once per network and
        partition and reused after. Default: inside the network store, under ``plans/``. On a cluster of
        several machines it must be a folder every worker can reach.
    explain
        Predict every mode's time with the cost model (:mod:`dasknn.cost`), even where ``mode`` is given; the
        predictions and the calibration are in the result.
    keep_activations
        Keep each chunk's final activations on its worker: the result's ``activations`` is then a dask.array of
        them (images x neurons, chunked like the chunks).
    overlap
        Model and hybrid modes: each part computes the outputs other parts read next first and sends them, then
        the rest while they travel, so no part waits for another's whole layer (two tasks per part and layer;
        CPU only; sync layers then at least 2 apart, their masks arriving two layers on). Off by default: on a
        streamed 65,536-wide network it ran slower, its layer reads no longer hidden in the parts' waits
        (BENCHMARKS.md).
    """
    path, store, source, count = _checked(network, inputs, images, dtype, sync_every, activations, results,
                                          messages, backend, chunks, resume and keep_activations)
    in_path = source.path
    if client is None:
        with ensure_client() as c:
            return infer(path, source, c, mode=mode, partition=partition, group_size=group_size, images=count,
                         chunks=chunks, segment=segment, sync_every=sync_every, dtype=dtype, backend=backend,
                         resident=resident, keep_layers=keep_layers, results=results, resume=resume,
                         progress=progress, messages=messages, explain=explain, activations=activations,
                         plan_store=plan_store, keep_activations=keep_activations, overlap=overlap)

    if overlap and backend != "cpu":
        raise DasknnError("overlap splits each layer's kernel by columns, which only the CPU kernel does: "
                          "leave it off with backend='gpu'")
    workers, threads, memory = _cluster(client)
    # by sizes alone: each worker would hold its share of the weights (values + indices) in memory
    weight_bytes = store.edges * (np.dtype(dtype).itemsize + 4)
    predictions: list = []
    calibration = None
    if mode == AUTO and backend == "gpu":
        # data mode on GPUs: the cost model is calibrated with the CPU kernels, and model mode's messages cross
        # device -> host -> network -> host -> device every layer (--explain still shows the CPU predictions)
        mode = DATA
    if mode == AUTO or explain:
        # the probe samples the inputs store, or rows in memory: the scattered batch, a dask.array's first chunk
        sample = in_path if in_path is not None else source.data_for(0)
        calibration, predictions = predict_modes(client, workers, threads, store, path, sample, count, dtype,
                                                 memory, weight_bytes, partition, chunks, sync_every, resident,
                                                 explain, group_size if mode == HYBRID else None)
    if mode == AUTO:
        from ..cost import cheapest

        best = cheapest(predictions)
        mode, group_size = best.mode, best.group_size
        if resident is None and best.group_size == 1:
            resident = best.resident
    g = check_mode(mode, len(workers), group_size)
    if resident is None:
        resident = weight_bytes / g <= WEIGHTS_SHARE * memory
    if chunks is None:
        chunks = default_chunks(count, threads, len(workers), g, resident,
                                lambda width: fits(store, dtype, resident, keep_layers, g, memory, width))
    bounds = source.bounds or chunk_bounds(count, chunks)
    done: set[int] = set()
    if results is not None:
        results = str(Path(results).resolve())
        run_desc = {"network": path, "inputs": in_path or source.label, "images": count, "dtype": dtype,
                    "chunks": bounds}
        bounds, done = open_results(results, run_desc, resume, activations)
    width = max(b - a for a, b in bounds)
    if g > 1 and not resident:
        # a part's stream keeps a layer more for each further chunk of its worker, where that fits
        wider = part_stream_keep(keep_layers, len(bounds), len(workers) // g)
        keep_layers = wider if fits(store, dtype, resident, wider, g, memory, width) else keep_layers
    job = Job(path=path, source=source, store=store, dtype=dtype, backend=backend, resident=resident,
              keep_layers=keep_layers, segment=segment, sync_every=sync_every, compact=messages == "compact",
              results=results, activations=activations, bounds=bounds, partition=partition, progress=progress,
              plan_store=None if plan_store is None else str(Path(plan_store).resolve()), keep=f"activations-{uuid.uuid4().hex[:8]}" if keep_activations else None,
              partition_on_cluster=partition_fits_worker(store.neurons, memory),
              overlap=overlap)
    check_memory(store, dtype, resident, keep_layers, g, memory, width)
    todo = [c for c in range(len(bounds)) if c not in done]
    runs = _run_recovering(client, job, workers, mode, group_size, todo)
    return _result(job, runs, mode, group_size, count, todo, done, predictions, calibration)


def _checked(network, inputs, images: int | None, dtype: str, sync_every: int, activations: bool, results,
             messages: str, backend: str, chunks: int | None, keep_resumed: bool) -> tuple:
    # the arguments checked before any cluster is asked: (network path, its store, input source, images)
    if dtype not in ("float32", "float64"):
        raise DasknnError(f"--dtype must be float32 or float64, not {dtype}")
    path = str(location(network))  # a local store, or a URL the workers read through fsspec
    store = open_store(path, check="metadata")  # the workers check every block they read
    source = inputs if isinstance(inputs, InputSource) else stored_source(
        path if inputs is None else str(location(inputs)))
    if source.neurons != store.neurons:
        raise DasknnError(f"the inputs have {source.neurons} pixels per image, the network {store.neurons} neurons",
                          source.label)
    count = source.images if images is None else images
    if not 1 <= count <= source.images:
        raise DasknnError(f"--batch must be between 1 and {source.images} (the stored images), not {count}")
    if source.bounds is not None and (count != source.images or chunks is not None):
        raise DasknnError("a dask.array's row chunks are the chunks: slice or rechunk the array instead")
    if keep_resumed:
        raise DasknnError("keep_activations needs every chunk computed: it cannot resume a run")
    if sync_every < 1:
        raise DasknnError("--sync-every must be at least 1")
    if activations and results is None:
        raise DasknnError("--activations needs --results (the store they are written to)")
    if messages not in ("compact", "dense"):
        raise DasknnError(f"--messages must be compact or dense, not {messages!r}")
    if backend not in ("cpu", "gpu"):
        raise DasknnError(f"backend must be cpu or gpu, not {backend!r}")
    return path, store, source, count


def _cluster(client) -> tuple[list[str], int, float]:
    # the workers (sorted), their threads, and the smallest memory limit among them
    info = workers_info(client)
    workers = sorted(info)
    if not workers:
        raise DasknnError("the Dask cluster has no workers")
    memory = smallest_memory_limit(info)
    threads = sum(w["nthreads"] for w in info.values())
    return workers, threads, memory


@dataclass
class _Runs:
    """The passes of one inference and the losses of workers it survived."""

    passes: list[Pass] = field(default_factory=list)
    recoveries: list[dict] = field(default_factory=list)
    finished: dict[int, tuple] = field(default_factory=dict)
    workers: list[str] = field(default_factory=list)


def _run_recovering(client, job: Job, workers: list[str], mode: str, group_size: int | None,
                    todo: list[int]) -> _Runs:
    # inference's recovery policy: a lost worker loses its blocks and the activations it held, so the chunks not
    # finished are run again on the workers there are then (the finished ones are kept), with the partition
    # redone if their number changed; at most MAX_RECOVERIES times
    runs = _Runs(workers=workers)
    remaining = list(todo)
    while remaining:
        # after a loss the groups are redone: a hybrid group size the workers left no longer divide is dropped
        fitting = group_size if group_size and len(runs.workers) % group_size == 0 else None
        g = check_mode(mode, len(runs.workers), fitting if runs.passes else group_size)
        try:
            one = execute(client, job, runs.workers, g, remaining)
            runs.passes.append(one)
            runs.finished.update(one.chunks)
            remaining = []
        except WorkersLost as lost:
            runs.passes.append(lost.partial)
            runs.finished.update(lost.partial.chunks)
            remaining = [c for c in remaining if c not in runs.finished]
            if len(runs.recoveries) >= MAX_RECOVERIES:
                raise DasknnError(f"workers were lost {len(runs.recoveries) + 1} times ({', '.join(lost.lost)}); "
                                  "giving up: if they ran out of memory, raise --memory-limit, use --stream, more "
                                  "--chunks or --keep-layers 1; else see the workers' logs") from None
            t0 = time.perf_counter()
            runs.workers = await_workers(client, len(runs.workers), AWAIT_WORKERS_SECONDS)
            if not runs.workers:
                raise DasknnError("every Dask worker was lost and none came back")
            waited = round(time.perf_counter() - t0, 3)
            runs.recoveries.append({"lost": lost.lost, "chunks_kept": len(runs.finished),
                                    "chunks_rerun": len(remaining), "waited_seconds": waited,
                                    "workers_now": len(runs.workers)})
    return runs


def _result(job: Job, runs: _Runs, mode: str, group_size: int | None, count: int, todo: list[int], done: set[int],
            predictions: list, calibration) -> InferenceResult:
    # the passes' figures summed, the categories of the chunks run and of those read back
    store, passes, bounds = job.store, runs.passes, job.bounds
    last = passes[-1] if passes else None
    plan = last.plan if last else None
    ids = [runs.finished[c][0] for c in todo]
    per_layer = sum((p.per_layer for p in passes), np.zeros((store.depth, 3), dtype=np.int64))
    if done:
        ids.extend(read_results(job.results, done).values())
    cats = np.sort(np.concatenate(ids)) if ids else np.empty(0, dtype=np.int64)
    g = last.group_size if last else check_mode(mode, len(runs.workers), group_size)
    return InferenceResult(
        categories=cats, images=count, neurons=store.neurons, layers=store.depth, edges=store.edges,
        seconds=sum(p.seconds for p in passes), workers=len(runs.workers), chunks=len(bounds),
        mode=mode, group_size=g, load_seconds=sum(p.load_seconds for p in passes),
        compile_seconds=sum(p.compile_seconds for p in passes),
        partition_seconds=sum(p.partition_seconds for p in passes), plan_seconds=sum(p.plan_seconds for p in passes),
        tasks=sum(p.tasks for p in passes), plan_volume=[] if plan is None else plan.volumes().tolist(),
        bytes_sent=sum(p.bytes_sent for p in passes), plan_bytes=sum(p.plan_bytes for p in passes),
        dense_message_bytes=per_layer[:, 0].tolist() if plan else [],
        message_bytes=per_layer[:, 1].tolist() if plan else [],
        exchange_bytes=per_layer[:, 2].tolist() if plan else [], bytes_read=sum(p.bytes_read for p in passes),
        resident=job.resident, computed_chunks=todo,
        images_computed=sum(bounds[c][1] - bounds[c][0] for c in todo),
        predictions=[p.as_dict() for p in predictions],
        calibration=None if calibration is None else calibration.as_dict(), recoveries=runs.recoveries,
        activations=_kept_array(job, runs) if job.keep else None,
    )


def _kept_array(job: Job, runs: _Runs):
    # the chunks' final activations, as a dask.array whose chunks are the futures the workers hold
    import dask.array as da

    kept = {c: f for p in runs.passes for c, f in p.kept.items() if c in runs.finished}
    name = job.keep
    graph = {(name, c, 0): kept[c] for c in range(len(job.bounds))}
    rows = tuple(b - a for a, b in job.bounds)
    return da.Array(graph, name, chunks=(rows, (job.store.neurons,)), dtype=job.dtype)


#: Times an inference re-runs its unfinished chunks after losing workers before it gives up.
MAX_RECOVERIES = 3


#: Seconds an inference waits after losing workers for as many to be back (a nanny restarts a killed one).
AWAIT_WORKERS_SECONDS = 60.0
