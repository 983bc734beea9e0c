"""Sizing a run: memory a worker needs, image chunks, sync layers, and the cost model's calibration on the cluster."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import replace

import numpy as np

from ..cost import Prediction
from ..errors import DasknnError
from ..kernels import tile_for
from ..kernels.cpu import TWIN_MIN_IMAGES
from ..locations import is_url, join, location
from ..partition import layer_volumes
from ..runtime.recovery import gather_watched
from .options import InferenceOptions
from .owners import check_partition, kept_report, stored_partition


#: Share of a worker's memory limit its weights may take before ``auto`` spreads the layers over more workers.
WEIGHTS_SHARE = 0.25
#: Layers a stream keeps at once by default (``--keep-layers``).
KEEP_LAYERS = InferenceOptions.keep_layers
#: A worker's memory a partition takes per neuron of the network's width: the hypergraph partition of a generated
#: 65,536 x 480 network, K = 2, peaked at about 450 MB (BENCHMARKS.md, issue 16); the layers are read one at a time.
PARTITION_NEURON_BYTES = 7e3


#: Memory a worker takes before it holds any data: Python, Dask, Zarr, the compiled kernels (measured: a
#: fresh worker with dasknn loaded uses about 140 MiB).
WORKER_BASE = 128 << 20


#: Share of a worker's memory limit at which Dask pauses it: what a run holds, over what the worker already
#: uses, must stay below it.
MEMORY_SHARE = 0.8


def chunk_bounds(images: int, chunks: int) -> list[tuple[int, int]]:
    """Split ``images`` into ``chunks`` contiguous, nearly equal ranges."""
    edges = np.linspace(0, images, max(1, min(chunks, images)) + 1).round().astype(int)
    return [(int(a), int(b)) for a, b in zip(edges[:-1], edges[1:]) if b > a]


def sync_layers(depth: int, sync_every: int, overlap: bool = False) -> list[int]:
    """Layers after which model-mode parts exchange alive masks and drop dead images (always the last).

    Overlapped steps (``overlap``) drop them two layers after the sync layer (:func:`compaction_layer`), so a sync
    layer must come at least two after the one before it: one closer to the next is left out.
    """
    layers = sorted(set(range(sync_every, depth + 1, sync_every)) | {depth})
    kept: list[int] = []
    for k in reversed(layers):
        if not kept or kept[-1] - k >= compaction_layer(0, overlap):
            kept.append(k)
    return kept[::-1]


def compaction_layer(k: int, overlap: bool) -> int:
    """The layer whose step drops the images that died by sync layer ``k``: the next one, or with overlapped steps
    (whose masks come from the other parts' second halves, done by then) the one after."""
    return k + (2 if overlap else 1)


def part_stream_keep(keep_layers: int, chunks: int, groups: int) -> int:
    """Layers a model-mode part's stream keeps out of core: ``keep_layers``, and one more for each further chunk
    its worker runs (``chunks`` go round ``groups``).

    A worker's chunks advance side by side, each up to a layer behind the one before; a chunk that finds its
    layer gone starts the stream again from there (measured: 2 chunks keeping 2 layers read a 2.5 GB part plan
    three times over).
    """
    return keep_layers + max(0, -(-chunks // max(1, groups)) - 1)


def memory_need(store, dtype: str, resident: bool, keep_layers: int, g: float, width: int) -> tuple[float, ...]:
    # what a worker must hold beside its base: (all of it, the weights, a chunk's activations, the biggest layer);
    # g: what the weights are divided by, the group size (pipeline mode: the network over its largest stage)
    item = np.dtype(dtype).itemsize
    biggest = int(store.layer_entries().max()) * (item + 4) + (store.neurons + 1) * 8
    # resident weights are briefly held twice while they load (decoded arrays, then the kernel's copies):
    # measured on a 65536 x 8 network, a worker's peak was its weights twice over plus the rest
    weights = (2 * store.edges * (item + 4) if resident else biggest * keep_layers) / g
    # input, output and a compacted copy of a chunk, and the kernel's two tile buffers (up to 64 MB each)
    tiles = 2 * store.neurons * min(width, tile_for(store.neurons, item)) * item
    activations = 3 * store.neurons * width * item + tiles
    return weights + 2 * biggest + activations, weights, activations, biggest  # + a layer being decoded


def fits(store, dtype: str, resident: bool, keep_layers: int, g: float, memory: float, width: int) -> bool:
    return WORKER_BASE + memory_need(store, dtype, resident, keep_layers, g, width)[0] <= MEMORY_SHARE * memory


#: Share of a worker's spare memory (below Dask's pause threshold, after what its run needs) that a stream (a
#: data-mode worker's, a pipeline stage's, a model-mode part's) may keep of its layers' stored bytes.
HOLD_SHARE = 0.5


def stream_hold_bytes(store, dtype: str, keep_layers: int, memory: float, width: int) -> int:
    """Streamed layers (data mode, a pipeline stage, a model-mode part), a worker running several chunks: the
    bytes its stream may keep of what it fetched from the store (encoded, as stored), so that its next chunks
    decode the layers from memory instead of fetching them again: a share of what the worker has spare beside its
    stream and a chunk's activations (the whole network's stream, the most a streamed worker holds)."""
    spare = MEMORY_SHARE * memory - WORKER_BASE - memory_need(store, dtype, False, keep_layers, 1, width)[0]
    return max(0, int(HOLD_SHARE * spare))


def default_chunks(images: int, threads: int, workers: int, g: int, resident: bool,
                   fits: Callable[[int], bool] | None = None) -> int:
    """Image chunks when none are asked for.

    Data mode: two per thread held in memory (they pipeline through the segments), one per thread streaming
    (each chunk reads the network once). Model and hybrid modes: one per thread of a group's workers. A group's
    parts already work on the same chunk side by side, and every further chunk adds a task per layer and part,
    which on a small machine costs more than overlapping chunks saves (BENCHMARKS.md, issue 10). Then twice as
    many, and again, while a chunk of that many images does not ``fits(images)`` in a worker (if one image does).
    """
    n = max(1, min((2 * threads if resident else threads) if g == 1 else (workers // g) * max(1, threads // workers),
                   images))
    if fits is not None and fits(1):
        while n < images and not fits(-(-images // n)):
            n = min(images, 2 * n)
    return n


def holds_weights(resident: bool | None, weight_bytes: float, memory: float, g: int = 1) -> bool:
    """Whether each of ``g`` workers holding a share of the weights holds it in memory: as ``resident`` says, or
    by default where the share is at most :data:`WEIGHTS_SHARE` of a worker's ``memory``."""
    return resident if resident is not None else weight_bytes / g <= WEIGHTS_SHARE * memory


def data_mode_alone(resident: bool | None, weight_bytes: float, memory: float, images: int, threads: int,
                    url: bool) -> bool:
    """Whether data mode is the only mode ``auto`` weighs: it holds the weights on every worker, has a chunk for
    every thread, and reads a store that is not behind a URL.

    There model and hybrid modes do data mode's multiply-adds and an exchange besides, and pipeline mode, which
    reads less, is weighed only where reading costs; so ``auto`` runs data mode without calibrating, and only
    ``explain`` (which predicts every mode) pays the probe.
    """
    return resident is not False and holds_weights(resident, weight_bytes, memory) and images >= threads \
        and not url


def pipeline_chunks(images: int, stages: int, pipelines: int, fits_chunks: int) -> int:
    """Chunks of a pipeline run: two per stage of each pipeline, so each stage has a chunk to run while the next
    runs the one before (the fill and drain are then at most half the run), but fewer (one per stage at least)
    where two would make chunks narrower than :data:`~dasknn.kernels.cpu.TWIN_MIN_IMAGES`; or ``fits_chunks``
    (what fits a worker's memory) where that is more; at most one per image.

    Below that width the kernel sums every column alone instead of the columns that share their inputs together:
    on a generated 65,536 x 480 network, 8 chunks of 125 images ran twice as long as 4 of 250 (BENCHMARKS.md).
    """
    least = stages * pipelines
    wanted = max(least, min(2 * least, images // TWIN_MIN_IMAGES))
    return max(1, min(images, max(wanted, fits_chunks)))


def check_memory(store, dtype: str, resident: bool, keep_layers: int, g: float, memory: float, width: int) -> None:
    """Refuse, with what to change, a run whose workers cannot hold what they must (instead of Dask pausing,
    killing and restarting them in a loop)."""
    if fits(store, dtype, resident, keep_layers, g, memory, width):
        return
    need, weights, activations, biggest = memory_need(store, dtype, resident, keep_layers, g, width)
    mb = 1 << 20
    if resident:
        what = f"{'its share of ' if g > 1 else ''}the weights ({weights / 2 / mb:,.0f} MiB, twice while they load)"
        advice = "use --stream (data mode) or more workers in model mode"
    else:
        what = f"{keep_layers} layer(s) of up to {biggest / g / mb:,.0f} MiB each"
        advice = "use --keep-layers 1" if keep_layers > 1 else "use model mode over more workers"
    raise DasknnError(
        f"a worker's memory limit ({memory / mb:,.0f} MiB) is too small: it must hold {what} and a chunk's "
        f"activations ({activations / mb:,.0f} MiB) beside the {WORKER_BASE / mb:,.0f} MiB a worker needs to run, "
        f"over {MEMORY_SHARE:.0%} of the limit; raise --memory-limit to at least "
        f"{(WORKER_BASE + need) / MEMORY_SHARE / mb:,.0f} MiB, {advice}, or use more --chunks")


def _noop(x: int) -> int:
    return x


def _make_bytes(nbytes: int) -> np.ndarray:
    return np.ones(nbytes // 8)


def _size(a: np.ndarray) -> int:
    return int(a.nbytes)


class ProbeUnfit(Exception):
    """The cost model's probe cannot run on these workers (``auto`` runs the mode that needs least memory)."""


def probe_memory(limit: float) -> float:
    """Bytes the probe may take of a worker of memory limit ``limit``: what is left below Dask's pause threshold
    (:data:`MEMORY_SHARE`) beside what the worker takes to run (:data:`WORKER_BASE`)."""
    return MEMORY_SHARE * limit - WORKER_BASE


def probe_room(client, worker: str, store, images: int, dtype: str) -> float:
    """The bytes the probe may take on ``worker`` (its memory limit, asked of the scheduler); :class:`ProbeUnfit`
    where that is too little for its smallest sample (:func:`~dasknn.cost.probe_width`)."""
    from ..cost import PROBE_MIN_IMAGES, probe_width
    from ..rates import probe_layer_bytes
    from ..runtime.recovery import memory_of

    limit = memory_of(client, [worker])[worker]
    room = probe_memory(limit)
    itemsize = np.dtype(dtype).itemsize
    if probe_width(store.neurons, itemsize, images, probe_layer_bytes(store, itemsize), room) == 0:
        mb = 1 << 20
        raise ProbeUnfit(f"the cost model's probe cannot sample {min(images, PROBE_MIN_IMAGES)} images of the "
                         f"{store.neurons:,}-wide network within a worker's memory limit ({limit / mb:,.0f} MiB)")
    return room


def _calibrate(client, workers: list[str], threads: int, store, path: str, in_path: str, images: int,
               dtype: str) -> dict:
    """Rates measured on the cluster: the probe on one worker (its sample sized to that worker's memory limit),
    task cost, worker-to-worker transfer rate."""
    from distributed import wait

    from ..rates import probe_layer_bytes

    room = probe_room(client, workers[0], store, images, dtype)
    # (the largest layer's bytes known here: the probe's worker reads the metadata of the layers it runs only)
    layer_bytes = probe_layer_bytes(store, np.dtype(dtype).itemsize)
    figures = gather_watched(client, [client.submit(_probe_task, path, in_path, images, dtype, room, layer_bytes,
                                                    workers=[workers[0]], allow_other_workers=False, pure=False)],
                             workers[:1])[0]
    # many small tasks in one graph, as the engine submits them: the cost of a task, per thread
    n = 100 * len(workers)
    t0 = time.perf_counter()
    futs = client.map(_noop, range(n), pure=False)
    wait(futs)
    figures["task_seconds"] = (time.perf_counter() - t0) * threads / n
    del futs
    # a run's graph submitted and its results gathered, however little it computes: one task there and back
    trips = []
    for _ in range(3):
        t0 = time.perf_counter()
        client.submit(_noop, 0, pure=False).result()
        trips.append(time.perf_counter() - t0)
    figures["round_trip_seconds"] = float(np.median(trips))
    rate = float("inf")
    if len(workers) > 1:
        nbytes = 32 << 20
        made = client.submit(_make_bytes, nbytes, workers=[workers[0]], pure=False)
        wait(made)
        t0 = time.perf_counter()
        gather_watched(client, [client.submit(_size, made, workers=[workers[1]], allow_other_workers=False,
                                              pure=False)], workers[:2])
        rate = nbytes / (time.perf_counter() - t0)
        made.release()
    figures["transfer_rate"] = rate
    # the cores of the workers' machines, each machine once: whether a read-ahead thread has a core to itself
    from distributed.comm import get_address_host

    cores = {get_address_host(w): n for w, n in client.run(os.cpu_count).items()}
    figures["cores"] = int(sum(cores.values()))
    # behind a URL the workers of a host share its link to the store: their reads add up host by host
    figures["readers"] = len({get_address_host(w) for w in workers}) if is_url(path) else 0
    return figures


def _step_rates(client, workers: list[str], path: str, dtype: str, k: int, owners: np.ndarray, width: int,
                share: float = 1.0):
    # model mode's step rates (rates.step_rates), every worker timing its place in its group at once; the mean,
    # the kernel's on the clock of a thread with ``share`` of a core (rates.clock_rate)
    from ..rates import StepRates, clock_rate, step_rates

    g = int(owners.max()) + 1
    futures = [client.submit(step_rates, path, k, dtype, owners, i % g, width, workers=[w],
                             allow_other_workers=False, pure=False) for i, w in enumerate(workers)]
    timed = [replace(r, kernel=clock_rate(r.kernel, r.kernel_cpu, share))
             for r in gather_watched(client, futures, workers)]
    return StepRates(*(float(np.mean([getattr(r, f) for r in timed]))
                       for f in ("kernel", "message", "marks", "first_step")))


def _on_every_worker(client, workers: list[str], timing: Callable, *args, mean: bool = True, **kwargs):
    # ``timing(*args, **kwargs)`` on every worker at once (as they run a mode's tasks together): the mean, or (not
    # ``mean``) what each gave
    futures = [client.submit(timing, *args, **kwargs, workers=[w], allow_other_workers=False, pure=False)
               for w in workers]
    timed = gather_watched(client, futures, workers)
    return float(np.mean(timed)) if mean else timed


def _probe_task(path: str, in_path: str, images: int, dtype: str, memory: float | None = None,
                layer_bytes: int = 0) -> dict:
    # the first task of a run on a worker: a cold Numba cache is filled by a child process first (the memory
    # compiling holds stays there), for this worker and for the others that share its cache
    from ..cost import probe
    from .warm import compiled_apart, every_kernel

    compiled_apart(every_kernel((dtype,), "cpu"))
    return probe(path, in_path, images, dtype, memory, layer_bytes)


def predict_modes(client, workers: list[str], threads: int, store, path: str, in_path: str, images: int, dtype: str,
                  memory: float, weight_bytes: int, partition, chunks: int | None, sync_every: int,
                  resident: bool | None, everything: bool, group_size: int | None, exchange: str = "auto",
                  pipeline: bool = False, stages: int | None = None, compress: bool = True,
                  plan_store: str | None = None, keep_layers: int = KEEP_LAYERS):
    """The cost model's predictions for data mode, every model/hybrid grouping the workers allow, and pipeline mode
    (``stages`` workers a pipeline: by default one pipeline over all of them) where it is the mode asked for
    (``pipeline``), data mode cannot hold the weights, or the store is behind a URL (where every worker reading all
    of it costs: :attr:`~dasknn.cost.Calibration.readers`).

    Model and hybrid modes do data mode's multiply-adds plus their exchange, so where data mode holds the
    weights, has a chunk for every thread and reads a local store (:func:`data_mode_alone`), the others are
    predicted only when ``everything`` is asked for (and ``auto`` does not calibrate there at all).
    Predicting them never computes the run's partition: one already there (given, or kept in the store) is used;
    otherwise the exchange is estimated from a cheap partition of a few layers
    (:func:`~dasknn.partition.cluster.sample_volumes`), and the one-time setup (the partition, the plan) is added
    to the mode's predicted time. Where that setup and data mode's own multiply-adds (which model mode does too)
    already cost more than data mode, nothing is estimated. Model and hybrid modes are predicted with the transport
    ``exchange`` names, or for ``"auto"`` with the cheaper of the two (as
    :func:`~dasknn.runtime.exchange.choice.choose_exchange` decides). With ``compress`` every mode computes only the
    distinct vectors among the alive images (the probe counts them); without, every alive image. A part plan made
    already (at ``plan_store``, or by default inside the store) is not counted as setup still to pay. A streaming
    worker keeps what it fetched for its later chunks where its memory has room beside ``keep_layers`` layers.
    """
    from ..cost import Calibration, alive_per_layer, busy_thread_count, computed_per_layer, predict, synced_layers
    from ..rates import COLLAPSED_IMAGES, clock_rate, layer_seconds, loop_timing

    cal = Calibration(**_calibrate(client, workers, threads, store, path, in_path, images, dtype))
    if not compress:
        cal.distinct = []  # (the calibration then says what the predictions used)
    nnz = store.layer_entries()
    itemsize = np.dtype(dtype).itemsize
    middle = max(1, store.depth // 2)

    def one(g: int, data: Prediction | None = None):
        res = holds_weights(resident, weight_bytes, memory, g)
        n_chunks = chunks or default_chunks(images, threads, len(workers), g, res)
        hold = 0 if res else stream_hold_bytes(store, dtype, keep_layers, memory, -(-images // max(1, n_chunks)))

        def model(volumes=None, setup: float = 0.0, source: str = ""):
            transports = [exchange] if exchange != "auto" else ["tasks", "p2p"]
            return min((predict(cal, images=images, layer_nnz=nnz, weight_bytes=weight_bytes, memory=memory,
                                workers=len(workers), threads=threads, chunks=min(n_chunks, images), group_size=g,
                                volumes=volumes, itemsize=itemsize, weights_share=WEIGHTS_SHARE,
                                sync_every=sync_every, resident=res, setup=setup, volumes_from=source,
                                transport=t, neurons=store.neurons, hold_bytes=hold)
                        for t in (transports if g > 1 else ["tasks"])),
                       key=lambda p: p.seconds)

        if g == 1:
            # data mode's own loop over layers, a chunk of the batch's first images through the first layers
            # (where most of the multiply-adds are), every worker running it at once (the loop's layers and tiles
            # within half a worker's memory, beside what the worker holds itself). Timed as it runs, not as a
            # ratio to the probe's steps: on 65,536-wide layers the ratio multiplied three timings' noise and
            # predicted data mode 16 % to 65 % slow, this 18 % fast to 2 % slow
            loops = _on_every_worker(client, workers, loop_timing, path, 1, dtype, mean=False, memory=memory / 2,
                                     width=-(-images // max(1, n_chunks)), inputs=in_path)
            # the loop's cost a layer on a chunk of as many equal images as the probe saw alive at its last layer:
            # the images folded onto one vector still cost the loop a little each (0.75 ms a layer for 1,024 of
            # them on the real n1024-l120 against 0.24 ms for 64, one process)
            folded = max(COLLAPSED_IMAGES, int(images / max(1, n_chunks) * alive_per_layer(cal, store.depth)[-1]))
            costs = _on_every_worker(client, workers, layer_seconds, path, middle, dtype, mean=False, width=folded)
            share = cal.core_share(busy_thread_count(threads, len(workers), n_chunks, 1))
            cal.kernel_rates[1] = float(np.mean([clock_rate(t.rate, t.cpu_rate, share) for t in loops]))
            cal.layer_seconds = float(np.mean([c.every_chunk for c in costs]))
            cal.layer_setup_seconds = float(np.mean([c.first_chunk for c in costs]))
            # what the loop's first call took beyond its layers' learning: its chunk's memory touched afresh
            cal.first_chunk_seconds = float(np.mean([max(0.0, t.first_extra - t.layers * cal.layer_setup_seconds)
                                                     for t in loops]))
            return model()
        volumes, window, setup, source = _exchange_estimate(workers, store, path, partition, g, nnz, res, data,
                                                            memory, plan_store)
        if window is None:  # the setup alone costs more than data mode: a lower bound, nothing computed
            return model(volumes, setup, source)
        # the step on this mode's blocks, every worker running it at once, over as many images as a chunk
        # computes where its multiply-adds are (each layer's width weighted by its multiply-adds): a step over
        # many of the kernel's tiles ran at a quarter of the rate of one tile's (the real network's part at K = 2:
        # 3.3e9 multiply-adds a second over 5,077 images against 1.4e10 over 352, in one process), and the first
        # layers, 15,000-20,000 images wide in a 20,000-image chunk, hold most of them
        computed = computed_per_layer(cal, store.depth)[synced_layers(store.depth, sync_every)] * nnz
        weighted = float(np.dot(computed, computed / np.maximum(nnz, 1)) / max(computed.sum(), 1e-12))
        width = max(1, int(round(images / max(1, min(n_chunks, images)) * weighted)))
        busy = busy_thread_count(threads, len(workers), min(n_chunks, images), g)
        rates = _step_rates(client, workers, path, dtype, middle, window, width, cal.core_share(busy))
        cal.kernel_rates[g], cal.message_rates[g], cal.mark_rates[g] = rates.kernel, rates.message, rates.marks
        cal.step_setup_seconds[g] = rates.first_step
        return model(volumes, setup, source)

    out = [one(1)]
    data_alone = data_mode_alone(resident, weight_bytes, memory, images, threads, is_url(path))
    if everything or not data_alone:
        sizes = [group_size] if group_size else [g for g in range(2, len(workers) + 1) if len(workers) % g == 0]
        out.extend(one(g, out[0]) for g in sizes)
    k = stages or len(workers)
    # behind a URL reading costs: pipeline mode, which reads the network once a pipeline, is weighed too
    if (pipeline or not data_alone) and 1 < k <= store.depth and len(workers) % k == 0:
        from ..runtime.recovery import memory_of

        out.append(pipeline_prediction(cal, store, images, threads, len(workers), k, chunks, dtype, memory,
                                       weight_bytes, resident, list(memory_of(client, workers).values()),
                                       keep_layers))
    return cal, out


def pipeline_prediction(cal, store, images: int, threads: int, workers: int, k: int, chunks: int | None,
                        dtype: str, memory: float, weight_bytes: int, resident: bool | None,
                        memory_limits: list[float] | None = None, keep_layers: int = KEEP_LAYERS) -> Prediction:
    """Pipeline mode's prediction (:func:`~dasknn.cost.predict_pipeline`) with the chunks it would run
    (:func:`pipeline_chunks`, where ``chunks`` is None), its stages placed by the workers' ``memory_limits``."""
    from ..cost import predict_pipeline

    nnz = store.layer_entries()
    res = holds_weights(resident, weight_bytes, memory, k)
    n_chunks = chunks or pipeline_chunks(images, k, workers // k, default_chunks(images, threads, workers, k, res))
    hold = stream_hold_bytes(store, dtype, keep_layers, memory, -(-images // max(1, n_chunks)))
    return predict_pipeline(cal, images=images, layer_nnz=nnz, weight_bytes=weight_bytes, memory=memory,
                            workers=workers, threads=threads, chunks=min(n_chunks, images), stages=k,
                            neurons=store.neurons, itemsize=np.dtype(dtype).itemsize, weights_share=WEIGHTS_SHARE,
                            resident=resident, memory_limits=memory_limits,  # (None: resident where it fits)
                            hold_bytes=hold)


def _exchange_estimate(workers: list[str], store, path: str, partition, g: int, nnz: np.ndarray,
                       resident: bool, data: Prediction | None, memory: float, plan_store: str | None = None) -> tuple:
    # model mode's boundary entries per layer, the owners rows of the middle layer (None: not estimated), the
    # one-time setup still to pay, and where the volumes came from
    from ..cost import setup_seconds
    from ..partition.cluster import sample_volumes, segment_count
    from ..store import open_plan_store, plan_digest

    owners, report = _partition_and_report(path, partition, g)
    middle = max(1, store.depth // 2)
    if owners is not None:
        owners = check_partition(owners, store.depth, store.neurons, g)
        # out of core, a part plan already made (where the run keeps it, as model mode finds it) is reused as well
        kept = plan_store or join(location(path), "plans", plan_digest(path, owners))
        plan = resident or open_plan_store(kept, path, owners) is None
        setup = setup_seconds(store.edges, g, None, plan, len(workers))
        # a partition kept in the store carries its volumes in its report (counted as it was computed); others
        # are counted layer by layer from the store (the client never holds the network; behind a slow link
        # that read of every layer took 4.9 s of a 43 s run at 4,096 x 120)
        volumes = np.asarray(report.get("volume_per_layer", []), dtype=np.int64)
        if volumes.size != store.depth:
            volumes = np.array([layer_volumes([store.layer(k)], owners[k - 1:k + 1], parts=g)[0]
                                for k in range(1, store.depth + 1)], dtype=np.int64)
        return volumes, owners[middle - 1:middle + 1], setup, "partition"
    # where a worker has the memory, the run partitions on the cluster, a segment per worker for a deep network
    segments = segment_count(store.depth, store.edges, len(workers), str(partition)) \
        if partition_fits_worker(store.neurons, memory) else 1
    setup = setup_seconds(store.edges, g, str(partition), True, len(workers), segments)
    # model mode does data mode's multiply-adds and more: where those and the setup already cost more than data
    # mode, estimating the exchange could not change the choice
    if data is not None and setup + data.compute >= data.seconds:
        return np.zeros(store.depth, dtype=np.int64), None, setup, "bound"
    # on the client: on a 65,536-wide network the sample's Mt-KaHyPar layer peaks at about 0.6 GB, more than a
    # small worker may hold (measured: 6.6 s for 3 layers on the 2-core VM)
    per_entry, window = sample_volumes(path, g, str(partition))
    return np.round(nnz * float(np.mean(per_entry))).astype(np.int64), window, setup, "sample"


def _partition_and_report(path: str, partition, parts: int) -> tuple[np.ndarray | None, dict]:
    # the owners ``partition`` names (None: not computed yet) and, for one kept in the store (or an array equal to
    # one), its report
    from ..store import load_partition, partition_name

    if isinstance(partition, np.ndarray) or str(partition).endswith(".npy"):
        owners = stored_partition(path, partition, parts)
        return owners, kept_report(path, owners, parts)
    saved = load_partition(path, partition_name(str(partition), parts))
    return (None, {}) if saved is None else saved


def partition_fits_worker(neurons: int, memory: float) -> bool:
    """Whether a partition of a network ``neurons`` wide is computed on a worker of ``memory`` bytes (with the
    share of its memory weights may take) rather than on the client."""
    return PARTITION_NEURON_BYTES * neurons <= WEIGHTS_SHARE * memory
