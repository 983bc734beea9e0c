"""Worker-side task functions of inference. What a run keeps on a worker between its tasks (streams, held blocks,
reused space, tallies) is the run's object (:class:`~dasknn.engine.worker_run.InferenceRun`), found by its id."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from .. import kernels
from ..kernels.ends import run_layers_remembering
from ..kernels.folds import Folds
from ..kernels.marks import SyncMarks, column_classes, kept_columns
from ..plan import PartLayer, layer_counts, local_block, plan_layer, received_rows
from ..runtime.exchange import Exchange
from ..runtime.exchange.tasks import pick  # noqa: F401 - its old home (the task exchange's picks)
from ..runtime.heap import large_array_heap
from .sizing import compaction_layer
from .exchange_plan import held_plan, take_blocks
from .inputs import load_images  # noqa: F401 - its old import path (engine.tasks.load_images)
from .worker_run import (  # (the stream specs' old home was here: importers of them from here still work)
    Block,
    InferenceRun,
    LayerStreamSpec,
    PartState,
    PartStreamSpec,
    SplitStep,
    StreamSpec,  # noqa: F401 - with the stream specs: their old import path
    inference_run,
)
from ..store import open_store, read_plan_owners, write_chunk_result, write_plan_layer



@dataclass(frozen=True)
class ResultSpec:
    """Where a chunk's worker writes its categories (and, with ``activations``, its last activations)."""

    path: str
    chunk: int
    activations: bool


@dataclass(frozen=True)
class ChunkResult:
    """What a chunk's last task returns: the original indices of its images that survived every layer, how many
    were alive after each round of alive masks (model mode; the plan's bytes are counted by them), and, where the
    run keeps them, its final activations as dense rows (images x neurons, the dead images' rows zero).

    Every mode adds, one entry a layer, the columns each layer computed and the images alive after it (each
    column counted with the images folded into it): ``layer_columns``, ``layer_alive``. In data and pipeline mode
    the columns are the distinct vectors the loop's looks found (:mod:`dasknn.kernels.folds`); in model mode those
    the parts' steps ran over, the images alive and distinct as of the last compaction (the sync layers' marks)."""

    ids: np.ndarray
    alive: tuple[int, ...] = ()
    activations: np.ndarray | None = None
    layer_columns: np.ndarray | None = None
    layer_alive: np.ndarray | None = None


def without_activations(result: ChunkResult) -> ChunkResult:
    """A chunk's result as the client gathers it: its final activations stay on the worker."""
    return dataclasses.replace(result, activations=None)


def activations_of(result: ChunkResult) -> np.ndarray:
    """A chunk's final activations (the dask.array chunk the run keeps on the worker)."""
    return result.activations


@dataclass(frozen=True)
class StepCount:
    """What one model-mode step of a part computed, for the run's per-layer counts: the kernel ran over
    ``columns`` images, those left by the chunk's first ``rounds`` rounds of sync marks (:func:`categories`
    replays them to know which images they are); ``alive``: which of them the part's rows hold nonzero after the
    layer, as :func:`numpy.packbits` of the mask (None until the step has run)."""

    columns: int
    rounds: int
    alive: np.ndarray | None = None


@dataclass(frozen=True)
class PartEnd:
    """What a part's last step returns to its chunk's :func:`categories`: its marks of every sync layer, its last
    block (None unless the step spec's ``with_block``), and its steps' counts, one a layer."""

    masks: list
    block: object
    counts: tuple[StepCount, ...]


@dataclass(frozen=True)
class MessageTag:
    """What a model-mode message is for: chunk ``chunk``'s layer ``layer`` (the rows a part reads there, and after
    a sync layer the sender's alive mask), or, with ``masks``, only a sync layer's mask that an overlapped step's
    second half sends, for the layer that compacts by it."""

    layer: int
    chunk: int
    masks: bool = False


