"""The cost model behind ``--mode auto``: predicted inference time of data, model, hybrid and pipeline modes.

Every mode does the same multiply-adds (each layer's entries times the images still alive when it runs); they
differ in what they add to them and in what must fit in memory:

* data mode: each worker holds every layer (or streams them from the store, one read of the network per chunk,
  overlapped with compute by the read-ahead), one task per chunk and segment;
* model mode (groups of ``g`` workers, ``g`` = all workers; hybrid: fewer): each worker holds ``1/g`` of the
  weights (or streams its share from a part plan, overlapped with compute as in data mode), but per layer and
  chunk packs, moves and unpacks the boundary rows the plan lists, and runs ``g`` tasks (more when a part sends
  to several others) instead of a share of one;
* pipeline mode (``g`` stages, ``workers / g`` pipelines): each worker holds a stage of consecutive layers; a
  pipeline's time is its slowest stage per chunk times its chunks, plus the fill and drain (``g - 1`` more stage
  times), plus the chunks' activations sent across each stage boundary, and one task per stage and chunk.

The prediction is a sum of those costs, each a size this module is given times a rate measured on the
workers (:class:`Calibration`): kernel multiply-adds per second, message entries packed and unpacked per
second, bytes moved between two workers per second, seconds per task, bytes read from the store per second.
The sizes come from the store (entries per layer), the plan (boundary entries per layer) and a probe: a sample
of the batch run through the network on one worker, which gives the fraction of images alive at each layer and
how small a compact message of their activations is. Nothing here knows Dask; the engine measures and asks.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from . import kernels
from .kernels.ends import ENDS_EVERY, ENDS_MOST_COLUMNS, next_span, next_stop
from .kernels.marks import column_classes
from .kernels.warm import WarmSpec, warm_kernels
from .locations import is_url
from .modes import mode_of
from .runtime.exchange.choice import P2P_MESSAGE_SECONDS
from .rates import (  # noqa: F401 - (their old import paths, re-exported)
    COLLAPSED_IMAGES, COLLAPSED_LAYERS, KERNEL_CALL, KERNEL_CALLS, KERNEL_SECONDS, LOOP_BYTES, LOOP_LAYERS, LayerCosts,
    LoopTiming, StepRates, batch_sample, kernel_rate, layer_seconds, loop_bytes, loop_timing, probe_layer_bytes,
    step_rates)
from .stages import place_stages, stage_capacity, stage_cuts
from .store import LayerStream, open_store

#: Multiply-adds a probe may spend (the probe runs on one worker before the timed run).
PROBE_BUDGET = 4e9
#: Seconds the probe may spend reading layers from a store behind a URL (behind a slow link, the store's read rate
#: is known long before the multiply-adds' budget is spent: 16.6 s of a 43 s run at 100 Mbit/s), once it has run
#: PROBE_MIN_LAYERS layers.
PROBE_READ_SECONDS = 2.0
PROBE_MIN_LAYERS = 8
#: The share of the network's layers the probe reads behind a URL before its read budget may stop it: the
#: challenge's images fold onto a few vectors after a dozen or more layers, and a probe stopped before that
#: predicted every later layer as its last (a 65,536 x 480 network behind 200 Mbit/s read 8 layers in its 2 s,
#: with 184 of 200 images distinct, where they are one vector from layer 15: every mode's compute predicted 2-9
#: times its figure at 1 Gbit/s). A twentieth of one read of the network, what any mode reads at least.
PROBE_READ_SHARE = 0.05
#: Images the probe carries on through the later layers once its multiply-adds' budget is spent, and the
#: multiply-adds it may spend on them: the collapse often comes after the budget's first layers (10 of 120 at
#: 65,536 neurons, 200 images, where data mode was then predicted at 319 s for 30 s measured).
PROBE_TAIL_IMAGES = 16
PROBE_TAIL_BUDGET = 4e9
#: Activations (images x neurons) in the probe's sample.
PROBE_ACTIVATIONS = 1 << 21
#: Bytes the probe takes per activation of its sample (images x neurons x itemsize) at most: the sample, the two
#: buffers its steps write into, a message packed and unpacked, the kernel's tile buffers (measured on a
#: 65,536-wide float64 layer: 0.19, 0.25, 0.36 and 0.57 GB over the process's own at 16, 64, 128 and 200 images,
#: 5.6 activations' bytes an image between the last two).
PROBE_COPIES = 6
#: Layers the probe holds at once at most (the stream's layer and its read-ahead, the warm-up's, scipy's copies).
PROBE_LAYERS = 4
#: Stored bytes the probe's stream keeps of what it reads, to time decoding its first layer again from memory
#: (:attr:`Calibration.decode_rate`): a 65,536-wide layer of random weights stores in about 7.5 MB.
PROBE_HOLD_BYTES = 16 << 20
#: Images the probe samples at least where the batch has them: in less memory than that takes, it cannot run
#: (``auto`` then runs the mode that needs least memory).
PROBE_MIN_IMAGES = 16
@dataclass
class Calibration:
    """Rates measured on this cluster's workers, and what a sample of the batch does in the network."""

    kernel_rate: float  # multiply-adds per second on one thread, fused kernel, probe-wide batches
    message_rate: float  # boundary entries packed + unpacked per second on one thread
    transfer_rate: float  # bytes per second between two workers (serialise, send, receive)
    task_seconds: float  # scheduler + worker cost of one small task
    read_rate: float  # decoded bytes per second read from the store by one worker
    alive: list[float]  # per layer: fraction of the batch's images alive when the layer runs
    message_factor: list[float]  # per layer: compact message bytes / dense rows bytes
    probe_layers: int  # layers the probe ran (later ones reuse the last measured figures)
    probe_images: int
    cores: int = 0  # CPU cores of the workers' machines together (0: unknown, taken as enough to spare)
    #: per group size (1: data mode): the kernel's rate on the blocks that mode runs, with every worker running
    #: at once (:func:`kernel_rate`); ``kernel_rate`` where a size was not measured
    kernel_rates: dict[int, float] = field(default_factory=dict)
    #: per layer: fraction of the batch's images computed when the layer runs where equal images fold (the distinct
    #: vectors among the alive, :mod:`dasknn.kernels.folds`); empty: every alive image (``compress=False``)
    distinct: list[float] = field(default_factory=list)
    #: workers whose reads of the store add up: behind a URL, the hosts the workers run on (each host's workers
    #: share its link to the store); 0: every worker (a local store, read and decoded by each worker alike)
    readers: int = 0
    #: per group size of model and hybrid modes: boundary entries packed and unpacked per second, and activations
    #: marked per second after a sync layer, on that mode's blocks over a chunk's width (:func:`step_rates`);
    #: ``message_rate`` where a size was not measured, and no marks counted
    message_rates: dict[int, float] = field(default_factory=dict)
    mark_rates: dict[int, float] = field(default_factory=dict)
    #: seconds data mode's loop spends on a layer of a chunk whatever its images (reading the layer through the
    #: cache, the loop's bookkeeping), timed on a chunk whose images are all equal (:func:`layer_seconds`)
    layer_seconds: float = 0.0
    #: seconds data mode's loop spends once more on a layer of a worker's first chunk of a run (:func:`layer_seconds`),
    #: and by group size a model-mode step on its layer (:func:`step_rates`)
    layer_setup_seconds: float = 0.0
    step_setup_seconds: dict[int, float] = field(default_factory=dict)
    #: seconds of one task submitted and its result gathered: what a run pays once however little it computes
    #: (its graph sent, its results back: 0.04-0.05 s for 8 images in data and pipeline mode, the 2-core VM)
    round_trip_seconds: float = 0.0
    #: seconds data mode's first chunk on a worker takes beyond its next for its memory, touched afresh in each run
    #: (:func:`loop_timing`'s first call beyond its layers' learning)
    first_chunk_seconds: float = 0.0
    #: images a second a worker reads from the batch and makes dense, as a chunk's first task does (the probe's
    #: sample; 0: not counted): 5,000 of the real n1024-l120's images took 18-37 ms, a tenth of their chunk's loop
    image_rate: float = 0.0
    #: decoded bytes per second one worker decodes of layers it keeps as stored (the hold: a streaming worker's later
    #: chunks read what its first fetched from memory), and the stored bytes of a decoded byte (0: not measured;
    #: every read then costs ``read_rate``)
    decode_rate: float = 0.0
    stored_share: float = 0.0

    def core_share(self, threads: float) -> float:
        """The share of a core each of ``threads`` threads computing at once has: 1 where the workers' machines
        have a core for each (or their cores are unknown), else their cores over the threads."""
        return 1.0 if not self.cores else min(1.0, self.cores / max(1.0, float(threads)))

    def as_dict(self, per_layer: bool = True) -> dict:
        """The calibration as plain values; without ``per_layer``, its rates alone (the lists with an entry a
        layer, ``alive``, ``message_factor`` and ``distinct``, left out)."""
        figures = asdict(self)
        if not per_layer:
            for name in PER_LAYER:
                figures.pop(name)
        return figures


