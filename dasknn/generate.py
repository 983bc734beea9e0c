"""Challenge-like networks and synthetic inputs, made fast and deterministically from a seed.

Networks follow the RadiX-Net idea the GraphChallenge networks come from: a radix-32 butterfly. Neuron indices
are ``b = log2(N)``-bit numbers; layer ``k`` connects input ``i`` to every output ``j`` that differs from ``i``
only in a window of 5 consecutive bits (cyclic), the window sliding one bit per layer. So every row and every
column has exactly 32 nonzeros, the diagonal is included (window unchanged), and after ``b - 4`` layers every
input reaches every output. Why slide by one bit, not five: with windows that tile the bits (the two-digit
radix-32 butterfly for N = 1024) every output of the second layer sums every input exactly once, so all
activations collapse to one value per image; overlapping windows give paths of different multiplicities, as the
challenge's networks have. A seeded relabelling of the neurons (the same for every layer and for the generated
images' pixels, so the diagonal stays) makes each seed a different network whose structure is hidden from its
labels, as a partitioner must expect.

Weights are the challenge's constant 1/16 (``weights="constant"``, which Zstandard squeezes 27x), or drawn
(``weights="random"``): uniform in [1/32, 3/32), a float32 each, so a stored layer costs what a pruned real network's
does to read (the low mantissa bits are noise no compressor removes). Their mean is the constant's, so a layer's
gain is the same and the challenge's bias keeps images neither all dead nor all alive after many layers.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from .errors import DasknnError
from .locations import as_location, is_url, local_path
from .network import CHALLENGE_YMAX, Network, challenge_bias

RADIX_BITS = 5  # 2**5 = 32 nonzeros per row and column
WEIGHT = 1.0 / 16.0
#: How a generated network's weight values are made (``--weights``): the challenge's constant, or drawn.
WEIGHTS = ("constant", "random")


def _bits(neurons: int) -> int:
    b = int(neurons).bit_length() - 1
    if neurons < 2**RADIX_BITS or 1 << b != neurons:
        raise DasknnError(f"--neurons must be a power of two, at least {2**RADIX_BITS} (got {neurons})")
    return b


def relabelling(neurons: int, seed: int) -> np.ndarray:
    """The seeded permutation of neuron labels (``perm[old] = new``)."""
    return np.random.default_rng(seed).permutation(neurons).astype(np.int64)


def butterfly_layer(neurons: int, k: int, perm: np.ndarray | None = None, dtype: type = np.float32) -> sp.csc_matrix:
    """Layer ``k`` (1-based) of the radix-32 butterfly as a CSC matrix, relabelled by ``perm``."""
    b = _bits(neurons)
    shift = (k - 1) % b
    window = np.arange(RADIX_BITS)
    wbits = (shift + window) % b  # the 5 (cyclic) bit positions this layer may change
    mask = int(np.bitwise_or.reduce(np.left_shift(1, wbits)))
    # value v in 0..31 spread over the window's bit positions
    v = np.arange(2**RADIX_BITS)
    spread = np.zeros(v.size, dtype=np.int64)
    for t, pos in enumerate(wbits):
        spread |= ((v >> t) & 1) << int(pos)
    j = np.arange(neurons, dtype=np.int64)
    rows = (j[:, None] & ~mask) | spread[None, :]  # (N, 32): the inputs of output j
    if perm is not None:
        inv = np.empty_like(perm)
        inv[perm] = np.arange(perm.size)
        rows = perm[rows[inv]]  # new column c is old column inv[c]; its rows get new labels
    rows.sort(axis=1)
    indptr = np.arange(0, neurons * 2**RADIX_BITS + 1, 2**RADIX_BITS, dtype=np.int64)
    data = np.full(rows.size, WEIGHT, dtype=dtype)
    return sp.csc_matrix((data, rows.ravel().astype(np.int32), indptr), shape=(neurons, neurons))


def _check_weights(weights: str) -> None:
    if weights not in WEIGHTS:
        raise DasknnError(f"--weights must be one of {', '.join(WEIGHTS)} (got {weights!r})")


def random_weights(count: int, seed: int, k: int) -> np.ndarray:
    """Layer ``k``'s drawn weight values (float32, uniform in [1/32, 3/32), mean 1/16), in the CSC's entry order.

    Drawn from their own stream (seed, layer), so a layer is the same whether made alone or in a sequence.
    """
    rng = np.random.default_rng([seed, k, 0x3E16])
    return (rng.uniform(0.5, 1.5, size=count) * WEIGHT).astype(np.float32)


def iter_layers(neurons: int, layers: int, seed: int = 0, dtype: type = np.float32,
                weights: str = "constant") -> Iterator[sp.csc_matrix]:
    """Yield the ``layers`` layers of a generated network one at a time (for streaming into a store).

    ``weights`` is one of :data:`WEIGHTS`; random values are drawn in float32 whatever ``dtype``, so every
    precision computes with the values a store keeps.
    """
    _check_weights(weights)
    perm = relabelling(neurons, seed)
    for k in range(1, layers + 1):
        w = butterfly_layer(neurons, k, perm, dtype)
        if weights == "random":
            w.data = random_weights(w.nnz, seed, k).astype(dtype)
        yield w


def network(neurons: int, layers: int, seed: int = 0, bias: float | None = None, dtype: type = np.float32,
            weights: str = "constant") -> Network:
    """A whole generated network in memory (see the module's description)."""
    if layers < 1:
        raise DasknnError(f"--layers must be at least 1 (got {layers})")
    drawn = "" if weights == "constant" else f", weights={weights!r}"
    return Network(list(iter_layers(neurons, layers, seed, dtype, weights)),
                   challenge_bias(neurons) if bias is None else bias,
                   source=f"dasknn.generate(neurons={neurons}, layers={layers}, seed={seed}{drawn})")


def images(count: int, neurons: int, seed: int = 0, strokes: int = 2, width: int = 3) -> sp.csr_matrix:
    """Synthetic binary images: a few thick random strokes on a ``sqrt(N) x sqrt(N)`` canvas (about 10 % set).

    Strokes rather than scattered pixels, because like the challenge's handwritten digits they set runs of
    neighbouring pixels, which the butterfly's first layers sum.
    """
    if count < 1:
        raise DasknnError(f"--images must be at least 1 (got {count})")
    side = int(round(np.sqrt(neurons)))
    if side * side != neurons:
        # canvases need a square; otherwise use a 2:1 rectangle (N is a power of two)
        rows_, cols_ = int(np.sqrt(neurons / 2)), int(np.sqrt(neurons / 2)) * 2
    else:
        rows_, cols_ = side, side
    rng = np.random.default_rng(seed + 0x5EED)
    samples = 2 * max(rows_, cols_)
    # strokes between random points in the central 80 % of the canvas
    p0 = rng.uniform(0.1, 0.9, size=(count, strokes, 2))
    p1 = rng.uniform(0.1, 0.9, size=(count, strokes, 2))
    t = np.linspace(0.0, 1.0, samples)
    scale = max(1, round(width * rows_ / 32))
    perm = relabelling(neurons, seed)  # the network of the same seed sees its canvas as seed 0's does
    img_parts, pix_parts = [], []
    batch = max(1, (1 << 24) // neurons)  # a few MB of canvas at a time, whatever the width
    for i0 in range(0, count, batch):
        i1 = min(count, i0 + batch)
        pts = p0[i0:i1, :, None, :] + (p1 - p0)[i0:i1, :, None, :] * t[:, None]  # (b, strokes, samples, 2)
        r = np.clip((pts[..., 0] * rows_).astype(np.int64), 0, rows_ - 1)
        c = np.clip((pts[..., 1] * cols_).astype(np.int64), 0, cols_ - 1)
        canvas = np.zeros((i1 - i0, rows_, cols_), dtype=bool)
        canvas[np.repeat(np.arange(i1 - i0), r[0].size), r.ravel(), c.ravel()] = True
        # thicken: every pixel (r + dr, c + dc) for dr, dc < scale, as one separable dilation
        down = canvas.copy()
        for d in range(1, scale):
            down[:, d:, :] |= canvas[:, :-d, :]
        thick = down.copy()
        for d in range(1, scale):
            thick[:, :, d:] |= down[:, :, :-d]
        im, rr, cc = np.nonzero(thick)
        img_parts.append(im + i0)
        pix_parts.append(perm[rr * cols_ + cc])
    im = np.concatenate(img_parts)
    pix = np.concatenate(pix_parts)
    m = sp.csr_matrix((np.ones(im.size, dtype=np.float32), (im, pix)), shape=(count, neurons))
    m.sort_indices()
    return m


#: The stages of :func:`write`, as :func:`write` names them to its ``stage`` callback.
LAYERS_STAGE = "generating layers"
TRUTH_STAGE = "computing the truth (float64 reference)"


def reference_categories(
    neurons: int,
    layers: int,
    seed: int,
    batch: sp.csr_matrix,
    bias: float,
    dtypes: tuple[type, ...] = (np.float64, np.float32),
    threads: int | None = None,
    progress: Callable[[int], None] | None = None,
    weights: str = "constant",
) -> dict[type, np.ndarray]:
    """The categories of ``batch`` through the generated network, by the reference, in each of ``dtypes``.

    Every layer is :func:`dasknn.reference.layer_step` on row chunks of the batch, the chunks (of every dtype) on a
    pool of threads (SciPy's sparse products release the GIL). A row of a product depends only on that row, so the
    chunks give the values the whole batch would, bit for bit. The layers are generated again, one at a time, as
    :func:`iter_layers` made them for the store: only one is in memory.

    Parameters
    ----------
    neurons, layers, seed
        The generated network (:func:`iter_layers`).
    batch
        The images, one row each.
    bias
        The layers' bias (the clamp is the challenge's).
    dtypes
        The arithmetic of each truth: float64 (exact against the published truth) and float32.
    threads
        Threads of the pool: the cores this process may use by default.
    progress
        Called with the number of each layer done.
    weights
        The generated network's weight values (:data:`WEIGHTS`).

    Returns
    -------
    dict
        0-based image indices by dtype.
    """
    from concurrent.futures import ThreadPoolExecutor

    from . import reference

    if threads is None:
        threads = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    # a chunk per thread and dtype: every thread busy on every layer, the layer's sync costing little
    edges = np.linspace(0, batch.shape[0], min(threads, batch.shape[0]) + 1).astype(int)
    chunks = {(dt, c): sp.csr_matrix(batch[a:b], dtype=dt)
              for dt in dtypes for c, (a, b) in enumerate(zip(edges[:-1], edges[1:]))}
    pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="dasknn-truth")
    try:
        for k, w in enumerate(iter_layers(neurons, layers, seed, weights=weights), start=1):
            by_dtype = {dt: w.astype(dt).tocsr() for dt in dtypes}  # converted once per layer, read by every chunk
            steps = {key: pool.submit(reference.layer_step, y, by_dtype[key[0]], bias, CHALLENGE_YMAX)
                     for key, y in chunks.items()}
            chunks = {key: step.result() for key, step in steps.items()}
            if progress is not None:
                progress(k)
    finally:
        pool.shutdown(cancel_futures=True)  # interrupted (Ctrl-C, SIGTERM): no queued step starts
    return {dt: reference.categories(sp.vstack([y for (d, _), y in chunks.items() if d == dt], format="csr"))
            for dt in dtypes}


def write(
    out: str | os.PathLike[str],
    neurons: int,
    layers: int,
    images_count: int = 0,
    seed: int = 0,
    truth: bool = False,
    overwrite: bool = False,
    progress: Callable[[int], None] | None = None,
    bias: float | None = None,
    stage: Callable[[str, int], Callable[[int], None] | None] | None = None,
    weights: str = "constant",
) -> Path | str:
    """Generate a network (and images) into ``out``: a store if it ends in ``.zarr`` (a local path or a URL), else
    the published layout (a local folder).

    ``weights`` (:data:`WEIGHTS`): the challenge's constant 1/16, or values drawn so the stored layers do not
    compress (the same wiring, the same mean, the same default bias).

    With ``truth``, the categories are computed by the reference (:func:`reference_categories`, float64 and
    float32) and saved beside. ``stage(name, total)`` is called as each stage begins (:data:`LAYERS_STAGE`, then
    with ``truth`` :data:`TRUTH_STAGE`), ``total`` its steps (layers), and may return what to call with the steps
    done; ``progress`` is called with them where it returns nothing (each stage counts its layers from 1).
    """
    from . import io, store

    out = as_location(out)
    if is_url(out) and not out.endswith(".zarr"):
        local_path(out, "--out (the published TSV layout)")  # refused: only a store is written behind a URL
    bias = challenge_bias(neurons) if bias is None else float(bias)
    if layers < 1:
        raise DasknnError(f"--layers must be at least 1 (got {layers})")
    _bits(neurons)
    _check_weights(weights)
    im = images(images_count, neurons, seed) if images_count else None
    source = f"dasknn generate --neurons {neurons} --layers {layers} --seed {seed}"
    if weights != "constant":
        source += f" --weights {weights}"  # a constant store's record as before

    def begin(name: str) -> Callable[[int], None] | None:
        return (stage(name, layers) if stage is not None else None) or progress

    def categories() -> dict[type, np.ndarray]:
        if im is None or not truth:
            return {}
        # in both precisions: images on a threshold may flip between them
        return reference_categories(neurons, layers, seed, im, bias, progress=begin(TRUTH_STAGE), weights=weights)

    def stream() -> Iterator[sp.csc_matrix]:
        done = begin(LAYERS_STAGE)
        for k, w in enumerate(iter_layers(neurons, layers, seed, weights=weights), start=1):
            yield w
            if done is not None:
                done(k)

    if os.fspath(out).endswith(".zarr"):
        with store.StoreWriter(out, neurons, layers, bias, source=source, overwrite=overwrite) as w:
            for k, layer in enumerate(stream(), start=1):
                w.write_layer(k, layer)
            if im is not None:
                cats = categories()
                w.write_inputs(im, cats.get(np.float64), cats.get(np.float32))
        return out
    if out.exists() and not out.is_dir():
        raise DasknnError("exists and is not a directory", out)
    io.write_network(stream(), out, neurons)
    if im is not None:
        io.write_images(out / f"sparse-images-{neurons}.tsv", im)
        cats = categories()
        if cats:
            io.write_categories(out / f"neuron{neurons}-l{layers}-categories.tsv", cats[np.float64])
    return out


def cache_dir() -> Path:
    """Where generated defaults are kept: ``$DASKNN_CACHE``, else ``$XDG_CACHE_HOME/dasknn``, else ``~/.cache/dasknn``."""
    env = os.environ.get("DASKNN_CACHE")
    if env:
        return Path(env)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "dasknn"


DEFAULT = {"neurons": 1024, "layers": 120, "images_count": 20000, "seed": 0}
DEFAULT_VERSION = 2


def default_store(
    progress: Callable[[int], None] | None = None,
    stage: Callable[[str, int], Callable[[int], None] | None] | None = None,
) -> Path:
    """The embedded default: a generated 1024 x 120 network with 20,000 images and their truth, made once.

    ``progress`` and ``stage`` are :func:`write`'s.
    """
    d = DEFAULT
    # the version names how the truth was computed: a cache from an older dasknn is not reused
    path = cache_dir() / f"default-v{DEFAULT_VERSION}-n{d['neurons']}-l{d['layers']}-i{d['images_count']}-s{d['seed']}.zarr"
    if not (path / "zarr.json").is_file():
        write(path, truth=True, overwrite=True, progress=progress, stage=stage, **d)
    return path
