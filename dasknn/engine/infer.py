"""Batch inference (:func:`infer`) and its result: argument checks, mode choice, recovery from lost workers."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from .. import timings
from ..cost import Calibration, Prediction
from ..errors import DasknnError
from ..locations import is_url
from ..modes import AUTO, DATA, HYBRID, PIPELINE
from ..runtime.dashboard import publish_traffic
from ..runtime.kept import detach
from ..runtime.recovery import Recovery, ensure_client, memory_of, smallest_memory_limit, workers_info
from ..stages import StagePlacement, place_stages, stage_capacity
from ..store import NetworkStore, location, open_results, open_store, read_results
from .data_mode import ChunkAgain
from .execute import Job, LayerBytes, Pass, execute
from .groups import check_mode
from .inputs import InputSource, StoredRows, stored_source
from .options import InferenceOptions, options_with
from .places import Slot, keep_places, most_parts
from .sizing import (WEIGHTS_SHARE, ProbeUnfit, check_memory, chunk_bounds, data_mode_alone, default_chunks,
                     fits, holds_weights, part_stream_keep, partition_fits_worker, pipeline_chunks,
                     pipeline_prediction, predict_modes, stream_hold_bytes)


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
    #: model and hybrid modes: the transport the boundary messages took (:mod:`dasknn.runtime.exchange`)
    exchange: str = ""
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
    #: per layer: what the boundary messages took to other workers, as the exchange counted them
    exchange_bytes: list[int] = field(default_factory=list)
    #: ``exchange_pairs[p][q]``: what part p's messages took to part q's worker (the groups' together)
    exchange_pairs: list[list[int]] = field(default_factory=list)
    bytes_read: int = 0
    resident: bool = True
    computed_chunks: list[int] = field(default_factory=list)

    images_computed: int | None = None
    #: the cost model's predictions (``--mode auto`` or ``explain``) and the rates it used
    predictions: list[Prediction] = field(default_factory=list)
    calibration: Calibration | None = None
    #: each loss of workers the run survived: who, chunks kept and re-run, seconds waited for workers
    recoveries: list[dict] = field(default_factory=list)
    #: ``auto`` (or ``explain``) without the cost model, in one line: why its probe could not run and which mode
    #: ran instead ("" where it ran)
    probe_skipped: str = ""
    #: pipeline mode: each stage's first and last layer (1-based, inclusive), as the last pass cut them
    stages: list[list[int]] = field(default_factory=list)
    #: with ``keep_activations``: the final activations, a dask.array (images x neurons) chunked like the
    #: batch's rows and persisted on the workers (each chunk dense NumPy rows, the dead images' rows all zero). Its
    #: chunks live on the client that ran the inference: with several clients open, compute it with that one
    #: (``activations.compute(scheduler=client)``), since dask computes on the newest. A worker lost after the run
    #: loses the chunks it held: where the network and the images are stores, computing them runs them again from
    #: the stores; else it fails with a line that says so (run the inference again)
    activations: object = None
    #: with a truth to compare (:func:`dasknn.infer`'s ``truth``): whether the categories match it, and how
    #: many images are in one and not the other
    matches_truth: bool | None = None
    mismatched: int | None = None
    #: one entry a layer summed over the chunks computed: the images alive after it, and the columns it computed
    #: (data and pipeline modes: each distinct vector once where ``compress``, every alive image where not; model
    #: and hybrid modes: the columns the parts' steps ran over, the images alive and distinct as of the last sync
    #: layer's compaction)
    layer_alive: list[int] = field(default_factory=list)
    layer_columns: list[int] = field(default_factory=list)
    #: the edges the kernels multiplied: each layer's entries x the columns it computed (None where not counted)
    edges_multiplied: int | None = None

    @property
    def edges_per_second(self) -> float:
        """The challenge's rate: images x edges / inference seconds (images computed in this run, when resumed)."""
        n = self.images if self.images_computed is None else self.images_computed
        return n * self.edges / self.seconds if self.seconds > 0 and n > 0 else float("nan")

    @property
    def multiplied_per_second(self) -> float:
        """The edges the kernels actually multiplied per inference second (each distinct vector once, dead images
        not at all); nan where the mode does not count them."""
        done = self.edges_multiplied
        return done / self.seconds if done is not None and self.seconds > 0 else float("nan")


