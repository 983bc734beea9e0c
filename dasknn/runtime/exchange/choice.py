"""Which transport a pass's boundary messages take where ``exchange="auto"``: what each would cost beyond the
messages' bytes (the same in both), predicted from the plan's counts. Sizes in, seconds out: nothing here runs."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: Seconds of the scheduler's and a worker's time one task costs where nothing calibrated it (the probe measures
#: ``Calibration.task_seconds``): 2.8 ms a task measured on this project's 2-core VM with a real scheduler and 16
#: single-threaded workers (59,526 tasks, 164.9 s; BENCHMARKS.md, issue 33), about 1 ms in Dask's documents.
TASK_SECONDS = 1e-3
#: Seconds one boundary message costs the p2p exchange beyond its bytes, on the sending worker (a write to an open
#: stream) and the receiving one (a read, a lookup): 250-550 us measured per Dask comm message on the same VM.
P2P_MESSAGE_SECONDS = 4e-4


@dataclass(frozen=True)
class ExchangeChoice:
    """The transport of a model-mode pass's boundary messages and what each would cost beyond the messages' bytes
    (the same in both): seconds of task overhead (through the one scheduler) and per-message overhead (spread over
    the workers that send)."""

    transport: str
    seconds: dict[str, float]


def exchange_overheads(counts: np.ndarray, chunks: int, workers: int, sync_every: int,
                       task_seconds: float = TASK_SECONDS) -> dict[str, float]:
    """Predicted overhead seconds of each transport for a model-mode pass.

    ``counts[k - 1, p, q]`` are the plan's entries part ``p`` sends part ``q`` in layer ``k`` (an
    :class:`~dasknn.plan.Outline`'s, or training's parts'), ``chunks`` the pass's chunks over all groups, ``workers`` all the workers.
    The task exchange runs a task per part, layer and chunk and, where a part has several recipients, one more per
    pair (the scheduler's time: it does not grow with the workers). The p2p exchange runs a task per part and chunk
    (a segment of all the layers) and sends one message per pair, layer and chunk from the workers themselves, and
    a mask to every other part after each sync layer.
    """
    depth, parts = counts.shape[0], counts.shape[1]
    pairs = float(np.count_nonzero(counts))  # (layer, sender, receiver) with rows to send
    masks = parts * (parts - 1) * (depth // max(1, sync_every))
    picks = 0.0 if parts <= 2 else pairs + masks
    tasks_transport = chunks * (depth * parts + picks) * task_seconds
    p2p_tasks = chunks * (2 * parts + 1) * task_seconds  # first sends, segments, the chunk's categories
    p2p_messages = chunks * (pairs + masks) * P2P_MESSAGE_SECONDS / max(1, workers)  # every worker sends
    return {"tasks": float(tasks_transport), "p2p": float(p2p_tasks + p2p_messages)}


def choose_exchange(counts: np.ndarray, chunks: int, workers: int, sync_every: int,
                    task_seconds: float = TASK_SECONDS) -> ExchangeChoice:
    """The transport :func:`exchange_overheads` predicts cheaper for a pass (``--exchange auto``), on CPU and GPU
    blocks alike: both transports' costs are the messages' and tasks' own, not the kernels' (p2p's messages from
    CuPy blocks were checked exact on an H200, ``tests/engine/test_engine.py`` ``-m gpu``)."""
    seconds = exchange_overheads(counts, chunks, workers, sync_every, task_seconds)
    return ExchangeChoice(min(seconds, key=seconds.get), seconds)