@dataclass(frozen=True)
class StepSpec:
    """What one model-mode step knows before it runs: part ``part``'s layer ``k`` of chunk ``chunk`` in run ``run``
    (whose object on the worker holds the part's block between its steps).

    ``senders`` are the parts whose messages for layer ``k`` it receives, in order, through ``exchange``;
    ``mask_senders`` those whose alive masks alone it receives (overlapped steps get the masks of a sync layer two
    layers on, from the other parts' :func:`step_rest`); ``recipients`` the parts it sends to for layer ``k + 1``;
    ``sync`` says whether the parts exchange alive masks after it (with ``compress``, each column's class of equal
    columns beside them, so that the images equal on every part fold); ``final`` whether it is the last layer, when it
    returns its block too if ``with_block``; ``compact`` picks the messages' form. With ``split`` the step computes
    only the outputs the recipients wait for and sends them; :func:`step_rest` computes the others after.
    """

    k: int
    run: str
    chunk: int
    part: int
    bias: float
    ymax: float
    senders: tuple[int, ...]
    recipients: tuple[int, ...]
    sync: bool
    final: bool
    with_block: bool
    compact: bool
    exchange: Exchange
    split: bool = False
    mask_senders: tuple[int, ...] = ()
    #: fold images equal on every part at the sync layers (each part's mask then carries its columns' classes,
    #: :class:`~dasknn.kernels.marks.SyncMarks`)
    compress: bool = False


def load_all_layers(path: str, dtype: str, backend: str) -> list[Block]:
    # data mode: the whole network, read by the worker straight from the store
    store = open_store(path, check="metadata")
    return kernels.held_layers(((w.indptr, w.indices, w.data) for w in store.iter_layers()),
                               int(store.layer_entries().sum()), dtype, backend)


def load_part_layers(path: str, part: list[PartLayer] | tuple[str, int, int], first_rows: int, dtype: str,
                     backend: str) -> list[tuple[PartLayer, Block]]:
    # model mode: only this part's columns of each layer, indexed into the rows it reads (its previous block,
    # then the received rows), kept beside the part's plan so the per-layer tasks carry no arrays of their own.
    # part: its plan, or (run, group, part): where this worker's run keeps the plan it made
    # (exchange_plan.plan_part) with the part's blocks, made from the layers it read then; read from the store
    # only when they are not kept
    blocks = None
    if not isinstance(part, list):
        run, group, q = part
        part, kept = held_plan(run, group, q), take_blocks(run, group, q)
        blocks = None if kept is None else _drain(kept)
    if blocks is None:
        store = open_store(path, check="metadata")
        rows = [first_rows] + [pl.outputs.size for pl in part[:-1]]
        blocks = (local_block(store.layer(k), pl, n) for k, (pl, n) in enumerate(zip(part, rows), start=1))
    return [(pl, tuple(kernels.to_device(a, backend) for a in (block[0], block[1], block[2].astype(dtype))))
            for pl, block in zip(part, blocks)]


def _drain(blocks: list[Block]):
    # the blocks in order, each let go as it is taken: a kept block leaves memory once its copy is made
    for i in range(len(blocks)):
        block, blocks[i] = blocks[i], None
        yield block


def close_streams(run: str) -> None:
    """Close run ``run``'s object in this process (its streams, held blocks, plans, space): the old name of
    :func:`dasknn.runtime.worker_runs.close_run`, for callers that call it directly."""
    from ..runtime.worker_runs import close_run

    close_run(run)


@large_array_heap()  # a layer's blocks are arrays of megabytes, made and dropped per layer
def write_part_plan_layer(path: str, plan_path: str, k: int, parts: int) -> np.ndarray:
    # one layer of a part plan: every part's lists and its block, indexed into the rows it will read
    w = open_store(path, check="lazy").layer(k)  # the client has checked the store's metadata
    before, after = read_plan_owners(plan_path, k - 1, k + 1)
    row = plan_layer(w, before, after, parts)
    blocks = []
    for q, pl in enumerate(row):
        own = int(np.count_nonzero(before == q))  # the rows of the part's previous block
        indptr, indices, data = local_block(w, pl, own)
        blocks.append(sp.csc_matrix((data, indices, indptr), shape=(own + received_rows(pl), pl.outputs.size)))
    write_plan_layer(plan_path, k, row, blocks)
    return layer_counts(row)


