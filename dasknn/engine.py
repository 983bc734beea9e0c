"""Running inference on a Dask cluster: per-layer task graphs over partitioned blocks.

The workers are split into *groups*; each group runs its share of the batch's image chunks, and the network is
partitioned over the workers of a group:

* ``data`` mode: groups of one worker. Every worker holds every layer and runs a chunk through a whole segment of
  consecutive layers in one task (no exchange is needed, so tasks stay coarse).
* ``model`` mode: one group of all workers. Part ``q`` owns the columns (output neurons) the partition gives it,
  reads only those from the store, and per layer and chunk runs one task, ``spmm-l{k}-p{q}-c{c}``: it computes
  the layer from its previous block (held on its worker between tasks) and the rows the others sent, and packs
  out of its new block exactly the rows the plan says each other part needs in the next layer. That packed
  output is the task's result, so Dask moves it worker to worker to the tasks that depend on it (the layer's
  first messages come from ``send-l1-p{p}-to{q}-c{c}``; with more than two parts, ``send-l{k}-p{p}-to{q}-c{c}``
  tasks pick each recipient's share). Tasks are pinned to workers, so those messages are the only activation
  traffic.
* ``hybrid``: groups of ``group_size`` workers, each a model-mode group on its own chunks.

Dead images (all-zero activations can never come back) are dropped: in data mode inside the segment task, in
model mode every ``sync_every`` layers, when each part sends its alive mask with its messages and all compact the
same way (the messages sent with the masks still carry the images that layer killed). Categories come back with
their original indices.

Timing follows the challenge: the clock starts once weights and inputs sit in the workers' memory and stops when
the categories are back on the client. The client never holds weights or activations: workers read the store.
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

from . import kernels
from .errors import DasknnError
from .partition import layer_volumes
from .plan import Outline, PartLayer, build_plan, layer_counts, local_block, plan_layer, received_rows
from .runtime.graph import PinnedGraph, ref
from .runtime.metrics import bytes_sent, exchange_log_pop, install_exchange_log
from .runtime.recovery import WorkersLost, await_workers, ensure_client, watch, workers_info
from .store import (
    LayerStream,
    PartStream,
    ReadAhead,
    create_plan_store,
    finish_plan_store,
    is_url,
    location,
    open_inputs,
    open_plan_store,
    open_results,
    open_store,
    plan_digest,
    read_plan_owners,
    read_results,
    write_chunk_result,
    write_plan_layer,
)

MODES = ("auto", "data", "model", "hybrid")
#: Share of a worker's memory limit its weights may take before ``auto`` spreads the layers over more workers.
WEIGHTS_SHARE = 0.25

Block = tuple[np.ndarray, np.ndarray, np.ndarray]  # indptr, indices, data (CSC)


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
    load_seconds: float = 0.0
    #: making the part plan a model-mode run out of core streams from (0 when one was reused or none was needed)
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

    @property
    def edges_per_second(self) -> float:
        """The challenge's rate: images x edges / inference seconds (images computed in this run, when resumed)."""
        n = self.images if self.images_computed is None else self.images_computed
        return n * self.edges / self.seconds if self.seconds > 0 and n > 0 else float("nan")


# --- tasks (run on workers) ---------------------------------------------------------------------------------


def _load_all_layers(path: str, dtype: str, backend: str) -> list[Block]:
    # data mode: the whole network, read by the worker straight from the store
    store = open_store(path, check="metadata")
    dev = kernels.to_device
    return [(dev(w.indptr, backend), dev(w.indices, backend), dev(w.data.astype(dtype), backend))
            for w in store.iter_layers()]


def _load_part_layers(path: str, part: list[PartLayer], first_rows: int, dtype: str, backend: str
                      ) -> list[tuple[PartLayer, Block]]:
    # model mode: only this part's columns of each layer, indexed into the rows it reads (its previous block,
    # then the received rows), kept beside the part's plan so the per-layer tasks carry no arrays of their own
    store = open_store(path, check="metadata")
    out = []
    rows = first_rows
    for k, pl in enumerate(part, start=1):
        block = local_block(store.layer(k), pl, rows)
        out.append((pl, tuple(kernels.to_device(a, backend) for a in (block[0], block[1], block[2].astype(dtype)))))
        rows = pl.outputs.size
    return out


def _load_images(path: str, start: int, stop: int, rows: np.ndarray | None, dtype: str, backend: str) -> np.ndarray:
    block = open_inputs(path).rows(start, stop)
    yt = kernels.dense_transposed(block, np.dtype(dtype))
    return kernels.to_device(yt if rows is None else np.ascontiguousarray(yt[rows]), backend)


_STREAMS: dict[tuple, ReadAhead] = {}
#: Decoded bytes read by the streams this worker process has closed (so the counts survive their closing).
_CLOSED_BYTES = [0]


#: Per worker process: each model-mode part's activations between its layer tasks, by (run, chunk, part), as
#: ``[layer, block, alive masks of its sync layers so far]``. Only the boundary messages travel through Dask; a
#: block never leaves its worker, so it needs no key (a key per block cost a scheduler round trip per layer).
_HELD: dict[tuple[str, int, int], list] = {}


def _stream(spec: tuple) -> ReadAhead:
    # one stream per worker process and spec, so consecutive tasks share its read-ahead:
    # ("stream", store, dtype, keep): whole layers (data mode); ("part", plan, q, dtype, keep): part q's blocks
    if spec not in _STREAMS:
        _STREAMS[spec] = LayerStream(*spec[1:]) if spec[0] == "stream" else PartStream(*spec[1:])
    return _STREAMS[spec]


