"""Partitioning work that runs on the Dask workers: each task reads the layers it needs from the store, so the
client holds owners arrays and summaries, never the layers.

A deep network is cut into one segment of layers per worker (:func:`segment_count`). The segments are
partitioned at once, each on its own worker; the client fetches only each segment's end rows to relabel the
segments' parts alike (:func:`~.segments.relabel_chain`); the rows around each seam are refined on a worker; and
each worker then relabels its segment and measures its own layers, so the client receives owners in the
smallest integer type that holds them and per-layer figures (:func:`~.metrics.report_of`).
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Iterator
from itertools import cycle

import numpy as np

from ..errors import DasknnError
from ..runtime.heap import large_array_heap
from ..runtime.recovery import workers_info
from ..store import open_store
from ..store.common import FULL_CHECK_ENTRIES
from .hypergraph import ProgressFn
from .methods import partition_network
from .metrics import layer_imbalance, layer_volumes, part_sends, partition_report, report_of
from .segments import SEAM_ROWS, bounds, refine_window, relabel_chain

#: Consecutive layers a sample partition covers (:func:`sample_volumes`).
SAMPLE_LAYERS = 3
#: Methods whose partition of a run of layers stands on its own (a forward pass over rows), so that segments of
#: a deep network can be partitioned on different workers and stitched.
SEGMENT_METHODS = ("hypergraph", "fast")
#: Fewest layers a segment gets: the seams' refinement costs a few rows' work each, and every seam loses a little.
MIN_SEGMENT_LAYERS = 64


def sample_window(depth: int, layers: int = SAMPLE_LAYERS) -> tuple[int, int]:
    """The layers ``first .. last`` (1-based, inclusive) a sample covers: up to ``layers`` around the middle one."""
    n = min(depth, layers)
    middle = max(1, depth // 2)
    first = max(1, min(middle - 1, depth - n + 1))
    return first, first + n - 1


def sample_volumes(path: str, parts: int, method: str, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A cheap estimate of the exchange a partition by ``method`` would need (it reads the layers it samples).

    The layers of :func:`sample_window` are partitioned on their own, by ``method`` where that is cheap
    (``block``, ``random``, ``fast``, ``fast-segments``) and by ``fast`` otherwise (the hypergraph methods send
    less, so the estimate errs towards a larger exchange).

    Returns
    -------
    tuple
        The sample's entries sent per image per layer divided by the layer's entries (one value per sampled
        layer after its first), and the owners rows ``middle - 1`` and ``middle`` of the network's middle layer.
    """
    store = open_store(path, check="lazy")
    first, last = sample_window(store.depth)
    layers = [store.layer(k) for k in range(first, last + 1)]
    cheap = method if method in ("block", "random", "fast", "fast-segments") else "fast"
    owners = partition_network(layers, parts, "fast" if cheap == "fast-segments" else cheap, seed=seed)
    per_entry = layer_volumes(layers, owners, parts=parts) / np.array([max(1, w.nnz) for w in layers], dtype=float)
    # the sample's first layer has its inputs free to follow its outputs (sends nothing): not like the network's
    per_entry = per_entry[1:] if per_entry.size > 1 else per_entry
    i = max(1, store.depth // 2) - first  # the middle layer's input row, in the sample's rows
    return per_entry, owners[i:i + 2]


def owner_dtype(parts: int) -> np.dtype:
    """The smallest unsigned integer type that holds ``parts - 1``: a quarter of ``int32``'s bytes for up to 256
    parts (what the client receives and holds)."""
    return np.min_scalar_type(max(0, parts - 1))


def compact(owners: np.ndarray, parts: int) -> np.ndarray:
    """``owners`` as :func:`owner_dtype`."""
    return owners.astype(owner_dtype(parts), copy=False)


def _reporter(topic: str | None, segment: int, rows: int) -> ProgressFn | None:
    """On a worker: a ``progress(done, total)`` that logs how many of its ``rows`` a segment has done (its method's
    passes in proportion) as an event of ``topic`` (:func:`_follow` shows them on the client)."""
    if topic is None:
        return None
    from distributed import get_worker

    worker = get_worker()
    return lambda done, total: worker.log_event(topic, {"segment": segment, "done": done * rows // max(1, total)})


@contextlib.contextmanager
def _follow(client, progress: ProgressFn | None, rows: int) -> Iterator[str | None]:
    """A topic the tasks log their rows to while the block runs, and ``progress(rows done, rows)`` as they do."""
    if progress is None:
        yield None
        return
    topic = f"dasknn-partition-{uuid.uuid4().hex}"
    done: dict[int, int] = {}

    def seen(event) -> None:
        msg = event[1]
        done[msg["segment"]] = msg["done"]
        progress(min(rows, sum(done.values())), rows)  # (segments share their end rows)

    client.subscribe_topic(topic, seen)
    try:
        yield topic
    finally:
        client.unsubscribe_topic(topic)
    # the scheduler has every event of a finished task (a worker sends them before the task's end): the last count
    for event in client.get_events(topic):
        seen(event)


@large_array_heap()
def partition_task(path: str, parts: int, method: str, epsilon: float = 0.03, seed: int = 0,
                   threads: int | None = None, topic: str | None = None) -> tuple[np.ndarray, dict]:
    """Partition the network stored at ``path`` on this worker (a task): its owners (:func:`compact`) and report.

    The worker reads the layers from the store (a layer or two at a time for a large network) and gives
    Mt-KaHyPar ``threads`` threads (by default the CPUs it may use), so the client holds only the owners. With
    ``topic``, the rows done are logged as events of it.
    """
    layers = open_store(path, check="metadata").partition_layers()
    t0 = time.perf_counter()
    owners = partition_network(layers, parts, method, epsilon=epsilon, seed=seed, threads=threads,
                               progress=_reporter(topic, 0, len(layers) + 1))
    seconds = time.perf_counter() - t0
    return compact(owners, parts), partition_report(layers, owners, method, seconds)


@large_array_heap()
def segment_task(path: str, a: int, b: int, parts: int, method: str, epsilon: float, seed: int,
                 threads: int | None, topic: str | None = None) -> np.ndarray:
    """Partition layers ``a + 1 .. b`` on their own (a task): ``int32`` owners of rows ``a .. b`` (rows done
    logged as events of ``topic``)."""
    layers = open_store(path, check="metadata").lazy_layers(a + 1, b)
    return partition_network(layers, parts, method, epsilon=epsilon, seed=seed, threads=threads,
                             progress=_reporter(topic, a, b - a + 1))


def take_rows(owners: np.ndarray, start: int, stop: int | None) -> np.ndarray:
    """Rows ``start:stop`` of a segment's owners (a task, so only they leave the worker)."""
    return np.array(owners[start:stop])


@large_array_heap()
def seam_task(path: str, lo: int, before: np.ndarray, after: np.ndarray, relabel_before: np.ndarray,
              relabel_after: np.ndarray, parts: int, method: str, epsilon: float, seed: int) -> np.ndarray:
    """Refine the rows around a seam (a task): rows ``lo + 1 .. lo + 2 * SEAM_ROWS + 1`` in the first segment's
    labels.

    ``before`` are rows ``lo .. lo + SEAM_ROWS + 1`` of the segment before the seam (its last rows, the seam row
    included) and ``after`` rows ``lo + SEAM_ROWS + 2 ..`` of the segment after it, each in its own labels.
    """
    window = np.concatenate([relabel_before[before], relabel_after[after]])
    hi = lo + len(window) - 1
    layers = open_store(path, check="metadata").lazy_layers(lo + 1, hi)
    refine_window(list(layers), window, parts, epsilon, seed + lo, method)
    return window[1:-1]


@large_array_heap()
def finish_segment(path: str, a: int, owners: np.ndarray, relabel: np.ndarray, head: np.ndarray | None,
                   tail: np.ndarray | None, parts: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A segment's final owners (a task): relabelled, its seam rows replaced by the refined ones (``head`` from
    row ``a``, ``tail`` up to its last row), with its layers' sends and imbalance measured here.

    Returns
    -------
    tuple
        Owners (:func:`compact`), :func:`~.metrics.part_sends` and :func:`~.metrics.layer_imbalance` of its layers.
    """
    out = relabel[owners]
    if head is not None:
        out[:len(head)] = head
    if tail is not None:
        out[len(out) - len(tail):] = tail
    layers = open_store(path, check="metadata").lazy_layers(a + 1, a + len(out) - 1)
    return compact(out, parts), part_sends(layers, out, parts=parts), layer_imbalance(layers, out, parts=parts)


def segment_count(depth: int, edges: int, workers: int, method: str) -> int:
    """Segments a network is partitioned in on ``workers`` workers: one per worker for a large network (read
    out of core) partitioned by a :data:`SEGMENT_METHODS` method, each at least :data:`MIN_SEGMENT_LAYERS` deep;
    else 1 (one task, as in one process)."""
    if method not in SEGMENT_METHODS or edges <= FULL_CHECK_ENTRIES:
        return 1
    return max(1, min(workers, depth // MIN_SEGMENT_LAYERS))


def partition_on_cluster(client, path: str, parts: int, method: str, epsilon: float = 0.03, seed: int = 0,
                         segments: int | None = None, progress: ProgressFn | None = None) -> tuple[np.ndarray, dict]:
    """Partition the network stored at ``path`` on ``client``'s cluster: its owners (:func:`compact`) and report.

    A large network is partitioned in segments, one per worker (:func:`segment_count`, the module docstring);
    otherwise :func:`partition_task` runs on the worker with the most threads, given all of them. ``segments``
    asks for that many segments instead (a :data:`SEGMENT_METHODS` method; at most one per
    ``2 * SEAM_ROWS + 2`` layers, so that seams stay apart). ``progress(rows done, rows)`` is called on the
    client as the workers finish rows of owners (a progress bar).
    """
    info = workers_info(client)  # (not the client's cached scheduler_info, which can look empty)
    workers = sorted(info, key=lambda w: -info[w].get("nthreads", 1))
    store = open_store(path, check="metadata")
    if segments is None:
        segments = segment_count(store.depth, store.edges, len(workers), method)
    elif method not in SEGMENT_METHODS:
        raise DasknnError(f"the {method} method is not partitioned in segments; use one of {', '.join(SEGMENT_METHODS)}")
    segments = max(1, min(int(segments), store.depth // (2 * SEAM_ROWS + 2)))
    with _follow(client, progress, store.depth + 1) as topic:
        if segments == 1 or parts == 1:
            future = client.submit(partition_task, path, parts, method, epsilon, seed,
                                   info[workers[0]].get("nthreads", 1), topic, workers=[workers[0]],
                                   allow_other_workers=True, pure=False)
            return future.result()
        return _in_segments(client, workers, info, store, path, parts, method, epsilon, seed, segments, topic)


def _in_segments(client, workers: list[str], info: dict, store, path: str, parts: int, method: str, epsilon: float,
                 seed: int, segments: int, topic: str | None) -> tuple[np.ndarray, dict]:
    # see the module docstring
    t0 = time.perf_counter()
    spans = bounds(store.depth, segments)
    owned = [client.submit(segment_task, path, a, b, parts, method, epsilon, seed + 104729 * s,
                           info[w].get("nthreads", 1), topic, workers=[w], allow_other_workers=True, pure=False)
             for s, ((a, b), w) in enumerate(zip(spans, cycle(workers)))]
    ends = client.gather([client.submit(take_rows, f, i, i + 1 or None, pure=False) for f in owned for i in (0, -1)])
    chain = relabel_chain([r[0] for r in ends[0::2]], [r[0] for r in ends[1::2]], parts)
    seams = []
    for s in range(1, segments):
        a_prev, a = spans[s - 1][0], spans[s][0]
        before = client.submit(take_rows, owned[s - 1], a - SEAM_ROWS - 1 - a_prev, a - a_prev + 1, pure=False)
        after = client.submit(take_rows, owned[s], 1, SEAM_ROWS + 2, pure=False)
        seams.append(client.submit(seam_task, path, a - SEAM_ROWS - 1, before, after, chain[s - 1], chain[s], parts,
                                   method, epsilon, seed, pure=False))
    finished = []
    for s, (a, _) in enumerate(spans):
        # a seam's refined rows are a - SEAM_ROWS .. a + SEAM_ROWS: the segment before takes those up to a
        head = client.submit(take_rows, seams[s - 1], SEAM_ROWS, 2 * SEAM_ROWS + 1, pure=False) if s else None
        tail = client.submit(take_rows, seams[s], 0, SEAM_ROWS + 1, pure=False) if s < segments - 1 else None
        finished.append(client.submit(finish_segment, path, a, owned[s], chain[s], head, tail, parts,
                                      workers=[workers[s % len(workers)]], allow_other_workers=True, pure=False))
    del owned, seams  # the finishing tasks hold what they need; the workers free the rest as they end
    owners = np.empty((store.depth + 1, store.neurons), dtype=owner_dtype(parts))
    sends, imbalance = [], []
    for (a, b), future in zip(spans, finished):
        rows, sent, imbalanced = future.result()
        future.release()  # one segment's owners on the client at a time, written straight into place
        owners[a:b + 1] = rows
        sends.append(sent)
        imbalance.append(imbalanced)
    return owners, report_of(method, parts, store.neurons, np.concatenate(sends), np.concatenate(imbalance),
                             time.perf_counter() - t0)