def run_segment(run: str, weights: list[Block] | LayerStreamSpec, yt: np.ndarray, ids: np.ndarray | int, first: int,
                last: int, bias: float, ymax: float, final: bool, results: ResultSpec | None = None,
                rows: tuple[int, int] | None = None, folds: Folds | None = None):
    # weights: resident blocks, or the spec of a stream (of run ``run``) that reads the layers as they are needed
    # ids: the images' original indices, or (first segment) the chunk's first index
    # rows: the chunk's (first index, images) where the run keeps its final activations (as dense rows)
    # folds: the chunk's record of images folded into equal ones (and its layers' counts), carried segment to
    # segment; None: neither folded nor counted
    # the last segment returns a ChunkResult, the others (yt, ids, folds) for the next
    ids = np.arange(ids, ids + yt.shape[1]) if isinstance(ids, int) else ids
    if isinstance(weights, list):
        layers = weights[first - 1:last]
    else:
        layers = inference_run(run).stream(weights).layers(first, last)
        # activations on a device: the streamed layers' device copies that fit are kept for the next chunks
        layers = kernels.backend_of(yt).keep_on_device(weights, first, layers)
    if folds is None:
        yt, ids = kernels.run_layers(yt, layers, bias, ymax, ids)
    elif folds.enabled:  # (vectors other chunks here converged to take the ends those found)
        yt, ids, folds = run_layers_remembering(inference_run(run).ends, yt, layers, first, last, bias, ymax, ids,
                                                folds)
    else:
        yt, ids, folds = kernels.run_layers(yt, layers, bias, ymax, ids, folds=folds)
    if not final:
        return yt, ids, folds
    if rows is None and (results is None or not results.activations):
        # the categories need only the images alive: their representatives' columns are not copied out for them
        ids = ids if folds is None or not folds.merged.size else folds.expand(ids)[0]
    else:
        yt, ids = expanded(yt, ids, folds)
    if results is not None:
        # written by the worker: a stopped run resumes from here
        write_chunk_result(results.path, results.chunk, ids, _rows_of(yt) if results.activations else None)
    return ChunkResult(ids, (), None if rows is None else dense_rows(yt, ids, *rows),
                       None if folds is None else folds.columns, None if folds is None else folds.alive)


def expanded(yt, ids: np.ndarray, folds: Folds | None):
    """A chunk's final activations and images with its folded images back: each reads its representative's
    column (:meth:`~dasknn.kernels.folds.Folds.expand`); as they are where nothing was folded."""
    if folds is None or not folds.merged.size:
        return yt, ids
    images, columns = folds.expand(ids)
    xp = kernels.array_module(yt)
    return xp.take(yt, xp.asarray(columns), axis=1), images


def dense_rows(yt, ids: np.ndarray, start: int, count: int) -> np.ndarray:
    """A chunk's final activations as dense NumPy rows (``count`` images x neurons), its dead images all zero;
    ``yt`` holds the live images ``ids`` (neurons x images, maybe on a GPU)."""
    out = np.zeros((count, yt.shape[0]), dtype=yt.dtype)
    out[ids - start] = kernels.to_host(yt).T
    return out


def _rows_of(yt):
    # final activations (neurons x images, dense, maybe on a GPU) as sparse rows, one per image
    return sp.csr_matrix(kernels.to_host(yt).T)


def segment_state(state, part: int):
    return state[part]


def _dropped(masks: list | None) -> np.ndarray | None:
    # the columns kept when some images died (or folded) since the last compaction; None when none did (nothing
    # to copy)
    if not masks:
        return None
    survivors = kept_columns(masks)[0]
    return None if survivors.all() else survivors


