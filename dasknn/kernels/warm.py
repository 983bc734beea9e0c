"""Compiling the kernels before the clock: every kernel entry point a run calls, called once on tiny arrays made
as the run's loaders make them.

Numba compiles a ``@numba.njit(cache=True)`` kernel once per *type signature*: the values' dtype, the index
dtypes, the layout (C, F or any), read-only or writable, each makes another one. A process calling a kernel with
a signature it has not seen yet compiles it (seconds per kernel) or, where Numba's cache holds it, loads it
(milliseconds); a fresh worker without a cache spent 17 s of a 20 s run compiling. :func:`warm_kernels` does
that work up front, outside any timed phase, for the exact signatures of a run (:class:`WarmSpec`): the arrays
below have the dtypes, layouts and flags of those the loaders make (``engine.tasks.load_all_layers``,
``load_part_layers``, ``engine.inputs.load_images``, ``store.LayerStream``/``PartStream``, the model-mode step's
received rows, messages and spaces, the training model's patterns), and every Python-level branch in front of a
compiled function is taken (a message of each kind, a split step's two halves).

:func:`cache_locations` says where Numba keeps these kernels' machine code in this process.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
from numba.core.dispatcher import Dispatcher

from . import cpu, cpu_folds, grad, messages
from .arrays import activations_of_rows
from .dispatch import keep_columns, layer_step, run_layers
from .folds import Folds
from .marks import column_classes
from .grad import back_input, weight_grad
from .messages import pack_rows, unpack_rows

#: Neurons of the tiny layers the warm-up runs (the shapes do not matter to the compiler, the types do).
WARM_NEURONS = 16
#: Images of the warm-up's batch: enough for a sparse message with varied values to be the smallest form.
WARM_IMAGES = 32


@dataclass(frozen=True)
class WarmSpec:
    """Which kernels a run calls and on what: what :func:`warm_kernels` compiles (or loads).

    Attributes
    ----------
    dtype
        The activations' and weights' dtype (``"float32"`` or ``"float64"``).
    backend
        ``"cpu"`` (Numba on NumPy blocks) or ``"gpu"`` (the CUDA kernels on CuPy blocks).
    loop
        Data mode's loop over layers (:func:`~dasknn.kernels.run_layers`).
    steps
        Model and hybrid modes' steps: a part's block and received rows through one layer, dead images dropped
        from both, boundary messages packed and unpacked.
    compact
        The steps' messages: compact (a bitmap and values) or dense rows.
    overlap
        Overlapped steps: inputs packed once into tiles, the layer computed in two sets of outputs.
    training
        Training's kernels (always float64): the forward step, the weight gradient, the error passed down.
    """

    dtype: str = "float64"
    backend: str = "cpu"
    loop: bool = False
    steps: bool = False
    compact: bool = True
    overlap: bool = False
    training: bool = False


@dataclass(frozen=True)
class CacheLocation:
    """A folder where Numba keeps compiled kernels, and how this process got their signatures from it."""

    path: str
    #: signatures this process loaded from there, and compiled (then wrote there), so far
    loaded: int
    compiled: int


def warm_kernels(spec: WarmSpec) -> float:
    """Compile (or load from Numba's cache) the kernels ``spec`` says a run calls, with the signatures it calls
    them with; return the seconds it took (milliseconds once this process has them)."""
    t0 = time.perf_counter()
    if spec.backend == "gpu":
        _warm_gpu(spec)
    else:
        _warm(spec, np)
    return time.perf_counter() - t0


def _warm(spec: WarmSpec, xp) -> None:
    # the calls a run makes, on NumPy (xp) or, for the GPU, CuPy arrays
    dtype = np.dtype(spec.dtype)
    images = _images()
    if spec.loop:
        indptr, indices, data = _stored_layer()
        layer = tuple(xp.asarray(a) for a in (indptr, indices, data.astype(dtype)))  # engine.tasks.load_all_layers
        yt = xp.asarray(activations_of_rows(images, dtype))
        # as engine.tasks.run_segment: the first segment's ids from the chunk's first index. More layers than a
        # group holds: the next group's activations are the survivors' columns of the last (not contiguous once
        # an image died, and two of these are dead from the start)
        run_layers(yt, [layer] * (cpu.GROUP_LAYERS + 1), 0.0, 1.0, np.arange(0, yt.shape[1]))
        # and folding equal images (engine.tasks.run_segment with a Folds record): every image twice, so that the
        # looks inside a group's tiles fold some, and a group of one layer's look over every tile compares some
        twice = xp.ascontiguousarray(xp.concatenate([yt, yt], axis=1))
        for layers in ([layer], [layer] * (cpu.GROUP_LAYERS + 1)):
            run_layers(twice, layers, 0.0, 1.0, np.arange(0, twice.shape[1]), folds=Folds())
        if xp is np:
            # one step on the layer as the store gives it (its pointers in scipy's index dtype, not the int64 of
            # a part's block): the cost model's probe and loop timings step so. Left out, a cold run's probe
            # worker compiled it itself, and compiling holds memory for good: both workers of 600 MB were lost
            # on the default 65,536-wide run (issue 42)
            layer_step(yt, *layer, 0.0, 1.0)
    if spec.steps:
        _warm_step(dtype, images, spec.compact, spec.overlap and xp is np, xp)
    if spec.training:
        _warm_training(images, xp)


def _images() -> sp.csr_matrix:
    # a batch of images as the inputs store returns them (rows are images), varied values, a few all zero
    rng = np.random.default_rng(0)
    x = (rng.random((WARM_IMAGES, WARM_NEURONS)) < 0.3) * rng.integers(1, 4, (WARM_IMAGES, WARM_NEURONS))
    x[-2:] = 0
    return sp.csr_matrix(x.astype(np.float64))


def _stored_layer() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    # a layer as the store reads it (store.sparse.Sparse.read: int64 pointers, int32 indices, then a CSC matrix,
    # which picks the index dtype) and the loaders pass it on: each output reads itself and the next 3 inputs
    n = WARM_NEURONS
    indices = ((np.arange(n)[:, None] + np.arange(4)) % n).astype(np.int32).ravel()
    indptr = np.arange(0, 4 * n + 1, 4, dtype=np.int64)
    w = sp.csc_matrix((np.full(indices.size, 0.5), indices, indptr), shape=(n, n))
    w.sort_indices()
    return w.indptr, w.indices, w.data


def _part_block(outputs: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    # a part's block as plan.local_block and the part plan give it (int64 pointers, int32 indices into the part's
    # rows then its received rows: here its own 8 rows and 8 received), before the loaders cast the values
    indptr, indices, data = _stored_layer()
    return indptr[:outputs + 1].astype(np.int64), indices[:indptr[outputs]].astype(np.int32), data[:indptr[outputs]]


def _warm_step(dtype: np.dtype, images: sp.csr_matrix, compact: bool, overlap: bool, xp) -> None:
    # engine.tasks.step and its helpers: the part owns the first half of the neurons and receives the rest
    own = WARM_NEURONS // 2
    rows = np.arange(own, dtype=np.int64)  # engine.inputs.load_images: the part's own input pixels
    block = xp.asarray(activations_of_rows(images, dtype, rows))
    indptr, indices, data = (xp.asarray(a) for a in _part_block(own))  # engine.tasks.load_part_layers
    data = data.astype(dtype)
    # messages of every kind, sent (from the first layer's pixels and from a step's block) and received into
    # row slices of the receive space
    sent = np.arange(0, own, 2, dtype=np.int64)
    recv = xp.empty((2 * sent.size, images.shape[0]), dtype=dtype)
    for i, source in enumerate(_message_sources(block, xp)):
        at = i % 2 * sent.size
        unpack_rows(pack_rows(source, sent, None, compact), recv[at:at + sent.size])
    # a sync layer's masks: the dead images dropped from the block and the received rows, in place
    keep = np.ones(images.shape[0], dtype=bool)
    keep[-1] = False
    block = keep_columns(block, keep)
    recv = keep_columns(recv, keep)
    # into a space of the part's (the CPU), or a new array (a device)
    out = layer_step(block, indptr, indices, data, 0.0, 1.0, extra=recv,
                     **({"out": np.empty((own, block.shape[1]), dtype=dtype)} if xp is np else {}))
    # a sync layer's classes of equal columns (compress): every column twice, so that some are compared
    column_classes(xp.ascontiguousarray(xp.concatenate([out, out], axis=1)))
    if overlap:
        # engine.tasks.step with split and step_rest: the outputs others read first, the rest after
        first = np.unique(np.concatenate([sent, sent[:1]]))
        rest = np.setdiff1d(np.arange(own), first, assume_unique=True)
        tiles = cpu.tile_inputs(block, recv, None)
        tiles = cpu.tile_inputs(block, recv, tiles.base if tiles.base is not None else tiles)
        for columns in (first, rest):
            cpu.layer_step_tiles(tiles, block.shape[1], indptr, indices, data, 0.0, 1.0, columns, out)


def _message_sources(block, xp) -> list:
    # blocks whose messages take each form: sparse with varied values (gathered), one constant value, dense,
    # and none at all
    return [block, xp.where(block != 0, block.dtype.type(1), block.dtype.type(0)),
            block + block.dtype.type(1), xp.zeros_like(block)]


def _warm_training(images: sp.csr_matrix, xp) -> None:
    # train.model: the forward step (float64), the weight gradient and the error passed down, on a pattern as
    # init_model keeps it (int64 pointers, int32 indices) and float64 parameters
    indptr, indices, data = _stored_layer()
    indptr, indices, data = (xp.asarray(a) for a in (indptr.astype(np.int64), indices.astype(np.int32),
                                                     data.astype(np.float64)))  # Model.on(backend)
    xin = xp.asarray(activations_of_rows(images, np.float64))
    y = layer_step(xin, indptr, indices, data, 0.0, float("inf"))
    weight_grad(indptr, indices, xin, y)
    back_input(indptr, indices, data, y, WARM_NEURONS)
    if xp is np:
        # train.model_mode: a part's rows sent forward (activations) and back (errors) as compact float64 messages
        sent = np.arange(0, WARM_NEURONS, 2, dtype=np.int64)
        for source in _message_sources(np.ascontiguousarray(xin), xp):
            unpack_rows(pack_rows(source, sent, None, True), np.empty((sent.size, xin.shape[1])))


def _warm_gpu(spec: WarmSpec) -> None:
    # the CUDA modules (inference's for the dtype, training's) are compiled by the first launch on this device.
    # Without CuPy there is nothing to compile: the run's own loaders say what is missing
    try:
        import cupy
    except ImportError:
        return
    _warm(spec, cupy)  # pragma: no cover - needs CuPy


def _kernels() -> list[Dispatcher]:
    return [k for module in (cpu, cpu_folds, messages, grad) for k in vars(module).values()
            if isinstance(k, Dispatcher)]


def cache_locations() -> list[CacheLocation]:
    """Where Numba keeps the kernels' machine code for this process (``NUMBA_CACHE_DIR`` where it is set, else
    ``__pycache__`` beside the installed package where that is writable, else the user's cache folder: Numba's
    cache locators, in that order), each folder once, with the signatures this process loaded from it and
    compiled."""
    found: dict[str, list[int]] = {}
    for kernel in _kernels():
        stats = kernel.stats
        counts = found.setdefault(str(stats.cache_path), [0, 0])
        counts[0] += sum(stats.cache_hits.values())
        counts[1] += sum(stats.cache_misses.values())
    return [CacheLocation(path, loaded, compiled) for path, (loaded, compiled) in found.items()]