#: :class:`Calibration`'s lists with an entry a layer.
PER_LAYER = ("alive", "message_factor", "distinct")


@dataclass
class Prediction:
    """Predicted seconds of one mode, and its parts."""

    mode: str
    group_size: int
    fits: bool  # whether each worker's share of the weights fits its memory as the mode needs
    resident: bool
    seconds: float
    compute: float
    exchange: float
    tasks: float
    read: float
    #: the one-time setup this run would pay first (a partition not yet computed, a part plan not yet made),
    #: included in ``seconds``
    setup_seconds: float = 0.0
    #: where model mode's exchange volumes came from: "partition" (the one the run would use), "sample" (a cheaper
    #: partition of a few layers, scaled to the depth), "bound" (not estimated: the setup and data mode's compute
    #: cost more than data mode, so the exchange is left at 0 and the prediction is a lower bound); "" in data mode
    volumes_from: str = ""
    #: model and hybrid modes: the transport the prediction assumes for the boundary messages ("tasks" or "p2p")
    transport: str = ""
    #: resident weights: the seconds of reading each worker's share from the store before the run (the load
    #: phase), included in ``seconds``; every worker reads at once, sharing what :func:`read_seconds` shares
    load_seconds: float = 0.0

    @property
    def inference_seconds(self) -> float:
        """The predicted seconds of the inference alone, as the run measures it (its ``seconds``): without the
        one-time setup and the load, which the engine times as phases of their own."""
        return self.seconds - self.setup_seconds - self.load_seconds

    def as_dict(self) -> dict:
        return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in asdict(self).items()}


