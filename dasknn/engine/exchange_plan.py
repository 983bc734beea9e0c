"""Model mode's resident exchange plan, built by the workers: each part's lists for every layer, made by the
worker that runs the part from the owners and the layers' patterns it reads from the store. The client holds the
owners and the exchange's counts (an :class:`~dasknn.plan.Outline`), never a layer."""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from ..plan import Outline, PartLayer, needed_inputs
from ..runtime.graph import PinnedGraph, ref
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
    outputs = np.flatnonzero(after == q).astype(np.int64)
    need = needed_inputs(w, outputs)
    holder = before[need]
    mine = holder == q
    local = (np.flatnonzero(mine), np.searchsorted(mine_before, need[mine]))
    recv = {int(p): np.flatnonzero(holder == p) for p in np.unique(holder[~mine])}
    # which of this part's inputs each part reads: one pass over the entries whose input this part holds
    cols = np.repeat(np.arange(w.shape[1], dtype=np.int64), np.diff(w.indptr))
    held = before[w.indices] == q
    read = np.zeros((parts, w.shape[0]), dtype=bool)
    read[after[cols[held]], w.indices[held]] = True
    read[q] = False
    send = {}
    for r in np.flatnonzero(read.any(axis=1)):
        send[int(r)] = np.searchsorted(mine_before, np.flatnonzero(read[r]))
    return PartLayer(outputs=outputs, inputs=need, local=local, recv=recv, send=send)


def plan_part(path: str, owners: np.ndarray, parts: int, q: int) -> list[PartLayer]:
    """Part ``q``'s plan for every layer of the network stored at ``path`` (a task on the part's worker)."""
    store = open_store(path, check="lazy")  # the client has checked the store's metadata
    return [part_plan_layer(store.layer(k), owners[k - 1], owners[k], parts, q) for k in range(1, store.depth + 1)]


def send_counts(part: list[PartLayer], parts: int) -> np.ndarray:
    """``counts[k - 1, r]``: entries the part sends part ``r`` for layer ``k`` (its row of the outline's counts)."""
    counts = np.zeros((len(part), parts), dtype=np.int64)
    for k, pl in enumerate(part):
        for r, rows in pl.send.items():
            counts[k, r] = rows.size
    return counts


def plan_on_workers(client, path: str, owners: np.ndarray, groups: list[list[str]], run: str
                    ) -> tuple[dict[str, object], Outline, object]:
    """Every group's parts' plans, each made and kept by the worker that runs the part.

    Returns the futures of the plans by worker (each ``list[PartLayer]``, for
    :func:`~dasknn.engine.tasks.load_part_layers`), the plan's outline, whose counts the first group's workers
    send back (every group's plan is the same), and the future of the owners the workers were sent (the plans'
    dependency: the caller releases it with them).
    """
    workers = [w for members in groups for w in members]
    parts = len(groups[0])
    # keyed so that the dashboard's prefix is the plan's, like its tasks'
    held = client.scatter({f"plan-{run}": owners}, workers=workers, broadcast=True)[f"plan-{run}"]
    graph = PinnedGraph(run)
    plan_keys: dict[str, str] = {}
    count_keys: list[str] = []
    for gi, members in enumerate(groups):
        for q, w in enumerate(members):
            plan_keys[w] = graph.add(w, f"plan-g{gi}-p{q}", (plan_part, path, held, parts, q))
            if gi == 0:
                count_keys.append(graph.add(w, f"plan-g0-p{q}-sends", (send_counts, ref(plan_keys[w]), parts)))
    futures = graph.submit(client, list(plan_keys.values()) + count_keys)
    watch(client, futures, workers)
    plans, counted = futures[:len(plan_keys)], futures[len(plan_keys):]
    counts = np.stack([f.result() for f in counted], axis=1)  # (layers, sender, receiver)
    for f in counted:
        f.release()
    return dict(zip(plan_keys, plans)), Outline.from_owners(owners, counts), held