def step(part: list[tuple[PartLayer, Block]] | PartStreamSpec, spec: StepSpec, images, after, inbox: list,
         masked: list) -> object:
    """Part ``spec.part``'s layer ``spec.k`` of one chunk, and what it sends for layer ``spec.k + 1``.

    The block comes from ``images`` (layer 1) or from what this worker's run holds (``after``, this part's
    previous step, orders the tasks). The exchange gives the messages of parts ``spec.senders`` for this layer
    (``inbox`` are the task's arguments for them, where the exchange needs some), each ``(alive mask or None,
    rows)``: their rows this part reads, and, after a sync layer, their masks (or, from ``spec.mask_senders``
    through ``masked``, the masks alone). Returns what the exchange makes of the messages it sends for layer
    ``spec.k + 1`` (the task exchange: ``(mask or None, {recipient: message})``), or, after the last layer, a
    :class:`PartEnd`. With ``spec.split`` it computes only the outputs the messages carry, and holds its
    inputs for :func:`step_rest`.
    """
    k, run = spec.k, inference_run(spec.run)
    block, masks, counts = (images, [], []) if k == 1 else _held_block(run, spec, k - 1)
    pl, (indptr, indices, data) = run.part_layer(part, k)
    messages = spec.exchange.collect(run.endpoint, MessageTag(k, spec.chunk), spec.part, spec.senders, inbox)
    carriers = messages if not spec.mask_senders else spec.exchange.collect(
        run.endpoint, MessageTag(k, spec.chunk, masks=True), spec.part, spec.mask_senders, masked)
    survivors = None
    rounds = counts[-1].rounds if counts else 0
    if k > 1 and carriers and carriers[0][0] is not None:
        # a sync layer's masks arrived: every part compacts by the union of all parts' masks
        survivors = _dropped([masks[-1]] + [mask for mask, _ in carriers])
        rounds = len(masks)
    if survivors is not None:
        block = kernels.keep_columns(block, survivors)  # over the held block itself: nothing else reads it
    counts.append(StepCount(block.shape[1], rounds))  # (its alive mask once the layer has run: _stepped)
    recv = _received(run, spec, pl, block, survivors, messages)
    if not spec.split:
        out = run.space(spec.chunk, spec.part, "block", block, (indptr.size - 1, block.shape[1]), 2)
        block = kernels.layer_step(block, indptr, indices, data, spec.bias, spec.ymax, extra=recv, out=out)
        return _stepped(run, part, spec, block, masks, counts)
    sent = _sent_rows(run, part, k + 1)
    out = run.space(spec.chunk, spec.part, "block", block, (indptr.size - 1, block.shape[1]), 2)
    # packed once for both halves, in place of the block and rows, into the space of the part's previous layer
    spaces = run.reused(spec.chunk, spec.part, "tiles")
    tiles = kernels.tile_inputs(block, recv, spaces.pop() if spaces else None)
    spaces.append(tiles.base if tiles.base is not None else tiles)
    kernels.layer_step_tiles(tiles, block.shape[1], indptr, indices, data, spec.bias, spec.ymax, sent, out)
    rest = np.setdiff1d(np.arange(indptr.size - 1), sent, assume_unique=True)
    # what step_rest needs: the inputs, the columns, the layer's block (a stream has moved on to layer k + 1)
    run.hold(spec.chunk, spec.part, PartState(k, out, masks, SplitStep(tiles, rest, (indptr, indices, data)),
                                              counts))
    return _post(run, spec, MessageTag(k + 1, spec.chunk), _pack(run, part, k + 1, out, spec.recipients,
                                                                  spec.compact))


def step_rest(part: list[tuple[PartLayer, Block]] | PartStreamSpec, spec: StepSpec, front: object) -> object:
    """The outputs of part ``spec.part``'s layer ``spec.k`` that its :func:`step` (``front``, which orders the
    tasks) left for later: computed while the messages that step sent travel. After a sync layer it sends the
    part's alive mask to every other part, which compact by it two layers on
    (:func:`~dasknn.engine.sizing.compaction_layer`)."""
    run = inference_run(spec.run)
    state = run.take(spec.chunk, spec.part, spec.k, split=True)
    split, out = state.split, state.block
    kernels.layer_step_tiles(split.tiles, out.shape[1], *split.layer, spec.bias, spec.ymax, split.rest, out)
    return _stepped(run, part, spec, out, state.masks, state.counts, send=False)


