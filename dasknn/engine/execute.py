"""Execution passes: load weights and inputs, run the chunks' graph, measure what crossed."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import DasknnError
from ..plan import Outline, build_plan
from ..runtime.graph import PinnedGraph
from ..runtime.metrics import bytes_sent, exchange_log_pop, install_exchange_log
from ..runtime.recovery import WorkersLost, watch
from ..store import create_plan_store, finish_plan_store, is_url, open_plan_store, plan_digest
from .data_mode import data_chunk
from .model_mode import model_chunk
from .owners import resolve_partition
from .sizing import sync_layers
from .tasks import (
    close_streams,
    load_all_layers,
    load_images,
    load_part_layers,
    message_tally,
    stream_bytes,
    write_part_plan_layer,
)


@dataclass
class Job:
    """What every pass of one inference shares."""

    path: str
    in_path: str
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


@dataclass
class Pass:
    """One pass over some chunks on one set of workers."""

    chunks: dict[int, tuple] = field(default_factory=dict)  # chunk -> (image ids, alive per sync round)
    plan: Outline | None = None
    group_size: int = 1
    plan_seconds: float = 0.0  # making a part plan (model mode out of core, once per partition)
    load_seconds: float = 0.0
    seconds: float = 0.0
    tasks: int = 0
    bytes_sent: int = 0
    bytes_read: int = 0
    plan_bytes: int = 0
    per_layer: np.ndarray | None = None


def execute(client, job: Job, workers: list[str], g: int, todo: list[int]) -> Pass:
    """Load and run chunks ``todo`` on ``workers`` in groups of ``g``; raise :class:`WorkersLost` with the chunks
    that finished if a worker leaves."""
    store, path, dtype, backend, resident = job.store, job.path, job.dtype, job.backend, job.resident
    bounds, depth = job.bounds, store.depth
    groups = [workers[i:i + g] for i in range(0, len(workers), g)]
    run = uuid.uuid4().hex[:8]
    out = Pass(group_size=g, per_layer=np.zeros((depth, 3), dtype=np.int64))
    plan = outline = None
    part_of: dict[str, object] = {}  # worker -> its part's layers: a future of them in memory, or a stream spec
    if g > 1:
        owners = resolve_partition(path, job.partition, g)
        if resident:
            plan = build_plan(store.network().layers, owners)
            outline = plan.outline()
        else:
            # out of core: each part streams its own columns from a part plan, made once per partition
            t0 = time.perf_counter()
            try:
                plan_path, outline = _part_plan(client, job, owners, workers, run)
            except WorkersLost as lost:
                raise WorkersLost(lost.lost, out) from None
            out.plan_seconds = time.perf_counter() - t0
            for members in groups:
                part_of.update({w: ("part", plan_path, q, dtype, job.keep_layers) for q, w in enumerate(members)})
        install_exchange_log(client)
    out.plan = outline

    # phase 1, untimed: weights and inputs into the workers' memory
    t0 = time.perf_counter()
    load = PinnedGraph(run)
    weight_keys: dict[str, str] = {}
    image_keys: dict[tuple[int, int], str] = {}
    chunk_group = {c: i % len(groups) for i, c in enumerate(todo)}
    for gi, members in enumerate(groups):
        for q, w in enumerate(members):
            if outline is None and resident:
                weight_keys[w] = load.add(w, f"weights-w{workers.index(w)}", (load_all_layers, path, dtype, backend))
            elif plan is not None:
                weight_keys[w] = load.add(w, f"weights-g{gi}-p{q}", (load_part_layers, path, plan.part(q),
                                                                     plan.inputs_owned[q].size, dtype, backend))
    for i, c in enumerate(todo):
        a, b = bounds[c]
        members = groups[chunk_group[c]]
        if outline is None:
            w = members[(i // len(groups)) % len(members)]
            image_keys[(c, 0)] = load.add(w, f"images-c{c}", (load_images, job.in_path, a, b, None, dtype, backend))
        else:
            for q, w in enumerate(members):
                image_keys[(c, q)] = load.add(w, f"images-p{q}-c{c}", (load_images, job.in_path, a, b,
                                                                       outline.inputs_owned[q], dtype, backend))
    keys = list(weight_keys.values()) + list(image_keys.values())
    loaded = dict(zip(keys, load.submit(client, keys)))
    try:
        watch(client, list(loaded.values()), workers)
    except WorkersLost as lost:
        raise WorkersLost(lost.lost, out) from None
    out.load_seconds = time.perf_counter() - t0
    part_of.update({w: loaded[key] for w, key in weight_keys.items()})

    # phase 2, timed: the inference graph, referring to the loaded blocks by their futures
    graph = PinnedGraph(run)
    result_keys: dict[str, int] = {}
    for i, c in enumerate(todo):
        a, b = bounds[c]
        members = groups[chunk_group[c]]
        res = None if job.results is None else (job.results, c, job.activations)
        if outline is None:
            w = members[(i // len(groups)) % len(members)]
            weights = part_of[w] if resident else ("stream", path, dtype, job.keep_layers)
            key = data_chunk(graph, c, a, w, weights, loaded[image_keys[(c, 0)]], depth, job.segment or depth,
                             store.bias, store.ymax, res)
        else:
            key = model_chunk(graph, c, a, b - a, members, outline, part_of,
                              [loaded[image_keys[(c, q)]] for q in range(len(members))], depth, job.sync_every,
                              store.bias, store.ymax, res, job.compact)
        result_keys[key] = c
    out.tasks = len(graph)
    read_before = client.run(stream_bytes)
    sent_before = client.run(bytes_sent)
    t0 = time.perf_counter()
    futures = graph.submit(client, list(result_keys))

    def finish(fut) -> None:
        value = fut.result()
        out.chunks[result_keys[fut.key]] = (value, []) if outline is None else value
        if job.progress is not None:
            job.progress(len(out.chunks), len(futures))

    try:
        watch(client, futures, workers, finish)
    except WorkersLost as lost:
        out.seconds = time.perf_counter() - t0
        raise WorkersLost(lost.lost, out) from None
    finally:
        for f in list(loaded.values()) + futures:
            f.release()  # the blocks leave the workers' memory
        client.run(close_streams, run)  # and the streamed layers
    out.seconds = time.perf_counter() - t0
    sent_after = client.run(bytes_sent)
    out.bytes_sent = sum(sent_after[w] - sent_before.get(w, 0) for w in sent_after)
    if outline is not None:
        for k, nbytes in client.run_on_scheduler(exchange_log_pop, run=run).items():
            if k <= depth:  # (the last layer's blocks go to the categories task, not to a part)
                out.per_layer[k - 1, 2] += nbytes
    for tally in client.run(message_tally, run).values():
        for k, (dense, sent) in tally.items():
            out.per_layer[k - 1, :2] += (dense, sent)
    read_after = client.run(stream_bytes)
    out.bytes_read = sum(read_after[w] - read_before.get(w, 0) for w in read_after)
    if outline is not None:
        # what the plan says crosses: each layer's volume x the images its messages carry x the item size. The
        # messages for layer k are packed as layer k - 1 ends, before the parts' masks of a sync layer k - 1
        # meet, so the images that layer kills ride along once more
        itemsize = np.dtype(dtype).itemsize
        syncs = set(sync_layers(depth, job.sync_every))
        for c, (_, alive) in out.chunks.items():
            width = bounds[c][1] - bounds[c][0]
            rounds = iter(alive)
            for k in range(1, depth + 1):
                out.plan_bytes += outline.volume(k) * width * itemsize
                if k - 1 in syncs:
                    width = next(rounds)
    return out


def _part_plan(client, job: Job, owners: np.ndarray, workers: list[str], run: str) -> tuple[str, Outline]:
    """The part plan for ``owners`` (each part's blocks and exchange lists, layer by layer): reused when one was
    made for this network and partition, else written by the workers, one task per layer."""
    path = job.plan_store
    if path is None:
        if is_url(job.path) or not os.access(job.path, os.W_OK):
            raise DasknnError("model mode out of core reads each part's columns from a part plan, which cannot be "
                              "written inside this store: give --plan-store DIR (a folder every worker can reach)",
                              job.path)
        path = str(Path(job.path) / "plans" / plan_digest(job.path, owners))
    found = open_plan_store(path, job.path, owners)
    if found is None:
        create_plan_store(path, job.path, owners)
        parts = int(owners.max()) + 1
        tasks = PinnedGraph(run)
        keys = [tasks.add(workers[(k - 1) % len(workers)], f"plan-l{k}",
                          (write_part_plan_layer, job.path, path, k, parts)) for k in range(1, len(owners))]
        futures = tasks.submit(client, keys)
        watch(client, futures, workers)
        finish_plan_store(path, np.stack([f.result() for f in futures]))
        found = open_plan_store(path, job.path, owners)
    return path, Outline.from_owners(owners, found.counts())