def infer(network: str | os.PathLike[str] | NetworkStore, inputs: str | os.PathLike[str] | InputSource | None = None,
          client=None, options: InferenceOptions | None = None, **changes) -> InferenceResult:
    """Run batch inference of a stored network on stored inputs, on a Dask cluster.

    Parameters
    ----------
    network
        A dasknn store (see :mod:`dasknn.store`): its path or URL, or the store opened (its metadata not read again
        where it was read on opening: :func:`~dasknn.store.open_store` with any ``check`` but ``"lazy"``).
    inputs
        A store holding inputs (the network store itself by default), or an :class:`~dasknn.engine.inputs.InputSource`
        (arrays scattered to the workers, a dask.array's chunks: see :func:`dasknn.infer`).
    client
        A ``distributed.Client``; a local cluster is started (and closed) when None.
    options
        How to run (:class:`~dasknn.engine.options.InferenceOptions`: the mode, the partition, chunks, dtype, ...).
    **changes
        Options given by keyword instead (each a field of :class:`~dasknn.engine.options.InferenceOptions`,
        over ``options``): ``infer(store, mode="model", dtype="float32")``.
    """
    options = options_with(options, changes)
    path, store, source, count = checked_arguments(network, inputs, options)
    with ensure_client(client) as c:
        return _infer_on(c, path, store, source, count, options)