def step_segment(part: list[tuple[PartLayer, Block]] | PartStreamSpec, specs: tuple[StepSpec, ...], images,
                 after) -> object:
    """Part ``specs[0].part``'s layers ``specs[0].k`` to ``specs[-1].k`` of one chunk in one task (a transport that
    delivers the messages itself: each layer sends and receives as it goes, :func:`step` by :func:`step`). Returns
    what the last layer's step returns."""
    out = None
    for spec in specs:
        out = step(part, spec, images if spec.k == 1 else None, None, [], [])
        if spec.split:
            out = step_rest(part, spec, out)
    return out


def _stepped(run: InferenceRun, part, spec: StepSpec, block, masks: list, counts: list, send: bool = True) -> object:
    # after a layer: the mask of a sync layer, the layer's count, the block held for the next step (or returned by
    # the last), and the messages for the next layer (send), or (an overlapped step's second half) the mask alone
    alive = kernels.alive(block)  # (every layer, for its count: a pass over the block, ~1/64 of the layer's work)
    if spec.sync:
        masks = masks + [SyncMarks(alive, column_classes(block)) if spec.compress else alive]
    counts[-1] = dataclasses.replace(counts[-1], alive=np.packbits(alive))
    if spec.final:
        return PartEnd(masks, block if spec.with_block else None, tuple(counts))
    run.hold(spec.chunk, spec.part, PartState(spec.k, block, masks, counts=counts))
    mask = masks[-1] if spec.sync else None
    if send:
        return _post(run, spec, MessageTag(spec.k + 1, spec.chunk),
                     _pack(run, part, spec.k + 1, block, spec.recipients, spec.compact), mask)
    if mask is None:
        return None, {}  # (orders the part's next step: nothing to send)
    others = tuple(q for q in range(len(spec.exchange.workers)) if q != spec.part)
    return spec.exchange.post(run.endpoint, MessageTag(compaction_layer(spec.k, True), spec.chunk, masks=True),
                              spec.part, others, {}, mask)


def _post(run: InferenceRun, spec: StepSpec, tag: MessageTag, messages: dict[int, object], mask=None) -> object:
    # the step's messages (and mask) to its recipients, through the run's exchange
    return spec.exchange.post(run.endpoint, tag, spec.part, spec.recipients, messages, mask)


def _sent_rows(run: InferenceRun, part, k: int) -> np.ndarray:
    # the rows of the part's block (its outputs of layer k - 1) that any other part reads in layer k, ascending
    send = run.part_layer(part, k)[0].send
    return np.unique(np.concatenate(list(send.values()))) if send else np.empty(0, dtype=np.int64)


def _held_block(run: InferenceRun, spec: StepSpec, k: int) -> tuple:
    # the part's block, masks and counts after its layer k, held by this worker's run since its previous step
    state = run.take(spec.chunk, spec.part, k)
    return state.block, state.masks, state.counts


def _received(run: InferenceRun, spec: StepSpec, pl: PartLayer, block, survivors: np.ndarray | None, inbox: tuple):
    # the received rows, stacked by sender, are read in place beside the block: nothing else is copied
    # (messages sent before a sync layer's masks were known hold every image: unpacked whole, then the live
    # images kept in the same space)
    recv = run.space(spec.chunk, spec.part, "received", block,
                     (received_rows(pl), block.shape[1] if survivors is None else survivors.size), 1)
    at = 0
    for p, (_, rows) in zip(spec.senders, inbox):
        if p not in pl.recv:
            continue
        n = pl.recv[p].size
        kernels.unpack_rows(rows, recv[at:at + n])
        at += n
    return recv if survivors is None else kernels.keep_columns(recv, survivors)


