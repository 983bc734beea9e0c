"""Model mode's resident exchange plan, built by the workers: each part's lists for every layer, made by the
worker that runs the part from the owners and the layers it reads from the store, with the part's blocks of those
layers (read once: the part's weights task takes them). The client holds the owners and the exchange's counts
(an :class:`~dasknn.plan.Outline`), never a layer."""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from ..errors import DasknnError
from ..plan import Outline, PartLayer, local_block, part_inputs
from ..runtime.graph import PinnedGraph
from ..runtime.recovery import watch
from ..store import open_store


def part_plan_layer(w: sp.spmatrix, before: np.ndarray, after: np.ndarray, parts: int, q: int) -> PartLayer:
    """Part ``q``'s :class:`~dasknn.plan.PartLayer` for layer ``w``: the same as
    ``dasknn.plan.plan_layer(w, before, after, parts)[q]``, without making the other parts' lists.

    ``before`` and ``after`` are rows ``k - 1`` and ``k`` of the owners array (of ``parts`` parts). Its send
    lists come from the layer's entries whose input part ``q`` holds: one pass over the entries, not one column
    slice per part.
    """
    w = sp.csc_matrix(w)
    mine_before = np.flatnonzero(before == q).astype(np.int64)  # the rows of the part's previous block
    pl = part_inputs(w, before, after, q, mine_before)
    # which of this part's inputs each part reads: one pass over the entries whose input this part holds
    cols = np.repeat(np.arange(w.shape[1], dtype=np.int64), np.diff(w.indptr))
    held = before[w.indices] == q
    read = np.zeros((parts, w.shape[0]), dtype=bool)
    read[after[cols[held]], w.indices[held]] = True
    read[q] = False
    for r in np.flatnonzero(read.any(axis=1)):
        pl.send[int(r)] = np.searchsorted(mine_before, np.flatnonzero(read[r]))
    return pl


#: Per worker process: each part's plan, made by :func:`plan_part` and kept by the worker until its run ends, by
#: ``(run, group, part)``. Its weights' task takes it from here, not as a Dask dependency: a worker lost later
#: then leaves that task waiting for it (the run raises WorkersLost), never depending on data already dropped.
PLANS: dict[tuple[str, int, int], list[PartLayer]] = {}

#: Per worker process: each part's blocks of every layer (:func:`~dasknn.plan.local_block`, the store's dtype),
#: made by :func:`plan_part` from the layers it read for the plan, by ``(run, group, part)``; the part's weights'
#: task takes them (:func:`take_blocks`) so that the worker reads each layer once.
BLOCKS: dict[tuple[str, int, int], list[tuple[np.ndarray, np.ndarray, np.ndarray]]] = {}


def plan_part(path: str, owners: np.ndarray, parts: int, held: tuple[str, int, int]) -> np.ndarray:
    """Part ``held[2]``'s plan for every layer of the network stored at ``path`` (a task on the part's worker),
    kept in :data:`PLANS` under ``held`` with the part's blocks in :data:`BLOCKS`; returns its counts
    (:func:`send_counts`)."""
    store = open_store(path, check="lazy")  # the client has checked the store's metadata
    q = held[2]
    plans, blocks = [], []
    rows = int(np.count_nonzero(owners[0] == q))  # layer 1 reads the part's input pixels
    for k in range(1, store.depth + 1):
        w = store.layer(k)
        plans.append(part_plan_layer(w, owners[k - 1], owners[k], parts, q))
        blocks.append(local_block(w, plans[-1], rows))
        rows = plans[-1].outputs.size
    PLANS[held], BLOCKS[held] = plans, blocks
    return send_counts(plans, parts)


def held_plan(held: tuple[str, int, int]) -> list[PartLayer]:
    """The plan :func:`plan_part` kept on this worker under ``held``."""
    if held not in PLANS:
        raise DasknnError(f"model mode: part {held[2]} of group {held[1]} found no plan on this worker "
                          "(its plan task ran elsewhere)")
    return PLANS[held]


def take_blocks(held: tuple[str, int, int]) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]] | None:
    """The part's blocks :func:`plan_part` kept on this worker under ``held``, no longer kept (the weights' task
    holds them as it needs them); None when they were taken already."""
    return BLOCKS.pop(held, None)


def drop_plans(run: str) -> None:
    """Forget the plans of ``run`` kept on this worker (and the blocks no task took)."""
    for held in [h for h in PLANS if h[0] == run]:
        del PLANS[held]
    for held in [h for h in BLOCKS if h[0] == run]:
        del BLOCKS[held]


def send_counts(part: list[PartLayer], parts: int) -> np.ndarray:
    """``counts[k - 1, r]``: entries the part sends part ``r`` for layer ``k`` (its row of the outline's counts)."""
    counts = np.zeros((len(part), parts), dtype=np.int64)
    for k, pl in enumerate(part):
        for r, rows in pl.send.items():
            counts[k, r] = rows.size
    return counts


def plan_on_workers(client, path: str, owners: np.ndarray, groups: list[list[str]], run: str
                    ) -> tuple[dict[str, tuple[str, int, int]], Outline]:
    """Every group's parts' plans, each made and kept by the worker that runs the part.

    Returns where each worker keeps its part's plan (for :func:`held_plan`) and the plan's outline, whose counts
    the first group's workers send back (every group's plan is the same).
    """
    workers = [w for members in groups for w in members]
    # keyed so that the dashboard's prefix is the plan's, like its tasks'
    sent = client.scatter({f"plan-{run}": owners}, workers=workers, broadcast=True)[f"plan-{run}"]
    graph = PinnedGraph(run)
    held = {w: (run, gi, q) for gi, members in enumerate(groups) for q, w in enumerate(members)}
    keys = [graph.add(w, f"plan-g{gi}-p{q}", (plan_part, path, sent, len(groups[0]), held[w]))
            for w, (_, gi, q) in held.items()]
    futures = graph.submit(client, keys)
    watch(client, futures, workers)
    counts = np.stack([f.result() for f in futures[:len(groups[0])]], axis=1)  # (layers, sender, receiver)
    for f in [sent, *futures]:
        f.release()
    return held, Outline.from_owners(owners, counts)
