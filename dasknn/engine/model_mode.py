"""Model mode's graph builder: one task per part, layer and chunk, exchanging boundary messages."""

from __future__ import annotations

from ..plan import Outline
from ..runtime.graph import PinnedGraph, ref
from .sizing import compaction_layer, sync_layers
from .tasks import ResultSpec, StepSpec, categories, first_messages, pick, step, step_rest


def model_chunk(graph: PinnedGraph, c: int, start: int, count: int, members: list[str], plan: Outline,
                part_of: dict[str, object], images: list, depth: int, sync_every: int, bias: float, ymax: float,
                results: ResultSpec | None, compact: bool, keep: bool = False, overlap: bool = False) -> str:
    """Chunk ``c``'s tasks (images ``start`` to ``start + count``) on the parts ``members``; the key of its
    ``categories-c{c}`` task (which, with ``keep``, returns the chunk's final activations as a third item).

    With ``overlap`` each layer but the last is two tasks per part: ``spmm-l{k}`` computes the outputs other parts
    read next and sends them, ``spmm-rest-l{k}`` the others while the messages travel, so no part waits for
    another's whole layer. Their alive masks then reach the others two layers on (``sync_layers``)."""
    # part_of: each worker's layers (a future of them, or a stream spec); images: each part's input rows (futures).
    # One task per part and layer (two with overlap): it computes the layer and packs what others need of it next.
    parts = len(members)
    syncs = set(sync_layers(depth, sync_every, overlap))
    with_block = keep or (results is not None and results.activations)
    previous: list[str | None] = [None] * parts
    # overlap: by the layer that compacts by them, a sync layer's second halves (their outputs are the masks)
    masks_due: dict[int, list[str]] = {}
    inbox: dict[int, list[tuple[int, str]]] = {q: [] for q in range(parts)}  # (sender, key) for the coming layer
    for p in range(parts):
        for r in plan.receivers(1, p):
            inbox[r].append((p, graph.add(members[p], f"send-l1-p{p}-to{r}-c{c}",
                                          (first_messages, part_of[members[p]], images[p], (r,), graph.run,
                                           compact))))
    for k in range(1, depth + 1):
        final, sync = k == depth, k in syncs
        split = overlap and not final
        masks_from = masks_due.get(k, [])
        coming: dict[int, list[tuple[int, str]]] = {q: [] for q in range(parts)}
        for p in range(parts):
            # after a sync layer every other part needs this part's mask, with or without rows (unless overlapped
            # steps send masks from their second halves)
            mask_to_all = sync and not overlap
            needs = set() if final else set(plan.receivers(k + 1, p)) | (set(range(parts)) - {p} if mask_to_all
                                                                          else set())
            recipients = tuple(sorted(needs))
            masked = tuple(key for q, key in enumerate(masks_from) if q != p)
            spec = StepSpec(k=k, run=graph.run, chunk=c, part=p, bias=bias, ymax=ymax, others=tuple(s for s, _ in inbox[p]),
                            recipients=recipients, sync=sync, final=final, with_block=with_block, compact=compact,
                            split=split, masked=len(masked))
            key = graph.add(members[p], f"spmm-l{k}-p{p}-c{c}", (
                step, part_of[members[p]], spec, images[p] if k == 1 else None,
                None if previous[p] is None else ref(previous[p]), *(ref(key) for _, key in inbox[p]),
                *(ref(key) for key in masked)))
            previous[p] = key
            if split:
                previous[p] = graph.add(members[p], f"spmm-rest-l{k}-p{p}-c{c}",
                                        (step_rest, part_of[members[p]], spec, ref(key)))
                if sync:
                    masks_due.setdefault(compaction_layer(k, overlap), []).append(previous[p])
            if len(recipients) == 1:
                coming[recipients[0]].append((p, key))
            else:
                for r in recipients:
                    coming[r].append((p, graph.add(members[p], f"send-l{k + 1}-p{p}-to{r}-c{c}",
                                                   (pick, ref(key), r))))
        inbox = coming
    finals = (plan.neurons, plan.last_outputs) if with_block else None
    return graph.add(members[0], f"categories-c{c}", (categories, start, count, results, finals, keep,
                                                      *(ref(key) for key in previous)))
