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


def stage_cuts(work, stages: int) -> list[Stage]:
    """Cut layers ``1..len(work)`` into ``stages`` consecutive, non-empty stages whose slowest (largest sum of
    ``work``) is as small as it can be.

    Parameters
    ----------
    work
        Each layer's work, e.g. its entries x the share of images alive when it runs.
    stages
        Stages wanted: at most the number of layers.
    """
    w = np.asarray(work, dtype=float)
    depth = w.size
    if not 1 <= stages <= depth:
        raise ValueError(f"{stages} stages cannot cut {depth} layers (at least 1 layer a stage)")
    # the smallest bound on a stage's work that a greedy cut meets with at most ``stages`` stages (bisection)
    lo, hi = float(w.max()), float(w.sum())
    for _ in range(100):
        if hi - lo <= 1e-9 * max(1.0, hi):
            break
        mid = (lo + hi) / 2
        if len(_greedy(w, mid)) <= stages:
            hi = mid
        else:
            lo = mid
    cuts = _greedy(w, hi)
    while len(cuts) < stages:
        cuts = _split_heaviest(w, cuts)  # splitting a stage never makes the slowest slower
    return cuts


def _greedy(w: np.ndarray, bound: float) -> list[Stage]:
    # consecutive stages, each as long as its work stays within ``bound`` (a layer alone may exceed it)
    out: list[Stage] = []
    first, total = 1, 0.0
    for k, x in enumerate(w, start=1):
        if k > first and total + x > bound:
            out.append(Stage(first, k - 1))
            first, total = k, 0.0
        total += x
    out.append(Stage(first, w.size))
    return out


def _split_heaviest(w: np.ndarray, cuts: list[Stage]) -> list[Stage]:
    # the heaviest stage of two layers or more, cut where its two halves' larger one is smallest
    splittable = [i for i, s in enumerate(cuts) if s.last > s.first]
    i = max(splittable, key=lambda j: w[cuts[j].first - 1:cuts[j].last].sum())
    s = cuts[i]
    best = min(range(s.first, s.last), key=lambda m: max(w[s.first - 1:m].sum(), w[m:s.last].sum()))
    return cuts[:i] + [Stage(s.first, best), Stage(best + 1, s.last)] + cuts[i + 1:]
