"""Pipeline mode's graph builder and its worker-side tasks: each worker of a pipeline holds a *stage* (consecutive
layers), and a chunk's activations flow from stage to stage.

A chunk is data mode's chain of segments with segment ``s`` pinned to stage ``s``'s worker: ``stage{s}-l{a}-{b}-c{c}``
runs layers ``a..b`` on the chunk, drops its dead images (:func:`~dasknn.kernels.run_layers` compacts them) and
returns a :class:`Handoff`, which Dask moves to the next stage's worker as the next task's dependency (one message
per chunk and stage boundary). The last stage returns the chunk's
:class:`~dasknn.engine.tasks.ChunkResult`. So a chunk is one task per stage; with more chunks than stages, stage
``s`` runs chunk ``c`` while stage ``s + 1`` runs chunk ``c - 1``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from dask.sizeof import sizeof

from .. import kernels
from ..kernels.folds import Folds
from ..runtime.graph import PinnedGraph, ref
from ..stages import Stage, stage_cuts  # noqa: F401 - the stages are this mode's: importable from here
from ..store import open_store
from .tasks import ResultSpec, run_segment
from .worker_run import Block, LayerStreamSpec


@dataclass(frozen=True)
class Handoff:
    """What a stage sends the next one for a chunk: the activations of its live images (neurons x images) and
    those images' original indices (the dead ones already dropped), and the chunk's record of folded images
    (:class:`~dasknn.kernels.folds.Folds`): only one column of each distinct vector crosses."""

    yt: object
    ids: np.ndarray
    folds: Folds | None = None


@sizeof.register(Handoff)
def _handoff_bytes(handoff: Handoff) -> int:
    # Dask counts a result's bytes (its memory, and what a transfer sent) by sizeof, which for an object it does
    # not know is the object's header alone
    folds = handoff.folds
    record = 0 if folds is None else sum(int(a.nbytes) for a in (folds.merged, folds.into, folds.columns, folds.alive))
    return int(sizeof(handoff.yt) + sizeof(handoff.ids)) + record


def keep_stage_places(groups: list[list[str]], stages: list[Stage], held: dict[str, Stage]) -> list[list[str]]:
    """``groups`` (each a pipeline: its ``s``-th worker holds ``stages[s]``) with their workers placed again so that
    a worker that holds one of ``stages`` already (``held``: worker -> stage, from the pass before a loss) holds it
    again, in the first group with that place free; the other workers fill the places left, in their order."""
    g = len(stages)
    workers = [w for members in groups for w in members]
    places: list[str | None] = [None] * len(workers)
    rest = []
    for w in workers:
        s = stages.index(held[w]) if held.get(w) in stages else None
        free = next((i for i in range(s, len(places), g) if places[i] is None), None) if s is not None else None
        if free is None:
            rest.append(w)
        else:
            places[free] = w
    others = iter(rest)
    filled = [w if w is not None else next(others) for w in places]
    return [filled[i:i + g] for i in range(0, len(filled), g)]


def stage_weights(path: str, stage: Stage, dtype: str, backend: str) -> list[Block | None]:
    """A stage's layers, read by its worker from the store, in a list indexed like data mode's (layer ``k`` at
    ``k - 1``): the layers before the stage are None, so :func:`~dasknn.engine.tasks.run_segment` runs it as is."""
    store = open_store(path, check="metadata")
    layers = ((w.indptr, w.indices, w.data) for w in map(store.layer, range(stage.first, stage.last + 1)))
    entries = int(store.layer_entries()[stage.first - 1:stage.last].sum())
    blocks: list[Block | None] = [None] * (stage.first - 1)
    return blocks + kernels.held_layers(layers, entries, dtype, backend)


def run_stage(run: str, weights: list | LayerStreamSpec, stage: Stage, bias: float, ymax: float, final: bool,
              results: ResultSpec | None, rows: tuple[int, int] | None, source, start: int, compress: bool = True):
    """Stage ``stage`` of one chunk: from the chunk's images (the first stage, whose first image is ``start``) or
    the previous stage's :class:`Handoff` (``source``); a :class:`Handoff` for the next stage, or after the last
    layer the chunk's :class:`~dasknn.engine.tasks.ChunkResult`. ``compress``: the first stage's record of folded
    images (:mod:`dasknn.kernels.folds`) folds them, or only counts the layers."""
    if isinstance(source, Handoff):
        yt, ids, folds = source.yt, source.ids, source.folds
    else:
        yt, ids, folds = source, start, Folds(enabled=compress)
    out = run_segment(run, weights, yt, ids, stage.first, stage.last, bias, ymax, final, results, rows, folds)
    return out if final else Handoff(*out)


def pipeline_chunk(graph: PinnedGraph, c: int, start: int, stages: list[Stage], members: list[str],
                   weights_of: dict[str, object], images, bias: float, ymax: float, results: ResultSpec | None,
                   rows: tuple[int, int] | None = None, compress: bool = True) -> str:
    """Chunk ``c``'s tasks (its first image ``start``; its ``images`` on ``members[0]``) through the pipeline of
    ``members``, stage ``s`` on ``members[s]`` with that worker's layers ``weights_of[members[s]]``: one task per
    stage; the last one's key (its result the chunk's :class:`~dasknn.engine.tasks.ChunkResult`, with its final
    activations where ``rows`` is given)."""
    source = images
    key = ""
    for s, (stage, w) in enumerate(zip(stages, members)):
        final = s == len(stages) - 1
        key = graph.add(w, f"stage{s}-l{stage.first}-{stage.last}-c{c}", (
            run_stage, graph.run, weights_of[w], stage, bias, ymax, final, results, rows if final else None, source,
            start, compress))
        source = ref(key)
    return key