#: Seconds per layer entry and doubling of the parts (``log2 K``) that computing a partition takes, by method;
#: measured on the client, this project's 2-core VM, 2026-12-01: ``hypergraph`` on generated 65,536 x 480, K = 2,
#: 139 s for 1.0e9 entries (with twins contracted); ``hypergraph-shared`` 132 s on 65,536 x 120 (measured before);
#: ``fast`` about 100 times faster than ``hypergraph-shared`` side by side, ``fast-segments`` about 2.5 times
#: ``fast`` (BENCHMARKS.md, issue 16); ``hypergraph-layered`` adds two sweeps of about the forward pass each.
PARTITION_RATES = {"hypergraph": 1.4e-7, "hypergraph-shared": 5.2e-7, "hypergraph-layered": 1.6e-6, "fast": 5.2e-9,
                   "fast-segments": 1.3e-8, "block": 1e-9, "random": 1e-9}
#: Seconds a layer of one chunk waits in model mode's p2p exchange beyond its messages (the step's task waking, the
#: event loop writing and reading): fitted on this project's 2-core VM, 2026-12-06, to the real n1024-l120 with 64
#: images (nothing to compute), 120 layers in 0.16-0.21 s at K = 2 and 0.38-0.41 s at K = 4 (BENCHMARKS.md, issue
#: 42 item 10), with :data:`~dasknn.runtime.exchange.choice.P2P_MESSAGE_SECONDS` per message sent and read.
P2P_STEP_SECONDS = 3e-4
#: Seconds per layer entry of making a part plan: 191.5 s for generated 65,536 x 480 (1.0e9 entries) written
#: by 2 workers (BENCHMARKS.md, out of core), i.e. about 3.8e-7 per entry on one process.
PLAN_RATE = 3.8e-7


def setup_seconds(entries: int, parts: int, method: str | None, plan: bool, workers: int = 1,
                  segments: int = 1) -> float:
    """Predicted one-time setup of model mode: computing a partition by ``method`` (None: one is already there)
    of a network of ``entries`` layer entries into ``parts`` parts, in ``segments`` segments at once on the cluster
    (:func:`~dasknn.partition.cluster.segment_count`), and making its plan (``plan``) on ``workers``."""
    seconds = 0.0
    if method is not None:
        seconds += (PARTITION_RATES.get(method, PARTITION_RATES["hypergraph"]) * entries * max(1.0, np.log2(parts))
                    / max(1, segments))
    if plan:
        seconds += PLAN_RATE * entries / max(1, workers)
    return float(seconds)


