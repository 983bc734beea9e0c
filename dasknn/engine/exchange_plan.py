"""Model mode's resident exchange plan, built by the workers: each part's lists for every layer, made by the
worker that runs the part from the owners and the layers it reads from the store, with the part's blocks of those
layers (read once: the part's weights task takes them). The client holds the owners and the exchange's counts
(an :class:`~dasknn.plan.Outline`), never a layer."""

from __future__ import annotations

import numpy as np

from ..errors import DasknnError
from ..plan import Outline, PartLayer, local_block, part_plan_layer, send_counts
from ..runtime.graph import PinnedGraph
from ..runtime.recovery import gather_watched, watch
from ..runtime.scatter import scatter_to_all
from ..store import open_store
from .places import Slot
from .worker_run import inference_run


def plan_part(path: str, owners: np.ndarray, parts: int, held: tuple[str, int, int]) -> np.ndarray:
    """Part ``held[2]``'s plan for every layer of the network stored at ``path`` (a task on the part's worker),
    kept by the worker's run ``held[0]`` for group ``held[1]`` with the part's blocks (see
    :class:`~dasknn.engine.worker_run.InferenceRun`); returns its counts (:func:`send_counts`)."""
    store = open_store(path, check="lazy")  # the client has checked the store's metadata
    run, group, q = held
    plans, blocks = [], []
    rows = int(np.count_nonzero(owners[0] == q))  # layer 1 reads the part's input pixels
    for k in range(1, store.depth + 1):
        w = store.layer(k)
        plans.append(part_plan_layer(w, owners[k - 1], owners[k], parts, q))
        blocks.append(local_block(w, plans[-1], rows))
        rows = plans[-1].outputs.size
    kept = inference_run(run)
    kept.plans[(group, q)], kept.blocks[(group, q)] = plans, blocks
    return send_counts(plans, parts)


def held_plan(run: str, group: int, part: int) -> list[PartLayer]:
    """The plan :func:`plan_part` kept on this worker for ``run``'s part ``part`` of group ``group``."""
    plans = inference_run(run).plans
    if (group, part) not in plans:
        raise DasknnError(f"model mode: part {part} of group {group} found no plan on this worker "
                          "(its plan task ran elsewhere)")
    return plans[(group, part)]


def take_blocks(run: str, group: int, part: int) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]] | None:
    """The part's blocks :func:`plan_part` kept on this worker, no longer kept (the weights' task holds them as it
    needs them); None when they were taken already."""
    return inference_run(run).blocks.pop((group, part), None)


def plan_on_workers(client, path: str, owners: np.ndarray, places: dict[Slot, str], parts: int, run: str
                    ) -> tuple[dict[Slot, tuple[str, int, int]], Outline | None]:
    """The plans of the parts ``places`` names (by (group, part): its worker), each made and kept by its worker (a
    worker may hold several parts).

    Returns where each part's plan is kept (for :func:`held_plan`), and the plan's outline, whose counts the first
    group's parts send back (every group's plan is the same); None where not every part of the first group was
    planned here (after a lost worker, only its parts are: the outline is the one made before).
    """
    workers = sorted(set(places.values()))
    # keyed so that the dashboard's prefix is the plan's, like its tasks'
    sent = scatter_to_all(client, owners, workers, key=f"plan-{run}")
    graph = PinnedGraph(run)
    held = {(gi, q): (run, gi, q) for gi, q in places}
    keys = {slot: graph.add(places[slot], f"plan-g{slot[0]}-p{slot[1]}", (plan_part, path, sent, parts, held[slot]))
            for slot in places}
    futures = dict(zip(keys, graph.submit(client, list(keys.values()))))
    watch(client, list(futures.values()), workers)
    first = [(0, q) for q in range(parts)]
    outline = None
    if all(slot in futures for slot in first):
        counts = gather_watched(client, [futures[slot] for slot in first], workers)
        outline = Outline.from_owners(owners, np.stack(counts, axis=1))  # (layers, sender, receiver)
    for f in [sent, *futures.values()]:
        f.release()
    return held, outline
