"""Pipeline mode on Dask (inter-layer parallelism): the layers cut into consecutive stages, one per worker; each
step's batch split into micro-batches that flow forward through the stages and back; the weight gradients summed
per stage over the micro-batches, then one optimiser step per stage. With replicas (``--group-size`` G below the
workers K), K / G pipelines of G stages each share the batch, and the gradient values of a stage are summed across
the replicas (values only, a tree of tasks pinned to the stage's workers) before every replica applies the step.

A step ends with a flush: a stage's update waits for the gradients of all the micro-batches, and the next step's
forward waits for the update. That is what makes the losses those of one synchronous SGD step over the whole
batch, as in single mode (the loss and the logits' error are scaled by the whole batch's size, so the
micro-batches' and replicas' gradients add up to the batch's, up to rounding). Within a step, two orders
(``pipeline_schedule``), the same numbers and the same bubble:

- ``gpipe``, GPipe's fill and drain: the graph states only the data dependencies, each worker runs the stage tasks
  that are ready, so stage 0 runs every forward pass back to back and holds all M micro-batches' activations until
  its first backward pass;
- ``1f1b`` (PipeDream-Flush): stage ``s`` of K runs K - s forward passes, then one backward and one forward in
  turn, and holds at most K - s micro-batches' activations; stated in the graph, stage ``s``'s forward task of
  micro-batch ``m`` also waits for its backward task of ``m - (K - s)``. Each of those waits is a round trip
  through the later stages and the scheduler, which on short tasks costs more than GPipe's freedom (BENCHMARKS.md);
- ``auto`` (the default): GPipe where a cut of the stages fits its activations in the workers' memory
  (:func:`place_train_stages`), else 1F1B. ``stage_held_micro_batches`` in the result counts what each stage held.

One step of one replica is, per micro-batch ``m`` and stage ``s``, a forward task ``pf`` (the stage's layers on the
previous stage's activations, which Dask moves worker to worker as model mode's compact messages, the zeros left
out) and a backward task ``pb`` (the stage's weight
gradients and the error of its inputs, sent to the previous stage); the last stage's forward task computes the
loss and the logits' error and goes on with the stage's backward pass at once (its activations need not wait).
Then per stage ``pgrads`` (the micro-batches' gradients, summed in micro-batch order as their backward tasks end, so
a stage holds one sum and not a gradient per micro-batch) and ``pupdate`` (the last stage's returns the step's
losses): (2·K - 1)·M + 2·K tasks per step and pipeline. The stages' arrays (values, optimiser state, for the
nonzeros only) and each micro-batch's activations between its forward and backward tasks live in the worker's run
object (:mod:`dasknn.runtime.worker_runs`).
"""

from __future__ import annotations

import dataclasses
import threading
import time
import uuid
from dataclasses import dataclass, field

import numpy as np

from ..errors import DasknnError
from ..stages import StagePlacement, place_stages, stage_cuts
from ..kernels import back_input, pack_rows, unpack_rows, weight_grad
from ..runtime.graph import PinnedGraph, ref, refs, tree_sum
from ..runtime.recovery import gather_watched, memory_of
from ..runtime.worker_runs import close_run, run_figures, worker_run
from .model import OPT_SLOTS, Model, active, apply_update, flatten, forward_layer, softmax_xent, unflatten

__all__ = ["PIPELINE_SCHEDULES", "PipelineRunner", "TrainStagePlan", "held_micro_batches", "join_stages",
           "place_train_stages", "split_stages", "stage_layer_bytes", "train_stage_cuts"]

#: The orders of a step's micro-batches through the stages (:class:`PipelineRunner`): GPipe's fill and drain, 1F1B
#: (one forward, one backward in turn), or ``auto``: GPipe where its activations fit the workers, else 1F1B.
GPIPE, ONE_F_ONE_B, AUTO_SCHEDULE = "gpipe", "1f1b", "auto"
PIPELINE_SCHEDULES = (AUTO_SCHEDULE, GPIPE, ONE_F_ONE_B)