def _pack(run: InferenceRun, part, k: int, block, recipients: tuple[int, ...], compact: bool) -> dict[int, tuple]:
    # the messages for layer k: the rows of the part's block (its activations after layer k - 1) each recipient
    # reads, in their smallest form
    out = {}
    if not recipients:
        return out
    send = run.part_layer(part, k)[0].send
    for r in recipients:
        if r in send:
            out[r] = kernels.pack_rows(block, send[r], None, compact)
            run.tally(k, send[r].size * block.shape[1] * block.dtype.itemsize, kernels.message_bytes(out[r]))
    return out


def first_messages(part: list[tuple[PartLayer, Block]] | PartStreamSpec, images, recipients: tuple[int, ...], run: str,
                   compact: bool, exchange: Exchange, sender: int, chunk: int) -> object:
    # what the part's input pixels send for layer 1 (as a step's messages, without a mask)
    kept = inference_run(run)
    return exchange.post(kept.endpoint, MessageTag(1, chunk), sender, recipients,
                         _pack(kept, part, 1, images, recipients, compact))


def categories(start: int, count: int, results: ResultSpec | None, finals: tuple | None, keep_activations: bool,
               *outs: PartEnd) -> ChunkResult:
    # outs: each part's last step; replaying the compactions round by round gives the surviving images' indices,
    # and which images each layer's columns were. With keep_activations, the chunk's final activations (dense
    # rows) come back too
    ids = np.arange(start, start + count)
    alive = []
    folds = Folds()
    columns_after = [(ids, folds.weights(ids))]  # after each round: the columns' images, the images each stands for
    rounds = list(zip(*(out.masks for out in outs)))
    for masks in rounds:
        keep, folded, into = kept_columns(list(masks))
        folds = folds.folded(ids[folded], ids[into])
        ids = ids[keep]
        alive.append(int(ids.size))
        columns_after.append((ids, folds.weights(ids)))
    layer_columns, layer_alive = _layer_counts(outs, columns_after)
    yt = _final_block(finals, rounds[-1], [out.block for out in outs]) if finals is not None else None
    if folds.merged.size:  # every image of the chunk back, those folded reading their representative's column
        images, columns = folds.expand(ids)
        yt = None if yt is None else yt[:, columns]
        ids = images
    if results is not None:
        write_chunk_result(results.path, results.chunk, ids, _rows_of(yt) if results.activations else None)
    return ChunkResult(ids, tuple(alive), dense_rows(yt, ids, start, count) if keep_activations else None,
                       layer_columns, layer_alive)


def _layer_counts(outs: tuple[PartEnd, ...], columns_after: list[tuple[np.ndarray, np.ndarray]]
                  ) -> tuple[np.ndarray, np.ndarray]:
    # one entry a layer: the columns the parts' steps ran over (the same on every part: they compact together),
    # and the images alive after it: a column alive on any part's rows, counted with the images folded into it
    columns, alive = [], []
    for steps in zip(*(out.counts for out in outs)):
        n = steps[0].columns
        ids, weights = columns_after[steps[0].rounds]
        if ids.size != n or any(s.columns != n or s.rounds != steps[0].rounds for s in steps):
            raise RuntimeError(f"model mode's per-layer counts disagree: {n} columns after {steps[0].rounds} "
                               f"rounds of marks, which leave {ids.size}")
        live = np.zeros(n, dtype=bool)
        for s in steps:
            live |= np.unpackbits(s.alive, count=n).astype(bool)
        columns.append(n)
        alive.append(int(weights[live].sum()))
    return np.array(columns, dtype=np.int64), np.array(alive, dtype=np.int64)


def _final_block(finals: tuple, masks: tuple, blocks: list) -> np.ndarray:
    # finals: (neurons, each part's output neurons); the last round's masks say which of the blocks' images survive
    neurons, outputs = finals
    survivors = kept_columns(list(masks))[0]
    yt = np.zeros((neurons, int(survivors.sum())), dtype=kernels.to_host(blocks[0]).dtype)
    for out, block in zip(outputs, blocks):
        yt[out] = kernels.to_host(block)[:, survivors]
    return yt
