"""Pipeline mode's stages: the layers cut into consecutive stages of balanced work, one per worker of a pipeline.

Pure arithmetic on each layer's work, so the cost model (:mod:`dasknn.cost`) and the engine
(:mod:`dasknn.engine.pipeline_mode`) cut the layers the same way.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Stage:
    """Layers ``first..last`` (1-based, inclusive) of the network, held by one worker of a pipeline."""

    first: int
    last: int

    def as_list(self) -> list[int]:
        return [self.first, self.last]


def stage_cuts(work, stages: int, sizes=None, cap: float | None = None) -> list[Stage]:
    """Cut layers ``1..len(work)`` into ``stages`` consecutive, non-empty stages whose slowest (largest sum of
    ``work``) is as small as it can be; with ``sizes`` and ``cap``, among the cuts whose every stage's sum of
    ``sizes`` is at most ``cap`` (each stage's layers fit its worker), where there is one.

    Parameters
    ----------
    work
        Each layer's work, e.g. its entries x the share of images alive when it runs.
    stages
        Stages wanted: at most the number of layers.
    sizes, cap
        Each layer's size (e.g. its entries) and the most a stage may hold. Where no cut into ``stages`` stages
        keeps every stage within ``cap`` (a layer alone over it, or too few stages), the cut is by work alone and
        the stages that do not fit stream their layers.
    """
    w = np.asarray(work, dtype=float)
    depth = w.size
    if not 1 <= stages <= depth:
        raise ValueError(f"{stages} stages cannot cut {depth} layers (at least 1 layer a stage)")
    size = np.zeros(depth) if sizes is None or cap is None else np.asarray(sizes, dtype=float)
    limit = np.inf if sizes is None or cap is None else float(cap)
    if len(_greedy(w, float(w.sum()), size, limit)) > stages or size.max(initial=0.0) > limit:
        size, limit = np.zeros(depth), np.inf  # no cut fits: by work alone
    # the smallest bound on a stage's work that a greedy cut meets with at most ``stages`` stages (bisection;
    # extending each stage as far as both bounds allow needs the fewest stages, both sums growing with a stage)
    lo, hi = float(w.max()), float(w.sum())
    for _ in range(100):
        if hi - lo <= 1e-9 * max(1.0, hi):
            break
        mid = (lo + hi) / 2
        if len(_greedy(w, mid, size, limit)) <= stages:
            hi = mid
        else:
            lo = mid
    cuts = _greedy(w, hi, size, limit)
    while len(cuts) < stages:
        cuts = _split_heaviest(w, cuts)  # splitting a stage never makes the slowest slower, nor a stage larger
    return cuts


def stage_capacity(weight_bytes: float, entries: int, memory: float, share: float) -> float:
    """The most entries a stage may hold for its layers to fit a worker: ``share`` of ``memory``, in the bytes an
    entry takes where the network's ``entries`` take ``weight_bytes``."""
    return share * memory * entries / max(1.0, weight_bytes)


def _greedy(w: np.ndarray, bound: float, size: np.ndarray, limit: float) -> list[Stage]:
    # consecutive stages, each as long as its work stays within ``bound`` (a layer alone may exceed it) and its
    # size within ``limit``
    out: list[Stage] = []
    first, total, held = 1, 0.0, 0.0
    for k, (x, n) in enumerate(zip(w, size), start=1):
        if k > first and (total + x > bound or held + n > limit):
            out.append(Stage(first, k - 1))
            first, total, held = k, 0.0, 0.0
        total += x
        held += n
    out.append(Stage(first, w.size))
    return out


def _split_heaviest(w: np.ndarray, cuts: list[Stage]) -> list[Stage]:
    # the heaviest stage of two layers or more, cut where its two halves' larger one is smallest
    splittable = [i for i, s in enumerate(cuts) if s.last > s.first]
    i = max(splittable, key=lambda j: w[cuts[j].first - 1:cuts[j].last].sum())
    s = cuts[i]
    best = min(range(s.first, s.last), key=lambda m: max(w[s.first - 1:m].sum(), w[m:s.last].sum()))
    return cuts[:i] + [Stage(s.first, best), Stage(best + 1, s.last)] + cuts[i + 1:]