def _stream_bytes(dask_worker) -> int:
    return int(sum(s.bytes_read for s in _STREAMS.values()) + _CLOSED_BYTES[0])


def _close_streams(run: str) -> None:
    # after a run: the layers a stream holds leave the worker's memory, and no stream outlives its plan;
    # nor does any block of the run's model-mode parts (a failed run leaves some)
    for held in [h for h in _HELD if h[0] == run]:
        del _HELD[held]
    for spec in list(_STREAMS):
        stream = _STREAMS.pop(spec)
        _CLOSED_BYTES[0] += stream.bytes_read
        stream.close()


def _part_layer(part: list[tuple[PartLayer, Block]] | tuple, k: int) -> tuple[PartLayer, Block]:
    # a model-mode part's layer k: held in memory (a list), or read from its part plan as it is needed
    return part[k - 1] if isinstance(part, list) else _stream(part).layer(k)


def _write_part_plan_layer(path: str, plan_path: str, k: int, parts: int) -> np.ndarray:
    # one layer of a part plan: every part's lists and its block, indexed into the rows it will read
    w = open_store(path, check="lazy").layer(k)  # the client has checked the store's metadata
    before, after = read_plan_owners(plan_path, k - 1, k + 1)
    row = plan_layer(w, before, after, parts)
    blocks = []
    for q, pl in enumerate(row):
        own = int(np.count_nonzero(before == q))  # the rows of the part's previous block
        indptr, indices, data = local_block(w, pl, own)
        blocks.append(sp.csc_matrix((data, indices, indptr), shape=(own + received_rows(pl), pl.outputs.size)))
    write_plan_layer(plan_path, k, row, blocks)
    return layer_counts(row)


def _run_segment(weights: list[Block] | tuple, yt: np.ndarray, ids: np.ndarray | int, first: int, last: int,
                 bias: float, ymax: float, final: bool, results: tuple | None = None):
    # weights: resident blocks, or ("stream", path, dtype, keep) to read the layers from the store as needed
    # ids: the images' original indices, or (first segment) the chunk's first index
    ids = np.arange(ids, ids + yt.shape[1]) if isinstance(ids, int) else ids
    layers = weights[first - 1:last] if isinstance(weights, list) else _stream(weights).layers(first, last)
    yt, ids = kernels.run_layers(yt, layers, bias, ymax, ids)
    if not final:
        return yt, ids
    if results is not None:
        # written by the worker: a stopped run resumes from here
        path, c, with_activations = results
        write_chunk_result(path, c, ids, _rows_of(yt) if with_activations else None)
    return ids


def _rows_of(yt):
    # final activations (neurons x images, dense, maybe on a GPU) as sparse rows, one per image
    import scipy.sparse as sp

    return sp.csr_matrix(kernels.to_host(yt).T)


def _segment_state(state, part: int):
    return state[part]


def _dropped(masks: list[np.ndarray] | None) -> np.ndarray | None:
    # the images to keep when some died since the last compaction; None when none did (nothing to copy)
    if not masks:
        return None
    keep = _keep(masks)
    return None if keep.all() else keep


def _keep(masks: list[np.ndarray]) -> np.ndarray:
    keep = masks[0].copy()
    for m in masks[1:]:
        keep |= m
    return keep


#: Per worker process and run: bytes of the boundary messages built, per layer, as [dense rows, sent].
_MESSAGES: dict[str, dict[int, list[int]]] = {}


def _message_tally(run: str) -> dict[int, list[int]]:
    return _MESSAGES.pop(run, {})


def _step(part: list[tuple[PartLayer, Block]] | tuple, k: int, held: tuple[str, int, int], images, after,
          bias: float, ymax: float, others: tuple[int, ...], recipients: tuple[int, ...], sync: bool, final: bool,
          with_block: bool, compact: bool, *inbox: tuple) -> tuple:
    """Part ``held[2]``'s layer ``k`` of one chunk, and what it sends for layer ``k + 1``.

    The block comes from ``images`` (layer 1) or from what this worker holds (``after``, this part's previous step,
    orders the tasks). ``inbox`` holds the outputs of parts ``others`` for the previous layer, each
    ``(alive mask or None, {part: message})``: their rows this part reads, and, after a sync layer, their masks.
    Returns ``(mask or None, {recipient: message})``, or, after the last layer, ``(masks, block or None)``.
    """
    run, _, q = held
    if k == 1:
        block, masks = images, []
    else:
        state = _HELD.pop(held, None)
        if state is None or state[0] != k - 1:
            raise DasknnError(f"model mode: part {q} expected its layer {k - 1} on this worker, found "
                              f"{'none' if state is None else state[0]} (a task ran twice or out of order)")
        _, block, masks = state
    pl, (indptr, indices, data) = _part_layer(part, k)
    keep = None
    if k > 1 and inbox and inbox[0][0] is not None:
        # the previous layer was a sync layer: every part compacts by the union of all parts' masks
        keep = _dropped([masks[-1]] + [mask for mask, _ in inbox])
    if keep is not None:
        block = block[:, keep]
    # the received rows, stacked by sender, are read in place beside the block: nothing else is copied
    recv = kernels.empty_like_kind(block, (received_rows(pl), block.shape[1]))
    at = 0
    for p, (_, messages) in zip(others, inbox):
        if p not in pl.recv:
            continue
        n = pl.recv[p].size
        if keep is None:
            kernels.unpack_rows(messages[q], recv[at:at + n])
        else:
            # sent before the masks were known: unpack whole, keep the live images
            whole = kernels.empty_like_kind(block, (n, keep.size))
            kernels.unpack_rows(messages[q], whole)
            recv[at:at + n] = whole[:, keep]
        at += n
    block = kernels.layer_step(block, indptr, indices, data, bias, ymax, extra=recv)
    if sync:
        masks = masks + [kernels.alive(block)]
    if final:
        return masks, block if with_block else None
    _HELD[held] = [k, block, masks]
    return (masks[-1] if sync else None), _pack(part, k + 1, block, recipients, run, compact)


