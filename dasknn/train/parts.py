"""A model split into parts (model and hybrid modes): each part owns the columns (output neurons) the partition
gives it in every layer, with their values and optimiser state, and the rows of the head for the neurons it holds
after the last layer (part 0 also the head's bias).

The client splits and joins the arrays by position (:func:`split_model`, :func:`join_model`: it needs the owners
only); each part's worker makes the part's plan itself, from the owners and the layers' patterns
(:func:`make_part`, with the engine's worker-side plan of a part), as inference's model mode does.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import scipy.sparse as sp

from ..plan import PartLayer, part_plan_layer, send_counts
from .model import Model


def column_positions(indptr: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """Positions in a CSC ``data`` array of the entries of columns ``cols`` (in order)."""
    if cols.size == 0:
        return np.empty(0, dtype=np.int64)
    starts, ends = indptr[cols], indptr[cols + 1]
    lens = ends - starts
    return (np.repeat(starts - np.cumsum(lens) + lens, lens) + np.arange(lens.sum())).astype(np.int64)


@dataclass(frozen=True)
class PartArrays:
    """One part's share of a model's arrays, as the client cuts them: ``params`` is ``[values_1 .. values_L (its
    columns' entries), head rows, head bias (part 0; empty elsewhere)]``, ``slots[s]`` the optimiser state alike."""

    part: int
    params: list[np.ndarray]
    slots: list[list[np.ndarray]]
    step: int


def part_positions(model: Model, owners: np.ndarray, q: int) -> list[np.ndarray]:
    """Where part ``q``'s arrays sit in the model's: per layer the positions of its columns' entries, then the
    neurons it holds after the last layer (its head rows)."""
    pos = [column_positions(model.patterns[k - 1][0], np.flatnonzero(owners[k] == q)) for k in range(1, model.depth + 1)]
    pos.append(np.flatnonzero(owners[model.depth] == q))
    return pos


def split_model(model: Model, owners: np.ndarray) -> tuple[list[PartArrays], list[list[np.ndarray]]]:
    """Each part's :class:`PartArrays` and the positions of its arrays in the model's (:func:`part_positions`)."""
    depth, parts = model.depth, int(owners.max()) + 1
    out, positions = [], []
    for q in range(parts):
        pos = part_positions(model, owners, q)

        def take(arrays: list[np.ndarray], q: int = q, pos: list[np.ndarray] = pos) -> list[np.ndarray]:
            taken = [a[i] for a, i in zip(arrays[:depth], pos[:depth])]
            taken.append(arrays[depth][pos[depth]])
            taken.append(arrays[depth + 1] if q == 0 else arrays[depth + 1][:0])
            return taken

        out.append(PartArrays(q, take(model.params), [take(s) for s in model.slots], model.step))
        positions.append(pos)
    return out, positions


def join_model(model: Model, parts: list[PartArrays], positions: list[list[np.ndarray]]) -> Model:
    """The whole model back from its parts' arrays (``model`` gives the patterns and the shapes)."""
    depth = model.depth

    def put(arrays_of) -> list[np.ndarray]:
        out = [np.empty_like(p) for p in model.params]
        for part, pos in zip(parts, positions):
            arrays = arrays_of(part)
            for k in range(depth + 1):
                out[k][pos[k]] = arrays[k]
            if part.part == 0:
                out[depth + 1][:] = arrays[depth + 1]
        return out

    slots = [put(lambda part, s=s: part.slots[s]) for s in range(len(model.slots))]
    return Model(model.patterns, put(lambda part: part.params), model.neurons, model.classes, model.bias,
                 model.ymax, model.optimizer, slots, parts[0].step)


@dataclass
class TrainPart:
    """One part's state on its worker, between its steps: its plan, its columns' patterns indexed into the inputs
    it reads, its arrays (:class:`PartArrays`' layout), the step it is at and the layer rule."""

    part: int
    plan: list[PartLayer]
    patterns: list[tuple[np.ndarray, np.ndarray]]
    params: list[np.ndarray]
    slots: list[list[np.ndarray]]
    step: int
    bias: float
    ymax: float
    optimizer: str
    counts: np.ndarray = field(repr=False, default=None)

    @property
    def depth(self) -> int:
        return len(self.plan)

    def arrays(self) -> PartArrays:
        """Its arrays as the client joins them."""
        return PartArrays(self.part, self.params, self.slots, self.step)


def make_part(owners: np.ndarray, patterns: list[tuple[np.ndarray, np.ndarray]], arrays: PartArrays, bias: float,
              ymax: float, optimizer: str) -> TrainPart:
    """Part ``arrays.part``'s state, made on its worker: its plan for every layer (the engine's
    :func:`~dasknn.plan.part_plan_layer`, from the owners and the layers' patterns) and its
    columns' patterns, their rows the positions of their inputs among the inputs it reads."""
    q, parts, neurons = arrays.part, int(owners.max()) + 1, owners.shape[1]
    plan, local = [], []
    for k, (indptr, indices) in enumerate(patterns, start=1):
        w = sp.csc_matrix((np.ones(indices.size), indices, indptr), shape=(neurons, neurons))
        pl = part_plan_layer(w, owners[k - 1], owners[k], parts, q)
        p = column_positions(indptr, pl.outputs)
        lens = indptr[pl.outputs + 1] - indptr[pl.outputs]
        local.append((np.concatenate([[0], np.cumsum(lens)]).astype(np.int64),
                      np.searchsorted(pl.inputs, indices[p]).astype(np.int32)))
        plan.append(pl)
    return TrainPart(q, plan, local, list(arrays.params), [list(s) for s in arrays.slots], arrays.step, bias, ymax,
                     optimizer, counts=send_counts(plan, parts))
