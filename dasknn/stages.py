"""Pipeline mode's stages: the layers cut into consecutive stages of balanced work, one per worker of a pipeline.

Pure arithmetic on each layer's work, so the cost model (:mod:`dasknn.cost`) and the engine
(:mod:`dasknn.engine.pipeline_mode`) cut the layers the same way.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Stage:
    """Layers ``first..last`` (1-based, inclusive) of the network, held by one worker of a pipeline."""

    first: int
    last: int

    def as_list(self) -> list[int]:
        return [self.first, self.last]


def stage_cuts(work, stages: int, sizes=None, cap: float | Sequence[float] | None = None) -> list[Stage]:
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
        Each layer's size (e.g. its entries) and the most a stage may hold: one figure for every stage, or one per
        stage in order (workers of different memory, :func:`place_stages`). Where no cut into ``stages`` stages
        keeps every stage within its cap (a layer alone over it, or too few stages), the cut is by work alone and
        the stages that do not fit stream their layers.
    """
    w = np.asarray(work, dtype=float)
    depth = w.size
    if not 1 <= stages <= depth:
        raise ValueError(f"{stages} stages cannot cut {depth} layers (at least 1 layer a stage)")
    if sizes is not None and cap is not None:
        cuts = _balanced(w, stages, np.asarray(sizes, dtype=float),
                         np.broadcast_to(np.asarray(cap, dtype=float), (stages,)))
        if cuts is not None:
            return cuts
    # no cut fits: by work alone (without caps, any cut of at least one layer a stage is one)
    by_work = _balanced(w, stages, np.zeros(depth), np.full(stages, np.inf))
    assert by_work is not None
    return by_work


def _balanced(w: np.ndarray, stages: int, size: np.ndarray, limits: np.ndarray) -> list[Stage] | None:
    # the cut into ``stages`` stages with the smallest slowest stage among those whose stage s holds at most
    # limits[s]; None where none does. Bisection on the bound of a stage's work, each bound checked exactly
    # (_cut_within: a greedy cut is not exact once each stage has its own cap)
    lo, hi = float(w.max()), float(w.sum())
    cuts = _cut_within(w, hi, size, limits)
    if cuts is None:
        return None
    for _ in range(100):
        if hi - lo <= 1e-9 * max(1.0, hi):
            break
        mid = (lo + hi) / 2
        found = _cut_within(w, mid, size, limits)
        if found is None:
            lo = mid
        else:
            hi, cuts = mid, found
    return cuts


def _cut_within(w: np.ndarray, bound: float, size: np.ndarray, limits: np.ndarray) -> list[Stage] | None:
    # a cut into limits.size non-empty stages, each of work at most ``bound`` (a layer alone may exceed it) and
    # stage s of size at most limits[s]; None where there is none. reach[s][k]: layers 1..k cut into stages
    # 0..s within those bounds; stage s can end at layer k when it starts at a layer j + 1 with reach[s - 1][j],
    # j no smaller than the first start both sums allow (they grow as a stage starts earlier)
    depth = w.size
    work_sum = np.concatenate([[0.0], np.cumsum(w)])
    size_sum = np.concatenate([[0.0], np.cumsum(size)])
    ends = np.arange(1, depth + 1)
    slack = 1e-9 * max(1.0, float(work_sum[-1]), float(size_sum[-1]))
    earliest = np.searchsorted(work_sum, work_sum[1:] - bound - slack, side="left")
    earliest = np.minimum(earliest, ends - 1)  # a layer alone is always a stage's worth of work
    reach = []
    before = np.zeros(depth + 1, dtype=bool)
    before[0] = True
    for cap in limits:
        first = np.maximum(earliest, np.searchsorted(size_sum, size_sum[1:] - cap - slack, side="left"))
        counted = np.concatenate([[0], np.cumsum(before)])  # counted[i]: reachable ends among 0..i - 1
        now = np.zeros(depth + 1, dtype=bool)
        now[1:] = (first <= ends - 1) & (counted[ends] - counted[np.minimum(first, ends)] > 0)
        reach.append(before)
        before = now
    if not before[depth]:
        return None
    # back from the last layer: each stage starts as late as it can (the earlier stages as long as the bounds allow)
    cuts: list[Stage] = []
    k = depth
    for s in range(limits.size - 1, -1, -1):
        j = k - 1
        while not reach[s][j]:
            j -= 1
        cuts.append(Stage(j + 1, k))
        k = j
    return cuts[::-1]


def stage_capacity(weight_bytes: float, entries: int, memory: float, share: float) -> float:
    """The most entries a stage may hold for its layers to fit a worker: ``share`` of ``memory``, in the bytes an
    entry takes where the network's ``entries`` take ``weight_bytes``."""
    return share * memory * entries / max(1.0, weight_bytes)


@dataclass(frozen=True)
class StagePlacement:
    """The pipelines' workers, each pipeline's ``s``-th worker holding ``stages[s]``, and whether every stage's
    layers fit its workers' share of memory (else the cut is by work alone and the stages stream)."""

    groups: list[list[str]]
    stages: list[Stage]
    fits: bool


def place_stages(work, sizes, groups: list[list[str]], memory: dict[str, float], entries_per_byte: float
                 ) -> StagePlacement:
    """Cut the layers into stages for the pipelines ``groups`` (each as many workers as stages) whose workers have
    the memory limits ``memory`` (bytes, by worker); a stage may hold ``entries_per_byte`` entries per byte of its
    worker's limit (:func:`stage_capacity` of one byte).

    Where the limits differ, the workers are placed by them, the smallest at the first stage: a layer's work is
    its entries times the images still alive, so a cut of balanced work gives the later stages, whose images
    have died, more entries to hold. Each stage's cap is then the smallest limit among the workers at its place.
    """
    g = len(groups[0])
    workers = [w for members in groups for w in members]
    if len({memory[w] for w in workers}) > 1:
        by_memory = sorted(workers, key=lambda w: memory[w])  # (stable: equal limits keep their order)
        pipelines = len(groups)
        groups = [[by_memory[s * pipelines + p] for s in range(g)] for p in range(pipelines)]
    caps = [entries_per_byte * min(memory[members[s]] for members in groups) for s in range(g)]
    cuts = stage_cuts(work, g, sizes, caps)
    return StagePlacement(groups=groups, stages=cuts, fits=stages_fit(groups, cuts, sizes, memory, entries_per_byte))


def stages_fit(groups: list[list[str]], stages: list[Stage], sizes, memory: dict[str, float],
               entries_per_byte: float) -> bool:
    """Whether each pipeline's ``s``-th worker (of ``groups``) can hold ``stages[s]``: its layers' ``sizes`` within
    ``entries_per_byte`` entries per byte of the worker's ``memory`` limit."""
    size = np.asarray(sizes, dtype=float)
    slack = 1e-9 * max(1.0, float(size.sum()))  # as the cut's own (_cut_within): a stage exactly at its cap fits
    return all(size[stage.first - 1:stage.last].sum() <= entries_per_byte * memory[members[s]] + slack
               for members in groups for s, stage in enumerate(stages))
