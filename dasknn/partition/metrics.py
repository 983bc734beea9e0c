"""Inputs and costs of a partition: checking layers and owners arrays, volumes, sends, work and balance."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import scipy.sparse as sp

from ..errors import DasknnError

#: Above this many cells a dense ``neurons x parts`` marker array is replaced by sorting (memory bound).
_DENSE_CELLS = 1 << 26


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


def check_partition_arguments(parts: Any, neurons: int, epsilon: Any) -> tuple[int, float]:
    """The number of parts and the imbalance allowed, checked for a network ``neurons`` wide (one line each).

    For a caller that checks before it starts a cluster; the methods check the same way.
    """
    return _check_parts(parts, neurons), _check_epsilon(epsilon)


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
    return report_of(method, k, int(ws[0].shape[0]), part_sends(ws, o, parts=k), layer_imbalance(ws, o, parts=k),
                     seconds)


def report_of(method: str, parts: int, neurons: int, sends: np.ndarray, imbalance: np.ndarray,
              seconds: float) -> dict[str, Any]:
    """:func:`partition_report` from per-layer figures (what each worker computes for its own layers on a
    cluster): ``sends`` as :func:`part_sends` gives them (layers x parts), ``imbalance`` as :func:`layer_imbalance`."""
    vol = sends.sum(axis=1)
    return {
        "method": str(method),
        "parts": int(parts),
        "layers": int(sends.shape[0]),
        "neurons": int(neurons),
        "volume_total": int(vol.sum()),
        "volume_per_layer": [int(v) for v in vol],
        "max_part_send": int(sends.sum(axis=0).max()),
        "imbalance_max": float(imbalance.max()),
        "seconds": float(seconds),
    }
