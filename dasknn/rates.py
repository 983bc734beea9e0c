"""The rates the cost model (:mod:`dasknn.cost`) times on the workers, as each mode runs its kernels: data mode's
loop over layers at its chunks' width and what it costs a layer beyond its multiply-adds, a model-mode part's
whole step on its blocks, and the fused kernel on a layer or a part's block. Each is a task the engine runs on every
worker at once (:mod:`dasknn.engine.sizing`); nothing here knows Dask."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import kernels
from .kernels.marks import column_classes
from .plan import local_block, plan_layer, received_rows
from .store import open_inputs, open_store

#: Seconds each worker runs the kernel for :func:`kernel_rate`, and the multiply-adds of one call at most.
KERNEL_SECONDS = 0.5
KERNEL_CALL = 2e8
#: Timed calls of :func:`kernel_rate` at least (their median is the rate).
KERNEL_CALLS = 3
#: Layers data mode's loop is timed over by :func:`kernel_rate` (``loop``), and the bytes of their arrays at most
#: (at least 2 layers): a worker of 600 MB timing 8 layers of a 65,536-wide network peaked at 0.8 GB and was
#: killed by its nanny.
LOOP_LAYERS = 8
LOOP_BYTES = 64 << 20
#: Images of the chunk, all equal, and layers :func:`layer_seconds` times data mode's loop over.
COLLAPSED_IMAGES = 64
COLLAPSED_LAYERS = LOOP_LAYERS


def probe_layer_bytes(store, itemsize: int) -> int:
    """The bytes of the network's largest layer as the probe holds it (values, indices and column pointers)."""
    return _held_bytes(store, int(store.layer_entries().max()), itemsize)


def window_layer_bytes(store, k: int, itemsize: int) -> int:
    """:func:`probe_layer_bytes` of the largest of the :data:`LOOP_LAYERS` layers from ``k``, the most a loop timed
    from ``k`` holds: the metadata of those layers only (a worker's store opened lazily read all 480 layers' of a
    65,536 x 480 network for the network's largest, 1.4 s a timing on the 2-core VM, and one request after another
    behind a URL)."""
    last = min(store.depth, k + LOOP_LAYERS - 1)
    return _held_bytes(store, max(store.layer_nnz(j) for j in range(k, last + 1)), itemsize)


def _held_bytes(store, entries: int, itemsize: int) -> int:
    # a layer of ``entries`` entries as the kernels hold it: values, int64 indices and column pointers
    return entries * (itemsize + 8) + (store.neurons + 1) * 8


def loop_bytes(layer_bytes: int, activation_bytes: int) -> int:
    """Peak bytes :func:`kernel_rate` takes to time data mode's loop on layers of ``layer_bytes`` over activations of
    ``activation_bytes``: its layers, and the activations about 7 times over (their draw, the loop's tiles, its
    outputs; measured on a 65,536-wide float64 layer with a 128-image tile: 0.51 GB over the process's own
    0.12 GB, of which 2 layers 0.05 GB)."""
    return int(_loop_layers(layer_bytes) * layer_bytes + 7 * activation_bytes)