#: Share of a worker's memory limit its stage may take during a step (:func:`stage_layer_bytes`): below Dask's
#: spill target (``distributed.worker.memory.target``, 0.6), leaving room for the messages in flight and the
#: worker itself.
TRAIN_STAGE_SHARE = 0.5


def train_stage_cuts(entries: list[int], stages: int) -> list[tuple[int, int]]:
    """Consecutive layer ranges ``[lo, hi)`` (0-based) for ``stages`` stages, balanced by entries: the stages of
    :func:`dasknn.stages.stage_cuts` (the inference pipeline's cut, here on the entries alone: training runs every
    image through every layer), as training's slices of the model's layers.

    Parameters
    ----------
    entries
        Nonzeros of each layer, in order.
    stages
        Stages wanted, at most ``len(entries)``.
    """
    depth = len(entries)
    if not 1 <= stages <= depth:
        raise DasknnError(f"pipeline mode: {stages} stages need at least as many layers, the network has {depth}")
    return [(s.first - 1, s.last) for s in stage_cuts(entries, stages)]


def held_micro_batches(pipeline_schedule: str, micro_batches: int, stages: int) -> int:
    """The most micro-batches whose activations a stage holds at once under ``pipeline_schedule`` (GPipe: all of
    them; 1F1B: ``stages - s`` at stage ``s``, so ``stages`` at most)."""
    return micro_batches if pipeline_schedule == GPIPE else min(micro_batches, stages)