def _pack(part: list[tuple[PartLayer, Block]] | tuple, k: int, block, recipients: tuple[int, ...], run: str,
          compact: bool) -> dict[int, tuple]:
    # the messages for layer k: the rows of the part's block (its activations after layer k - 1) each recipient
    # reads, in their smallest form
    out = {}
    if not recipients:
        return out
    send = _part_layer(part, k)[0].send
    tally = _MESSAGES.setdefault(run, {}).setdefault(k, [0, 0])
    for r in recipients:
        if r in send:
            out[r] = kernels.pack_rows(block, send[r], None, compact)
            tally[0] += send[r].size * block.shape[1] * block.dtype.itemsize
            tally[1] += kernels.message_bytes(out[r])
    return out


def _first_messages(part: list[tuple[PartLayer, Block]] | tuple, images, recipients: tuple[int, ...], run: str,
                    compact: bool) -> tuple:
    # what the part's input pixels send for layer 1 (a step's output, without a mask)
    return None, _pack(part, 1, images, recipients, run, compact)


def _pick(output: tuple, q: int) -> tuple:
    # one recipient's share of a step's output (its message, and the mask)
    mask, messages = output
    return mask, {q: messages[q]} if q in messages else {}


def _categories(start: int, count: int, results: tuple | None, finals: tuple | None, *outs: tuple
                ) -> tuple[np.ndarray, list[int]]:
    # outs: each part's last step, (its alive masks at every sync layer, its last block or None); replaying the
    # compactions round by round gives the surviving images' indices
    ids = np.arange(start, start + count)
    alive = []
    rounds = list(zip(*(masks for masks, _ in outs)))
    for masks in rounds:
        ids = ids[_keep(list(masks))]
        alive.append(int(ids.size))
    if results is not None:
        path, c, with_activations = results
        rows = None
        if with_activations:
            # finals: (neurons, each part's output neurons); the last round's masks say which of the blocks'
            # images survive
            neurons, outputs = finals
            keep = _keep(list(rounds[-1]))
            blocks = [block for _, block in outs]
            yt = np.zeros((neurons, int(keep.sum())), dtype=kernels.to_host(blocks[0]).dtype)
            for out, block in zip(outputs, blocks):
                yt[out] = kernels.to_host(block)[:, keep]
            rows = _rows_of(yt)
        write_chunk_result(path, c, ids, rows)
    return ids, alive


# --- graph building (client) --------------------------------------------------------------------------------


def chunk_bounds(images: int, chunks: int) -> list[tuple[int, int]]:
    """Split ``images`` into ``chunks`` contiguous, nearly equal ranges."""
    edges = np.linspace(0, images, max(1, min(chunks, images)) + 1).round().astype(int)
    return [(int(a), int(b)) for a, b in zip(edges[:-1], edges[1:]) if b > a]


def sync_layers(depth: int, sync_every: int) -> list[int]:
    """Layers after which model-mode parts exchange alive masks and drop dead images (always the last)."""
    return sorted(set(range(sync_every, depth + 1, sync_every)) | {depth})


def _noop(x: int) -> int:
    return x