def _fitting_width(width: int, tile: int, layer_bytes: int, column_bytes: int, memory: float | None) -> int:
    # the width asked for, cut to as many whole tiles as let a loop's layers and tiles fit in ``memory`` bytes (at
    # least one tile; None: unbounded). Whether even that fits is the caller's test: a loop over a wide layer
    # spends about 20 ms a layer finding its twins, shared by all the tiles of a chunk (65,536 wide, 128-image
    # tiles: a third of a tile's sums where a chunk is one tile, a tenth where it is four)
    while memory is not None and width > tile and loop_bytes(layer_bytes, column_bytes * width) > memory:
        width = max(tile, (width - 1) // tile * tile)
    return width


def _loop_layers(layer_bytes: int) -> int:
    # how many layers the loop is timed over: LOOP_LAYERS, fewer where they pass LOOP_BYTES, at least 2
    return min(LOOP_LAYERS, max(2, LOOP_BYTES // max(1, layer_bytes)))


@dataclass(frozen=True)
class LoopTiming:
    """Data mode's loop timed as it runs (:func:`loop_timing`)."""

    rate: float  # multiply-adds per second
    first_extra: float  # seconds its first call took beyond the others (fresh memory, the layers learnt)
    layers: int  # the layers a call ran
    cpu_rate: float = 0.0  # multiply-adds per CPU second of its thread (0: not timed; see clock_rate)


def loop_timing(path: str, k: int, dtype: str, width: int | None = None, seconds: float = KERNEL_SECONDS,
                memory: float | None = None, inputs: Any = None) -> LoopTiming:
    """:func:`kernel_rate` of data mode's loop (``loop``), with what its first call took beyond the others: a
    worker's first chunk of a run touches its activations' memory for the first time, as this first call does.

    With ``inputs`` (the batch: the inputs store's path, or rows in memory, as :func:`batch_sample` reads them),
    the loop runs the batch's first ``width`` images through the layers from ``k`` as a chunk runs them: dead
    images dropped and equal ones folded as they go (:class:`~dasknn.kernels.folds.Folds`), its multiply-adds
    counted from the columns each layer computed. On the real n1024-l120 a 5,000-image chunk's loop ran at
    7.8e9 multiply-adds a second where images at the clamp that never die ran at 1.2-1.5e10, whatever the width:
    the tiles empty as their images die and fold, and the first layers, where most of the multiply-adds are, are
    where they do. Where the sample's layers compute less than :data:`LIVELY_SHARE` of their full load (the
    batch dies or folds within them), its time is the loop's cost a layer, not its multiply-adds' (counted apart:
    :func:`layer_seconds`), and the images at the clamp are timed instead.
    """
    if inputs is not None:
        timed = _batch_loop_timing(path, k, dtype, inputs, width, seconds, memory)
        if timed is not None:
            return timed
    macs, times, layers = _kernel_timing(path, k, dtype, None, 0, width, seconds, True, memory)
    return LoopTiming(rate=macs / times.median, first_extra=max(0.0, times.first - times.median), layers=layers,
                      cpu_rate=macs / times.cpu_median)


#: The share of its layers' full load (every image computed on every layer) below which a sample of the batch is
#: not timed for data mode's multiply-adds (:func:`loop_timing`).
LIVELY_SHARE = 0.25
#: Images of a chunk :func:`loop_timing` times its rate on, where the chunk has more than twice as many.
LOOP_RATE_IMAGES = 2048


def _batch_loop_timing(path: str, k: int, dtype: str, inputs: Any, width: int | None, seconds: float,
                       memory: float | None) -> LoopTiming | None:
    # loop_timing on the batch's first images (None where they do not keep the layers busy)
    from .kernels.folds import Folds

    store = open_store(path, check="lazy")
    dt = np.dtype(dtype)
    layer_bytes = window_layer_bytes(store, k, dt.itemsize)
    n_layers = min(_loop_layers(layer_bytes), store.depth - k + 1)
    tile = kernels.tile_for(store.neurons, dt.itemsize)
    width = _fitting_width(int(max(1, width or tile)), tile, layer_bytes, store.neurons * dt.itemsize, memory)
    if memory is not None and loop_bytes(layer_bytes, store.neurons * width * dt.itemsize) > memory:
        # not even one tile's loop fits: one step's rate, as _kernel_timing times it (a 200-image chunk of a
        # 65,536-wide network took 313 MB more here, and a worker of 600 MB was lost in the probe)
        return None
    # a chunk wider than twice LOOP_RATE_IMAGES is timed on its first LOOP_RATE_IMAGES images: the loop's rate a
    # multiply-add is the same at any width (the real n1024-l120's: 5.4-5.7e9 a second from 1,024 to 15,000
    # images), and timed at a chunk's 15,000 it took 2.7 s on every worker, most of the calibration of the
    # README's default run; what the first call takes beyond the others (its memory) scales with the width
    scale = 1.0
    if width > 2 * LOOP_RATE_IMAGES:
        scale, width = width / LOOP_RATE_IMAGES, LOOP_RATE_IMAGES
    yt = batch_sample(inputs, width, dt)
    layers = [_layer_arrays(store, j, dt) for j in range(k, k + n_layers)]
    ids = np.arange(yt.shape[1])

    def call():
        return kernels.run_layers(yt, layers, store.bias, store.ymax, ids, folds=Folds())

    columns = call()[2].columns  # (the loop leaves its input as it was: every call runs the same chunk)
    entries = np.array([layer[1].size for layer in layers[:columns.size]], dtype=float)
    macs = float(np.dot(columns, entries))
    if macs < LIVELY_SHARE * yt.shape[1] * float(sum(layer[1].size for layer in layers)):
        return None
    times = _timed_calls(call, seconds)
    return LoopTiming(rate=macs / times.median, first_extra=max(0.0, times.first - times.median) * scale,
                      layers=n_layers, cpu_rate=macs / times.cpu_median)


def batch_sample(inputs: Any, width: int, dtype: np.dtype) -> np.ndarray:
    """The batch's first ``width`` images as the kernels' dense transposed block (on the host), from the inputs
    store (its path) or from rows in memory (NumPy, ``scipy.sparse``: a scattered batch, a dask.array's first
    chunk; then at most that chunk's rows)."""
    if isinstance(inputs, (str, os.PathLike)):
        return kernels.dense_transposed(open_inputs(inputs).rows(0, width), dtype)
    if getattr(inputs, "format", None) not in (None, "csr"):
        inputs = inputs.tocsr()  # a sparse format without row slices (COO)
    return kernels.activations_of_rows(inputs[:width], dtype)


def kernel_rate(path: str, k: int, dtype: str, owners: np.ndarray | None = None, part: int = 0,
                width: int | None = None, seconds: float = KERNEL_SECONDS, loop: bool = False,
                memory: float | None = None) -> float:
    """Multiply-adds per second of the fused kernel on layer ``k`` as a mode runs it: the whole layer (data
    mode), or part ``part``'s block of it (its columns, indexed into its own and its received rows) when
    ``owners`` (rows ``k - 1`` and ``k`` of an owners array) is given (model mode), over ``width`` images (by
    default one of the kernel's tiles). With ``loop``, data mode's loop over layers
    (:func:`dasknn.kernels.run_layers`, tiles carried through :data:`LOOP_LAYERS` layers from ``k``, the first
    ones over again where fewer are held) instead of one step: it keeps a tile's activations in cache between
    layers, so on narrow layers it runs faster per multiply-add than a single step. The loop runs as many whole
    tiles of ``width`` as its arrays (:func:`loop_bytes`) fit in ``memory`` bytes; where not even one tile fits,
    one step is timed instead. The rate is that of the median of at least :data:`KERNEL_CALLS` calls after an
    untimed one.

    The activations are random: the kernel visits every entry for every image, so its time does not depend on
    the values (the loop's multiply-adds, which depend on the images that die, are counted layer by layer
    before the timing). The engine runs this on one worker alone and then on every worker at once, once per
    mode: the rate depends on the block's shape and on what workers sharing a machine take from each other's
    caches (on a 65,536 x 480 network a part's block ran 1.4 times faster per multiply-add than the whole layer
    with two workers running). The ratios scale the probe's rate, which knows the batch's real widths.
    """
    macs, times, _ = _kernel_timing(path, k, dtype, owners, part, width, seconds, loop, memory)
    return macs / times.median


def _kernel_timing(path: str, k: int, dtype: str, owners: np.ndarray | None, part: int, width: int | None,
                   seconds: float, loop: bool, memory: float | None) -> tuple[float, CallTimes, int]:
    # kernel_rate's timing: the multiply-adds of a call, its calls' times, the layers a call runs (1: a step)
    store = open_store(path, check="lazy")
    w = store.layer(k)
    dt = np.dtype(dtype)
    if owners is None:
        block, rows, extra_rows = (w.indptr, w.indices, w.data.astype(dt)), w.shape[0], 0
    else:
        pl = plan_layer(w, owners[0], owners[1], max(int(owners.max()), part) + 1)[part]
        rows = int((owners[0] == part).sum())
        indptr, indices, data = local_block(w, pl, rows)
        block, extra_rows = (indptr, indices, data.astype(dt)), received_rows(pl)
    nnz = max(1, block[1].size)
    tile = kernels.tile_for(rows + extra_rows, dt.itemsize)
    width = int(max(1, min(width or tile, max(tile, KERNEL_CALL // nnz))))
    layer_bytes = sum(a.nbytes for a in block)
    if loop:
        width = _fitting_width(width, tile, layer_bytes, rows * dt.itemsize, memory)
    rng = np.random.default_rng(k)
    # inputs at the clamp, as activations are after the first layers: images live on through a loop's layers
    # (drawn in float32: the draw is the largest temporary)
    yt = (rng.random((rows, width), dtype=np.float32) < 0.25).astype(dt) * dt.type(store.ymax)
    extra = (rng.random((extra_rows, width), dtype=np.float32) < 0.25).astype(dt) if owners is not None else None
    if loop and memory is not None and loop_bytes(layer_bytes, yt.nbytes) > memory:
        loop = False  # the loop's layers and tiles would not fit beside the worker's own memory: one step's rate
    if loop:
        last = min(store.depth, k + _loop_layers(layer_bytes) - 1)
        held = [block] + [_layer_arrays(store, j, dt) for j in range(k + 1, last + 1)]
        # LOOP_LAYERS layers, the ones held over again where fewer fit (square layers: any order runs): a call
        # allocates its outputs and tiles its images, which a run's segment of hundreds of layers does once
        layers = [held[i % len(held)] for i in range(max(len(held), min(LOOP_LAYERS, store.depth)))]
        macs = _loop_macs(yt, layers, store)
        call = lambda: kernels.run_layers(yt, layers, store.bias, store.ymax, np.arange(width))  # noqa: E731
    else:
        macs = nnz * width
        call = lambda: kernels.layer_step(yt, *block, store.bias, store.ymax, extra=extra)  # noqa: E731
    # one whole call untimed first: it loads the machine code, and touches the memory its outputs and the
    # thread's tile buffers take for the first time (page faults that made a fresh worker's first timing up to
    # 6 times slower than its next on a 65,536-wide layer), as the run's second and later calls do not; then
    # the median call of at least KERNEL_CALLS: on a shared machine one call in a few ran at a third of the rate
    # of the others (two workers timing 65,536-wide loops at once), and a run of hundreds of layers averages
    # such pauses away
    return macs, _timed_calls(call, seconds), len(layers) if loop else 1


#: First calls :func:`layer_seconds` times, each on fresh copies of its layers (their median is what it learns).
FIRST_CALLS = 3


@dataclass(frozen=True)
class LayerCosts:
    """Seconds data mode's loop spends on a layer beyond its images' multiply-adds (:func:`layer_seconds`)."""

    every_chunk: float  # on every chunk: the layer read through the cache, looked at, its one vector computed
    first_chunk: float  # once more on a worker's first chunk of a run: what the loop learns of the layer then


def layer_seconds(path: str, k: int, dtype: str, width: int = COLLAPSED_IMAGES, seconds: float = KERNEL_SECONDS / 2,
                  layers: int = COLLAPSED_LAYERS) -> LayerCosts:
    """What data mode's loop spends on one layer of a chunk of ``width`` images that are all equal (as most of a
    chunk is after the first dozen layers of the challenge's networks): read from the cache, looked at, folded, the
    one vector left computed; and what its first call spends beyond that (finding the layer's twins and whether
    it is of one weight, kept for the run's later chunks). ``layers`` layers from ``k`` (as many as
    :func:`kernel_rate`'s loop holds, over again): the first call, and the median of at least :data:`KERNEL_CALLS`
    calls after it.

    A chunk pays the first on every layer whatever its images: on the real n1024-l120 a 2,500-image chunk took
    22-45 ms for layers 7-120, where its images' multiply-adds alone come to a few; counting the kernel's tiles a
    chunk still used instead charged it 200 ms. A worker's first chunk of a run pays the second too: 5,000 images
    took 0.19-0.23 s there against 0.10-0.13 s for its next (the same 120 layers, one process)."""
    from .kernels.folds import Folds

    store = open_store(path, check="lazy")
    dt = np.dtype(dtype)
    held = [_layer_arrays(store, j, dt) for j in range(k, min(store.depth, k + _loop_layers(
        window_layer_bytes(store, k, dt.itemsize)) - 1) + 1)]
    cycle = [held[i % len(held)] for i in range(3 * layers)]
    # one vector, a quarter of it nonzero, repeated: it lives on through the layers (a dead chunk stops early); the
    # chunk, its copy and the loop's buffers within LOOP_BYTES (a worker of 600 MB may run this)
    width = int(min(width, max(16, LOOP_BYTES // (4 * store.neurons * dt.itemsize))))
    yt = np.repeat(_varied(np.random.default_rng(k), (store.neurons, 1), dt, store.ymax), width, axis=1)

    def call(n: int, run_on: list = cycle):
        return lambda: kernels.run_layers(yt.copy(), run_on[:n], store.bias, store.ymax, np.arange(width),
                                          folds=Folds())

    def first_call() -> float:
        # a call on fresh copies of the held layers: what the loop learns of a layer it keeps by the layer's
        # arrays, so it learns each copy afresh
        copies = [tuple(a.copy() for a in layer) for layer in held]
        run = call(layers, [copies[i % len(copies)] for i in range(layers)])
        t0 = time.perf_counter()
        run()
        return time.perf_counter() - t0

    # the loop's machine code loaded first: the first call in a fresh process took 0.18 s a layer more than the
    # next on a 65,536-wide network, 0.02 s once its code was loaded, and multiplied by 480 layers that charged
    # data mode's prediction 14.6 s it never spent; then the median of FIRST_CALLS first calls (one, divided by
    # the 2-3 layers held and multiplied by 480, turned a pause of 20 ms into 5 s)
    first_call()
    first = float(np.median([first_call() for _ in range(FIRST_CALLS)]))
    # a layer's cost once the chunk has folded: what 2 * layers more cost (the first layers run every image until
    # the loop looks and folds them); the first calls' extra: they ran the held layers for the first time
    short = _median_call(call(layers), seconds / 2)
    longer = _median_call(call(3 * layers), seconds / 2)
    return LayerCosts(every_chunk=max(0.0, longer - short) / (2 * layers),
                      first_chunk=max(0.0, first - short) / len(held))


@dataclass(frozen=True)
class StepRates:
    """Rates of one part's model-mode step, timed on its own block over a chunk's width (:func:`step_rates`)."""

    kernel: float  # multiply-adds per second of the fused kernel on the part's block, its received rows beside it
    message: float  # boundary entries per second packed (the rows it sends) and unpacked (the rows it receives)
    marks: float  # activations per second marked after a sync layer (which images live, which are equal)
    first_step: float = 0.0  # seconds a step spends once more on its layer, on the first chunk of a run
    kernel_cpu: float = 0.0  # the kernel's multiply-adds per CPU second of its thread (0: not timed; clock_rate)


def step_rates(path: str, k: int, dtype: str, owners: np.ndarray, part: int, width: int,
               seconds: float = KERNEL_SECONDS) -> StepRates:
    """What part ``part``'s step of layer ``k`` costs in model mode, per unit, over ``width`` images: its kernel
    (into an output reused from call to call, as the run's steps reuse their space), its messages packed and
    unpacked, and the marks of a sync layer (alive images, equal columns), each the median of at least
    :data:`KERNEL_CALLS` timed calls after an untimed one. ``owners`` holds rows ``k - 1`` and ``k`` of an owners
    array. The width is capped as :func:`kernel_rate` caps it (a call of :data:`KERNEL_CALL` multiply-adds at most,
    one of the kernel's tiles at least).

    Timed at the width a chunk computes, not over one tile: on the real n1024-l120 at K = 2 the step's kernel ran at
    about a third of its one-tile rate over 15,000-20,000 images, and packing, unpacking and marking the images
    took as long again as the kernel, none of which a narrow sample shows.
    """
    store = open_store(path, check="lazy")
    dt = np.dtype(dtype)
    pl = plan_layer(store.layer(k), owners[0], owners[1], max(int(owners.max()), part) + 1)[part]
    rows = int((owners[0] == part).sum())
    indptr, indices, data = local_block(store.layer(k), pl, rows)
    extra_rows = received_rows(pl)
    tile = kernels.tile_for(rows + extra_rows, dt.itemsize)
    width = int(max(1, min(width, max(tile, KERNEL_CALL // max(1, indices.size)))))
    # a quarter of the activations nonzero, of varied values, as a real network's are after its first layers: the
    # messages' compact form of values all at the clamp is a bitmap, packed 2.7 times faster than the real
    # network's layer-5 activations (n1024-l120, 27 % nonzero) are
    yt, extra = (_varied(np.random.default_rng(k + n), (n, width), dt, store.ymax) for n in (rows, extra_rows))
    out = np.empty((indptr.size - 1, width), dtype=dt)
    sent = np.concatenate([np.asarray(r) for r in pl.send.values()] or [np.zeros(0, np.int64)])
    sent = sent if sent.size else np.arange(min(rows, 64))  # (a part that sends nothing: any rows, for a rate)
    received = np.empty((sent.size, width), dtype=dt)

    from .runtime.exchange.p2p import decoded, encoded

    def messages():
        # packed, encoded to send, decoded on arrival, unpacked: what the p2p exchange does to every message
        message = decoded(encoded(kernels.pack_rows(yt, sent, None, True)))
        kernels.unpack_rows(message, received[:sent.size])

    def marks():
        kernels.alive(out)
        column_classes(out)

    values = data.astype(dt)  # (once: the run's steps hold their block's values cast already)
    step = lambda: kernels.layer_step(yt, indptr, indices, values, store.bias, store.ymax,  # noqa: E731
                                      extra=extra, out=out)
    # the step's machine code loaded first, at the timed width on copies of the block (what a step learns of its
    # layer it keeps by the layer's arrays): a worker that had not run a step took 0.24 s more on its first call,
    # once a process, where the layer's own first call (what a run's first chunk pays on each of its layers,
    # multiplied by them) took 0-1.3 ms more than the next (the real n1024-l120, K = 4); loaded on one image only,
    # the wider path's code still cost the first call 0.1 s on a 65,536-wide layer
    kernels.layer_step(yt, indptr.copy(), indices.copy(), values.copy(), store.bias, store.ymax, extra=extra,
                       out=np.empty_like(out))
    times = _timed_calls(step, seconds)
    macs = float(indices.size) * width
    return StepRates(kernel=macs / times.median, first_step=max(0.0, times.first - times.median),
                     message=float(sent.size) * width / _median_call(messages, seconds / 2),
                     marks=float(out.size) / _median_call(marks, seconds / 2), kernel_cpu=macs / times.cpu_median)


def _varied(rng, shape: tuple[int, int], dt: np.dtype, ymax: float) -> np.ndarray:
    # random activations: a quarter nonzero, uniform in (0, ymax] (drawn in float32: the largest temporary)
    values = rng.random(shape, dtype=np.float32)
    return np.where(values < 0.25, np.float32(ymax) * (1 - 4 * values), 0).astype(dt)


def _median_call(call, seconds: float) -> float:
    # the median seconds of at least KERNEL_CALLS calls of ``call`` (and ``seconds`` of them) after an untimed one
    # (see kernel_rate)
    return _first_and_median(call, seconds)[1]


def _first_and_median(call, seconds: float) -> tuple[float, float]:
    # the seconds of the first call of ``call``, and the median of at least KERNEL_CALLS calls (and ``seconds`` of
    # them) after it
    times = _timed_calls(call, seconds)
    return times.first, times.median


@dataclass(frozen=True)
class CallTimes:
    """A timed call's seconds on the clock: its first call's, the median of the calls after it; and that median in
    CPU seconds of the calling thread."""

    first: float
    median: float
    cpu_median: float


def _timed_calls(call, seconds: float) -> CallTimes:
    # the first call of ``call``, then at least KERNEL_CALLS calls (and ``seconds`` of them on the clock)
    t0 = time.perf_counter()
    call()
    first = time.perf_counter() - t0
    times: list[float] = []
    cpu: list[float] = []
    start = time.perf_counter()
    while len(times) < KERNEL_CALLS or time.perf_counter() - start < seconds:
        t0, c0 = time.perf_counter(), time.thread_time()
        call()
        times.append(time.perf_counter() - t0)
        cpu.append(time.thread_time() - c0)
    return CallTimes(first=first, median=max(float(np.median(times)), 1e-12),
                     cpu_median=max(float(np.median(cpu)), 1e-12))


def clock_rate(rate: float, cpu_rate: float, share: float) -> float:
    """A kernel's rate on the clock with every worker running at once: as timed on the clock (``rate``, which
    counts what else takes the worker's core meanwhile: its event loop, its messages), but at most its rate per
    CPU second (``cpu_rate``; 0: not timed) times the ``share`` of a core each worker's thread has
    (:meth:`~dasknn.cost.Calibration.core_share`). Where the threads outnumber the cores the timings overlap
    only in part (each worker stops when its own calls are done, and the last run with the cores to
    themselves): four workers on two cores timed data mode's loop at a mean of 3.2e9 to 6.4e9 multiply-adds a
    second on the clock, two at 7.7-8.0e9."""
    return min(rate, cpu_rate * share) if cpu_rate > 0 else rate


def _layer_arrays(store, k: int, dt: np.dtype) -> tuple:
    w = store.layer(k)
    return w.indptr, w.indices, w.data.astype(dt)


def _loop_macs(yt: np.ndarray, layers: list[tuple], store) -> float:
    # the multiply-adds of the layer loop on yt: each layer's entries times the images alive at its input
    macs = 0.0
    for indptr, indices, data in layers:
        if yt.shape[1] == 0:
            break
        macs += float(indices.size) * yt.shape[1]
        yt = kernels.layer_step(yt, indptr, indices, data, store.bias, store.ymax)
        yt = yt[:, kernels.alive(yt)]
    return macs
