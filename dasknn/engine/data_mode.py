"""Data mode's graph builder: one worker runs a chunk through segments of consecutive layers; and a chunk run
again from the stores alone on any worker (:class:`ChunkAgain`)."""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass

import numpy as np

from ..kernels.folds import Folds
from ..runtime.graph import PinnedGraph, ref
from ..runtime.worker_runs import close_run
from .inputs import StoredRows, load_images
from .tasks import LayerStreamSpec, ResultSpec, run_segment, segment_state


@dataclass(frozen=True)
class ChunkAgain:
    """A chunk's final activations computed again, on whatever worker calls it, from the network store at
    ``network`` (``depth`` layers) and the images ``start:stop`` of ``inputs``: data mode's segment over every
    layer, streamed two at a time, in a run of its own. What a kept chunk lost with its worker after the run falls
    back on (:mod:`dasknn.runtime.kept`): the same kernels on the same inputs, so the same activations, as dense
    rows (images x neurons, the dead images' rows zero)."""

    network: str
    depth: int
    inputs: StoredRows
    start: int
    stop: int
    dtype: str
    backend: str
    bias: float
    ymax: float

    def __call__(self) -> np.ndarray | None:
        """The activations; None where a store is gone (a temporary one, removed after the run)."""
        if not (os.path.isdir(self.network) and os.path.isdir(self.inputs.path)):
            return None
        yt = load_images(self.inputs, None, self.start, self.stop, None, self.dtype, self.backend)
        run = f"again-{uuid.uuid4().hex[:8]}"  # (its stream closes with it)
        try:
            out = run_segment(run, LayerStreamSpec(self.network, self.dtype, keep=2), yt, self.start, 1, self.depth,
                              self.bias, self.ymax, True, None, (self.start, self.stop - self.start))
        finally:
            close_run(run)
        return out.activations


def data_chunk(graph: PinnedGraph, c: int, start: int, w: str, weights: list | LayerStreamSpec, images, depth: int,
               segment: int, bias: float, ymax: float, results: ResultSpec | None,
               rows: tuple[int, int] | None = None, compress: bool = True) -> str:
    """Chunk ``c``'s tasks on worker ``w``: one per segment of ``segment`` layers; the last one's key.

    With ``rows`` (the chunk's first image and its size) the run keeps its final activations: the last task's
    :class:`~dasknn.engine.tasks.ChunkResult` holds them. With ``compress`` the chunk's images whose activations
    become equal are computed once (:mod:`dasknn.kernels.folds`); without, its layers are only counted.
    """
    key = ""
    folds: object = Folds(enabled=compress)
    for first in range(1, depth + 1, segment):
        last = min(depth, first + segment - 1)
        final = last == depth
        args = (graph.run, weights, images, start, first, last, bias, ymax, final, results)
        if first > 1:
            # continue from the previous segment's (yt, ids, folds)
            yt_key = graph.add(w, f"state-l{first - 1}-c{c}-yt", (segment_state, ref(key), 0))
            id_key = graph.add(w, f"state-l{first - 1}-c{c}-ids", (segment_state, ref(key), 1))
            folds = ref(graph.add(w, f"state-l{first - 1}-c{c}-folds", (segment_state, ref(key), 2)))
            args = (graph.run, weights, ref(yt_key), ref(id_key), first, last, bias, ymax, final, results)
        args = (*args, rows if final else None, folds)
        key = graph.add(w, f"spmm-l{first}-{last}-p0-c{c}", (run_segment, *args))
    return key