def _make_bytes(nbytes: int) -> np.ndarray:
    return np.ones(nbytes // 8)


def _size(a: np.ndarray) -> int:
    return int(a.nbytes)


def _calibrate(client, workers: list[str], threads: int, path: str, in_path: str, images: int, dtype: str) -> dict:
    """Rates measured on the cluster: the probe on one worker, task cost, worker-to-worker transfer rate."""
    from distributed import wait

    figures = client.submit(_probe_task, path, in_path, images, dtype, workers=[workers[0]],
                            allow_other_workers=False, pure=False).result()
    # many small tasks in one graph, as the engine submits them: the cost of a task, per thread
    n = 100 * len(workers)
    t0 = time.perf_counter()
    futs = client.map(_noop, range(n), pure=False)
    wait(futs)
    figures["task_seconds"] = (time.perf_counter() - t0) * threads / n
    del futs
    rate = float("inf")
    if len(workers) > 1:
        nbytes = 32 << 20
        made = client.submit(_make_bytes, nbytes, workers=[workers[0]], pure=False)
        wait(made)
        t0 = time.perf_counter()
        client.submit(_size, made, workers=[workers[1]], allow_other_workers=False, pure=False).result()
        rate = nbytes / (time.perf_counter() - t0)
        made.release()
    figures["transfer_rate"] = rate
    # the cores of the workers' machines, each machine once: whether a read-ahead thread has a core to itself
    from distributed.comm import get_address_host

    figures["cores"] = int(sum({get_address_host(w): n for w, n in client.run(os.cpu_count).items()}.values()))
    return figures


def _kernel_rate(client, workers: list[str], path: str, dtype: str, k: int, owners: np.ndarray | None) -> float:
    # ``workers`` at once, each on the block its mode gives it (model mode: its part, its place in its group)
    from .cost import kernel_rate

    g = 1 if owners is None else int(owners.max()) + 1
    futures = [client.submit(kernel_rate, path, k, dtype, owners, i % g, workers=[w],
                             allow_other_workers=False, pure=False) for i, w in enumerate(workers)]
    return float(np.mean(client.gather(futures)))


def _probe_task(path: str, in_path: str, images: int, dtype: str) -> dict:
    from .cost import probe

    return probe(path, in_path, images, dtype)


def _predict(client, workers: list[str], threads: int, store, path: str, in_path: str, images: int, dtype: str,
             memory: float, weight_bytes: int, partition, chunks: int | None, sync_every: int,
             resident: bool | None, everything: bool, group_size: int | None):
    """The cost model's predictions for data mode and every model/hybrid grouping the workers allow.

    Model and hybrid modes do data mode's multiply-adds plus their exchange, so where data mode holds the
    weights and has a chunk for every thread, the others are predicted (which partitions the network) only
    when ``everything`` is asked for.
    """
    from .cost import Calibration, predict

    cal = Calibration(**_calibrate(client, workers, threads, path, in_path, images, dtype))
    nnz = np.array([store.layer_nnz(k) for k in range(1, store.depth + 1)], dtype=np.int64)
    itemsize = np.dtype(dtype).itemsize

    middle = max(1, store.depth // 2)
    solo = _kernel_rate(client, workers[:1], path, dtype, middle, None)

    def one(g: int):
        res = resident if resident is not None else weight_bytes / g <= WEIGHTS_SHARE * memory
        n_chunks = chunks or default_chunks(images, threads, len(workers), g, res)
        volumes = owners = None
        if g > 1:
            owners = resolve_partition(path, partition, g)
            # layer by layer from the store: the client never holds the network
            volumes = np.array([layer_volumes([store.layer(k)], owners[k - 1:k + 1], parts=g)[0]
                                for k in range(1, store.depth + 1)], dtype=np.int64)
        # the probe's rate (one worker, the whole layer), scaled by how this mode's blocks run with every
        # worker running against how the whole layer runs on one worker alone
        cal.kernel_rates[g] = cal.kernel_rate * _kernel_rate(
            client, workers, path, dtype, middle, None if owners is None else owners[middle - 1:middle + 1]) / solo
        return predict(cal, images=images, layer_nnz=nnz, weight_bytes=weight_bytes, memory=memory,
                       workers=len(workers), threads=threads, chunks=min(n_chunks, images), group_size=g,
                       volumes=volumes, itemsize=itemsize, weights_share=WEIGHTS_SHARE, sync_every=sync_every,
                       resident=res)

    out = [one(1)]
    data_suffices = out[0].resident and images >= threads and resident is not False
    if everything or not data_suffices:
        sizes = [group_size] if group_size else [g for g in range(2, len(workers) + 1) if len(workers) % g == 0]
        out.extend(one(g) for g in sizes)
    return cal, out


def _check_mode(mode: str, workers: int, group_size: int | None) -> int:
    if mode not in MODES:
        raise DasknnError(f"--mode must be one of {', '.join(MODES)}, not {mode!r}")
    if mode == "data":
        return 1
    if mode == "model":
        return workers
    g = group_size or (2 if workers % 2 == 0 and workers >= 4 else workers)
    if g < 1 or workers % g:
        raise DasknnError(f"--group-size {g} must divide the {workers} workers")
    return g


def resolve_partition(store_path: str, partition, parts: int, seed: int = 0) -> np.ndarray:
    """An owners array for ``parts`` parts: a method name (computed once, then kept in the store), a ``.npy``
    file, or an array."""
    from . import partition as part_mod
    from .store import load_partition, partition_name, save_partition

    store = open_store(store_path, check="metadata")
    if isinstance(partition, np.ndarray):
        owners = partition
    elif isinstance(partition, (str, os.PathLike)) and str(partition).endswith(".npy"):
        try:
            owners = np.load(partition, allow_pickle=False)
        except (OSError, ValueError) as e:
            raise DasknnError(f"cannot read the partition ({e})", partition) from None
    else:
        name = partition_name(str(partition), parts, seed)
        saved = load_partition(store_path, name)
        if saved is not None:
            owners = saved[0]
        else:
            t0 = time.perf_counter()
            layers = store.partition_layers()
            owners = part_mod.partition_network(layers, parts, str(partition), seed=seed)
            report = part_mod.partition_report(layers, owners, str(partition), time.perf_counter() - t0)
            if os.access(store_path, os.W_OK):
                save_partition(store_path, name, owners, report)
    owners = part_mod.validate_partition(owners, store.depth, store.neurons)
    if int(owners.max()) + 1 != parts:
        raise DasknnError(f"the partition has {int(owners.max()) + 1} parts but each group has {parts} workers; "
                          f"partition with --parts {parts} or change --workers/--group-size")
    return owners


def infer(
    network: str | os.PathLike[str],
    inputs: str | os.PathLike[str] | None = None,
    client=None,
    *,
    mode: str = "auto",
    partition: str | np.ndarray = "hypergraph",
    group_size: int | None = None,
    images: int | None = None,
    chunks: int | None = None,
    segment: int | None = None,
    sync_every: int = 2,
    dtype: str = "float32",
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
    mode
        ``"data"``, ``"model"`` or ``"hybrid"`` (see the module's description), or ``"auto"``: the mode the
        cost model (:mod:`dasknn.cost`) predicts fastest among those whose share of the weights fits.
    partition
        For model and hybrid modes: a method of :mod:`dasknn.partition`, a ``.npy`` owners file, or an array.
    group_size
        Workers per group in hybrid mode (2 by default where the workers divide evenly).
    images
        Use only the first ``images`` inputs.
    chunks
        Number of image chunks. By default (:func:`default_chunks`) 2 per worker thread in data mode, so chunks
        pipeline through the layers, 1 per thread of a group in model and hybrid mode; more where a chunk's
        activations would not fit in a worker's memory.
    segment
        Data mode: layers per task (all by default: no exchange is needed between them).
    sync_every
        Model mode: layers between alive-mask exchanges that drop dead images.
    dtype
        ``"float32"`` or ``"float64"``.
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
        Layers a streaming worker holds at once (the one computing and the one being read ahead).
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
    """
    if dtype not in ("float32", "float64"):
        raise DasknnError(f"--dtype must be float32 or float64, not {dtype}")
    path = str(location(network))  # a local store, or a URL the workers read through fsspec
    store = open_store(path, check="metadata")  # the workers check every block they read
    in_path = path if inputs is None else str(location(inputs))
    batch = open_inputs(in_path)
    if batch.neurons != store.neurons:
        raise DasknnError(f"the inputs have {batch.neurons} pixels per image, the network {store.neurons} neurons",
                          in_path)
    count = batch.images if images is None else images
    if not 1 <= count <= batch.images:
        raise DasknnError(f"--batch must be between 1 and {batch.images} (the stored images), not {count}")
    if sync_every < 1:
        raise DasknnError("--sync-every must be at least 1")
    if activations and results is None:
        raise DasknnError("--activations needs --results (the store they are written to)")
    if messages not in ("compact", "dense"):
        raise DasknnError(f"--messages must be compact or dense, not {messages!r}")
    if backend not in ("cpu", "gpu"):
        raise DasknnError(f"backend must be cpu or gpu, not {backend!r}")
    if client is None:
        with ensure_client() as c:
            return infer(path, in_path, c, mode=mode, partition=partition, group_size=group_size, images=count,
                         chunks=chunks, segment=segment, sync_every=sync_every, dtype=dtype, backend=backend,
                         resident=resident, keep_layers=keep_layers, results=results, resume=resume,
                         progress=progress, messages=messages, explain=explain, activations=activations,
                         plan_store=plan_store)

    info = workers_info(client)
    workers = sorted(info)
    if not workers:
        raise DasknnError("the Dask cluster has no workers")
    import psutil

    # by sizes alone: each worker would hold its share of the weights (values + indices) in memory
    weight_bytes = store.edges * (np.dtype(dtype).itemsize + 4)
    memory = min((w.get("memory_limit") or psutil.virtual_memory().total / len(workers)) for w in info.values())
    threads = sum(w["nthreads"] for w in info.values())
    predictions: list = []
    calibration = None
    if mode == "auto" or explain:
        calibration, predictions = _predict(client, workers, threads, store, path, in_path, count, dtype, memory,
                                            weight_bytes, partition, chunks, sync_every, resident, explain,
                                            group_size if mode == "hybrid" else None)
    if mode == "auto":
        from .cost import cheapest

        best = cheapest(predictions)
        mode, group_size = best.mode, best.group_size
        if resident is None and best.group_size == 1:
            resident = best.resident
    g = _check_mode(mode, len(workers), group_size)
    if resident is None:
        resident = weight_bytes / g <= WEIGHTS_SHARE * memory
    if chunks is None:
        chunks = default_chunks(count, threads, len(workers), g, resident,
                                lambda width: _fits(store, dtype, resident, keep_layers, g, memory, width))
    bounds = chunk_bounds(count, chunks)
    done: set[int] = set()
    if results is not None:
        results = str(Path(results).resolve())
        run_desc = {"network": path, "inputs": in_path, "images": count, "dtype": dtype, "chunks": bounds}
        bounds, done = open_results(results, run_desc, resume, activations)
    todo = [c for c in range(len(bounds)) if c not in done]
    job = _Job(path=path, in_path=in_path, store=store, dtype=dtype, backend=backend, resident=resident,
               keep_layers=keep_layers, segment=segment, sync_every=sync_every, compact=messages == "compact",
               results=results, activations=activations, bounds=bounds, partition=partition, progress=progress,
               plan_store=None if plan_store is None else str(Path(plan_store).resolve()))
    _check_memory(store, dtype, resident, keep_layers, g, memory,
                  max(b - a for a, b in bounds))

    # a lost worker loses its blocks and the activations it held: the chunks not finished are run again on the
    # workers there are then (the finished ones are kept), with the partition redone if their number changed
    passes: list[_Pass] = []
    recoveries: list[dict] = []
    finished: dict[int, tuple] = {}
    remaining = list(todo)
    while remaining:
        # after a loss the groups are redone: a hybrid group size the workers left no longer divide is dropped
        fitting = group_size if group_size and len(workers) % group_size == 0 else None
        g = _check_mode(mode, len(workers), fitting if passes else group_size)
        try:
            one = _execute(client, job, workers, g, remaining)
            passes.append(one)
            finished.update(one.chunks)
            remaining = []
        except WorkersLost as lost:
            passes.append(lost.partial)
            finished.update(lost.partial.chunks)
            remaining = [c for c in remaining if c not in finished]
            if len(recoveries) >= MAX_RECOVERIES:
                raise DasknnError(f"workers were lost {len(recoveries) + 1} times ({', '.join(lost.lost)}); giving "
                                  "up: if they ran out of memory, raise --memory-limit, use --stream, more --chunks "
                                  "or --keep-layers 1; else see the workers' logs") from None
            t0 = time.perf_counter()
            workers = await_workers(client, len(workers), AWAIT_WORKERS_SECONDS)
            if not workers:
                raise DasknnError("every Dask worker was lost and none came back")
            recoveries.append({"lost": lost.lost, "chunks_kept": len(finished), "chunks_rerun": len(remaining),
                               "waited_seconds": round(time.perf_counter() - t0, 3), "workers_now": len(workers)})
    last = passes[-1] if passes else None
    plan = last.plan if last else None
    ids = [finished[c][0] for c in todo]
    plan_bytes = sum(p.plan_bytes for p in passes)
    per_layer = sum((p.per_layer for p in passes), np.zeros((store.depth, 3), dtype=np.int64))
    if done:
        ids.extend(read_results(results, done).values())
    cats = np.sort(np.concatenate(ids)) if ids else np.empty(0, dtype=np.int64)
    g = last.group_size if last else _check_mode(mode, len(workers), group_size)
    return InferenceResult(
        categories=cats, images=count, neurons=store.neurons, layers=store.depth, edges=store.edges,
        seconds=sum(p.seconds for p in passes), workers=len(workers), chunks=len(bounds),
        mode=mode, group_size=g, load_seconds=sum(p.load_seconds for p in passes),
        plan_seconds=sum(p.plan_seconds for p in passes),
        tasks=sum(p.tasks for p in passes), plan_volume=[] if plan is None else plan.volumes().tolist(),
        bytes_sent=sum(p.bytes_sent for p in passes), plan_bytes=plan_bytes,
        dense_message_bytes=per_layer[:, 0].tolist() if plan else [],
        message_bytes=per_layer[:, 1].tolist() if plan else [],
        exchange_bytes=per_layer[:, 2].tolist() if plan else [], bytes_read=sum(p.bytes_read for p in passes),
        resident=resident, computed_chunks=todo, images_computed=sum(bounds[c][1] - bounds[c][0] for c in todo),
        predictions=[p.as_dict() for p in predictions],
        calibration=None if calibration is None else calibration.as_dict(), recoveries=recoveries,
    )


#: Times an inference re-runs its unfinished chunks after losing workers before it gives up.
MAX_RECOVERIES = 3
#: Seconds an inference waits after losing workers for as many to be back (a nanny restarts a killed one).
AWAIT_WORKERS_SECONDS = 60.0
#: Memory a worker takes before it holds any data: Python, Dask, Zarr, the compiled kernels (measured: a
#: fresh worker with dasknn loaded uses about 140 MiB).
WORKER_BASE = 128 << 20
#: Share of a worker's memory limit at which Dask pauses it: what a run holds, over what the worker already
#: uses, must stay below it.
MEMORY_SHARE = 0.8


def _memory_need(store, dtype: str, resident: bool, keep_layers: int, g: int, width: int) -> tuple[float, ...]:
    # what a worker must hold beside its base: (all of it, the weights, a chunk's activations, the biggest layer)
    item = np.dtype(dtype).itemsize
    biggest = max(store.layer_nnz(k) for k in range(1, store.depth + 1)) * (item + 4) + (store.neurons + 1) * 8
    # resident weights are briefly held twice while they load (decoded arrays, then the kernel's copies):
    # measured on a 65536 x 8 network, a worker's peak was its weights twice over plus the rest
    weights = (2 * store.edges * (item + 4) if resident else biggest * keep_layers) / g
    activations = 3 * store.neurons * width * item  # input, output and a compacted copy of a chunk
    return weights + 2 * biggest + activations, weights, activations, biggest  # + a layer being decoded


def _fits(store, dtype: str, resident: bool, keep_layers: int, g: int, memory: float, width: int) -> bool:
    return WORKER_BASE + _memory_need(store, dtype, resident, keep_layers, g, width)[0] <= MEMORY_SHARE * memory


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


def _check_memory(store, dtype: str, resident: bool, keep_layers: int, g: int, memory: float, width: int) -> None:
    """Refuse, with what to change, a run whose workers cannot hold what they must (instead of Dask pausing,
    killing and restarting them in a loop)."""
    if _fits(store, dtype, resident, keep_layers, g, memory, width):
        return
    need, weights, activations, biggest = _memory_need(store, dtype, resident, keep_layers, g, width)
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


@dataclass
class _Job:
    """What every pass of one inference shares."""

    path: str
    in_path: str
    store: object
    dtype: str
    backend: str
    resident: bool
    keep_layers: int
    segment: int | None
    sync_every: int
    compact: bool
    results: str | None
    activations: bool
    bounds: list[tuple[int, int]]
    partition: object
    progress: Callable[[int, int], None] | None
    plan_store: str | None = None


@dataclass
class _Pass:
    """One pass over some chunks on one set of workers."""

    chunks: dict[int, tuple] = field(default_factory=dict)  # chunk -> (image ids, alive per sync round)
    plan: Outline | None = None
    group_size: int = 1
    plan_seconds: float = 0.0  # making a part plan (model mode out of core, once per partition)
    load_seconds: float = 0.0
    seconds: float = 0.0
    tasks: int = 0
    bytes_sent: int = 0
    bytes_read: int = 0
    plan_bytes: int = 0
    per_layer: np.ndarray | None = None


def _execute(client, job: _Job, workers: list[str], g: int, todo: list[int]) -> _Pass:
    """Load and run chunks ``todo`` on ``workers`` in groups of ``g``; raise :class:`WorkersLost` with the chunks
    that finished if a worker leaves."""
    store, path, dtype, backend, resident = job.store, job.path, job.dtype, job.backend, job.resident
    bounds, depth = job.bounds, store.depth
    groups = [workers[i:i + g] for i in range(0, len(workers), g)]
    run = uuid.uuid4().hex[:8]
    out = _Pass(group_size=g, per_layer=np.zeros((depth, 3), dtype=np.int64))
    plan = outline = None
    part_of: dict[str, object] = {}  # worker -> its part's layers: a future of them in memory, or a stream spec
    if g > 1:
        owners = resolve_partition(path, job.partition, g)
        if resident:
            plan = build_plan(store.network().layers, owners)
            outline = plan.outline()
        else:
            # out of core: each part streams its own columns from a part plan, made once per partition
            t0 = time.perf_counter()
            try:
                plan_path, outline = _part_plan(client, job, owners, workers, run)
            except WorkersLost as lost:
                raise WorkersLost(lost.lost, out) from None
            out.plan_seconds = time.perf_counter() - t0
            for members in groups:
                part_of.update({w: ("part", plan_path, q, dtype, job.keep_layers) for q, w in enumerate(members)})
        install_exchange_log(client)
    out.plan = outline

    # phase 1, untimed: weights and inputs into the workers' memory
    t0 = time.perf_counter()
    load = PinnedGraph(run)
    weight_keys: dict[str, str] = {}
    image_keys: dict[tuple[int, int], str] = {}
    chunk_group = {c: i % len(groups) for i, c in enumerate(todo)}
    for gi, members in enumerate(groups):
        for q, w in enumerate(members):
            if outline is None and resident:
                weight_keys[w] = load.add(w, f"weights-w{workers.index(w)}", (_load_all_layers, path, dtype, backend))
            elif plan is not None:
                weight_keys[w] = load.add(w, f"weights-g{gi}-p{q}", (_load_part_layers, path, plan.part(q),
                                                                         plan.inputs_owned[q].size, dtype, backend))
    for i, c in enumerate(todo):
        a, b = bounds[c]
        members = groups[chunk_group[c]]
        if outline is None:
            w = members[(i // len(groups)) % len(members)]
            image_keys[(c, 0)] = load.add(w, f"images-c{c}", (_load_images, job.in_path, a, b, None, dtype, backend))
        else:
            for q, w in enumerate(members):
                image_keys[(c, q)] = load.add(w, f"images-p{q}-c{c}", (_load_images, job.in_path, a, b,
                                                                       outline.inputs_owned[q], dtype, backend))
    keys = list(weight_keys.values()) + list(image_keys.values())
    loaded = dict(zip(keys, load.submit(client, keys)))
    try:
        watch(client, list(loaded.values()), workers)
    except WorkersLost as lost:
        raise WorkersLost(lost.lost, out) from None
    out.load_seconds = time.perf_counter() - t0
    part_of.update({w: loaded[key] for w, key in weight_keys.items()})

    # phase 2, timed: the inference graph, referring to the loaded blocks by their futures
    graph = PinnedGraph(run)
    result_keys: dict[str, int] = {}
    for i, c in enumerate(todo):
        a, b = bounds[c]
        members = groups[chunk_group[c]]
        res = None if job.results is None else (job.results, c, job.activations)
        if outline is None:
            w = members[(i // len(groups)) % len(members)]
            weights = part_of[w] if resident else ("stream", path, dtype, job.keep_layers)
            key = _data_chunk(graph, c, a, w, weights, loaded[image_keys[(c, 0)]], depth, job.segment or depth,
                              store.bias, store.ymax, res)
        else:
            key = _model_chunk(graph, c, a, b - a, members, outline, part_of,
                               [loaded[image_keys[(c, q)]] for q in range(len(members))], depth, job.sync_every,
                               store.bias, store.ymax, res, job.compact)
        result_keys[key] = c
    out.tasks = len(graph)
    read_before = client.run(_stream_bytes)
    sent_before = client.run(bytes_sent)
    t0 = time.perf_counter()
    futures = graph.submit(client, list(result_keys))

    def finish(fut) -> None:
        value = fut.result()
        out.chunks[result_keys[fut.key]] = (value, []) if outline is None else value
        if job.progress is not None:
            job.progress(len(out.chunks), len(futures))

    try:
        watch(client, futures, workers, finish)
    except WorkersLost as lost:
        out.seconds = time.perf_counter() - t0
        raise WorkersLost(lost.lost, out) from None
    finally:
        for f in list(loaded.values()) + futures:
            f.release()  # the blocks leave the workers' memory
        client.run(_close_streams, run)  # and the streamed layers
    out.seconds = time.perf_counter() - t0
    sent_after = client.run(bytes_sent)
    out.bytes_sent = sum(sent_after[w] - sent_before.get(w, 0) for w in sent_after)
    if outline is not None:
        for k, nbytes in client.run_on_scheduler(exchange_log_pop, run=run).items():
            if k <= depth:  # (the last layer's blocks go to the categories task, not to a part)
                out.per_layer[k - 1, 2] += nbytes
    for tally in client.run(_message_tally, run).values():
        for k, (dense, sent) in tally.items():
            out.per_layer[k - 1, :2] += (dense, sent)
    read_after = client.run(_stream_bytes)
    out.bytes_read = sum(read_after[w] - read_before.get(w, 0) for w in read_after)
    if outline is not None:
        # what the plan says crosses: each layer's volume x the images its messages carry x the item size. The
        # messages for layer k are packed as layer k - 1 ends, before the parts' masks of a sync layer k - 1
        # meet, so the images that layer kills ride along once more
        itemsize = np.dtype(dtype).itemsize
        syncs = set(sync_layers(depth, job.sync_every))
        for c, (_, alive) in out.chunks.items():
            width = bounds[c][1] - bounds[c][0]
            rounds = iter(alive)
            for k in range(1, depth + 1):
                out.plan_bytes += outline.volume(k) * width * itemsize
                if k - 1 in syncs:
                    width = next(rounds)
    return out


def _part_plan(client, job: _Job, owners: np.ndarray, workers: list[str], run: str) -> tuple[str, Outline]:
    """The part plan for ``owners`` (each part's blocks and exchange lists, layer by layer): reused when one was
    made for this network and partition, else written by the workers, one task per layer."""
    path = job.plan_store
    if path is None:
        if is_url(job.path) or not os.access(job.path, os.W_OK):
            raise DasknnError("model mode out of core reads each part's columns from a part plan, which cannot be "
                              "written inside this store: give --plan-store DIR (a folder every worker can reach)",
                              job.path)
        path = str(Path(job.path) / "plans" / plan_digest(job.path, owners))
    found = open_plan_store(path, job.path, owners)
    if found is None:
        create_plan_store(path, job.path, owners)
        parts = int(owners.max()) + 1
        tasks = PinnedGraph(run)
        keys = [tasks.add(workers[(k - 1) % len(workers)], f"plan-l{k}",
                          (_write_part_plan_layer, job.path, path, k, parts)) for k in range(1, len(owners))]
        futures = tasks.submit(client, keys)
        watch(client, futures, workers)
        finish_plan_store(path, np.stack([f.result() for f in futures]))
        found = open_plan_store(path, job.path, owners)
    return path, Outline.from_owners(owners, found.counts())


def _data_chunk(graph: PinnedGraph, c: int, start: int, w: str, weights, images, depth: int, segment: int, bias: float,
                ymax: float, results: tuple | None) -> str:
    key = ""
    for first in range(1, depth + 1, segment):
        last = min(depth, first + segment - 1)
        final = last == depth
        args = (weights, images, start, first, last, bias, ymax, final, results)
        if first > 1:
            # continue from the previous segment's (yt, ids)
            yt_key = graph.add(w, f"state-l{first - 1}-c{c}-yt", (_segment_state, ref(key), 0))
            id_key = graph.add(w, f"state-l{first - 1}-c{c}-ids", (_segment_state, ref(key), 1))
            args = (weights, ref(yt_key), ref(id_key), first, last, bias, ymax, final, results)
        key = graph.add(w, f"spmm-l{first}-{last}-p0-c{c}", (_run_segment, *args))
    return key


def _model_chunk(graph: PinnedGraph, c: int, start: int, count: int, members: list[str], plan: Outline,
                 part_of: dict[str, object], images: list, depth: int, sync_every: int, bias: float, ymax: float,
                 results: tuple | None, compact: bool) -> str:
    # part_of: each worker's layers (a future of them, or a stream spec); images: each part's input rows (futures).
    # One task per part and layer: it computes the layer and packs what others need of it for the next one.
    parts = len(members)
    syncs = set(sync_layers(depth, sync_every))
    with_block = results is not None and results[2]
    previous: list[str | None] = [None] * parts
    inbox: dict[int, list[tuple[int, str]]] = {q: [] for q in range(parts)}  # (sender, key) for the coming layer
    for p in range(parts):
        for r in plan.receivers(1, p):
            inbox[r].append((p, graph.add(members[p], f"send-l1-p{p}-to{r}-c{c}",
                                          (_first_messages, part_of[members[p]], images[p], (r,), graph.run,
                                           compact))))
    for k in range(1, depth + 1):
        final, sync = k == depth, k in syncs
        coming: dict[int, list[tuple[int, str]]] = {q: [] for q in range(parts)}
        for p in range(parts):
            # after a sync layer every other part needs this part's mask, with or without rows
            needs = set() if final else set(plan.receivers(k + 1, p)) | (set(range(parts)) - {p} if sync else set())
            recipients = tuple(sorted(needs))
            key = graph.add(members[p], f"spmm-l{k}-p{p}-c{c}", (
                _step, part_of[members[p]], k, (graph.run, c, p), images[p] if k == 1 else None,
                None if previous[p] is None else ref(previous[p]), bias, ymax, tuple(s for s, _ in inbox[p]),
                recipients, sync, final, with_block, compact, *(ref(key) for _, key in inbox[p])))
            previous[p] = key
            if len(recipients) == 1:
                coming[recipients[0]].append((p, key))
            else:
                for r in recipients:
                    coming[r].append((p, graph.add(members[p], f"send-l{k + 1}-p{p}-to{r}-c{c}",
                                                   (_pick, ref(key), r))))
        inbox = coming
    finals = (plan.neurons, plan.last_outputs) if with_block else None
    return graph.add(members[0], f"categories-c{c}", (_categories, start, count, results, finals,
                                                       *(ref(key) for key in previous)))
