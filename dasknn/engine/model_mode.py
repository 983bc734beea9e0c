"""Model mode's graph builder: one task per part, layer and chunk, exchanging boundary messages."""

from __future__ import annotations

from ..plan import Outline
from ..runtime.exchange import Exchange, exchange_for
from ..runtime.graph import PinnedGraph, ref, refs_of
from .sizing import compaction_layer, sync_layers
from .tasks import ResultSpec, StepSpec, categories, first_messages, step, step_rest, step_segment


def model_chunk(graph: PinnedGraph, c: int, start: int, count: int, members: list[str], plan: Outline,
                weights: list, images: list, depth: int, sync_every: int, bias: float, ymax: float,
                results: ResultSpec | None, compact: bool, keep_activations: bool = False, overlap: bool = False,
                exchange: Exchange | None = None, segment: int = 1, compress: bool = False) -> str:
    """Chunk ``c``'s tasks (images ``start`` to ``start + count``) on the parts ``members``; the key of its
    ``categories-c{c}`` task (whose result holds, with ``keep_activations``, the chunk's final activations).

    The boundary messages go through ``exchange`` (:mod:`dasknn.runtime.exchange`; by default the task exchange
    between ``members``). Each part runs ``segment`` layers per task: one (``spmm-l{k}-p{q}-c{c}``) where the
    messages are task results, so that a layer's task takes what the others sent; several
    (``spmm-l{a}-{b}-p{q}-c{c}``) with a transport that delivers them itself, whose tasks exchange as they go.
    With ``overlap`` each layer but the last computes the outputs other parts read next first and sends them, then
    the others while the messages travel (``spmm-rest-l{k}`` tasks where a layer is a task), so no part waits for
    another's whole layer. Their alive masks then reach the others two layers on (``sync_layers``). With
    ``compress`` the masks carry each part's classes of equal columns, and the images equal on every part fold at
    the compactions (:class:`~dasknn.kernels.marks.SyncMarks`): the messages after carry one column of each."""
    # weights: each part's layers (a future of them, or a stream spec; two parts may share a worker after a lost
    # one); images: each part's input rows (futures)
    parts = len(members)
    exchange = exchange or exchange_for("tasks", members)
    if segment > 1 and exchange.carries_messages:
        raise ValueError(f"the {exchange.name} exchange carries messages as task results: one layer per task")
    syncs = set(sync_layers(depth, sync_every, overlap))
    with_block = keep_activations or (results is not None and results.activations)
    previous: list[str | None] = [None] * parts
    pending: list[list[StepSpec]] = [[] for _ in range(parts)]  # a segment's steps, by part, until its last layer
    # overlap: by the layer that compacts by them, each part's (sender, argument) of a sync layer's mask
    masks_due: dict[int, dict[int, list[tuple[int, object]]]] = {}
    inbox: dict[int, list[tuple[int, object]]] = {q: [] for q in range(parts)}  # (sender, argument), coming layer
    for p in range(parts):
        recipients = plan.receivers(1, p)
        if recipients:
            name = f"send-l1-p{p}-to{recipients[0]}-c{c}" if len(recipients) == 1 else f"send-l1-p{p}-c{c}"
            key = graph.add(members[p], name, (first_messages, weights[p], images[p], recipients,
                                               graph.run, compact, exchange, p, c))
            previous[p] = key  # (before the part's first step: a transport whose messages no task takes still sends)
            _deliver(inbox, p, recipients,
                     exchange.connect(graph, key, p, recipients, lambda r, p=p: f"send-l1-p{p}-to{r}-c{c}"))
    for k in range(1, depth + 1):
        final, sync = k == depth, k in syncs
        split = overlap and not final
        masks_from = masks_due.pop(k, {})
        coming: dict[int, list[tuple[int, object]]] = {q: [] for q in range(parts)}
        for p in range(parts):
            # after a sync layer every other part needs this part's mask, with or without rows (unless overlapped
            # steps send masks from their second halves)
            mask_to_all = sync and not overlap
            needs = set() if final else set(plan.receivers(k + 1, p)) | (set(range(parts)) - {p} if mask_to_all
                                                                          else set())
            recipients = tuple(sorted(needs))
            masked = masks_from.get(p, [])
            spec = StepSpec(k=k, run=graph.run, chunk=c, part=p, bias=bias, ymax=ymax,
                            senders=tuple(s for s, _ in inbox[p]), recipients=recipients, sync=sync, final=final,
                            with_block=with_block, compact=compact, split=split,
                            mask_senders=tuple(s for s, _ in masked), exchange=exchange, compress=compress)
            after = None if previous[p] is None else ref(previous[p])
            if segment == 1:
                key = previous[p] = graph.add(members[p], f"spmm-l{k}-p{p}-c{c}", (
                    step, weights[p], spec, images[p] if k == 1 else None, after, _args(inbox[p]),
                    _args(masked)))
                if split:
                    previous[p] = graph.add(members[p], f"spmm-rest-l{k}-p{p}-c{c}",
                                            (step_rest, weights[p], spec, ref(key)))
            else:
                pending[p].append(spec)
                if final or k % segment == 0:  # the segment's last layer: its task
                    first = pending[p][0].k
                    key = previous[p] = graph.add(members[p], f"spmm-l{first}-{k}-p{p}-c{c}", (
                        step_segment, weights[p], tuple(pending[p]), images[p] if first == 1 else None,
                        after))
                    pending[p] = []
                else:
                    key = ""  # (no task yet: the transport needs none to send)
            if split and sync:
                others = tuple(q for q in range(parts) if q != p)
                _deliver(masks_due.setdefault(compaction_layer(k, overlap), {q: [] for q in range(parts)}), p,
                         others, exchange.connect(graph, previous[p], p, others, str, personal=False))
            if recipients:
                _deliver(coming, p, recipients, exchange.connect(
                    graph, key, p, recipients, lambda r, k=k, p=p: f"send-l{k + 1}-p{p}-to{r}-c{c}"))
        inbox = coming
    finals = (plan.neurons, plan.last_outputs) if with_block else None
    return graph.add(members[0], f"categories-c{c}", (categories, start, count, results, finals, keep_activations,
                                                      *(ref(key) for key in previous)))


def _deliver(inbox: dict[int, list[tuple[int, object]]], sender: int, recipients: tuple[int, ...],
             args: dict[int, object]) -> None:
    # each recipient expects a message from ``sender``, with its argument for it (None where the transport
    # needs none)
    for r in recipients:
        inbox[r].append((sender, args.get(r)))


def _args(received: list[tuple[int, object]]):
    # the arguments a receiving task takes, in its senders' order
    return refs_of([arg for _, arg in received if arg is not None])
