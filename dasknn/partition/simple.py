"""The baselines (``block``, ``random``) and the balance helpers every method shares."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import scipy.sparse as sp


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


def _cap(total: float, parts: int, eps: float) -> int:
    """Largest part weight allowed: ``floor((1 + eps) * mean)``, but never below a feasible ``ceil(mean)``."""
    mean = total / parts
    return max(int(math.floor((1.0 + eps) * mean + 1e-9)), int(math.ceil(mean - 1e-9)))


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
