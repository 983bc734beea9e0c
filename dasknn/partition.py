"""Who owns which neuron: partitioning a sparse network across workers, and what a partition costs.

Every neuron of every layer, the input pixels included, has one owner (a *part*). A partition is an ``int32``
array ``owners`` of shape ``(layers + 1, neurons)``: row 0 owns the input pixels, row ``k`` owns the outputs of
layer ``k``.

Computing output ``j`` of layer ``k`` (column ``j`` of ``W_k``) needs every input ``i`` with ``W_k[i, j] != 0``.
The value of input ``i`` is sent by its owner to every *other* part that owns such a ``j``, so the
communication volume of layer ``k`` is ``sum_i (lambda_i - 1)``, where ``lambda_i`` is the number of distinct
parts in ``{owners[k-1, i]} | {owners[k, j] : W_k[i, j] != 0}``. That is the connectivity-1 metric of a
hypergraph with one net per (layer, input neuron). The work of a part in layer ``k`` is the number of
nonzeros in the columns it owns; a partition is balanced when, in every layer,
``max_part_work / mean_part_work - 1 <= epsilon``.

Methods
-------
``block``
    Contiguous index ranges, the same for every row of ``owners`` (what a naive split does).
``random``
    A seeded random balanced assignment, independent per row (the no-locality baseline).
``hypergraph-shared``
    One owner per neuron *index*, shared by all rows; Mt-KaHyPar minimises connectivity-1 over the nets of
    all layers at once (``N`` vertices, one net ``{i} | row_i(W_k)`` per layer and input). Each layer is
    balanced exactly when every layer's columns have the same nonzero count (the challenge networks); other
    networks are balanced on the summed work only.
``hypergraph-layered``
    Each row gets its own owners: row 1 from the hypergraph of layer 1, then row by row with the previous
    row's owners fixed (Mt-KaHyPar fixed vertices: the nets of layer ``k`` are exactly its volume), then
    refinement sweeps, backward then forward, that re-partition one row with *both* neighbouring rows fixed
    (the exact volume of the two layers it touches) and keep it only if that volume drops. Every row is
    balanced on its own layer's work, whatever the network.
``hypergraph``
    The default: ``hypergraph-layered`` without the sweeps, or ``hypergraph-shared`` where that sends less
    and still balances every layer (both are computed). On the challenge network (1024 x 120) the
    forward pass alone sends 26-31 % less than ``hypergraph-shared`` at K = 4 and 16 (1 % less at K = 64) in
    similar time, because a RadiX-Net layer's locality changes from layer to layer and one owner per index
    cannot follow it, and it keeps every layer balanced on any network, where one shared owner can balance
    only the summed work. The sweeps win a further 0.2-1 % for 1.5-2 times the forward pass's time each
    (see BENCHMARKS.md).

Mt-KaHyPar is seeded, but with more than one thread its parallel refinement is not bit-for-bit
deterministic: two runs may differ slightly in volume (never in validity or balance). ``preset="deterministic"``
(Mt-KaHyPar's deterministic preset) gives the same owners on every run, at some cost in time.
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np
import scipy.sparse as sp

from .errors import DasknnError

#: Methods :func:`partition_network` accepts.
METHODS: tuple[str, ...] = ("hypergraph", "hypergraph-shared", "hypergraph-layered", "block", "random")

#: Mt-KaHyPar presets :func:`partition_network` accepts (our name: Mt-KaHyPar's ``PresetType``).
PRESETS: dict[str, str] = {"default": "DEFAULT", "quality": "QUALITY", "deterministic": "DETERMINISTIC"}

#: Above this many cells a dense ``neurons x parts`` marker array is replaced by sorting (memory bound).
_DENSE_CELLS = 1 << 26

_MTK_LOCK = threading.Lock()
_MTK: Any = None  # the process-wide Mt-KaHyPar initializer (its thread pool can be set up only once)
_MTK_THREADS = 0


# --------------------------------------------------------------------------------------------- inputs
def _as_layer(w: Any, k: int, shape: tuple[int, int] | None) -> sp.csc_matrix:
    """Layer ``k`` as a canonical CSC matrix, checked to be square and of ``shape`` (layer 1's) when given."""
    if not (sp.issparse(w) or isinstance(w, np.ndarray)):
        raise DasknnError(f"layer {k} is a {type(w).__name__}, not a sparse matrix")
    m = sp.csc_matrix(w)
    if m.shape[0] != m.shape[1]:
        raise DasknnError(f"layer {k} is {m.shape[0]} x {m.shape[1]}; layers must be square")
    if shape is not None and m.shape != shape:
        raise DasknnError(f"layer {k} is {m.shape[0]} x {m.shape[1]}, layer 1 is {shape[0]} x {shape[1]}")
    if not m.has_canonical_format:
        m = m.copy()
        m.sum_duplicates()  # a duplicate entry is one connection, not two
    return m


class _LazyLayers(Sequence):
    """Layers read one at a time from a sequence that reads them on demand (a store's, out of core): each is
    checked as it arrives, and only the last two are kept."""

    def __init__(self, source: Sequence, shape: tuple[int, int]):
        self.source = source
        self.shape = shape
        self._kept: dict[int, sp.csc_matrix] = {}

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        i = int(i) + (len(self) if i < 0 else 0)
        if not 0 <= i < len(self):
            raise IndexError(i)  # how a Sequence's iteration ends
        if i not in self._kept:
            if len(self._kept) >= 2:
                del self._kept[max(self._kept, key=lambda j: abs(j - i))]  # the farthest from the one asked for
            self._kept[i] = _as_layer(self.source[i], i + 1, self.shape)
        return self._kept[i]


def _as_layers(layers: Any) -> Sequence[sp.csc_matrix]:
    """Return the layers as canonical CSC matrices, checking that they are square and alike: a list, or, for a
    sequence that reads its layers on demand (anything but a list, a tuple or a Network), a lazy view of it."""
    if hasattr(layers, "layers") and not isinstance(layers, (list, tuple)):
        layers = layers.layers  # a dasknn.network.Network
    if not isinstance(layers, (list, tuple)) and isinstance(layers, Sequence):
        if len(layers) == 0:
            raise DasknnError("a network needs at least one layer")
        first = _as_layer(layers[0], 1, None)
        return _LazyLayers(layers, first.shape)
    out: list[sp.csc_matrix] = []
    for k, w in enumerate(layers, start=1):
        out.append(_as_layer(w, k, out[0].shape if out else None))
    if not out:
        raise DasknnError("a network needs at least one layer")
    return out


def _check_parts(parts: Any, neurons: int) -> int:
    if isinstance(parts, (bool, np.bool_)) or not isinstance(parts, (int, np.integer)):
        raise DasknnError(f"the number of parts must be an integer, got {parts!r}")
    parts = int(parts)
    if parts < 1:
        raise DasknnError(f"the number of parts must be at least 1, got {parts}")
    if parts > neurons:
        raise DasknnError(f"cannot split {neurons} neurons per layer into {parts} parts (at most {neurons})")
    return parts


def _check_epsilon(epsilon: Any) -> float:
    try:
        eps = float(epsilon)
    except (TypeError, ValueError):
        raise DasknnError(f"epsilon must be a number, got {epsilon!r}") from None
    if not math.isfinite(eps) or eps < 0:
        raise DasknnError(f"epsilon must be a finite number >= 0, got {epsilon!r}")
    return eps


def validate_partition(owners: Any, layers: int, neurons: int, parts: int | None = None) -> np.ndarray:
    """Check an owners array against a network's shape and return it as ``int32``.

    Parameters
    ----------
    owners
        The candidate partition: an integer array of shape ``(layers + 1, neurons)``.
    layers, neurons
        The network's depth and width.
    parts
        If given, every owner must be below it; otherwise owners only need to be non-negative.

    Returns
    -------
    numpy.ndarray
        ``owners`` as a C-contiguous ``int32`` array (a copy only if the dtype or layout differs).

    Raises
    ------
    DasknnError
        If ``owners`` is not an integer array, has the wrong shape, or holds an owner out of range.
    """
    a = np.asarray(owners) if not isinstance(owners, np.ndarray) else owners
    if a.dtype == np.bool_ or a.dtype.kind not in "iu":
        raise DasknnError(f"a partition must hold integers, got dtype {a.dtype}")
    want = (int(layers) + 1, int(neurons))
    if a.shape != want:
        raise DasknnError(
            f"a partition of {layers} layers x {neurons} neurons must have shape {want[0]} x {want[1]} "
            f"(row 0 for the inputs), got {' x '.join(str(s) for s in a.shape) or 'a scalar'}"
        )
    if a.size:
        lo, hi = int(a.min()), int(a.max())
        if lo < 0:
            raise DasknnError(f"a partition holds owner {lo}; owners must be >= 0")
        if parts is not None and hi >= parts:
            raise DasknnError(f"a partition holds owner {hi}; with {parts} parts owners must be below {parts}")
        if hi > np.iinfo(np.int32).max:
            raise DasknnError(f"a partition holds owner {hi}, which does not fit in int32")
    return np.ascontiguousarray(a, dtype=np.int32)


def _owners_for(layers: list[sp.csc_matrix], owners: Any, parts: int | None) -> tuple[np.ndarray, int]:
    n = layers[0].shape[0]
    o = validate_partition(owners, len(layers), n, parts)
    k = int(parts) if parts is not None else (int(o.max()) + 1 if o.size else 1)
    return o, k


# --------------------------------------------------------------------------------------------- metrics
def _lambdas(w: sp.csc_matrix, prev: np.ndarray, cur: np.ndarray, parts: int) -> np.ndarray:
    """``lambda_i`` for every input ``i`` of one layer: distinct parts among its owner and its consumers' owners."""
    n = w.shape[0]
    rows = w.indices
    col_owner = np.repeat(cur, np.diff(w.indptr))
    if n * parts <= _DENSE_CELLS:
        mark = np.zeros((n, parts), dtype=np.bool_)
        mark[rows, col_owner] = True
        mark[np.arange(n), prev] = True  # the owner of i always holds it, needed or not
        return mark.sum(axis=1, dtype=np.int64)
    keys = np.concatenate([rows.astype(np.int64) * parts + col_owner, np.arange(n, dtype=np.int64) * parts + prev])
    uniq = np.unique(keys)
    return np.bincount(uniq // parts, minlength=n).astype(np.int64)


def layer_volumes(layers: Sequence[sp.csc_matrix], owners: np.ndarray, *, parts: int | None = None) -> np.ndarray:
    """Communication volume of every layer: ``sum_i (lambda_i - 1)`` (connectivity-1).

    Parameters
    ----------
    layers
        ``W_1 ... W_L`` (CSC, challenge orientation), or a :class:`~dasknn.network.Network`.
    owners
        Partition of shape ``(L + 1, N)``.
    parts
        Number of parts; inferred as ``owners.max() + 1`` when omitted.

    Returns
    -------
    numpy.ndarray
        ``(L,)`` ``int64``: entries sent between parts to compute each layer.
    """
    ws = _as_layers(layers)
    o, k = _owners_for(ws, owners, parts)
    return np.array([int((_lambdas(w, o[i], o[i + 1], k) - 1).sum()) for i, w in enumerate(ws)], dtype=np.int64)


def part_sends(layers: Sequence[sp.csc_matrix], owners: np.ndarray, *, parts: int | None = None) -> np.ndarray:
    """Entries each part sends in each layer.

    The owner of input ``i`` of layer ``k`` sends ``lambda_i - 1`` entries, one to each other part that needs
    it, so each row sums to the layer's volume.

    Returns
    -------
    numpy.ndarray
        ``(L, K)`` ``int64``.
    """
    ws = _as_layers(layers)
    o, k = _owners_for(ws, owners, parts)
    out = np.zeros((len(ws), k), dtype=np.int64)
    for i, w in enumerate(ws):
        out[i] = np.bincount(o[i], weights=_lambdas(w, o[i], o[i + 1], k) - 1, minlength=k).astype(np.int64)
    return out


def part_work(layers: Sequence[sp.csc_matrix], owners: np.ndarray, *, parts: int | None = None) -> np.ndarray:
    """Nonzeros of the columns each part owns, per layer.

    Returns
    -------
    numpy.ndarray
        ``(L, K)`` ``int64``.
    """
    ws = _as_layers(layers)
    o, k = _owners_for(ws, owners, parts)
    out = np.zeros((len(ws), k), dtype=np.int64)
    for i, w in enumerate(ws):
        out[i] = np.bincount(o[i + 1], weights=np.diff(w.indptr), minlength=k).astype(np.int64)
    return out


def _imbalance(work: np.ndarray) -> np.ndarray:
    """``max / mean - 1`` along the last axis; 0 for a layer without work."""
    work = np.asarray(work, dtype=np.float64)
    mean = work.mean(axis=-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        imb = np.where(mean > 0, work.max(axis=-1) / np.where(mean > 0, mean, 1.0) - 1.0, 0.0)
    return imb


def layer_imbalance(layers: Sequence[sp.csc_matrix], owners: np.ndarray, *, parts: int | None = None) -> np.ndarray:
    """Work imbalance of every layer, ``max_part_work / mean_part_work - 1``.

    The mean is over all ``K`` parts (an empty part counts), so leaving a part idle shows as imbalance.

    Returns
    -------
    numpy.ndarray
        ``(L,)`` ``float64``; a layer with no nonzeros has imbalance 0.
    """
    return _imbalance(part_work(layers, owners, parts=parts))


def partition_report(
    layers: Sequence[sp.csc_matrix], owners: np.ndarray, method: str, seconds: float, *, parts: int | None = None
) -> dict[str, Any]:
    """Summarise a partition's cost.

    Parameters
    ----------
    layers, owners
        The network and its partition.
    method
        Label recorded in the report.
    seconds
        How long partitioning took.
    parts
        Number of parts; inferred as ``owners.max() + 1`` when omitted.

    Returns
    -------
    dict
        ``method``, ``parts``, ``layers``, ``neurons``, ``volume_total``, ``volume_per_layer`` (list of int),
        ``max_part_send`` (the busiest part's outgoing entries summed over layers: the real bottleneck),
        ``imbalance_max`` (the worst layer's work imbalance) and ``seconds`` (time to partition).
    """
    ws = _as_layers(layers)
    o, k = _owners_for(ws, owners, parts)
    sends = part_sends(ws, o, parts=k)
    vol = sends.sum(axis=1)
    return {
        "method": str(method),
        "parts": k,
        "layers": len(ws),
        "neurons": int(ws[0].shape[0]),
        "volume_total": int(vol.sum()),
        "volume_per_layer": [int(v) for v in vol],
        "max_part_send": int(sends.sum(axis=0).max()),
        "imbalance_max": float(layer_imbalance(ws, o, parts=k).max()),
        "seconds": float(seconds),
    }


# --------------------------------------------------------------------------------------------- baselines
def _split_by_weight(order: np.ndarray, weights: np.ndarray, parts: int) -> np.ndarray:
    """Cut ``order`` into ``parts`` contiguous runs of near-equal total weight; return owners by index."""
    n = len(order)
    w = weights[order].astype(np.float64)
    total = float(w.sum())
    if total <= 0:  # nothing to balance: split by count
        w = np.ones(n)
        total = float(n)
    mid = np.cumsum(w) - w / 2  # each neuron goes where its weight's midpoint falls
    run = np.minimum((mid * parts / total).astype(np.int64), parts - 1)
    owners = np.empty(n, dtype=np.int32)
    owners[order] = run
    return owners


def _block(ws: Sequence[sp.csc_matrix], parts: int) -> np.ndarray:
    n = ws[0].shape[0]
    weights = np.zeros(n, dtype=np.int64)
    for w in ws:
        weights += np.diff(w.indptr)
    row = _split_by_weight(np.arange(n), weights, parts)
    return np.tile(row, (len(ws) + 1, 1))


def _random(ws: Sequence[sp.csc_matrix], parts: int, seed: int) -> np.ndarray:
    n = ws[0].shape[0]
    rng = np.random.default_rng(seed)
    owners = np.empty((len(ws) + 1, n), dtype=np.int32)
    owners[0] = _split_by_weight(rng.permutation(n), np.ones(n), parts)
    for k, w in enumerate(ws, start=1):
        owners[k] = _split_by_weight(rng.permutation(n), np.diff(w.indptr), parts)
    return owners


# --------------------------------------------------------------------------------------------- Mt-KaHyPar
def _mtk(threads: int | None) -> Any:
    """The process-wide Mt-KaHyPar initializer; its thread count is fixed by the first call."""
    global _MTK, _MTK_THREADS
    with _MTK_LOCK:
        if _MTK is None:
            try:
                import mtkahypar
            except ImportError as e:  # pragma: no cover - a declared dependency
                raise DasknnError("hypergraph partitioning needs the mtkahypar package (pip install mtkahypar)") from e
            if threads is None:
                threads = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
            _MTK_THREADS = max(1, int(threads))
            _MTK = mtkahypar.initialize(_MTK_THREADS, False)
        return _MTK


def _context(parts: int, eps: float, caps: Sequence[int], preset: str = "default") -> Any:
    import mtkahypar

    # DEFAULT: on the challenge network QUALITY came out within DEFAULT's run-to-run spread (128.2k against
    # 128.2k-128.7k at K = 16) for ~5 % more time; HIGHEST_QUALITY took twice as long for < 1 %.
    ctx = _MTK.context_from_preset(getattr(mtkahypar.PresetType, PRESETS[preset]))
    ctx.set_partitioning_parameters(parts, eps, mtkahypar.Objective.KM1)
    ctx.logging = False
    # Explicit block capacities make the balance exact (max work <= (1 + eps) * mean) instead of Mt-KaHyPar's
    # rounded-up bound, and let fixed vertices carry weight without eating the free vertices' room.
    ctx.set_individual_target_block_weights([int(c) for c in caps])
    return ctx


def _cap(total: float, parts: int, eps: float) -> int:
    """Largest part weight allowed: ``floor((1 + eps) * mean)``, but never below a feasible ``ceil(mean)``."""
    mean = total / parts
    return max(int(math.floor((1.0 + eps) * mean + 1e-9)), int(math.ceil(mean - 1e-9)))


def _run_mtk(
    num_nodes: int,
    flat: np.ndarray,
    ptr: np.ndarray,
    net_weights: np.ndarray | None,
    node_weights: np.ndarray,
    parts: int,
    eps: float,
    caps: Sequence[int],
    seed: int,
    fixed: np.ndarray | None = None,
    preset: str = "default",
) -> np.ndarray:
    """Partition one hypergraph (nets as CSR ``ptr``/``flat``) with Mt-KaHyPar; return the block of every node."""
    import mtkahypar

    ctx = _context(parts, eps, caps, preset)
    fl = flat.tolist()  # the binding takes lists of lists; slicing one list is far faster than per-net numpy
    p = ptr.tolist()
    nets = [fl[p[e] : p[e + 1]] for e in range(len(p) - 1)]
    nw = [1] * len(nets) if net_weights is None else net_weights.tolist()
    hg = _MTK.create_hypergraph(ctx, num_nodes, len(nets), nets, node_weights.tolist(), nw)
    if fixed is not None:
        hg.add_fixed_vertices(fixed.tolist(), parts)
    mtkahypar.set_seed(int(seed))
    phg = hg.partition(ctx)
    return np.asarray(phg.get_partition(), dtype=np.int32)


def _row_nets(csr: sp.csr_matrix, head_offset: int, col_offset: int, head_ids: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Nets ``{head_offset + i} | {col_offset + j : W[i, j] != 0}`` for every row ``i`` with a nonzero."""
    rnnz = np.diff(csr.indptr)
    keep = np.flatnonzero(rnnz > 0)
    size = rnnz[keep] + (1 if head_ids else 0)
    ptr = np.zeros(len(keep) + 1, dtype=np.int64)
    np.cumsum(size, out=ptr[1:])
    flat = np.empty(int(ptr[-1]), dtype=np.int64)
    is_head = np.zeros(len(flat), dtype=np.bool_)
    if head_ids:
        is_head[ptr[:-1]] = True
        flat[ptr[:-1]] = head_offset + keep
    flat[~is_head] = col_offset + csr.indices.astype(np.int64)  # CSR order is row order, as are the nets
    return flat, ptr


def _concat_nets(parts_: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    flats = [f for f, _ in parts_]
    ptrs = [np.zeros(1, dtype=np.int64)]
    base = 0
    for f, p in parts_:
        ptrs.append(p[1:] + base)
        base += len(f)
    return (np.concatenate(flats) if flats else np.zeros(0, np.int64)), np.concatenate(ptrs)


def _shared(ws: list[sp.csc_matrix], parts: int, eps: float, seed: int, preset: str = "default") -> np.ndarray:
    """One owner per neuron index: Mt-KaHyPar over the nets of all layers on ``N`` vertices."""
    n = ws[0].shape[0]
    groups: dict[int, list[np.ndarray]] = {}
    for w in ws:
        csr = w.tocsr()
        rows = np.repeat(np.arange(n, dtype=np.int64), np.diff(csr.indptr))
        # Net of input i: i itself (it owns the value) and its consumers; a sorted key per pin canonicalises it.
        keys = np.unique(np.concatenate([rows * n + csr.indices, np.arange(n, dtype=np.int64) * (n + 1)]))
        net = keys // n
        pin = keys % n
        size = np.bincount(net, minlength=n)
        starts = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(size, out=starts[1:])
        for s in np.unique(size):
            if s < 2:
                continue  # a net inside one vertex can never be cut
            sel = np.flatnonzero(size == s)
            idx = starts[sel][:, None] + np.arange(s)[None, :]
            groups.setdefault(int(s), []).append(pin[idx])
    flat_parts: list[tuple[np.ndarray, np.ndarray]] = []
    weights: list[np.ndarray] = []
    for s, blocks in sorted(groups.items()):
        # Identical nets (the same input feeding the same outputs in several layers) become one weighted net.
        uniq, counts = np.unique(np.concatenate(blocks), axis=0, return_counts=True)
        flat_parts.append((uniq.ravel(), np.arange(0, uniq.size + 1, s, dtype=np.int64)))
        weights.append(counts)
    flat, ptr = _concat_nets(flat_parts)
    work = np.sum([np.diff(w.indptr) for w in ws], axis=0).astype(np.int64)
    if len(ptr) == 1:  # no nets at all: only balance matters
        return _tile_row(_split_by_weight(np.arange(n), work, parts), len(ws))
    node_w = np.maximum(work, 1)  # Mt-KaHyPar misbehaves on zero-weight vertices; an empty column weighs 1
    caps = [_cap(float(node_w.sum()), parts, eps)] * parts
    row = _run_mtk(n, flat, ptr, np.concatenate(weights), node_w, parts, eps, caps, seed, preset=preset)
    return _tile_row(row, len(ws))


def _tile_row(row: np.ndarray, layers: int) -> np.ndarray:
    return np.ascontiguousarray(np.tile(row.astype(np.int32), (layers + 1, 1)))


class _Layered:
    """Row-by-row partitioning with neighbouring rows fixed (the ``hypergraph-layered`` machinery)."""

    def __init__(self, ws: Sequence[sp.csc_matrix], parts: int, eps: float, seed: int, preset: str = "default"):
        self.ws = ws
        self.preset = preset
        self.n = ws[0].shape[0]
        self.L = len(ws)
        self.parts = parts
        self.eps = eps
        self.seed = seed
        self._csr: dict[int, sp.csr_matrix] = {}

    def csr(self, i: int) -> sp.csr_matrix:
        """Layer ``i + 1`` as CSR; a row's solve needs at most two layers, so only the last two are kept."""
        if i not in self._csr:
            if len(self._csr) >= 2:
                del self._csr[max(self._csr, key=lambda j: abs(j - i))]
            self._csr[i] = self.ws[i].tocsr()
        return self._csr[i]

    def weight(self, r: int) -> np.ndarray:
        """Vertex weights of row ``r``: its layer's column counts. Row 0 has no work; balancing it by count keeps
        the input pixels spread evenly."""
        return np.ones(self.n, dtype=np.int64) if r == 0 else np.diff(self.ws[r - 1].indptr).astype(np.int64)

    def row_volume(self, owners: np.ndarray, r: int, row: np.ndarray) -> int:
        """Volume of the layers row ``r`` touches (``r`` as output, ``r + 1`` as input) if row ``r`` were ``row``."""
        vol = 0
        if r >= 1:
            vol += int((_lambdas(self.ws[r - 1], owners[r - 1], row, self.parts) - 1).sum())
        if r < self.L:
            vol += int((_lambdas(self.ws[r], row, owners[r + 1], self.parts) - 1).sum())
        return vol

    def balanced(self, r: int, row: np.ndarray) -> bool:
        w = self.weight(r)
        load = np.bincount(row, weights=w, minlength=self.parts)
        return bool(load.max() <= _cap(float(w.sum()), self.parts, self.eps) + 1e-9)

    def solve_row(self, owners: np.ndarray, r: int, use_prev: bool, use_next: bool) -> np.ndarray:
        """Partition row ``r`` with the rows before/after it fixed to their current owners."""
        n, k = self.n, self.parts
        nets: list[tuple[np.ndarray, np.ndarray]] = []
        fixed_rows: list[np.ndarray] = []
        offset = n
        if use_prev and r >= 1:  # layer r: fixed input i (its owner is given) and free outputs of row r
            nets.append(_row_nets(self.csr(r - 1), offset, 0))
            fixed_rows.append(owners[r - 1])
            offset += n
        if use_next and r < self.L:  # layer r + 1: free input i of row r and fixed outputs of row r + 1
            nets.append(_row_nets(self.csr(r), 0, offset))
            fixed_rows.append(owners[r + 1])
            offset += n
        flat, ptr = _concat_nets(nets)
        w = self.weight(r)
        free_w = np.maximum(w, 1)  # zero weights crash Mt-KaHyPar next to fixed vertices
        num = n * (1 + len(fixed_rows))
        if len(ptr) == 1:
            return _split_by_weight(np.arange(n), w, k)
        fixed = np.concatenate([np.full(n, -1, dtype=np.int64)] + [f.astype(np.int64) for f in fixed_rows])
        # Fixed vertices weigh 1 each; each block's capacity grows by the fixed weight it already holds.
        fixed_load = np.bincount(np.concatenate(fixed_rows), minlength=k) if fixed_rows else np.zeros(k, np.int64)
        cap = _cap(float(free_w.sum()), k, self.eps)
        caps = (cap + fixed_load).tolist()
        node_w = np.concatenate([free_w] + [np.ones(n, dtype=np.int64)] * len(fixed_rows))
        part = _run_mtk(num, flat, ptr, None, node_w, k, self.eps, caps, self.seed + r, fixed=fixed, preset=self.preset)
        return part[:n].astype(np.int32)

    def forward(self) -> np.ndarray:
        """Initial owners: layer 1 from its column-net hypergraph, then each row with the previous one fixed."""
        n, k = self.n, self.parts
        owners = np.zeros((self.L + 1, n), dtype=np.int32)
        # Row 1 alone: nets are the consumer sets of each input (the input's own owner is chosen afterwards).
        flat, ptr = _row_nets(self.csr(0), 0, 0, head_ids=False)
        sizes = np.diff(ptr)
        keep = np.flatnonzero(sizes >= 2)
        idx = np.concatenate([np.arange(ptr[e], ptr[e + 1]) for e in keep]) if len(keep) else np.zeros(0, np.int64)
        flat, ptr = flat[idx], np.concatenate([[0], np.cumsum(sizes[keep])]).astype(np.int64)
        w1 = np.maximum(self.weight(1), 1)
        if len(ptr) > 1:
            owners[1] = _run_mtk(n, flat, ptr, None, w1, k, self.eps, [_cap(float(w1.sum()), k, self.eps)] * k, self.seed,
                                 preset=self.preset)
        else:
            owners[1] = _split_by_weight(np.arange(n), self.weight(1), k)
        owners[0] = self.solve_row(owners, 0, use_prev=False, use_next=True)
        for r in range(2, self.L + 1):
            owners[r] = self.solve_row(owners, r, use_prev=True, use_next=False)
        return owners

    def sweep(self, owners: np.ndarray, order: Sequence[int]) -> int:
        """Re-partition each row in ``order`` with both neighbours fixed; keep a row only if it is better.

        A fresh partition, not V-cycles from the current row: measured, V-cycles never left the forward
        pass's local optimum, fresh runs improve about a third of the rows.
        """
        changed = 0
        for r in order:
            cur = owners[r].copy()
            cand = self.solve_row(owners, r, use_prev=True, use_next=True)
            if self.balanced(r, cand) and self.row_volume(owners, r, cand) < self.row_volume(owners, r, cur):
                owners[r] = cand
                changed += 1
        return changed


def _rebalance(row: np.ndarray, weights: np.ndarray, parts: int, cap: int) -> np.ndarray:
    """Move vertices out of parts heavier than ``cap`` into the lightest part, largest that fits first.

    A safety net: Mt-KaHyPar meets the capacities in practice, but it may miss them when they are tight
    (a few heavy columns) and substitutes weight 1 for empty columns.
    """
    row = row.copy()
    load = np.bincount(row, weights=weights, minlength=parts).astype(np.int64)
    for _ in range(len(row)):
        p = int(load.argmax())
        if load[p] <= cap:
            break
        q = int(load.argmin())
        members = np.flatnonzero((row == p) & (weights > 0))
        fits = members[weights[members] <= cap - load[q]]
        if len(fits) == 0:
            break  # nothing moves without overloading the lightest part: leave the best we have
        v = fits[np.argmax(weights[fits])]  # the largest that fits: fewest moves, like first-fit decreasing
        row[v] = q
        load[p] -= weights[v]
        load[q] += weights[v]
    return row


def _layered(ws: Sequence[sp.csc_matrix], parts: int, eps: float, seed: int, sweeps: int,
             preset: str = "default") -> np.ndarray:
    lay = _Layered(ws, parts, eps, seed, preset)
    owners = lay.forward()
    rows = list(range(lay.L + 1))
    for s in range(sweeps):
        order = rows[::-1] if s % 2 == 0 else rows  # backward first: the forward pass never looked ahead
        if lay.sweep(owners, order) == 0:
            break
    for r in range(1, lay.L + 1):
        w = lay.weight(r)
        owners[r] = _rebalance(owners[r], w, parts, _cap(float(w.sum()), parts, eps))
    return owners


# --------------------------------------------------------------------------------------------- entry point
def partition_network(
    layers: Sequence[sp.csc_matrix],
    parts: int,
    method: str = "hypergraph",
    *,
    epsilon: float = 0.03,
    seed: int = 0,
    threads: int | None = None,
    sweeps: int | None = None,
    preset: str = "default",
) -> np.ndarray:
    """Assign every neuron of every layer (inputs included) to one of ``parts`` parts.

    Parameters
    ----------
    layers
        ``W_1 ... W_L`` as ``N x N`` CSC matrices in the challenge orientation, or a
        :class:`~dasknn.network.Network`.
    parts
        Number of parts ``K``, ``1 <= K <= N``.
    method
        One of :data:`METHODS` (see the module docstring).
    epsilon
        Allowed per-layer work imbalance, ``max / mean - 1``. ``block`` and ``random`` balance by
        construction; ``hypergraph-shared`` balances the work summed over layers.
    seed
        Seed for ``random`` and for Mt-KaHyPar.
    threads
        Mt-KaHyPar threads (default: the CPUs this process may use). Mt-KaHyPar sets up its thread pool
        once per process, so only the first hypergraph call's value takes effect.
    sweeps
        Refinement sweeps after the forward pass of the layered methods (alternately backward and
        forward; each re-partitions every row). Default: 0 for ``hypergraph``, 2 for ``hypergraph-layered``.
    preset
        Mt-KaHyPar preset, one of :data:`PRESETS`: ``"default"``, or ``"deterministic"`` (the same owners on
        every run, whatever the threads: for reproducible figures; slower).

    Returns
    -------
    numpy.ndarray
        ``int32`` owners of shape ``(L + 1, N)``, every entry in ``[0, parts)``.

    Raises
    ------
    DasknnError
        For an unknown method, a bad ``parts`` or ``epsilon``, or layers that are not square and alike.
    """
    ws = _as_layers(layers)
    n = ws[0].shape[0]
    k = _check_parts(parts, n)
    eps = _check_epsilon(epsilon)
    if method not in METHODS:
        raise DasknnError(f"unknown partition method {method!r}; choose one of {', '.join(METHODS)}")
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, (int, np.integer)) or threads < 1):
        raise DasknnError(f"threads must be a positive integer, got {threads!r}")
    if sweeps is not None and (isinstance(sweeps, bool) or not isinstance(sweeps, (int, np.integer)) or sweeps < 0):
        raise DasknnError(f"sweeps must be a non-negative integer, got {sweeps!r}")
    if preset not in PRESETS:
        raise DasknnError(f"unknown Mt-KaHyPar preset {preset!r}; choose one of {', '.join(PRESETS)}")
    seed = int(seed)
    if k == 1:
        return np.zeros((len(ws) + 1, n), dtype=np.int32)
    if method == "block":
        owners = _block(ws, k)
    elif method == "random":
        owners = _random(ws, k, seed)
    else:
        _mtk(threads)
        if method == "hypergraph-shared":
            owners = _shared(ws, k, eps, seed, preset)
        else:
            # Measured on the challenge network: the forward pass alone beats the shared owner by about a
            # third in volume in less time; each sweep costs about as much as the forward pass for ~0.5 %.
            default_sweeps = 2 if method == "hypergraph-layered" else 0
            owners = _layered(ws, k, eps, seed, default_sweeps if sweeps is None else int(sweeps), preset)
            if method == "hypergraph" and isinstance(ws, list):
                # (not for layers read on demand: the shared owner's hypergraph holds every layer's nets at once)
                # some networks keep one locality through all layers (a shared owner per index then sends
                # far less: 0.003 of random against the layered pass's 0.22 on the training benchmark's
                # network); keep it where it is smaller and still balances every layer
                shared = _shared(ws, k, eps, seed, preset)
                if (layer_imbalance(ws, shared, parts=k).max() <= eps + 1e-12
                        and layer_volumes(ws, shared, parts=k).sum() < layer_volumes(ws, owners, parts=k).sum()):
                    owners = shared
    return validate_partition(owners, len(ws), n, k)


# --------------------------------------------------------------------------------------------- plot
def plot_partition(
    layers: Sequence[sp.csc_matrix],
    owners: np.ndarray,
    method: str,
    path: str | os.PathLike[str],
    *,
    seed: int = 0,
    parts: int | None = None,
) -> None:
    """Draw a partition's cost against the ``block`` and ``random`` baselines into one PNG.

    Left: communication volume per layer for ``method``, ``block`` and ``random`` (same ``K``). Right: each
    part's load under ``method``, work (nonzeros owned, summed over layers) and entries sent.

    Parameters
    ----------
    layers, owners
        The network and the partition to draw.
    method
        Label for ``owners``.
    path
        Where to write the PNG.
    seed
        Seed of the ``random`` baseline.
    parts
        Number of parts; inferred as ``owners.max() + 1`` when omitted.
    """
    from matplotlib.figure import Figure  # lazily: plotting is optional and matplotlib is slow to import

    ws = _as_layers(layers)
    o, k = _owners_for(ws, owners, parts)
    series = {method: layer_volumes(ws, o, parts=k)}
    for base in ("block", "random"):
        if base != method:
            series[base] = layer_volumes(ws, partition_network(ws, k, base, seed=seed), parts=k)
    work = part_work(ws, o, parts=k).sum(axis=0)
    sends = part_sends(ws, o, parts=k).sum(axis=0)

    fig = Figure(figsize=(12, 4.5), layout="constrained")
    ax1, ax2 = fig.subplots(1, 2)
    x = np.arange(1, len(ws) + 1)
    for name, vol in series.items():
        ax1.plot(x, np.maximum(vol, 0.5), label=f"{name} (total {int(vol.sum()):,})", lw=1.2)
    ax1.set_yscale("log")
    ax1.set_xlabel("layer")
    ax1.set_ylabel("entries sent (connectivity - 1)")
    ax1.set_title(f"volume per layer, K = {k}, N = {ws[0].shape[0]}")
    ax1.legend(fontsize=8)
    ids = np.arange(k)
    ax2.bar(ids - 0.2, work, width=0.4, label="work (nonzeros owned)", color="tab:blue")
    ax2.set_xlabel("part")
    ax2.set_ylabel("work", color="tab:blue")
    ax3 = ax2.twinx()
    ax3.bar(ids + 0.2, sends, width=0.4, label="entries sent", color="tab:orange")
    ax3.set_ylabel("entries sent", color="tab:orange")
    ax2.set_title(f"load per part ({method}): worst layer imbalance {layer_imbalance(ws, o, parts=k).max():.2%}")
    fig.savefig(os.fspath(path), dpi=110)
