"""Data mode on Dask: every replica holds the whole model and a shard of each batch; the gradient values (one
flat array, the loss riding along as its last value) are summed by a tree of tasks pinned to the replicas'
workers, and every replica applies the same optimiser step."""

from __future__ import annotations

import uuid

import numpy as np

from ..runtime.graph import PinnedGraph, ref, tree_sum
from ..runtime.recovery import gather_watched, watch
from .device import array_module, take_batch
from .model import Model, apply_update, flatten, gradients, unflatten


def _d_grad(model: Model, xt: np.ndarray, labels: np.ndarray, idx: np.ndarray, scale: float) -> np.ndarray:
    # this replica's share of the batch; the loss rides along as the last value, so the reduction sums it too
    loss, grads = gradients(model, *take_batch(xt, labels, idx), scale)
    flat = flatten(grads)
    xp = array_module(flat)
    return xp.concatenate([flat, xp.asarray([loss])])


def _d_update(model: Model, total: np.ndarray, lr: float) -> Model:
    grads = unflatten(total[:-1], model.params)
    step = model.step + 1
    params, slots = apply_update(model.optimizer, model.params, grads, model.slots, lr, step)
    return Model(model.patterns, params, model.neurons, model.classes, model.bias, model.ymax, model.optimizer,
                 slots, step)


def _last(a: np.ndarray) -> float:
    return float(a[-1])


class DataRunner:
    """Data mode: replicas of the whole model, each on a shard of every batch, gradient values all-reduced."""

    def __init__(self, client, workers, model, xt, labels):
        self.client, self.workers = client, workers
        self.replicas = [client.scatter(model, workers=[w], hash=False) for w in workers]
        self.x = {w: client.scatter(xt, workers=[w], hash=False) for w in set(workers)}
        self.y = {w: client.scatter(labels, workers=[w], hash=False) for w in set(workers)}

    def run(self, steps: list[np.ndarray], lr: float, first: int) -> list[float]:
        graph = PinnedGraph(uuid.uuid4().hex[:8])
        r = len(self.workers)
        cur = list(self.replicas)
        loss_keys = []
        for s, idx in enumerate(steps, start=first):
            shards = np.array_split(idx, r)
            gk = [graph.add(w, f"grad-s{s}-r{i}", (_d_grad, cur[i] if s == first else ref(cur[i]), self.x[w],
                                                    self.y[w], shards[i], float(idx.size)))
                  for i, w in enumerate(self.workers)]
            root = tree_sum(graph, gk, self.workers, f"allreduce-s{s}")
            loss_keys.append(graph.add(self.workers[0], f"loss-s{s}", (_last, ref(root))))
            cur = [graph.add(w, f"model-s{s}-r{i}", (_d_update, cur[i] if s == first else ref(cur[i]), ref(root), lr))
                   for i, w in enumerate(self.workers)]
        futures = graph.submit(self.client, cur + loss_keys)
        watch(self.client, futures, set(self.workers))
        losses = gather_watched(self.client, futures[r:], self.workers)
        self.replicas = futures[:r]
        return losses

    def model(self) -> Model:
        return gather_watched(self.client, self.replicas[:1], self.workers[:1])[0]

    def close(self) -> None:
        """Let go of the replicas and the data scattered for them."""
        for f in list(self.replicas) + list(self.x.values()) + list(self.y.values()):
            f.release()  # (not client.cancel: tasks that used them may still be known to the scheduler)

    cancel = close