def stage_layer_bytes(model: Model, micro_batches: int, images: int, held: int) -> np.ndarray:
    """The most bytes each layer of ``model`` takes on its stage's worker during a step of ``images`` images (a
    replica's share of a batch) in ``micro_batches`` micro-batches: its values, optimiser state and pattern, four
    gradients' worth (a micro-batch's, its flat copy, the running sum, the all-reduced total), and its output's
    activations (dense float64 blocks) for the ``held`` micro-batches a stage holds at once between their forward
    and backward passes (:func:`held_micro_batches`).

    Parameters
    ----------
    model
        The model whose layers are cut.
    micro_batches
        Micro-batches per replica's share of a batch.
    images
        Images in a replica's share of a batch (0: activations not counted).
    held
        Micro-batches whose activations a stage holds at once.
    """
    copies = 1 + OPT_SLOTS[model.optimizer] + 4
    values = np.array([p.nbytes for p in model.params[:model.depth]], dtype=float)
    pattern = np.array([a.nbytes + b.nbytes for a, b in model.patterns], dtype=float)
    held_images = min(images, held * -(-images // micro_batches)) if micro_batches else 0
    return values * copies + pattern + float(model.neurons * held_images * 8)


@dataclass(frozen=True)
class TrainStagePlan:
    """Where a training pipeline's stages go (:func:`place_train_stages`) and the order of the micro-batches
    (``gpipe`` or ``1f1b``) their memory was counted for."""

    placement: StagePlacement
    pipeline_schedule: str


def place_train_stages(model: Model, replicas: list[list[str]], memory: dict[str, float], micro_batches: int,
                       images: int, pipeline_schedule: str = AUTO_SCHEDULE) -> TrainStagePlan:
    """The stages of ``model`` for the pipelines ``replicas`` whose workers have the memory limits ``memory``
    (bytes, by worker): balanced by entries (training runs every image through every layer) among the cuts whose
    stages fit :data:`TRAIN_STAGE_SHARE` of their workers' limits (:func:`stage_layer_bytes` under
    ``pipeline_schedule``), the workers placed by their limits where these differ
    (:func:`dasknn.stages.place_stages`). A worker that holds several places (fewer workers than stages) splits
    its memory between them. The placement's ``fits`` is False where no cut fits (the cut is then by entries
    alone). With ``auto``, GPipe (the faster where tasks are short: BENCHMARKS.md) where a cut fits its
    activations, else 1F1B.
    """
    places = [w for ws in replicas for w in ws]
    per_place = {w: memory[w] / places.count(w) for w in set(places)}
    entries = [int(p.size) for p in model.params[:model.depth]]
    stages = len(replicas[0])
    if not 1 <= stages <= len(entries):
        train_stage_cuts(entries, stages)  # (its one-line refusal)
    tried = (GPIPE, ONE_F_ONE_B) if pipeline_schedule == AUTO_SCHEDULE else (pipeline_schedule,)
    for one in tried:
        sizes = stage_layer_bytes(model, micro_batches, images, held_micro_batches(one, micro_batches, stages))
        placed = place_stages(entries, sizes, replicas, per_place, TRAIN_STAGE_SHARE)
        if placed.fits:
            break
    return TrainStagePlan(placed, one)


@dataclass(frozen=True)
class StageArrays:
    """One stage's share of a model: layers ``lo + 1 .. hi`` (1-based) with their patterns, values and optimiser
    state, and (the last stage) the dense head. ``params`` is ``[values_lo+1 .. values_hi, (head_w, head_b)]``,
    ``slots[i]`` optimiser state ``i`` alike."""

    stage: int
    lo: int
    hi: int
    last: bool
    patterns: tuple
    params: tuple
    slots: tuple
    step: int
    neurons: int
    bias: float
    ymax: float
    optimizer: str


def split_stages(model: Model, cuts: list[tuple[int, int]]) -> list[StageArrays]:
    """Each stage's :class:`StageArrays` (views of the model's arrays)."""
    out = []
    for s, (lo, hi) in enumerate(cuts):
        last = s == len(cuts) - 1

        def take(arrays: list[np.ndarray], lo: int = lo, hi: int = hi, last: bool = last) -> tuple:
            return tuple(arrays[lo:hi]) + (tuple(arrays[-2:]) if last else ())

        out.append(StageArrays(s, lo, hi, last, tuple(model.patterns[lo:hi]), take(model.params),
                               tuple(take(slot) for slot in model.slots), model.step, model.neurons, model.bias,
                               model.ymax, model.optimizer))
    return out


def join_stages(model: Model, stages: list[StageArrays]) -> Model:
    """The whole model back from its stages' arrays (``model`` gives the patterns and the rest)."""

    def put(arrays_of) -> list[np.ndarray]:
        layers = [a for st in stages for a in arrays_of(st)[:st.hi - st.lo]]
        return layers + list(arrays_of(stages[-1])[-2:])

    slots = [put(lambda st, i=i: st.slots[i]) for i in range(len(model.slots))]
    return Model(model.patterns, put(lambda st: st.params), model.neurons, model.classes, model.bias, model.ymax,
                 model.optimizer, slots, stages[0].step)


# worker side: the run object and the tasks


@dataclass(frozen=True)
class PipeRunSpec:
    """One pipeline training run as its workers know it: its id."""

    run: str

    def open(self) -> PipeRun:
        return PipeRun()


@dataclass
class GradientSum:
    """A stage's gradient values summed over a step's micro-batches as their backward passes end: the sum of the
    first ``added`` of them, and those that ended before their turn."""

    total: np.ndarray | None = None
    added: int = 0
    waiting: dict = field(default_factory=dict)  # micro-batch -> its flat gradient values


@dataclass
class PipeRun:
    """What a pipeline run keeps on one worker: its stages' arrays (by replica and stage), each micro-batch's
    activations between its forward and backward tasks, its gradients until the stage sums them, and the seconds
    each stage's tasks were busy (for the bubble's share)."""

    stages: dict = field(default_factory=dict)  # (replica, stage) -> StageArrays
    saved: dict = field(default_factory=dict)  # (step, replica, stage, micro) -> activations, until the backward
    losses: dict = field(default_factory=dict)  # (step, replica, last stage, micro) -> the micro-batch's loss
    sums: dict = field(default_factory=dict)  # (step, replica, stage) -> the micro-batches' GradientSum so far
    busy: dict = field(default_factory=dict)  # "r{replica}-s{stage}" -> seconds in forward/backward/update
    held: dict = field(default_factory=dict)  # "r{replica}-s{stage}" -> most micro-batches' activations held at once
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add_busy(self, replica: int, stage: int, seconds: float) -> None:
        with self.lock:
            key = f"r{replica}-s{stage}"
            self.busy[key] = self.busy.get(key, 0.0) + seconds

    def add_gradients(self, task: MicroTask, flat: np.ndarray) -> None:
        """Add a micro-batch's gradient values (one flat array) to its stage's sum for the step, in micro-batch
        order: one arriving early waits for those before it, so the sum does not depend on the tasks' timing."""
        with self.lock:
            acc = self.sums.setdefault((task.step, task.replica, task.stage), GradientSum())
            acc.waiting[task.micro] = flat
            while acc.added in acc.waiting:
                g = acc.waiting.pop(acc.added)
                if acc.total is None:
                    acc.total = g
                else:
                    acc.total += g
                acc.added += 1

    def save(self, task: MicroTask, activations: list[np.ndarray]) -> None:
        """Keep a micro-batch's activations for its backward task, counting the most a stage holds at once."""
        with self.lock:
            self.saved[task.key] = activations
            now = sum(1 for k in self.saved if k[1:3] == (task.replica, task.stage))
            name = f"r{task.replica}-s{task.stage}"
            self.held[name] = max(self.held.get(name, 0), now)

    def figures(self) -> dict:
        return {"busy": dict(self.busy), "held": dict(self.held)}

    def close(self) -> None:
        self.stages.clear()
        self.saved.clear()
        self.losses.clear()
        self.sums.clear()


def pipe_run(run: str) -> PipeRun:
    """Pipeline run ``run``'s object in this process (made on first use)."""
    return worker_run(PipeRunSpec(run))


@dataclass(frozen=True)
class MicroTask:
    """Micro-batch ``micro`` of step ``step`` at stage ``stage`` of replica ``replica``, in run ``run``."""

    run: str
    step: int
    replica: int
    stage: int
    micro: int

    @property
    def key(self) -> tuple[int, int, int, int]:
        return self.step, self.replica, self.stage, self.micro


def setup_stage(run: str, replica: int, arrays: StageArrays) -> int:
    """Keep a stage's arrays in the run on this worker; its number of values."""
    pipe_run(run).stages[(replica, arrays.stage)] = arrays
    return sum(int(p.size) for p in arrays.params)


def stage_arrays(run: str, replica: int, stage: int) -> StageArrays:
    """A stage's arrays as they are now (for the client to join them)."""
    found = pipe_run(run).stages.get((replica, stage))
    if found is None:
        raise DasknnError(f"training: stage {stage} of replica {replica} has no state on this worker")
    return found


def _message(block: np.ndarray | None) -> tuple | None:
    # what crosses a stage boundary: all the rows of the block, as model mode's compact messages (the zeros of
    # the activations and of the errors left out; lossless)
    return None if block is None else pack_rows(block, np.arange(block.shape[0]), None, True)


def _block(message: tuple) -> np.ndarray:
    out = np.empty((int(message[0][0]), int(message[0][1])))
    unpack_rows(message, out)
    return out


def forward_stage(task: MicroTask, inputs, idx: np.ndarray, labels, scale: float, after) -> tuple | float | None:
    """The stage's layers on a micro-batch: the images ``idx`` of ``inputs`` (the training images, stage 0) or the
    previous stage's activations (a compact message). Returns the activations for the next stage, as a message.
    The last stage goes on at once: the micro-batch's loss (scaled by the whole batch, kept for the update task to
    return), then the stage's backward pass (:func:`backward_stage`'s work), and returns the error of its inputs
    for the previous stage, as a message."""
    t0 = time.perf_counter()
    run = pipe_run(task.run)
    st = run.stages[(task.replica, task.stage)]
    xin = inputs[:, idx] if task.stage == 0 else _block(inputs)
    ys = [np.ascontiguousarray(xin, dtype=np.float64)]
    for (indptr, indices), values in zip(st.patterns, st.params):
        ys.append(forward_layer(ys[-1], indptr, indices, values, st.bias, st.ymax))
    if st.last:
        hw, hb = st.params[-2], st.params[-1]
        run.losses[task.key], dlog = softmax_xent(hw.T @ ys[-1] + hb[:, None], labels[idx], scale)
        out = _message(_backward(run, st, task, ys, dlog, None))
    else:
        run.save(task, ys)
        out = _message(ys[-1])
    run.add_busy(task.replica, task.stage, time.perf_counter() - t0)
    return out


def backward_stage(task: MicroTask, error: tuple, after) -> tuple | None:
    """A stage's layers backwards on a micro-batch (all but the last stage, whose forward task does it), from the
    error of its outputs that the next stage returned (a message); keeps its weight gradients; returns the error of
    its inputs as a message (None at stage 0, whose inputs are the images)."""
    t0 = time.perf_counter()
    run = pipe_run(task.run)
    st = run.stages[(task.replica, task.stage)]
    g = _message(_backward(run, st, task, run.saved.pop(task.key), None, _block(error)))
    run.add_busy(task.replica, task.stage, time.perf_counter() - t0)
    return g


def _backward(run: PipeRun, st: StageArrays, task: MicroTask, ys: list[np.ndarray], dlog, error) -> np.ndarray | None:
    # the stage's gradients, from the logits' error (last stage) or its outputs' error, kept in the run; returns
    # the error of its inputs (None at stage 0)
    grads: list = [None] * len(st.params)
    g = error
    if st.last:
        hw = st.params[-2]
        grads[-2], grads[-1] = ys[-1] @ dlog.T, dlog.sum(axis=1)
        g = hw @ dlog
    for j in range(st.hi - st.lo - 1, -1, -1):
        indptr, indices = st.patterns[j]
        delta = g * active(ys[j + 1], st.ymax)
        grads[j] = weight_grad(indptr, indices, ys[j], delta)
        g = back_input(indptr, indices, st.params[j], delta, st.neurons) if j > 0 or task.stage > 0 else None
    run.add_gradients(task, flatten(grads))
    return g


def stage_gradients(task: MicroTask, micros: int, after) -> np.ndarray:
    """The stage's gradient values over its ``micros`` micro-batches of the step, summed in micro-batch order as
    their backward passes ended (:meth:`PipeRun.add_gradients`), as one flat array."""
    run = pipe_run(task.run)
    acc = run.sums.pop((task.step, task.replica, task.stage), GradientSum())
    if micros == 0:  # (a replica whose share of a short batch is empty)
        return np.zeros(sum(int(p.size) for p in run.stages[(task.replica, task.stage)].params))
    if acc.added != micros:
        raise DasknnError(f"training: stage {task.stage} of replica {task.replica} summed {acc.added} of its "
                          f"{micros} micro-batches' gradients at step {task.step}")
    return acc.total


def apply_stage(task: MicroTask, lr: float, total: np.ndarray, micros: int) -> list[float] | None:
    """The optimiser step of the stage from its gradient values (summed over the micro-batches and replicas). The
    last stage returns its ``micros`` micro-batches' losses of the step, in order."""
    t0 = time.perf_counter()
    run = pipe_run(task.run)
    st = run.stages[(task.replica, task.stage)]
    step = st.step + 1
    params, slots = apply_update(st.optimizer, list(st.params), unflatten(total, list(st.params)),
                                 [list(s) for s in st.slots], lr, step)
    run.stages[(task.replica, task.stage)] = dataclasses.replace(
        st, params=tuple(params), slots=tuple(tuple(s) for s in slots), step=step)
    run.add_busy(task.replica, task.stage, time.perf_counter() - t0)
    if not st.last:
        return None
    return [run.losses.pop(dataclasses.replace(task, micro=m).key) for m in range(micros)]


# client side: the graphs


class PipelineRunner:
    """Pipeline mode: ``replicas`` (lists of workers, one per stage) of the model cut into consecutive stages,
    each replica on its share of every batch, ``micro_batches`` micro-batches per share.

    Same interface as :class:`~dasknn.train.data_mode.DataRunner`: ``run``, ``model``, ``close``, ``cancel``,
    ``workers``; and ``figures`` (the seconds each stage's tasks were busy). The stages are cut and the workers
    placed by their memory limits (:func:`place_train_stages`, a step of ``batch`` images); where no cut fits them
    the runner refuses in one line."""

    def __init__(self, client, replicas: list[list[str]], model: Model, xt: np.ndarray, labels: np.ndarray,
                 micro_batches: int = 4, batch: int = 0, pipeline_schedule: str = AUTO_SCHEDULE):
        if micro_batches < 1:
            raise DasknnError(f"--micro-batches must be at least 1, not {micro_batches}")
        if pipeline_schedule not in PIPELINE_SCHEDULES:
            raise DasknnError(f"--pipeline-schedule must be one of {', '.join(PIPELINE_SCHEDULES)}, "
                              f"not {pipeline_schedule!r}")
        images, stages = -(-batch // len(replicas)), len(replicas[0])
        plan = place_train_stages(model, replicas, memory_of(client, sorted(set(w for ws in replicas for w in ws))),
                                  micro_batches, images, pipeline_schedule)
        placed, self.pipeline_schedule = plan.placement, plan.pipeline_schedule
        if not placed.fits:
            held = held_micro_batches(plan.pipeline_schedule, micro_batches, stages)
            need = stage_layer_bytes(model, micro_batches, images, held).sum()
            raise DasknnError(
                f"pipeline mode: the model's training state ({need / 1e9:.2f} GB a replica, {micro_batches} "
                f"micro-batches of {images} images, {plan.pipeline_schedule}) fits no cut into {stages} stages on "
                f"these workers (a stage may take {TRAIN_STAGE_SHARE:.0%} of its worker's memory limit): use more "
                f"workers or stages, fewer images a step, or workers with more memory")
        replicas = placed.groups
        self.client, self.replicas, self.template, self.micro_batches = client, replicas, model, micro_batches
        self.workers = [w for ws in replicas for w in ws]
        self.cuts = [(s.first - 1, s.last) for s in placed.stages]
        self.run_id, self.graphs = uuid.uuid4().hex[:8], 0
        arrays = split_stages(model, self.cuts)
        graph = PinnedGraph(self.run_id)
        scattered = [client.scatter(arrays[s], workers=[w], hash=False) for ws in replicas for s, w in enumerate(ws)]
        keys = [graph.add(w, f"psetup-r{r}-s{s}", (setup_stage, self.run_id, r, scattered[r * len(ws) + s]))
                for r, ws in enumerate(replicas) for s, w in enumerate(ws)]
        futures = graph.submit(client, keys)
        gather_watched(client, futures, self.workers)
        for f in scattered:
            f.release()
        # the images where the first stages run, the labels where the last ones do
        self.x = {w: client.scatter(xt, workers=[w], hash=False) for w in {ws[0] for ws in replicas}}
        self.y = {w: client.scatter(labels, workers=[w], hash=False) for w in {ws[-1] for ws in replicas}}

    @property
    def stages(self) -> int:
        return len(self.replicas[0])

    def run(self, steps: list[np.ndarray], lr: float, first: int) -> list[float]:
        """Run ``steps`` (each a batch's image indices) from step ``first``; the losses, one per step."""
        self.graphs += 1
        graph = PinnedGraph(f"{self.run_id}x{self.graphs}")
        updated: dict[tuple[int, int], str] = {}  # (replica, stage) -> its last update in this graph
        loss_keys: list[list[str]] = []  # per step, each replica's last stage's update (its micro-batches' losses)
        last = self.stages - 1
        for t, idx in enumerate(steps, start=first):
            shares = np.array_split(idx, len(self.replicas))
            flats, micros = [], []
            for r, share in enumerate(shares):
                parts = [m for m in np.array_split(share, self.micro_batches) if m.size]
                flats.append(self._replica_step(graph, t, r, parts, float(idx.size), updated))
                micros.append(len(parts))
            for s in range(self.stages):
                # stage s of every replica holds the same layers: sum their gradient values (values only)
                root = tree_sum(graph, [flats[r][s] for r in range(len(self.replicas))],
                                [ws[s] for ws in self.replicas], f"pallreduce-t{t}-s{s}")
                for r, ws in enumerate(self.replicas):
                    updated[(r, s)] = graph.add(ws[s], f"pupdate-t{t}-r{r}-s{s}", (
                        apply_stage, MicroTask(self.run_id, t, r, s, 0), lr, ref(root), micros[r]))
            loss_keys.append([updated[(r, last)] for r in range(len(self.replicas))])
        flat_losses = [k for keys in loss_keys for k in keys]
        rest = [k for (_, s), k in updated.items() if s != last]  # (waited for: the next graph starts from them)
        futures = graph.submit(self.client, flat_losses + rest)
        values = gather_watched(self.client, futures, self.workers)
        out, at = [], 0
        for keys in loss_keys:
            # the micro-batches' and replicas' losses are shares of the batch's loss: their sum, in order
            out.append(float(sum(v for shares in values[at:at + len(keys)] for v in shares)))
            at += len(keys)
        return out

    def _replica_step(self, graph: PinnedGraph, t: int, r: int, micros: list[np.ndarray], scale: float,
                      updated: dict) -> list[str]:
        # step t of replica r: forward tasks micro-batch by micro-batch through the stages (the last stage's goes on
        # backwards), backward tasks back; returns each stage's summed gradients' key
        ws, stages = self.replicas[r], self.stages
        back: list[list[str]] = [[] for _ in range(stages)]
        for m, idx in enumerate(micros):
            fwd, prev = [], None
            for s in range(stages):
                # besides its inputs a forward task waits for the previous step's update of its stage and (1F1B) for
                # the stage's backward task of micro-batch m - (stages - s): a stage holds at most stages - s
                # micro-batches' activations (the last stage's forward task does its backward pass itself)
                waits = [updated[(r, s)]] if (r, s) in updated else []
                if self.pipeline_schedule == ONE_F_ONE_B and s < stages - 1 and m >= stages - s:
                    waits.append(back[s][m - (stages - s)])
                after = refs(waits)
                inputs = self.x[ws[0]] if s == 0 else ref(prev)
                labels = self.y[ws[-1]] if s == stages - 1 else None
                prev = graph.add(ws[s], f"pf-t{t}-r{r}-s{s}-m{m}", (
                    forward_stage, MicroTask(self.run_id, t, r, s, m), inputs, idx, labels, scale, after))
                fwd.append(prev)
            back[-1].append(prev)
            for s in range(stages - 2, -1, -1):
                prev = graph.add(ws[s], f"pb-t{t}-r{r}-s{s}-m{m}", (
                    backward_stage, MicroTask(self.run_id, t, r, s, m), ref(prev), ref(fwd[s])))
                back[s].append(prev)
        return [graph.add(ws[s], f"pgrads-t{t}-r{r}-s{s}", (
            stage_gradients, MicroTask(self.run_id, t, r, s, 0), len(micros), refs(back[s]))) for s in range(stages)]

    def model(self) -> Model:
        """The model as the stages of replica 0 hold it now."""
        graph = PinnedGraph(uuid.uuid4().hex[:8])
        keys = [graph.add(w, f"pstage-s{s}", (stage_arrays, self.run_id, 0, s)) for s, w in enumerate(self.replicas[0])]
        futures = graph.submit(self.client, keys)
        return join_stages(self.template, gather_watched(self.client, futures, self.replicas[0]))

    def figures(self) -> dict:
        """Seconds each stage's tasks (forward, backward, update) were busy in this run, by ``"r{replica}-s{stage}"``,
        summed over the workers; and each stage's layers (1-based, first and last)."""
        busy: dict[str, float] = {}
        held: dict[str, int] = {}
        for found in self.client.run(run_figures, self.run_id, on_error="ignore").values():
            if isinstance(found, dict):
                for key, seconds in found.get("busy", {}).items():
                    busy[key] = busy.get(key, 0.0) + seconds
                for key, count in found.get("held", {}).items():
                    held[key] = max(held.get(key, 0), count)
        return {"stage_busy_seconds": busy, "stage_layers": [[lo + 1, hi] for lo, hi in self.cuts],
                "stage_held_micro_batches": held, "pipeline_schedule": self.pipeline_schedule}

    def close(self) -> None:
        """Let go of the run on the workers (its stages' states) and of the data scattered for it."""
        for f in list(self.x.values()) + list(self.y.values()):
            f.release()  # (not client.cancel: tasks that used them may still be known to the scheduler)
        self.client.run(close_run, self.run_id, on_error="ignore")

    cancel = close