def _infer_on(client, path: str, store, source: InputSource, count: int, o: InferenceOptions) -> InferenceResult:
    # the run on a client: the mode, the sizes, the job; its passes under the recovery policy; the result
    workers, threads, memory = _cluster(client)
    # every phase on the cluster runs under one policy for lost workers (the probe, the partition, the plan, the
    # loads, the pass): each redoes only what a loss left unfinished
    recovery = Recovery(client, "inference", workers, max_losses=MAX_RECOVERIES, wait_seconds=AWAIT_WORKERS_SECONDS,
                        advice=GIVE_UP_ADVICE)
    # by sizes alone: each worker would hold its share of the weights (values + indices) in memory
    weight_bytes = store.edges * (np.dtype(o.dtype).itemsize + 4)
    mode, group_size, resident = o.mode, o.group_size, o.resident
    predictions: list = []
    calibration = None
    skipped = ""
    if mode == AUTO and o.backend == "gpu":
        # data mode on GPUs: the cost model is calibrated with the CPU kernels, and model mode's messages cross
        # device -> host -> network -> host -> device every layer (--explain still shows the CPU predictions)
        mode = DATA
    if mode == AUTO and not o.explain and data_mode_alone(resident, weight_bytes, memory, count, threads,
                                                          is_url(path)):
        # no other mode is weighed there: the calibration would only predict the mode auto must run
        mode = DATA
    if mode == AUTO or o.explain:
        # the probe samples the inputs store, or rows in memory: the scattered batch, a dask.array's first chunk
        sample = source.path if source.path is not None else source.data_for(0)
        try:
            calibration, predictions = _probe(recovery, store, path, sample, count, weight_bytes, o,
                                              group_size if mode == HYBRID else None, mode == PIPELINE)
        except ProbeUnfit as why:
            # without the cost model: auto runs the mode that needs least memory, data mode (no partition, no plan;
            # streamed where the weights do not fit, chunks as narrow as a worker needs)
            skipped = f"{why}: {'ran data mode, which needs least memory' if mode == AUTO else 'no predictions'}"
            mode = DATA if mode == AUTO else mode
        if recovery.losses:  # the run is sized for the workers there are now
            workers, threads, memory = _cluster(client, recovery.workers)
    if mode == AUTO:
        from ..cost import cheapest

        best = cheapest(predictions)
        mode, group_size = best.mode, best.group_size
        if resident is None and best.group_size == 1:
            resident = best.resident
    g = check_mode(mode, len(workers), group_size)
    if mode == PIPELINE and g > store.depth:
        raise DasknnError(f"pipeline mode gives each of its {g} workers a stage of at least one layer, and the "
                          f"network has {store.depth}: give --group-size {store.depth} or fewer (dividing the "
                          f"workers), or use fewer workers")
    # (a chunk's images as pipeline mode cuts them by default, for the stages' work: its multiply-adds against what
    # each layer costs whatever they are)
    chunk_images = count / max(1, o.chunks or pipeline_chunks(count, g, max(1, len(workers) // g), 0))
    stage_work = _stage_work(store, calibration, chunk_images) if mode == PIPELINE else None
    # pipeline mode: the stages cut so that each fits the workers placed at it where a cut can (their memory
    # limits may differ)
    per_byte = stage_capacity(weight_bytes, store.edges, 1.0, WEIGHTS_SHARE) if mode == PIPELINE else None
    if resident is None and stage_work is None:
        resident = holds_weights(None, weight_bytes, memory, g)
    elif resident is None:
        limits = memory_of(client, workers)
        resident = _placement(store, stage_work, g, limits, per_byte).fits
        if resident and calibration is not None:
            # a cut whose every stage fits may be less balanced than the cut by work alone (workers of different
            # memory): the stages are held only where the cost model predicts that faster than streaming them
            held, streamed = (pipeline_prediction(calibration, store, count, threads, len(workers), g, o.chunks,
                                                  o.dtype, memory, weight_bytes, r, list(limits.values()),
                                                  o.keep_layers)
                              for r in (True, False))
            resident = held.seconds <= streamed.seconds
    if stage_work is not None and not resident:
        # streamed stages: each layer's read counts in its work too
        stage_work = _stage_work(store, calibration, chunk_images, weight_bytes)

    def shares(g: int, ws: list[str]) -> list[tuple[float, float]]:
        return _shares(store, stage_work, resident, per_byte, g, memory_of(client, ws))

    job = _job(path, store, source, count, o, resident, g, workers, threads, memory, shares(g, workers),
               stage_work, per_byte)
    todo = [c for c in range(len(job.bounds)) if c not in job.done]
    width = max(b - a for a, b in job.bounds)

    def check_fits(g: int, ws: list[str]) -> None:
        # after a loss: the work must still fit the workers there are
        for holds, limit in shares(g, ws):
            check_memory(store, o.dtype, resident, job.keep_layers, holds, limit, width)

    def fits_holding(g: int, ws: list[str], most: int) -> bool:
        # after a loss, model and hybrid modes: whether the workers can hold the parts kept where a worker holds
        # ``most`` of them (a survivor holding the lost worker's part beside its own)
        return all(fits(store, o.dtype, resident, job.keep_layers, holds / most, limit, width)
                   for holds, limit in shares(g, ws))

    runs = _run_recovering(client, job, recovery, mode, group_size, todo, check_fits, fits_holding)
    timings.enter("results")  # the categories gathered, the activations kept, the traffic published
    if job.activations_name:
        runs.kept = _detached_activations(client, job, runs)
    result = _result(job, runs, mode, group_size, count, todo, job.done, predictions, calibration)
    result.probe_skipped = skipped
    if result.exchange_bytes:
        # the boundary traffic, on the dashboard's /dasknn/traffic page
        publish_traffic(client, result)
    return result


def _stage_work(store, calibration, chunk_images: float, streamed_bytes: float | None = None) -> np.ndarray:
    # pipeline mode: each layer's work on a chunk (cost.stage_work; its entries alone where nothing was probed),
    # streamed (``streamed_bytes``: the network's, decoded) with each layer's read
    from ..cost import stage_work

    nnz = store.layer_entries().astype(float)
    layer_bytes = None if streamed_bytes is None else streamed_bytes * nnz / max(1.0, nnz.sum())
    return stage_work(calibration, nnz, chunk_images, layer_bytes)


def _shares(store, stage_work: np.ndarray | None, resident: bool, per_byte: float | None, g: int,
            memory: dict[str, float]) -> list[tuple[float, float]]:
    # what the memory checks weigh on workers of the ``memory`` limits (in their order) in groups of g, for each
    # kind of worker: (what the weights are divided by, the smallest limit); resident in pipeline mode, for each
    # stage: the network's entries over the stage's (the stages are cut by work, not entries: a stage of layers
    # whose images mostly died holds more of them), and the smallest limit among the workers placed at it
    if stage_work is None or not resident:
        return [(g if stage_work is None else 1, min(memory.values()))]
    placed = _placement(store, stage_work, g, memory, per_byte)
    nnz = store.layer_entries()
    return [(store.edges / max(1, int(nnz[stage.first - 1:stage.last].sum())),
             min(memory[members[s]] for members in placed.groups)) for s, stage in enumerate(placed.stages)]


def _placement(store, stage_work: np.ndarray, g: int, memory: dict[str, float], per_byte: float) -> StagePlacement:
    # pipeline mode: the stages for pipelines of g of the workers of the ``memory`` limits (in their order), placed
    # by those limits
    workers = list(memory)
    groups = [workers[i:i + g] for i in range(0, len(workers), g)]
    return place_stages(stage_work, store.layer_entries(), groups, memory, per_byte)


def _job(path: str, store, source: InputSource, count: int, o: InferenceOptions, resident: bool, g: int,
         workers: list[str], threads: int, memory: float, shares: list[tuple[float, float]],
         stage_work: np.ndarray | None = None, per_byte: float | None = None) -> Job:
    # the chunks (and the results store's: a resumed run keeps its chunks), the layers a stream keeps, checked to
    # fit the workers' memory: ``shares`` as (what the weights are divided by, the memory limit) for each kind of
    # worker (data, model, hybrid and streamed pipeline modes one; a resident pipeline each place of its stages)
    def fit(keep: int, width: int) -> bool:
        return all(fits(store, o.dtype, resident, keep, holds, limit, width) for holds, limit in shares)

    chunks = o.chunks or default_chunks(count, threads, len(workers), g, resident,
                                        lambda width: fit(o.keep_layers, width))
    if stage_work is not None and not o.chunks:
        chunks = pipeline_chunks(count, g, len(workers) // g, chunks)
    bounds = source.bounds or chunk_bounds(count, chunks)
    done: set[int] = set()
    results = None if o.results is None else str(location(o.results))
    if results is not None:
        run_desc = {"network": path, "inputs": source.path or source.label, "images": count, "dtype": o.dtype,
                    "chunks": bounds}
        bounds, done = open_results(results, run_desc, o.resume, o.activations)
    width = max(b - a for a, b in bounds)
    keep_layers = o.keep_layers
    if g > 1 and not resident and stage_work is None:
        # a part's stream keeps a layer more for each further chunk of its worker, where that fits
        wider = part_stream_keep(keep_layers, len(bounds), len(workers) // g)
        keep_layers = wider if fit(wider, width) else keep_layers
    for holds, limit in shares:
        check_memory(store, o.dtype, resident, keep_layers, holds, limit, width)
    # a streamed worker that runs several chunks (data mode's, a pipeline stage's, a part's) keeps what it fetched
    # where it has room: it fetches each of its layers once
    repeats = -(-len(bounds) // max(1, len(workers) // g))
    hold = stream_hold_bytes(store, o.dtype, keep_layers, memory, width) if not resident and repeats > 1 else 0
    return Job(path=path, source=source, store=store, dtype=o.dtype, backend=o.backend, resident=resident,
               keep_layers=keep_layers, segment=o.segment, sync_every=o.sync_every, compact=o.messages == "compact",
               results=results, activations=o.activations, bounds=bounds, partition=o.partition,
               progress=o.progress, plan_store=None if o.plan_store is None else str(location(o.plan_store)),
               activations_name=f"activations-{uuid.uuid4().hex[:8]}" if o.keep_activations else None,
               partition_on_cluster=partition_fits_worker(store.neurons, memory), overlap=o.overlap,
               exchange=o.exchange, done=done, stage_work=stage_work, stage_entries_per_byte=per_byte,
               hold_bytes=hold, compress=o.compress)


def checked_arguments(network, inputs, options: InferenceOptions) -> tuple:
    """Check :func:`infer`'s arguments without a cluster: what it would refuse, refused first, in one line.

    The command line calls it before it starts a cluster, so a wrong path or ``--batch -1`` costs no cluster's
    start, and gives :func:`infer` the store it opened (whose metadata is then not read again).

    Returns
    -------
    tuple
        The network's path, its store, the input source and the number of images to run.
    """
    options.check()
    if isinstance(network, NetworkStore) and network.metadata_checked:
        # opened and checked already (the command line's, before its cluster): opening a 65,536 x 480 network's
        # metadata again took 1.15 s on the 2-core VM, a wait per request behind a URL
        store, path = network, str(network.path)
    else:
        # a local store, or a URL the workers read through fsspec
        path = str(location(network.path if isinstance(network, NetworkStore) else network))
        store = open_store(path, check="metadata")  # the workers check every block they read
    source = inputs if isinstance(inputs, InputSource) else stored_source(
        path if inputs is None else str(location(inputs)))
    if source.neurons != store.neurons:
        raise DasknnError(f"the inputs have {source.neurons} pixels per image, the network {store.neurons} neurons",
                          source.label)
    count = source.images if options.images is None else options.images
    if not 1 <= count <= source.images:
        raise DasknnError(f"--batch must be between 1 and {source.images} (the stored images), not {count}")
    if source.bounds is not None and (count != source.images or options.chunks is not None):
        raise DasknnError("a dask.array's row chunks are the chunks: slice or rechunk the array instead")
    return path, store, source, count


def _probe(recovery: Recovery, store, path: str, sample, count: int, weight_bytes: int, o: InferenceOptions,
           group_size: int | None, pipeline: bool = False) -> tuple:
    # the cost model's calibration and predictions, measured again on the workers there are if one is lost
    client = recovery.client

    def measure(workers: list[str]) -> tuple:
        lost = sum(loss.phase == "probe" for loss in recovery.losses)
        if lost >= PROBE_LOSSES:
            # a probe that keeps losing its worker (out of memory, by the look of it) is not run again
            raise ProbeUnfit(f"the cost model's probe lost a worker {lost} times")
        _, threads, memory = _cluster(client, workers)
        return predict_modes(client, workers, threads, store, path, sample, count, o.dtype, memory, weight_bytes,
                             o.partition, o.chunks, o.sync_every, o.resident, o.explain, group_size, o.exchange,
                             pipeline, o.group_size if pipeline else None, o.compress,
                             None if o.plan_store is None else str(location(o.plan_store)), o.keep_layers)

    recovery.enter("probe")
    return recovery.run(measure)


def _cluster(client, among: list[str] | None = None) -> tuple[list[str], int, float]:
    # the workers (sorted; of ``among`` only, where given), their threads, and the smallest memory limit among them
    info = workers_info(client)
    if among is not None:
        info = {w: v for w, v in info.items() if w in among}
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
    #: with ``keep_activations``: each chunk's final activations on the workers, detached from the run's tasks
    kept: dict[int, object] = field(default_factory=dict)


def _run_recovering(client, job: Job, recovery: Recovery, mode: str, group_size: int | None, todo: list[int],
                    check_fits: Callable[[int, list[str]], None],
                    fits_holding: Callable[[int, list[str], int], bool]) -> _Runs:
    # inference's part of the recovery policy: a lost worker loses its blocks and the activations it held, so the
    # chunks not finished are run again on the workers there are then (the finished ones are kept). Model and
    # hybrid modes keep their partition and the parts the workers left hold, the lost worker's parts placed on a
    # new worker or beside a survivor's own (``fits_holding``: where the memory allows); else the partition is
    # redone for the workers there are (and the memory checked again for it)
    runs = _Runs()

    def attempt(workers: list[str]) -> None:
        remaining = [c for c in todo if c not in runs.finished]
        places = _kept_places(job, workers, fits_holding) if recovery.losses else None
        if places is not None:
            g = job.held_parts.parts
        else:
            # after a loss the groups are redone: a hybrid group size the workers left no longer divide is dropped
            fitting = group_size if group_size and len(workers) % group_size == 0 else None
            g = check_mode(mode, len(workers), fitting if recovery.losses else group_size)
            if recovery.losses:
                check_fits(g, workers)
        runs.passes.append(Pass())
        after = recovery.losses[-1] if recovery.losses else None  # the loss this pass redoes the work of, if any
        try:
            execute(client, job, workers, g, remaining, runs.passes[-1], recovery, places)
        finally:
            done = runs.passes[-1]
            runs.finished.update(done.chunks)
            if after is not None:
                _say_reloaded(after.details, done)

    def on_loss(lost) -> dict:
        remaining = [c for c in todo if c not in runs.finished]
        return {"chunks_kept": len(runs.finished), "chunks_rerun": len(remaining)}

    try:
        recovery.run(attempt, on_loss)
    finally:
        job.release_held()  # the layers kept between passes leave the workers with the run
    runs.workers = recovery.workers
    runs.recoveries = [loss.as_dict() for loss in recovery.losses]
    return runs


def _kept_places(job: Job, workers: list[str], fits_holding: Callable[[int, list[str], int], bool]
                 ) -> dict[Slot, str] | None:
    # model and hybrid modes after a loss: each part's worker, the parts the workers left hold kept, or None where
    # the partition is to be redone (no part kept, more workers than parts, or too little memory for a worker to
    # hold the parts it would)
    held = job.held_parts
    places = keep_places(held.places, workers)
    if places is None or not fits_holding(held.parts, workers, most_parts(places)):
        return None
    return places


def _say_reloaded(details: dict, done: Pass) -> None:
    # in a loss's record, what the pass after it kept of the layers the workers held, and what it loaded again
    if done.stages_loaded + done.stages_kept:
        # pipeline mode: the survivors kept their stages' layers, the new workers loaded theirs
        details.update(stages_kept=done.stages_kept, stages_reloaded=done.stages_loaded)
    if done.parts_loaded + done.parts_kept:
        # model and hybrid modes: the survivors kept their parts, the lost worker's were planned and loaded again
        details.update(parts_kept=done.parts_kept, parts_reloaded=done.parts_loaded)
    if done.networks_loaded + done.networks_kept:
        # data mode: the survivors kept the network, the new workers loaded it
        details.update(networks_kept=done.networks_kept, networks_reloaded=done.networks_loaded)


def _result(job: Job, runs: _Runs, mode: str, group_size: int | None, count: int, todo: list[int], done: set[int],
            predictions: list, calibration) -> InferenceResult:
    # the passes' figures summed, the categories of the chunks run and of those read back
    store, passes, bounds = job.store, runs.passes, job.bounds
    last = passes[-1] if passes else None
    plan = last.plan if last else None
    ids = [runs.finished[c].ids for c in todo]
    per_layer = sum((p.layer_bytes for p in passes if p.layer_bytes is not None), LayerBytes.zeros(store.depth))
    if done:
        ids.extend(read_results(job.results, done).values())
    cats = np.sort(np.concatenate(ids)) if ids else np.empty(0, dtype=np.int64)
    g = last.group_size if last else check_mode(mode, len(runs.workers), group_size)
    alive, columns = _layer_counts([runs.finished[c] for c in todo], store.depth)
    return InferenceResult(
        categories=cats, images=count, neurons=store.neurons, layers=store.depth, edges=store.edges,
        seconds=sum(p.seconds for p in passes), workers=len(runs.workers), chunks=len(bounds),
        mode=mode, group_size=g, exchange=passes[-1].exchange if g > 1 and job.stage_work is None else "",
        load_seconds=sum(p.load_seconds for p in passes), compile_seconds=sum(p.compile_seconds for p in passes),
        partition_seconds=sum(p.partition_seconds for p in passes), plan_seconds=sum(p.plan_seconds for p in passes),
        tasks=sum(p.tasks for p in passes), plan_volume=[] if plan is None else plan.volumes().tolist(),
        bytes_sent=sum(p.bytes_sent for p in passes), plan_bytes=sum(p.plan_bytes for p in passes),
        dense_message_bytes=per_layer.dense.tolist() if plan else [],
        message_bytes=per_layer.sent.tolist() if plan else [],
        exchange_bytes=per_layer.crossed.tolist() if plan else [], bytes_read=sum(p.bytes_read for p in passes),
        exchange_pairs=_pairs(passes, plan.parts) if plan else [],
        resident=job.resident, computed_chunks=todo,
        images_computed=sum(bounds[c][1] - bounds[c][0] for c in todo),
        predictions=list(predictions), calibration=calibration, recoveries=runs.recoveries,
        activations=_kept_array(job, runs) if job.activations_name else None,
        stages=[stage.as_list() for stage in last.stages] if last else [],
        layer_alive=alive.tolist() if alive is not None else [],
        layer_columns=columns.tolist() if columns is not None else [],
        edges_multiplied=None if columns is None else int(columns @ store.layer_entries()),
    )


def _layer_counts(results: list, depth: int) -> tuple[np.ndarray | None, np.ndarray | None]:
    # the chunks' per-layer counts summed (a chunk whose images all died stopped counting: zeros after); None
    # where a chunk did not count them
    counted = [r for r in results if r.layer_columns is not None]
    if not counted or len(counted) < len(results):
        return None, None
    alive, columns = np.zeros(depth, dtype=np.int64), np.zeros(depth, dtype=np.int64)
    for r in counted:
        alive[:r.layer_alive.size] += r.layer_alive[:depth]
        columns[:r.layer_columns.size] += r.layer_columns[:depth]
    return alive, columns


def _pairs(passes: list[Pass], parts: int) -> list[list[int]]:
    # the passes' traffic between parts as a parts x parts table (sender, receiver)
    table = np.zeros((parts, parts), dtype=np.int64)
    for one in passes:
        for (sender, receiver), nbytes in one.pairs.items():
            if sender < parts and receiver < parts:  # (a pass on more workers, before a loss, had more parts)
                table[sender, receiver] += nbytes
    return table.tolist()


def _detached_activations(client, job: Job, runs: _Runs) -> dict[int, object]:
    # the chunks' final activations as the workers hold them, taken over from the run's pinned tasks: a worker lost
    # after the run then has the chunks it held computed again from the stores where the images are stored, or
    # failed with a line (their pinned tasks would wait for it for ever)
    kept = {c: f for p in runs.passes for c, f in p.kept.items() if c in runs.finished}
    lost = {c: f"keep_activations: the final activations of chunk {c} (images {a}..{b - 1}) were lost with the "
               "worker that held them after the inference: run it again to have them"
            for c, (a, b) in enumerate(job.bounds) if c in kept}
    spec, store = job.source.spec, job.store
    again = {c: ChunkAgain(job.path, store.depth, spec, a, b, job.dtype, job.backend, store.bias, store.ymax)
             for c, (a, b) in enumerate(job.bounds) if c in kept} if isinstance(spec, StoredRows) else None
    return detach(client, kept, f"{job.activations_name}-kept", lost, again)


def _kept_array(job: Job, runs: _Runs):
    # the chunks' final activations, as a dask.array whose chunks are the futures the workers hold
    import dask.array as da

    name = job.activations_name
    graph = {(name, c, 0): runs.kept[c] for c in range(len(job.bounds))}
    rows = tuple(b - a for a, b in job.bounds)
    return da.Array(graph, name, chunks=(rows, (job.store.neurons,)), dtype=job.dtype)


#: Times an inference re-runs its unfinished chunks after losing workers before it gives up.
MAX_RECOVERIES = 3
#: Losses of workers in the probe phase after which ``auto`` runs without the cost model.
PROBE_LOSSES = 2


#: What the line that gives up after MAX_RECOVERIES losses tells the user to check.
GIVE_UP_ADVICE = ("if they ran out of memory, raise --memory-limit, use --stream, more --chunks or --keep-layers 1; "
                  "else see the workers' logs")


#: Seconds an inference waits after losing workers for as many to be back (a nanny restarts a killed one).
AWAIT_WORKERS_SECONDS = 60.0
