"""Data mode's graph builder: one worker runs a chunk through segments of consecutive layers."""

from __future__ import annotations

from ..runtime.graph import PinnedGraph, ref
from .tasks import LayerStreamSpec, ResultSpec, run_segment, segment_state


def data_chunk(graph: PinnedGraph, c: int, start: int, w: str, weights: list | LayerStreamSpec, images, depth: int,
               segment: int, bias: float, ymax: float, results: ResultSpec | None,
               rows: tuple[int, int] | None = None) -> str:
    """Chunk ``c``'s tasks on worker ``w``: one per segment of ``segment`` layers; the last one's key.

    With ``rows`` (the chunk's first image and its size) the run keeps its final activations: the last task's
    :class:`~dasknn.engine.tasks.ChunkResult` holds them.
    """
    key = ""
    for first in range(1, depth + 1, segment):
        last = min(depth, first + segment - 1)
        final = last == depth
        args = (graph.run, weights, images, start, first, last, bias, ymax, final, results)
        if first > 1:
            # continue from the previous segment's (yt, ids)
            yt_key = graph.add(w, f"state-l{first - 1}-c{c}-yt", (segment_state, ref(key), 0))
            id_key = graph.add(w, f"state-l{first - 1}-c{c}-ids", (segment_state, ref(key), 1))
            args = (graph.run, weights, ref(yt_key), ref(id_key), first, last, bias, ymax, final, results)
        if final and rows is not None:
            args = (*args, rows)
        key = graph.add(w, f"spmm-l{first}-{last}-p0-c{c}", (run_segment, *args))
    return key
