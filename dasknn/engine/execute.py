"""Execution passes: load weights and inputs, run the chunks' graph, measure what crossed."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from .. import timings
from ..errors import DasknnError
from ..kernels.warm import WarmSpec
from ..locations import join, location, writable
from ..plan import Outline
from ..runtime.exchange import exchange_for
from ..runtime.exchange.choice import choose_exchange
from ..runtime.graph import PinnedGraph, ref
from ..runtime.metrics import bytes_sent
from ..runtime.recovery import Recovery, WorkersLost, gather_watched, memory_of, watch
from ..runtime.worker_runs import close_run, run_figures
from ..stages import place_stages, stage_cuts, stages_fit
from ..store import create_plan_store, finish_plan_store, open_plan_store, plan_digest, resume_plan_store
from .data_mode import data_chunk
from .exchange_plan import plan_on_workers
from .inputs import InputSource, load_images
from .model_mode import model_chunk
from .pipeline_mode import Stage, keep_stage_places, pipeline_chunk, stage_weights
from .owners import partition_owners
from .places import HeldParts, Slot
from .sizing import compaction_layer, sync_layers
from .warm import add_warm_tasks, longest
from .tasks import (
    ChunkResult,
    ResultSpec,
    activations_of,
    load_all_layers,
    load_part_layers,
    without_activations,
    write_part_plan_layer,
)
from .worker_run import LayerStreamSpec, PartStreamSpec


@dataclass
class Job:
    """What every pass of one inference shares."""

    path: str
    source: InputSource
    store: object
    dtype: str
    backend: str
    resident: bool
    keep_layers: int
    segment: int | None
    sync_every: int
    compact: bool
    results: str | None
    activations: bool
    bounds: list[tuple[int, int]]
    partition: object
    progress: Callable[[int, int], None] | None
    plan_store: str | None = None
    #: compute a partition not stored yet on a worker of the cluster, not on the client (where a worker has the
    #: memory: :func:`~dasknn.engine.sizing.partition_fits_worker`)
    partition_on_cluster: bool = False
    #: the name of the dask.array of final activations each chunk keeps on its worker (futures in
    #: :attr:`Pass.kept`), or None where the run does not keep them
    activations_name: str | None = None
    #: model mode: each layer's outputs that other parts read computed and sent first, the rest while they travel
    #: (:func:`~dasknn.engine.model_mode.model_chunk`)
    overlap: bool = False
    #: model and hybrid modes: the transport of the boundary messages (:mod:`dasknn.runtime.exchange`)
    exchange: str = "tasks"
    #: images whose activations become equal computed once, in every mode (:mod:`dasknn.kernels.folds`)
    compress: bool = True
    #: the chunks a resumed run read back from its results store (not run again)
    done: set[int] = field(default_factory=set)
    #: model and hybrid modes: the partition by parts per group, once resolved (a pass after a lost worker, with
    #: as many parts, reuses it)
    owners: dict[int, np.ndarray] = field(default_factory=dict)
    #: pipeline mode: each layer's work (its entries x the share of images alive when it runs), by which each
    #: pass cuts the layers into as many stages as its groups have workers; None in the other modes
    stage_work: np.ndarray | None = None
    #: pipeline mode: the entries a stage may hold per byte of its worker's memory limit
    #: (:func:`~dasknn.stages.stage_capacity` of one byte)
    stage_entries_per_byte: float | None = None
    #: streamed, a worker running several chunks: the bytes its stream keeps of what it fetched
    #: (:func:`~.sizing.stream_hold_bytes`), so that it fetches each layer (its stage's, its part's) once
    hold_bytes: int = 0
    #: pipeline mode, resident: each worker's stage and the future of its layers, kept from one pass to the next,
    #: so that a pass after a lost worker loads only the stages whose workers are new
    held_stages: dict[str, tuple[Stage, object]] = field(default_factory=dict)
    #: model and hybrid modes: each part's worker and (resident) the future of its layers, kept from one pass to the
    #: next, so that a pass after a lost worker plans and loads only the parts whose workers are new
    held_parts: HeldParts = field(default_factory=HeldParts)
    #: data mode, resident: each worker's future of the whole network, kept from one pass to the next, so that a
    #: pass after a lost worker loads it only on the workers that are new
    held_networks: dict[str, object] = field(default_factory=dict)

    def held_keys(self) -> set[str]:
        """The keys of the layers kept for the next pass (stages, parts, networks)."""
        held = [f for _, f in self.held_stages.values()] + list(self.held_parts.layers.values())
        return {f.key for f in held + list(self.held_networks.values())}

    def release_held(self) -> None:
        """Let go of the layers kept for the next pass: they leave the workers with the run."""
        for f in [f for _, f in self.held_stages.values()] + list(self.held_parts.layers.values()):
            f.release()
        for f in self.held_networks.values():
            f.release()
        self.held_stages.clear()
        self.held_parts = HeldParts()
        self.held_networks.clear()


@dataclass
class LayerBytes:
    """Bytes of the boundary messages, per layer (index k - 1): as dense rows, as built (both measured on the
    workers as they were packed), and what crossed to other workers (as the exchange counted it)."""

    dense: np.ndarray
    sent: np.ndarray
    crossed: np.ndarray

    @classmethod
    def zeros(cls, depth: int) -> LayerBytes:
        return cls(*(np.zeros(depth, dtype=np.int64) for _ in range(3)))

    def __add__(self, other: LayerBytes) -> LayerBytes:
        return LayerBytes(self.dense + other.dense, self.sent + other.sent, self.crossed + other.crossed)


@dataclass
class Pass:
    """One pass over some chunks on one set of workers."""

    chunks: dict[int, ChunkResult] = field(default_factory=dict)
    plan: Outline | None = None
    group_size: int = 1
    partition_seconds: float = 0.0  # computing the partition (0 when one was given or stored)
    plan_seconds: float = 0.0  # making the exchange plan (resident) or a part plan (out of core, once per partition)
    load_seconds: float = 0.0  # the load phase, warm-up included
    compile_seconds: float = 0.0  # the longest warm-up of the kernels among the workers (in the load phase)
    seconds: float = 0.0
    tasks: int = 0
    bytes_sent: int = 0
    bytes_read: int = 0
    plan_bytes: int = 0
    layer_bytes: LayerBytes | None = None
    #: what crossed between parts, by (sender, receiver), as the exchange counted it (the groups' together)
    pairs: dict[tuple[int, int], int] = field(default_factory=dict)
    #: model mode: the transport the messages took (``job.exchange``, or the cost model's choice for ``"auto"``)
    exchange: str = ""
    kept: dict[int, object] = field(default_factory=dict)  # chunk -> future of its final activations (dense rows)
    stages: list[Stage] = field(default_factory=list)  # pipeline mode: each stage's layers
    #: pipeline mode, resident: the stages this pass loaded, and those it found still held from the pass before
    stages_loaded: int = 0
    stages_kept: int = 0
    #: model and hybrid modes, resident: the parts this pass planned and loaded, and those it found still held by
    #: their workers from the pass before
    parts_loaded: int = 0
    parts_kept: int = 0
    #: data mode, resident: the workers that loaded the network in this pass, and those that still held it
    networks_loaded: int = 0
    networks_kept: int = 0


@dataclass
class _Layout:
    """Where one pass puts things: its groups of workers, each chunk's group, and each worker's layers."""

    run: str
    groups: list[list[str]]
    #: model mode, resident: where each part's worker keeps the part's plan (made by that worker), by (group, part)
    plans: dict[Slot, tuple[str, int, int]] = field(default_factory=dict)
    outline: Outline | None = None  # model mode: the exchange lists' sizes (from the plan or the part plan)
    exchange: str = "tasks"  # model mode: the transport of the boundary messages, chosen once the outline is known
    #: data and pipeline modes: worker -> its layers, a future of them in memory (or the spec of a stream)
    part_of: dict[str, object] = field(default_factory=dict)
    #: model mode: (group, part) -> the part's layers, a future of them in memory or the spec of a stream (after a
    #: lost worker, a worker may hold two parts)
    parts: dict[Slot, object] = field(default_factory=dict)
    #: pipeline mode: the stages, the ``s``-th held by the ``s``-th worker of each group
    stages: list[Stage] = field(default_factory=list)

    def members(self, i: int) -> list[str]:
        """The workers of the ``i``-th chunk to run: chunks go round the groups."""
        return self.groups[i % len(self.groups)]

    def places(self) -> dict[Slot, str]:
        """Model mode: each part's worker, by (group, part)."""
        return {(gi, q): w for gi, members in enumerate(self.groups) for q, w in enumerate(members)}

    def weights_of(self, i: int) -> list:
        """Model mode: the layers of each part of the ``i``-th chunk's group."""
        gi = i % len(self.groups)
        return [self.parts[(gi, q)] for q in range(len(self.groups[gi]))]

    def warm_spec(self, job: Job) -> WarmSpec:
        """The kernels this pass calls and on what: data mode's loop, or model mode's steps."""
        steps = self.outline is not None
        return WarmSpec(dtype=job.dtype, backend=job.backend, loop=not steps, steps=steps, compact=job.compact,
                        overlap=job.overlap)

    def solo(self, i: int) -> str:
        """Data mode: the one worker of its group that runs the ``i``-th chunk (pipeline mode: its first stage's)."""
        members = self.members(i)
        if self.stages:
            return members[0]
        return members[(i // len(self.groups)) % len(members)]

    def stage_of(self, w: str) -> Stage:
        """Pipeline mode: the stage worker ``w`` holds."""
        for members in self.groups:
            if w in members:
                return self.stages[members.index(w)]
        raise KeyError(w)


def execute(client, job: Job, workers: list[str], g: int, todo: list[int], out: Pass,
            recovery: Recovery | None = None, places: dict[Slot, str] | None = None) -> None:
    """Partition, plan, load and run chunks ``todo`` on ``workers`` in groups of ``g``, filling ``out`` as it goes.

    ``places`` (model and hybrid modes, after a lost worker: :func:`~dasknn.engine.places.keep_places`) puts each
    part of each group on its worker instead, the parts the workers still hold kept (not planned or loaded again).

    A lost worker ends the pass with its error as it comes (:class:`WorkersLost` while waiting for tasks, or what
    a scatter or a gather raised); the chunks that finished are in ``out`` by then. ``recovery`` (the workflow's
    policy, which decides what a loss costs) is told each phase as it starts."""
    enter = recovery.enter if recovery is not None else _unnamed
    layout = _Layout(run=uuid.uuid4().hex[:8], groups=[workers[i:i + g] for i in range(0, len(workers), g)])
    out.group_size, out.layer_bytes = g, LayerBytes.zeros(job.store.depth)
    if places is not None:
        layout.groups = [[places[(gi, q)] for q in range(g)] for gi in range(len(places) // g)]
    if job.stage_work is not None and not job.resident:
        # pipeline mode, streamed: a stage holds a few layers however long it is, so the cut is by work alone
        layout.stages = out.stages = stage_cuts(job.stage_work, g)
    elif job.stage_work is not None:
        # pipeline mode: the layers cut again for the workers of this pass (fewer after a loss), each stage within
        # the memory of the workers placed at it
        entries = job.store.layer_entries()
        memory = memory_of(client, workers)
        placed = place_stages(job.stage_work, entries, layout.groups, memory, job.stage_entries_per_byte)
        layout.stages = out.stages = placed.stages
        held = {w: stage for w, (stage, _) in job.held_stages.items()}
        kept = keep_stage_places(placed.groups, layout.stages, held)
        # the workers left keep their stages' layers, unless that puts a stage on a worker too small for it
        fits = stages_fit(kept, layout.stages, entries, memory, job.stage_entries_per_byte)
        layout.groups = kept if fits else placed.groups
    try:
        if g > 1 and not layout.stages:
            _partition(client, job, workers, layout, out, enter)
        # phase 1, untimed: weights and inputs into the workers' memory
        enter("load")
        loaded, images = _load(client, job, workers, layout, todo, out)
        # phase 2, timed: the inference graph, referring to the loaded blocks by their futures
        enter("inference")
        _run(client, job, workers, layout, todo, loaded, images, out)
    finally:
        # however the pass ended, the run's blocks, plans and streamed layers leave the workers still there
        client.run(close_run, layout.run, on_error="ignore")
    if layout.outline is not None:
        out.plan_bytes = _plan_bytes(job, layout.outline, out)


def _unnamed(phase: str) -> None:
    # the phases of a pass run without a recovery policy: nobody to tell
    return None


def _partition(client, job: Job, workers: list[str], layout: _Layout, out: Pass, enter: Callable[[str], None]
               ) -> None:
    # model and hybrid modes: the plan, and each part's layers held in memory or streamed from a part plan
    parts = len(layout.groups[0])
    enter("partition")
    if parts not in job.owners:
        # (kept for the next pass: a store that cannot keep the partition would have it computed again)
        job.owners[parts], out.partition_seconds = partition_owners(
            job.path, job.partition, parts, client=client if job.partition_on_cluster else None)
    owners = job.owners[parts]
    enter("plan")
    if job.resident:
        # each part's worker makes its part's plan from the layers it reads: the client reads none of them; a part
        # whose worker still holds its layers from the pass before (a lost worker's pass) is not planned again
        t0 = time.perf_counter()
        held = job.held_parts
        todo = {slot: w for slot, w in layout.places().items() if held.layers_on(slot, w, parts) is None}
        layout.plans, made = plan_on_workers(client, job.path, owners, todo, parts, layout.run) if todo else ({}, None)
        layout.outline = made if made is not None else held.outline
        out.plan_seconds = time.perf_counter() - t0
    else:
        # out of core: each part streams its own columns from a part plan, made once per partition
        t0 = time.perf_counter()
        plan_path, layout.outline = _part_plan(client, job, owners, workers, layout.run)
        out.plan_seconds = time.perf_counter() - t0
        layout.parts = {(gi, q): PartStreamSpec(plan_path, q, job.dtype, job.keep_layers, job.hold_bytes)
                        for gi, q in layout.places()}
    layout.exchange = out.exchange = _transport(job, layout, len(workers))
    exchange_for(layout.exchange, layout.groups[0]).prepare(client)  # (what the transport needs on the workers)
    out.plan = layout.outline


def _transport(job: Job, layout: _Layout, workers: int) -> str:
    # the exchange asked for, or for "auto" the one the cost model predicts cheaper for this pass's plan
    if job.exchange != "auto":
        return job.exchange
    chunks = len(job.bounds) - len(job.done)
    return choose_exchange(layout.outline.counts, chunks, workers, job.sync_every).transport


def _load(client, job: Job, workers: list[str], layout: _Layout, todo: list[int], out: Pass
          ) -> tuple[dict[str, object], dict[tuple[int, int], str]]:
    # the load graph: each worker's kernels compiled for this pass (warm-w*), its weights (resident) and each
    # chunk's inputs (each part's rows in model mode); returns the futures by key and the image keys by (chunk, part)
    t0 = time.perf_counter()
    path, dtype, backend, outline = job.path, job.dtype, job.backend, layout.outline
    load = PinnedGraph(layout.run)
    warm_keys = add_warm_tasks(load, workers, (layout.warm_spec(job),))
    # by worker (data and pipeline modes) or by (group, part) (model mode): the layers loaded now, and those still
    # held from the pass before
    weight_keys, kept = _weight_tasks(load, job, workers, layout)
    image_keys: dict[tuple[int, int], str] = {}
    spec = job.source.spec
    for i, c in enumerate(todo):
        a, b = job.bounds[c]
        data = job.source.data_for(c)  # a dask.array's chunk, the scattered batch, or nothing (a store)
        if outline is None:
            image_keys[(c, 0)] = load.add(layout.solo(i), f"images-c{c}",
                                          (load_images, spec, data, a, b, None, dtype, backend))
        else:
            for q, w in enumerate(layout.members(i)):
                image_keys[(c, q)] = load.add(w, f"images-p{q}-c{c}", (load_images, spec, data, a, b,
                                                                       outline.inputs_owned[q], dtype, backend))
    keys = list(weight_keys.values()) + list(image_keys.values())
    loaded = dict(zip(warm_keys + keys, load.submit(client, warm_keys + keys)))
    watch(client, list(loaded.values()), workers)
    out.load_seconds = time.perf_counter() - t0
    warmed = [loaded.pop(key) for key in warm_keys]
    out.compile_seconds = longest(gather_watched(client, warmed, workers))
    # the longest warm-up, which the workers' loads waited for, is the load phase's compiling
    timings.move("load", "compile", out.compile_seconds)
    for f in warmed:
        f.release()
    held = {holder: loaded[key] for holder, key in weight_keys.items()} | kept
    (layout.parts if outline is not None else layout.part_of).update(held)
    _keep_for_next_pass(job, workers, layout, held, out, len(weight_keys))
    return loaded, image_keys


def _weight_tasks(load: PinnedGraph, job: Job, workers: list[str], layout: _Layout) -> tuple[dict, dict]:
    # the tasks loading each worker's layers (data mode: the network; pipeline mode: its stage's) or each part's
    # (model mode, resident), and the layers still held from the pass before where they are the same, each by its
    # holder: the worker, or the (group, part)
    path, dtype, backend, outline = job.path, job.dtype, job.backend, layout.outline
    keys: dict = {}
    kept: dict = {}
    for gi, members in enumerate(layout.groups):
        for q, w in enumerate(members):
            if layout.stages and job.resident:
                # pipeline mode: only the worker's stage's layers, loaded unless it holds them already
                stage, held = job.held_stages.get(w, (None, None))
                if stage == layout.stages[q]:
                    kept[w] = held
                else:
                    keys[w] = load.add(w, f"stage-weights-w{workers.index(w)}", (
                        stage_weights, path, layout.stages[q], dtype, backend))
            elif outline is None and job.resident:
                if w in job.held_networks:
                    kept[w] = job.held_networks[w]
                else:
                    keys[w] = load.add(w, f"weights-w{workers.index(w)}", (load_all_layers, path, dtype, backend))
            elif outline is not None and job.resident:
                held = job.held_parts.layers_on((gi, q), w, len(members))
                if held is not None:
                    kept[(gi, q)] = held
                else:
                    keys[(gi, q)] = load.add(w, f"weights-g{gi}-p{q}", (
                        load_part_layers, path, layout.plans[(gi, q)], outline.inputs_owned[q].size, dtype, backend))
    return keys, kept


def _keep_for_next_pass(job: Job, workers: list[str], layout: _Layout, held: dict, out: Pass, loaded: int) -> None:
    # what the workers hold now (``held``: by holder, ``loaded`` of them loaded in this pass), kept for the pass
    # after a lost worker; the layers of a lost worker, of a stage cut differently or of another partition let go
    if layout.stages and job.resident:
        out.stages_loaded, out.stages_kept = loaded, len(held) - loaded
        job.held_stages = {w: (layout.stage_of(w), layout.part_of[w]) for w in workers}
    elif layout.outline is None and job.resident:
        out.networks_loaded, out.networks_kept = loaded, len(held) - loaded
        _let_go(job.held_networks.values(), held.values())
        job.held_networks = held
    elif layout.outline is not None:
        if job.resident:
            out.parts_loaded, out.parts_kept = loaded, len(held) - loaded
        _let_go(job.held_parts.layers.values(), held.values())
        job.held_parts = HeldParts(len(layout.groups[0]), layout.outline, layout.places(), held)


def _let_go(before, now) -> None:
    # the futures of ``before`` not among ``now``, released
    keep = {f.key for f in now}
    for f in before:
        if f.key not in keep:
            f.release()


def _graph(job: Job, layout: _Layout, todo: list[int], loaded: dict[str, object],
           image_keys: dict[tuple[int, int], str]) -> tuple[PinnedGraph, dict[str, int], dict[int, tuple]]:
    # every chunk's tasks, by its mode's builder; returns the graph, each chunk's result key and (where the run
    # keeps them) each chunk's key of its final activations
    store, outline = job.store, layout.outline
    graph = PinnedGraph(layout.run)
    result_keys: dict[str, int] = {}
    kept_keys: dict[int, tuple] = {}
    for i, c in enumerate(todo):
        a, b = job.bounds[c]
        res = None if job.results is None else ResultSpec(job.results, c, job.activations)
        if layout.stages:
            members = layout.members(i)
            w = members[-1]  # where the last stage, and so the chunk's result, is
            weights_of = {m: layout.part_of[m] if job.resident else
                          LayerStreamSpec(job.path, job.dtype, job.keep_layers, layout.stage_of(m).last,
                                          job.hold_bytes)
                          for m in members}
            key = pipeline_chunk(graph, c, a, layout.stages, members, weights_of, loaded[image_keys[(c, 0)]],
                                 store.bias, store.ymax, res, (a, b - a) if job.activations_name else None,
                                 job.compress)
        elif outline is None:
            w = layout.solo(i)
            weights = (layout.part_of[w] if job.resident else
                       LayerStreamSpec(job.path, job.dtype, job.keep_layers, hold_bytes=job.hold_bytes))
            key = data_chunk(graph, c, a, w, weights, loaded[image_keys[(c, 0)]], store.depth,
                             job.segment or store.depth, store.bias, store.ymax, res,
                             (a, b - a) if job.activations_name else None, job.compress)
        else:
            w = layout.members(i)[0]  # where the categories task runs
            exchange = exchange_for(layout.exchange, layout.members(i))
            # a transport that delivers messages itself lets a task run many layers (all by default)
            segment = 1 if exchange.carries_messages else (job.segment or store.depth)
            key = model_chunk(graph, c, a, b - a, layout.members(i), outline, layout.weights_of(i),
                              [loaded[image_keys[(c, q)]] for q in range(len(layout.members(i)))], store.depth,
                              job.sync_every, store.bias, store.ymax, res, job.compact, bool(job.activations_name),
                              job.overlap, exchange, segment, job.compress)
        if job.activations_name:
            key, kept_keys[c] = _split_kept(graph, w, (job.activations_name, c, 0), key)
        result_keys[key] = c
    return graph, result_keys, kept_keys


def _split_kept(graph: PinnedGraph, w: str, chunk: tuple[str, int, int], key: str) -> tuple[str, tuple]:
    # the chunk's last task returned its result with its final activations: one task for the result (what the
    # client gathers) and one for the activations, keyed as the dask.array chunk it becomes (they stay put)
    head = graph.add(w, f"ids-c{chunk[1]}", (without_activations, ref(key)))
    graph.by_worker.setdefault(w, {})[chunk] = (activations_of, ref(key))
    return head, chunk


def _run(client, job: Job, workers: list[str], layout: _Layout, todo: list[int], loaded: dict[str, object],
         image_keys: dict[tuple[int, int], str], out: Pass) -> None:
    # submit the graph, collect the chunks as they finish, then what the workers measured
    graph, result_keys, kept_keys = _graph(job, layout, todo, loaded, image_keys)
    out.tasks = len(graph)
    sent_before = client.run(bytes_sent)
    t0 = time.perf_counter()
    futures = graph.submit(client, list(result_keys) + list(kept_keys.values()))
    futures, kept = futures[:len(result_keys)], futures[len(result_keys):]
    out.kept = dict(zip(kept_keys, kept))

    def finish(fut) -> None:
        out.chunks[result_keys[fut.key]] = gather_watched(client, [fut], workers)[0]
        if job.progress is not None:
            job.progress(len(out.chunks), len(futures))

    try:
        watch(client, futures, workers, finish)
    except WorkersLost:
        out.seconds = time.perf_counter() - t0
        raise
    finally:
        held = job.held_keys()  # (kept for a pass after a loss)
        for f in list(loaded.values()) + futures:
            if f.key not in held:
                f.release()  # the blocks leave the workers' memory (the streamed layers as the pass ends)
    out.seconds = time.perf_counter() - t0
    out.bytes_sent = _grown(sent_before, client.run(bytes_sent))
    for figures in client.run(run_figures, layout.run).values():
        for k, (dense, sent) in figures.get("messages", {}).items():
            out.layer_bytes.dense[k - 1] += dense
            out.layer_bytes.sent[k - 1] += sent
        for k, nbytes in figures.get("crossed", {}).items():  # as the exchange counted them
            out.layer_bytes.crossed[k - 1] += nbytes
        for (sender, receiver), nbytes in figures.get("pairs", {}).items():
            out.pairs[(sender, receiver)] = out.pairs.get((sender, receiver), 0) + nbytes
        out.bytes_read += figures.get("bytes_read", 0)
    if layout.outline is not None and not exchange_for(layout.exchange, workers).carries_messages:
        # a transport that pushes messages itself does so past Dask's transfer counters: what it counted
        out.bytes_sent += int(out.layer_bytes.crossed.sum())


def _grown(before: dict[str, int], after: dict[str, int]) -> int:
    # a per-worker counter's growth over the workers there are now (a restarted worker counts from zero)
    return sum(after[w] - before.get(w, 0) for w in after)


def _plan_bytes(job: Job, outline: Outline, out: Pass) -> int:
    # what the plan says crosses: each layer's volume x the images its messages carry x the item size. The
    # messages for layer k + 1 are packed as layer k ends, with the images of the last compaction at or before
    # layer k: the images a sync layer kills ride along once more (twice with overlapped steps)
    depth, total = job.store.depth, 0
    itemsize = np.dtype(job.dtype).itemsize
    compacting = [compaction_layer(s, job.overlap) for s in sync_layers(depth, job.sync_every, job.overlap)]
    for c, result in out.chunks.items():
        width = job.bounds[c][1] - job.bounds[c][0]
        rounds = iter(result.alive)
        for k in range(1, depth + 1):
            total += outline.volume(k) * width * itemsize
            if k in compacting:
                width = next(rounds)
    return total


def _part_plan(client, job: Job, owners: np.ndarray, workers: list[str], run: str) -> tuple[str, Outline]:
    """The part plan for ``owners`` (each part's blocks and exchange lists, layer by layer): reused when one was
    made for this network and partition, else written by the workers, one task per layer."""
    path = job.plan_store
    if path is None:
        if not writable(location(job.path)):
            raise DasknnError("model mode out of core reads each part's columns from a part plan, which cannot be "
                              "written inside this store: give --plan-store DIR (a folder every worker can reach)",
                              job.path)
        path = str(join(location(job.path), "plans", plan_digest(job.path, owners)))
    found = open_plan_store(path, job.path, owners)
    if found is None:
        # the layers a writing interrupted by a lost worker finished are kept; the others are written now
        counts = resume_plan_store(path, job.path, owners)
        if not counts:
            create_plan_store(path, job.path, owners)
        parts = int(owners.max()) + 1
        tasks = PinnedGraph(run)
        todo = [k for k in range(1, len(owners)) if k not in counts]
        keys = [tasks.add(workers[i % len(workers)], f"plan-l{k}", (write_part_plan_layer, job.path, path, k, parts))
                for i, k in enumerate(todo)]
        futures = tasks.submit(client, keys)
        counts.update(zip(todo, gather_watched(client, futures, workers)))
        finish_plan_store(path, np.stack([counts[k] for k in range(1, len(owners))]))
        found = open_plan_store(path, job.path, owners)
    return path, Outline.from_owners(owners, found.counts())