def probe_width(neurons: int, itemsize: int, images: int, layer_bytes: int = 0,
                memory: float | None = None) -> int:
    """Images the probe samples of a batch of ``images``, in ``memory`` bytes (None: unbounded) beside what its
    worker holds already; 0 where not even :data:`PROBE_MIN_IMAGES` (or the batch, if smaller) fit.

    :data:`PROBE_ACTIVATIONS` activations wide (2,048 images at 1,024 neurons, several of the kernel's tiles, so
    its alive fractions are those of a real chunk) and two of the kernel's tiles at least (256 images at 65,536
    neurons in float64), but only as many whole vectors of images as :data:`PROBE_LAYERS` layers of
    ``layer_bytes`` and :data:`PROBE_COPIES` times the sample leave room for: two tiles of a 65,536-wide float64
    layer took 0.6 GB, more than a worker of 600 MB may hold.
    """
    # two of the kernel's tiles at least: a sample of a wide layer narrower than TWIN_MIN_IMAGES (as one tile's
    # images are, once a few die) runs the kernel without its twins, at a third of the rate a run's chunks get
    # (65,536 wide: 1.4e9 against 4.1e9 multiply-adds per second)
    width = min(images, 4096, max(64, PROBE_ACTIVATIONS // neurons, 2 * kernels.tile_for(neurons, itemsize)))
    if memory is None:
        return int(width)
    room = int((memory - PROBE_LAYERS * layer_bytes) // (PROBE_COPIES * neurons * itemsize))
    if room < min(width, PROBE_MIN_IMAGES):
        return 0
    # whole vectors of 16 images where more than 16 fit (the kernel's tiles are)
    return int(min(width, room - room % 16 if room >= 16 else room))


def probe(path: str, inputs: Any, images: int, dtype: str, memory: float | None = None, layer_bytes: int = 0) -> dict:
    """Run a sample of the batch through the network on this worker (a task): alive fractions, message factors,
    kernel, packing and store-read rates.

    The sample is the batch's first images, as many as :func:`probe_width` gives in ``memory`` bytes (None:
    unbounded); the probe stops after :data:`PROBE_BUDGET` multiply-adds, once its reads took
    :data:`PROBE_READ_SECONDS` behind a URL (after :data:`PROBE_MIN_LAYERS` layers and :data:`PROBE_READ_SHARE` of
    them), or once its alive images are one vector: later layers are assumed to behave like the last one it ran.

    ``inputs`` is the inputs store (its path), or rows in memory the task was given: a scattered batch, or a
    dask.array's first chunk (NumPy, ``scipy.sparse`` or CuPy; the sample is then at most that chunk's rows).
    ``layer_bytes``, where the caller knows it (0: not), is the network's largest layer as the probe holds it
    (:func:`~dasknn.rates.probe_layer_bytes`): the store is then opened lazily, the metadata of the layers the
    probe runs read with them (every layer's took 1 s of a 65,536 x 480 network's probe on the 2-core VM).
    """
    # the store opened once, by the stream that reads its layers
    stream = LayerStream(path, dtype, keep=1, hold_bytes=PROBE_HOLD_BYTES, check="lazy" if layer_bytes else "metadata")
    store = stream.store
    itemsize = np.dtype(dtype).itemsize
    width = probe_width(store.neurons, itemsize, images, layer_bytes or probe_layer_bytes(store, itemsize), memory)
    if width == 0:
        stream.close()
        raise MemoryError(f"the cost model's probe cannot sample {PROBE_MIN_IMAGES} images of a {store.neurons}-wide "
                          f"network in {memory / (1 << 20):,.0f} MiB")
    t0 = time.perf_counter()
    yt = batch_sample(inputs, width, np.dtype(dtype))
    sample_s = time.perf_counter() - t0
    width = yt.shape[1]
    # the steps write into two buffers in turn, touched once here, as data mode's loop reuses its memory: a fresh
    # output per step is a fresh mapping whose page faults made single steps time 1.5 to 6 times slower
    buffers = [np.zeros(yt.shape[0] * width, dtype=yt.dtype) for _ in range(2)]
    alive, distinct, factor = [], [], []
    macs = tail_macs = 0.0
    per_column = 1.0 / width  # the share of the sample one column stands for (more once a tail is carried on)
    kernel_s = read_s = message_s = 0.0
    entries = 0
    read_bytes = 0
    remote = is_url(path)  # (a local store's reads are decoding, bounded by the budgets of multiply-adds)
    read_layers = max(PROBE_MIN_LAYERS, int(np.ceil(PROBE_READ_SHARE * store.depth)))
    _warm_up(yt, stream.layer(1), store, buffers[1])
    for k in range(1, store.depth + 1):
        store.layer_nnz(k)  # (its metadata opened untimed: a run's stream opens every layer's before it reads)
        t0 = time.perf_counter()
        indptr, indices, data = stream.layer(k)
        read_s += time.perf_counter() - t0
        read_bytes += indptr.nbytes + indices.nbytes + data.nbytes
        keep = kernels.alive(yt) if k > 1 else np.ones(yt.shape[1], dtype=bool)
        alive.append(float(keep.sum()) * per_column)
        # the collapse: how many distinct vectors the alive images hold (the columns a folding run computes)
        classes = column_classes(yt)
        vectors = int(np.count_nonzero(keep & (classes == np.arange(classes.size))))
        distinct.append(distinct_share(vectors, per_column, width))
        if vectors == 1 and k >= PROBE_MIN_LAYERS:
            # collapsed onto one vector: images equal after a layer stay equal after every later one, so the
            # later layers compute that one vector (or none, once it dies), as the last figures say. Carried on,
            # the tail of a 65,536 x 480 network ran 115 more layers for nothing, 4-5 s of auto's calibration
            break
        # dropped in place as model mode drops them: its blocks stay C-ordered (yt[:, keep] is not), so the messages
        # packed below are of the run's layout (and of the signature the warm-up compiled)
        yt = kernels.keep_columns(yt, keep) if not keep.all() else yt
        if yt.shape[1] == 0:
            factor.append(0.0)
            break
        rows = np.arange(0, yt.shape[0], 2)  # half the neurons: a part's boundary, as far as density goes
        tail = per_column * width > 1.0  # (the tail's narrow steps are not timed: a run's chunks are wider)
        t0 = time.perf_counter()
        msg = kernels.pack_rows(yt, rows)
        kernels.unpack_rows(msg, np.empty((rows.size, yt.shape[1]), dtype=yt.dtype))
        message_s += 0.0 if tail else time.perf_counter() - t0
        entries += 0 if tail else rows.size * yt.shape[1]
        factor.append(kernels.message_bytes(msg) / max(1, rows.size * yt.shape[1] * yt.dtype.itemsize))
        t0 = time.perf_counter()
        out = buffers[k % 2][:(indptr.size - 1) * yt.shape[1]].reshape(indptr.size - 1, yt.shape[1])
        yt = kernels.layer_step(yt, indptr, indices, data, store.bias, store.ymax, out=out)
        if tail:
            tail_macs += float(indices.size) * yt.shape[1]
        else:
            kernel_s += time.perf_counter() - t0
            macs += float(indices.size) * yt.shape[1]
        if remote and read_s >= PROBE_READ_SECONDS and k >= read_layers or tail_macs >= PROBE_TAIL_BUDGET:
            break
        if macs >= PROBE_BUDGET and not tail:
            if yt.shape[1] <= PROBE_TAIL_IMAGES:
                break
            # the budget spent: a few of the images carried on, each standing for its share of those alive
            per_column *= yt.shape[1] / PROBE_TAIL_IMAGES
            yt = np.ascontiguousarray(yt[:, :PROBE_TAIL_IMAGES])
    decode_rate, stored_share = _decode_timing(stream, read_bytes)
    stream.close()
    return {"kernel_rate": macs / max(kernel_s, 1e-9), "message_rate": entries / max(message_s, 1e-9),
            "read_rate": read_bytes / max(read_s, 1e-9), "decode_rate": decode_rate, "stored_share": stored_share,
            "alive": alive, "distinct": distinct,
            "message_factor": factor, "image_rate": width / max(sample_s, 1e-9),
            "probe_layers": len(alive), "probe_images": width}


def _decode_timing(stream: LayerStream, read_bytes: int) -> tuple[float, float]:
    # the probe's first layer read again from what its stream kept (as a streaming worker's later chunks read
    # theirs): decoded bytes a second, and the stored bytes of a decoded byte; (0, 0) where it kept nothing
    held = stream.store.held
    if held is None or not held.held or not read_bytes:
        return 0.0, 0.0
    stored_share = held.fetched / read_bytes
    before = held.fetched
    t0 = time.perf_counter()
    indptr, indices, data = stream.layer(1)
    seconds = time.perf_counter() - t0
    decoded = indptr.nbytes + indices.nbytes + data.nbytes
    if held.fetched - before > 0.5 * decoded * stored_share:  # (not kept whole: fetched again, not a decode)
        return 0.0, stored_share
    return decoded / max(seconds, 1e-9), stored_share


def distinct_share(classes: int, per_column: float, width: int) -> float:
    """The share of the batch's images that are distinct vectors, from ``classes`` distinct among the probe's
    columns, each standing for ``per_column`` of the batch, of a sample ``width`` images wide.

    Where each column is one image (``per_column`` is ``1 / width``) that is the count itself. In the tail, where
    each column stands for several alive images, one class is taken as one vector (the tail's images all equal,
    as the challenge's collapse leaves them) and each further class as every image its column stands for: scaling
    every class by its columns, one vector left of 172 alive at 65,536 x 480 counted as 11 from layer 15 to 480,
    and charged data mode's prediction 6 s of multiply-adds in a run of 24 s.
    """
    if classes <= 0:
        return 0.0
    return 1.0 / width + (classes - 1) * per_column


def _warm_up(yt: np.ndarray, layer: tuple, store, buffer: np.ndarray) -> None:
    # the kernels' first calls in a fresh worker load (or compile) their machine code: measured inside the
    # probe, that made the packing rate look 5 times slower than the run then saw. Model mode's steps (messages
    # of every kind, images dropped), then the step on a layer as the probe reads it (scipy's index dtypes), at
    # the sample's whole width into ``buffer``: the thread's tile buffers are touched for the first time then
    # (timed, a 65,536-wide layer's first step ran at a tenth of the rate of its next)
    warm_kernels(WarmSpec(dtype=yt.dtype.name, steps=True))
    rows = layer[0].size - 1
    kernels.layer_step(yt, *layer, store.bias, store.ymax, out=buffer[:rows * yt.shape[1]].reshape(rows, -1))


def read_seconds(cal: Calibration, total_bytes: float, workers: int) -> float:
    """Seconds ``workers`` reading at once take to read ``total_bytes`` (decoded) from the store, all of them
    together: the probe's rate (one worker reading alone) times the readers whose reads add up
    (:attr:`Calibration.readers`; behind a rate-limited link to an object store, all the workers of a host share its
    link: one host's workers read no faster together than one of them alone)."""
    readers = min(workers, cal.readers) if cal.readers else workers
    return float(total_bytes) / (cal.read_rate * max(1, readers))


def stream_read_seconds(cal: Calibration, pass_bytes: float, passes: int, workers: int,
                        hold_bytes: float = 0.0, later_share: float = 1.0) -> float:
    """Seconds ``workers`` streaming at once spend reading, all of them together, where each reads ``pass_bytes``
    (decoded) ``passes`` times (once for each chunk it runs; a later chunk ``later_share`` of it,
    :func:`later_pass_share`). The first pass fetches and decodes at the probe's rate (:func:`read_seconds`); a
    later pass decodes from memory what its worker kept as stored, up to ``hold_bytes``
    (:func:`~dasknn.engine.sizing.stream_hold_bytes`), at :attr:`Calibration.decode_rate`, every worker on its
    own at once, and fetches the rest again. Without a measured decode rate every pass fetches."""
    again = max(0, int(passes) - 1) * later_share
    held = 0.0
    if again and cal.decode_rate and cal.stored_share and pass_bytes:
        held = min(1.0, float(hold_bytes) / (pass_bytes * cal.stored_share))
    fetched = read_seconds(cal, pass_bytes * workers * (1 + again * (1.0 - held)), workers)
    return fetched + (pass_bytes * again * held / cal.decode_rate if held else 0.0)


def later_pass_last(cal: Calibration, depth: int, first: int, last: int, images: int) -> int:
    """The last of layers ``first..last`` (data mode's network, a pipeline stage) that a worker's later chunk of a
    run runs, and streamed reads, where its chunks share their ends (:mod:`~dasknn.kernels.ends`): the first of
    the loop's stops after which the batch of ``images`` holds :data:`~dasknn.kernels.ends.ENDS_MOST_COLUMNS`
    distinct vectors at most (an earlier chunk on the worker met them there and left their ends); ``last`` where
    the probe saw no such collapse, or where images do not fold. Measured at 65,536 x 480 with 200 images: a
    stage's second chunk streamed 17 and 33 of its 240 layers, where each chunk was charged all of them."""
    if not cal.distinct or last < first:
        return last
    share = _per_layer(cal.distinct, depth)
    # the stops as the loop places them, backing off while they find nothing; a chunk's columns counted as the
    # probe's sample's distinct vectors (collapsed, they are the same few whatever the batch: scaled to 20,000
    # images, 3 of a sample of 2,048 would count 29)
    sample = min(images, cal.probe_images) if cal.probe_images else images
    done, span, columns = first - 1, ENDS_EVERY, float(sample)
    while done < last:
        stop = min(last, next_stop(done, span))
        after = float(share[min(stop, depth - 1)]) * sample  # (the distinct vectors the layer after ``stop`` computes)
        span, columns = next_span(span, columns, after), after
        if stop < last and after <= ENDS_MOST_COLUMNS:
            return stop
        done = stop
    return last


def later_pass_share(cal: Calibration, depth: int, first: int, last: int, images: int) -> float:
    """The share of layers ``first..last`` a worker's later chunk runs (:func:`later_pass_last`)."""
    return _layers_share(first, last, later_pass_last(cal, depth, first, last, images))


def _layers_share(first: int, last: int, end: int) -> float:
    """The share of layers ``first..last`` that layers ``first..end`` are."""
    return (end - first + 1) / max(1, last - first + 1)


def _per_layer(values: list[float], depth: int) -> np.ndarray:
    out = np.asarray(values + [values[-1] if values else 1.0] * (depth - len(values)), dtype=float)[:depth]
    return out


def predict(
    cal: Calibration,
    *,
    images: int,
    layer_nnz: np.ndarray,
    weight_bytes: float,
    memory: float,
    workers: int,
    threads: int,
    chunks: int,
    group_size: int,
    volumes: np.ndarray | None,
    itemsize: int,
    weights_share: float,
    sync_every: int = 2,
    resident: bool | None = None,
    setup: float = 0.0,
    volumes_from: str = "",
    transport: str = "tasks",
    neurons: int = 0,
    hold_bytes: float = 0.0,
) -> Prediction:
    """Predicted seconds of a run with groups of ``group_size`` workers (1: data mode).

    Parameters
    ----------
    layer_nnz
        Entries of each layer.
    weight_bytes, memory
        The whole network's bytes as held in memory; one worker's memory limit.
    volumes
        Model and hybrid modes: the plan's boundary entries per image for each layer.
    weights_share
        Share of a worker's memory its weights may take (the engine's rule).
    setup
        Model and hybrid modes: seconds of one-time setup this run pays first (:func:`setup_seconds`), added.
    volumes_from
        Where ``volumes`` came from, recorded in the prediction (see :class:`Prediction`).
    transport
        Model and hybrid modes: how the messages travel: ``"tasks"`` (a task per part and layer, and picks) or
        ``"p2p"`` (a task per part and chunk, and a message per pair and layer sent by the workers themselves,
        :data:`~dasknn.runtime.exchange.choice.P2P_MESSAGE_SECONDS` each).
    neurons
        Model and hybrid modes: the network's width, for the marks made after each sync layer over every part's
        rows (at :attr:`Calibration.mark_rates`); 0: not counted.
    hold_bytes
        Streamed: the bytes of what it fetched a worker keeps for its later chunks (:func:`stream_read_seconds`).
    """
    depth = layer_nnz.size
    alive = computed_per_layer(cal, depth)  # (where images fold, only the distinct ones are computed and sent)
    if group_size > 1:
        alive = alive[synced_layers(depth, sync_every)]  # (model mode drops and folds only after its sync layers)
    factor = _per_layer(cal.message_factor, depth)
    g = group_size
    share = weight_bytes / g
    fits = share <= weights_share * memory
    resident = fits if resident is None else resident
    per_thread = threads / workers
    # the same multiply-adds in every mode, spread over the threads that have chunks to run
    busy_threads = busy_thread_count(threads, workers, chunks, g)
    macs = images * float(np.dot(alive, layer_nnz))
    compute = macs / (cal.kernel_rates.get(g, cal.kernel_rate) * busy_threads)
    # each chunk's images read and made dense first: by its worker in data mode, by each of its parts (their own
    # rows) in model mode
    compute += images * g / (cal.image_rate * busy_threads) if cal.image_rate else 0.0
    # the chunks a streaming worker runs, each a pass over its layers (its part's in model mode); in data mode a
    # worker's later chunk runs, and reads, its layers only up to where the worker's chunks share their ends
    passes = 1 if resident else -(-chunks // max(1, workers // g))
    later = later_pass_share(cal, depth, 1, depth, images) if g == 1 else 1.0
    learnt = 1 + (passes - 1) * later
    if g == 1:
        # the loop's cost a layer, whatever is left, and what it learns of a layer on each worker's first chunk (on
        # every chunk where the layers are streamed: each pass decodes them afresh)
        firsts = min(chunks, workers)
        chunk_layers = depth * (firsts + (chunks - firsts) * later)
        compute += (chunk_layers * cal.layer_seconds / busy_threads + learnt * depth * cal.layer_setup_seconds
                    + cal.first_chunk_seconds)
    exchange = read = load = 0.0
    if not resident:
        # each chunk reads the whole network once (data mode), or each part its share of it (model mode), from the
        # store or from what its worker kept of it. Reading a local store is mostly decoding: the read-ahead
        # thread hides it behind compute only on a core the kernels leave idle, else it adds to the time
        read_total = stream_read_seconds(cal, weight_bytes / g, passes, workers, hold_bytes, later)
        hidden = 1.0 if not cal.cores else min(1.0, max(0, cal.cores - threads) / workers)
        read = (1.0 - hidden) * read_total + hidden * max(0.0, read_total - compute)
    else:
        # each group reads the network once before the run: every worker all of it in data mode, its part of it
        # in model mode
        load = read_seconds(cal, weight_bytes * workers / g, workers)
    if g == 1:
        tasks = chunks * 1.0  # one segment task per chunk
    else:
        vol = np.asarray(volumes, dtype=float)
        entries = images * float(np.dot(alive, vol))  # boundary entries crossing, all groups together
        compute += passes * depth * cal.step_setup_seconds.get(g, 0.0)  # on each part's first chunk (each, streamed)
        pack = entries / (cal.message_rates.get(g, cal.message_rate) * busy_threads)
        if neurons and g in cal.mark_rates:
            # after each sync layer every part marks its rows of the images it computed: which live, which are equal
            marked = images * neurons * float(alive[sync_every - 1::sync_every].sum())
            pack += marked / (cal.mark_rates[g] * busy_threads)
        moved = entries * itemsize * float(np.dot(alive * vol, factor) / max(np.dot(alive, vol), 1e-12))
        exchange = pack + moved / (cal.transfer_rate * workers)
        # a step per part and layer packs its own messages; with more than one recipient (g > 2) each gets its
        # share from a small task, and after a sync layer every other part is a recipient (of the mask)
        pairs = float(np.count_nonzero(vol)) / depth * g * (g - 1) if vol.size else 0.0
        if transport == "p2p":
            tasks = chunks * (2.0 * g + 1)  # a first send and a segment of every layer per part, the categories
            # (no volumes: the exchange is not estimated, and stays a lower bound of 0)
            # each layer of a chunk waits for its messages: a part's thread runs its chunks' layers one after
            # another, each sending and reading its messages (and after a sync layer its masks) in turn
            per_part = pairs / g + (g - 1) / sync_every
            rounds = np.ceil(chunks / max(1, workers // g) / max(1.0, per_thread))
            exchange += rounds * depth * p2p_layer_seconds(per_part) if vol.any() else 0.0
        else:
            picks = 0.0 if g <= 2 else pairs + g * (g - 1) / sync_every
            tasks = chunks * depth * (g + picks)
    task_time = tasks * cal.task_seconds / max(1, threads) + cal.round_trip_seconds
    seconds = compute + exchange + task_time + read + setup + load
    return Prediction(mode=mode_of(g, workers), group_size=g, fits=bool(fits or not resident), resident=bool(resident),
                      seconds=seconds, compute=compute, exchange=exchange, tasks=task_time, read=read,
                      setup_seconds=float(setup), volumes_from=volumes_from if g > 1 else "",
                      transport=transport if g > 1 else "", load_seconds=float(load))


def busy_thread_count(threads: int, workers: int, chunks: int, group_size: int) -> float:
    """The threads that have chunks to run at once: each chunk a thread in data mode (``group_size`` 1), each chunk
    a thread of each of its group's workers in model and hybrid mode; at most ``threads``."""
    if group_size == 1:
        return min(threads, chunks)
    return min(threads, chunks * group_size * threads / workers)


def p2p_layer_seconds(messages: float) -> float:
    """Seconds one layer of a chunk waits in model mode's p2p exchange beyond its work, where each part sends and
    reads ``messages`` messages a layer: :data:`P2P_STEP_SECONDS` and
    :data:`~dasknn.runtime.exchange.choice.P2P_MESSAGE_SECONDS` for each message sent and each read."""
    return P2P_STEP_SECONDS + 2.0 * messages * P2P_MESSAGE_SECONDS


def alive_per_layer(cal: Calibration, depth: int) -> np.ndarray:
    """The share of the batch's images alive when each of ``depth`` layers runs, as the probe saw it (the layers
    past the probe's last as that one)."""
    return _per_layer(cal.alive, depth)


def synced_layers(depth: int, sync_every: int) -> np.ndarray:
    """For each of ``depth`` layers (0-based), the layer whose images model mode's step computes: the parts drop
    the images that died, and fold those equal on every part, only after each ``sync_every``-th layer (as its next
    layer runs), so a layer runs the images alive (or distinct) at the last such layer."""
    every = max(1, int(sync_every))
    return np.arange(depth) // every * every


def computed_per_layer(cal: Calibration, depth: int) -> np.ndarray:
    """The share of the batch's images each of ``depth`` layers computes: the distinct vectors among the alive
    where equal images fold (the probe's count of them), else every alive image."""
    return _per_layer(cal.distinct or cal.alive, depth)


def stage_work(cal: Calibration | None, layer_nnz: np.ndarray, chunk_images: float,
               layer_bytes: np.ndarray | None = None) -> np.ndarray:
    """Each layer's seconds on a chunk of ``chunk_images`` images in a pipeline stage, what the stages are cut by
    (:func:`~dasknn.stages.stage_cuts`): its multiply-adds at data mode's loop rate (on the share of images the
    probe saw computed), the loop's cost a layer, and where the stage streams (``layer_bytes``: each layer's
    decoded bytes) its read at the probe's rate; the layers' entries alone where nothing was probed (``cal``
    None). Cut by multiply-adds alone, a network whose images fold onto one vector in its first layers (65,536 x
    480) put a dozen layers in the first stage and had the second read and run the other 468."""
    nnz = np.asarray(layer_nnz, dtype=float)
    if cal is None:
        return nnz
    rate = cal.kernel_rates.get(1, cal.kernel_rate)
    work = chunk_images * nnz * computed_per_layer(cal, nnz.size) / rate + cal.layer_seconds
    if layer_bytes is not None and cal.read_rate:
        work = work + np.asarray(layer_bytes, dtype=float) / cal.read_rate
    return work


def predict_pipeline(cal: Calibration, *, images: int, layer_nnz: np.ndarray, weight_bytes: float, memory: float,
                     workers: int, threads: int, chunks: int, stages: int, neurons: int, itemsize: int,
                     weights_share: float, resident: bool | None = None,
                     memory_limits: list[float] | None = None, hold_bytes: float = 0.0) -> Prediction:
    """Predicted seconds of pipeline mode: ``workers / stages`` pipelines of ``stages`` workers, each holding the
    consecutive layers :func:`~dasknn.stages.place_stages` gives it (``memory_limits``: each worker's, where they
    differ; else ``memory`` each), or streaming the layers of the cut by work alone (``resident`` False; None:
    resident where the stages fit).

    Each chunk runs each stage's layers with data mode's loop (its rate, and its cost a layer); a pipeline runs its
    chunks one stage time of its slowest stage apart, and the first chunk takes ``stages - 1`` more to fill it (as
    the last to drain it), unless the workers' cores are fewer than the stages' threads: then every stage's work
    shares them. The activations of the images alive at each stage boundary (dense, ``neurons`` x images) cross to
    the next worker. A worker must hold its stage's weights: the largest stage's share of ``weight_bytes``.
    Streamed, a stage worker keeps up to ``hold_bytes`` of what it fetched for its later chunks
    (:func:`stream_read_seconds`).
    """
    depth = layer_nnz.size
    alive = computed_per_layer(cal, depth)  # (where images fold, only the distinct ones are computed and cross)
    nnz = np.asarray(layer_nnz, dtype=float)
    pipelines = max(1, workers // stages)
    names = [str(i) for i in range(pipelines * stages)]
    limits = dict(zip(names, memory_limits or [memory] * len(names)))
    chunk_images = images / max(1, chunks)
    placed = place_stages(stage_work(cal, nnz, chunk_images), nnz,
                          [names[i:i + stages] for i in range(0, len(names), stages)], limits,
                          stage_capacity(weight_bytes, nnz.sum(), 1.0, weights_share))
    fits = placed.fits
    resident = fits if resident is None else resident
    # streamed stages hold a few layers whatever their length: cut by work alone, their reads included
    cuts = placed.stages if resident else stage_cuts(stage_work(cal, nnz, chunk_images,
                                                                weight_bytes * nnz / max(1.0, nnz.sum())), stages)
    per_thread = max(1.0, threads / workers)
    rate = cal.kernel_rates.get(1, cal.kernel_rate)
    def seconds_to(first: int, last: int) -> float:
        # a chunk's seconds on layers first..last (at the rate of every worker running at once)
        return (chunk_images * float(np.dot(alive[first - 1:last], nnz[first - 1:last])) / rate
                + (last - first + 1) * cal.layer_seconds)

    # each stage's seconds on a stage worker's first chunk and on its later ones (up to where they share their
    # ends), and its share of the weights
    ends = [later_pass_last(cal, depth, s.first, s.last, images) for s in cuts]
    stage_seconds = [seconds_to(s.first, s.last) for s in cuts]
    later_seconds = [seconds_to(s.first, end) for s, end in zip(cuts, ends)]
    if cal.image_rate:
        for times in (stage_seconds, later_seconds):
            times[0] += chunk_images / cal.image_rate  # the first stage reads each chunk's images
    stage_share = max(float(nnz[s.first - 1:s.last].sum()) for s in cuts) / max(1.0, float(nnz.sum()))
    largest = weight_bytes * stage_share
    per_pipeline = -(-chunks // pipelines)
    # more stage threads than cores (4 stages on 2 cores): a stage alone, as in the fill and drain, runs faster
    # than at the rate timed with every worker running, and the stages' work together is what the cores do
    shared = 1.0 if not cal.cores else max(1.0, threads / cal.cores)
    slowest, slowest_later = max(stage_seconds), max(later_seconds)
    # the first chunk through every stage (the fill, and the drain after the last: fewer stages busy, faster),
    # then the later ones a later stage time apart with every stage busy (at the rate timed so); or the stages'
    # work together over their threads, where that is more. Each stage time divided by the share (the fill's
    # and the steady state's alike) predicted 4 stages on 2 cores 1.8x fast on the real n1024-l120
    compute = max(slowest * (stages - 1) / shared + slowest + slowest_later * (per_pipeline / per_thread - 1),
                  (sum(stage_seconds) + sum(later_seconds) * (per_pipeline - 1)) / (stages * per_thread))
    # the first chunk's pass learns every stage's layers, and touches each stage's memory, in turn; streamed, each
    # chunk's learns its stage's layers afresh, the stages side by side
    later = [_layers_share(s.first, s.last, end) for s, end in zip(cuts, ends)]
    learning = 1.0 if resident else max(1.0, (1 + (per_pipeline - 1) * max(later)) / stages)
    compute += learning * depth * cal.layer_setup_seconds + stages * cal.first_chunk_seconds
    # the images alive after each stage but the last (alive[last] is the share entering the next layer)
    crossing = sum(float(alive[s.last]) for s in cuts[:-1])
    sent = images * neurons * itemsize * crossing
    exchange = sent / (cal.transfer_rate * workers) if sent else 0.0
    read = load = 0.0
    if not resident:
        # each stage worker reads its stage's layers once per chunk it runs (from what it kept of them, where it
        # could), behind compute where a core is spare: its largest stage's share of the network, each worker at once
        read_total = max(stream_read_seconds(cal, weight_bytes * float(nnz[s.first - 1:s.last].sum()) / nnz.sum(),
                                             per_pipeline, workers, hold_bytes, share)
                         for s, share in zip(cuts, later))
        hidden = 1.0 if not cal.cores else min(1.0, max(0, cal.cores - threads) / workers)
        read = (1.0 - hidden) * read_total + hidden * max(0.0, read_total - compute)
    else:
        load = read_seconds(cal, weight_bytes * pipelines, workers)  # each pipeline reads the network once
    task_time = chunks * stages * cal.task_seconds / max(1, threads) + cal.round_trip_seconds
    return Prediction(mode="pipeline", group_size=stages, fits=bool(fits or not resident), resident=bool(resident),
                      seconds=compute + exchange + task_time + read + load, compute=compute, exchange=exchange,
                      tasks=task_time, read=read, load_seconds=float(load))


def cheapest(predictions: list[Prediction]) -> Prediction:
    """The fastest prediction among those that fit in memory (data mode streaming always fits)."""
    return min((p for p in predictions if p.fits), key=lambda p: p.seconds)
