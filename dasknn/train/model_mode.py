"""Model and hybrid mode on Dask: the layers' columns split into parts (values, optimiser state and head rows
per part, :mod:`.parts`), each part's state made and kept by its worker's run (:mod:`.worker_run`), the boundary
activations sent forward and the errors sent back through the exchange seam (:mod:`dasknn.runtime.exchange`) as
inference's compact messages; in hybrid mode, groups of parts split each batch and all-reduce each part's gradient
values.

One step of one group is a chain of tasks per part, pinned to its worker: ``batch`` (its pixels of the batch, and
the rows others read in layer 1), ``fwd-l{k}`` (layer k from what it holds and what it received; then the rows
others read in layer k + 1, or, after the last layer, its share of the logits to part 0), ``loss`` (part 0: the
loss and the logits' error, sent to every part), ``back-l{k}`` from the last layer down (the error of its outputs,
its values' gradient, and the errors of the inputs it received, returned to their owners) and ``state`` (the
optimiser step; in hybrid mode ``grads``, a tree sum between the groups' copies of the part, then ``state``).
"""

from __future__ import annotations

import dataclasses
import uuid
from dataclasses import dataclass

import numpy as np

from .. import kernels
from ..kernels import back_input, weight_grad
from ..runtime.exchange import Exchange, exchange_for
from ..runtime.exchange.choice import choose_exchange
from ..runtime.graph import PinnedGraph, pairwise_sum, ref, refs_of, tree_sum
from ..runtime.recovery import gather_watched, watch
from ..runtime.scatter import scatter_to_all
from ..runtime.worker_runs import close_run, run_figures
from .model import Model, active, apply_update, flatten, forward_layer, softmax_xent, unflatten
from .parts import PartArrays, column_positions, join_model, make_part, split_model
from .worker_run import TrainRun, train_run

__all__ = ["ModelRunner", "column_positions", "join_model", "split_model"]


@dataclass(frozen=True)
class StepTag:
    """What a training message is for, in step ``step`` of group ``group``: ``fwd``, the rows a part reads in layer
    ``layer``; ``logits``, a part's share of the logits (to part 0); ``dlog``, the logits' error (from part 0);
    ``back``, the errors of the inputs of layer ``layer``, returned to the parts that sent them."""

    step: int
    group: int
    layer: int
    kind: str


@dataclass(frozen=True)
class ReduceTag:
    """What an all-reduce message is for (hybrid mode with a transport that delivers messages itself): step
    ``step``'s gradient values of part ``part``, between the groups' copies of the part."""

    step: int
    part: int


@dataclass(frozen=True)
class PartRoutes:
    """Whom one part sends rows to (``sends[k - 1]``) and receives rows from (``hears[k - 1]``) in layer ``k``'s
    forward pass; the backward pass returns the errors the other way."""

    sends: tuple[tuple[int, ...], ...]
    hears: tuple[tuple[int, ...], ...]


@dataclass(frozen=True)
class PartTask:
    """Whose task it is: part ``part`` of group ``group`` in step ``step`` of run ``run``, whose messages go
    through ``exchange``."""

    run: str
    group: int
    part: int
    step: int
    exchange: Exchange

    def tag(self, layer: int, kind: str) -> StepTag:
        return StepTag(self.step, self.group, layer, kind)


# worker side: what each task does


def setup_part(run: str, group: int, shared: tuple, arrays: PartArrays, bias: float, ymax: float, optimizer: str
               ) -> np.ndarray:
    """Make part ``arrays.part``'s state on this worker (its plan too, from ``shared``: the owners and the layers'
    patterns) and keep it in the run; its send counts."""
    owners, patterns = shared
    part = make_part(owners, patterns, arrays, bias, ymax, optimizer)
    train_run(run).parts[(group, arrays.part)] = part
    return part.counts


def part_arrays(run: str, group: int, q: int) -> PartArrays:
    """Part ``q``'s arrays as they are now (for the client to join them)."""
    return train_run(run).part(group, q).arrays()


def _at(task: PartTask) -> tuple[TrainRun, object, object]:
    run = train_run(task.run)
    return run, run.part(task.group, task.part), run.step_work(task.step, task.group, task.part)


def _received(task: PartTask, run: TrainRun, tag: StepTag, senders: tuple[int, ...], inbox: list, rows_of) -> list:
    # each sender's message under ``tag``, unpacked into a fresh array of ``rows_of(sender)`` rows
    out = []
    for p, (_, message) in zip(senders, task.exchange.collect(run.endpoint, tag, task.part, senders, inbox)):
        rows = np.empty((rows_of(p), int(message[0][1])))
        kernels.unpack_rows(message, rows)
        out.append((p, rows))
    return out


def _post_rows(task: PartTask, run: TrainRun, tag: StepTag, block: np.ndarray, rows: dict[int, np.ndarray],
               recipients: tuple[int, ...]) -> object:
    # the rows of ``block`` each recipient reads, as compact messages
    messages = {r: kernels.pack_rows(block, rows[r], None, True) for r in recipients}
    return task.exchange.post(run.endpoint, tag, task.part, recipients, messages)


def batch(task: PartTask, x_part: np.ndarray, idx: np.ndarray, recipients: tuple[int, ...], after) -> object:
    """The part's pixels of the step's batch; sends the rows other parts read in layer 1."""
    run, part, work = _at(task)
    work.outputs[0] = np.ascontiguousarray(x_part[:, idx])
    return _post_rows(task, run, task.tag(1, "fwd"), work.outputs[0], part.plan[0].send, recipients)


def forward(task: PartTask, k: int, senders: tuple[int, ...], recipients: tuple[int, ...], after, inbox: list
            ) -> object:
    """Layer ``k`` of the part: its inputs from its previous outputs and the rows received; then the rows others
    read in layer ``k + 1``, or, after the last layer, its share of the logits to part 0."""
    run, part, work = _at(task)
    pl, prev = part.plan[k - 1], work.outputs[k - 1]
    xin = np.empty((pl.inputs.size, prev.shape[1]))
    xin[pl.local[0]] = prev[pl.local[1]]
    for p, rows in _received(task, run, task.tag(k, "fwd"), senders, inbox, lambda p: pl.recv[p].size):
        xin[pl.recv[p]] = rows
    indptr, indices = part.patterns[k - 1]
    y = forward_layer(xin, indptr, indices, part.params[k - 1], part.bias, part.ymax)
    work.inputs[k], work.outputs[k] = xin, y
    if k < part.depth:
        return _post_rows(task, run, task.tag(k + 1, "fwd"), y, part.plan[k].send, recipients)
    partial = part.params[-2].T @ y
    if task.part == 0:
        work.partial_logits = partial
        return task.exchange.post(run.endpoint, task.tag(k, "logits"), 0, (), {})
    return task.exchange.post(run.endpoint, task.tag(k, "logits"), task.part, (0,), {0: partial})


def loss(task: PartTask, labels: np.ndarray, idx: np.ndarray, scale: float, senders: tuple[int, ...], after,
         inbox: list) -> object:
    """Part 0: the logits (its share, then the others' in part order), the loss, and the logits' error, sent to
    every other part. The loss and the error are scaled by the whole batch, so the groups' gradients add up."""
    run, part, work = _at(task)
    lg = work.partial_logits.copy()
    for _, partial in task.exchange.collect(run.endpoint, task.tag(part.depth, "logits"), 0, senders, inbox):
        lg += partial
    run.losses[(task.step, task.group)], work.dlog = softmax_xent(lg + part.params[-1][:, None], labels[idx], scale)
    others = tuple(range(1, len(task.exchange.workers)))
    return task.exchange.post(run.endpoint, task.tag(part.depth, "dlog"), 0, others, {}, work.dlog)


def backward(task: PartTask, k: int, senders: tuple[int, ...], recipients: tuple[int, ...], after, inbox: list
             ) -> object:
    """Layer ``k`` of the part, backwards: the error of its outputs (from the logits' error after the last layer;
    else its own share and what the parts it sent to returned), its values' gradient, and the errors of the inputs
    it received, returned to their senders."""
    run, part, work = _at(task)
    if k == part.depth:
        dlog = work.dlog if task.part == 0 else task.exchange.collect(
            run.endpoint, task.tag(k, "dlog"), task.part, (0,), inbox)[0][0]
        g = part.params[-2] @ dlog
        work.head = (work.outputs[k] @ dlog.T, dlog.sum(axis=1) if task.part == 0 else part.params[-1][:0])
    else:
        above, gin = part.plan[k], work.passed_down.pop(k + 1)
        g = np.zeros((part.plan[k - 1].outputs.size, gin.shape[1]))
        g[above.local[1]] += gin[above.local[0]]
        for p, rows in _received(task, run, task.tag(k + 1, "back"), senders, inbox, lambda p: above.send[p].size):
            g[above.send[p]] += rows
    xin, y = work.inputs.pop(k), work.outputs.pop(k)
    indptr, indices = part.patterns[k - 1]
    delta = g * active(y, part.ymax)
    work.grads[k] = weight_grad(indptr, indices, xin, delta)
    if k == 1:
        return task.exchange.post(run.endpoint, task.tag(k, "back"), task.part, (), {})
    work.passed_down[k] = back_input(indptr, indices, part.params[k - 1], delta, xin.shape[0])
    return _post_rows(task, run, task.tag(k, "back"), work.passed_down[k], part.plan[k - 1].recv, recipients)


def _gradients(run: TrainRun, task: PartTask) -> list[np.ndarray]:
    # the part's gradients of the step, aligned with its arrays; the step's work is done with
    work = run.end_step(task.step, task.group, task.part)
    return [work.grads[k] for k in sorted(work.grads)] + list(work.head)


def _apply(run: TrainRun, task: PartTask, grads: list[np.ndarray], lr: float) -> float | None:
    # the optimiser step on the part's arrays; part 0 returns its group's loss of the step
    part = run.part(task.group, task.part)
    part.step += 1
    part.params, part.slots = apply_update(part.optimizer, part.params, grads, part.slots, lr, part.step)
    return run.losses.pop((task.step, task.group), None) if task.part == 0 else None


def update(task: PartTask, lr: float, after) -> float | None:
    """Model mode: the part's optimiser step from its own gradients (no traffic)."""
    run = train_run(task.run)
    return _apply(run, task, _gradients(run, task), lr)


def gradients(task: PartTask, after) -> np.ndarray:
    """Hybrid mode: the part's gradient values as one flat array, for the all-reduce between groups."""
    return flatten(_gradients(train_run(task.run), task))


def apply(task: PartTask, lr: float, total: np.ndarray) -> float | None:
    """Hybrid mode: the optimiser step from the gradient values summed over the groups."""
    run = train_run(task.run)
    return _apply(run, task, unflatten(total, run.part(task.group, task.part).params), lr)


def run_part_steps(task: PartTask, steps: tuple[tuple[int, np.ndarray, float], ...], x_part: np.ndarray, labels,
                   lr: float, routes: PartRoutes, replicas: Exchange | None, after) -> list[float]:
    """A transport that delivers messages itself: the part's whole chunk of ``steps`` (each ``(step, its group's
    share of the batch, the batch's size)``) in one task, the same calls as the task graph makes, exchanging as it
    goes. ``replicas`` (hybrid mode) all-reduces the gradient values between the groups' copies of the part (the
    group is the replica's place there), summed in :func:`~dasknn.runtime.graph.tree_sum`'s order. Returns part
    0's losses (its group's shares), one per step."""
    q, depth = task.part, len(routes.sends)
    parts = len(task.exchange.workers)
    losses = []
    for s, idx, scale in steps:
        t = dataclasses.replace(task, step=s)
        batch(t, x_part, idx, routes.sends[0], None)
        for k in range(1, depth + 1):
            forward(t, k, routes.hears[k - 1], routes.sends[k] if k < depth else ((0,) if q else ()), None, [])
        if q == 0:
            loss(t, labels, idx, scale, tuple(range(1, parts)), None, [])
        for k in range(depth, 0, -1):
            backward(t, k, routes.sends[k] if k < depth else (), routes.hears[k - 1] if k > 1 else (), None, [])
        if replicas is None:
            value = update(t, lr, None)
        else:
            value = apply(t, lr, _all_reduced(t, replicas, gradients(t, None)))
        if q == 0:
            losses.append(value)
    return losses


def _all_reduced(task: PartTask, replicas: Exchange, flat: np.ndarray) -> np.ndarray:
    # every copy of the part sends its gradient values to the others and sums all of them in the same order
    run, a = train_run(task.run), task.group
    tag, others = ReduceTag(task.step, task.part), tuple(g for g in range(len(replicas.workers)) if g != a)
    replicas.post(run.endpoint, tag, a, others, {}, flat)
    received = dict(zip(others, (shared for shared, _ in replicas.collect(run.endpoint, tag, a, others, []))))
    return pairwise_sum([flat if g == a else received[g] for g in range(len(replicas.workers))])


# client side: the graphs


class ModelRunner:
    """Model mode (one group of parts) and hybrid mode (several groups, each a model-mode copy of the partitioned
    model on its share of the batch, the gradient values of corresponding parts all-reduced between groups).

    Each part's state is made and kept by its worker (:func:`setup_part`); the client keeps the owners, the
    exchange's counts (who sends whom how many entries in each layer) and the positions to join the parts by."""

    def __init__(self, client, groups: list[list[str]], model: Model, owners: np.ndarray, xt: np.ndarray,
                 labels: np.ndarray, exchange: str = "auto"):
        self.client, self.groups, self.template = client, groups, model
        self.workers = [w for ws in groups for w in ws]
        self.run_id, self.graphs = uuid.uuid4().hex[:8], 0
        arrays, self.positions = split_model(model, owners)
        everywhere = sorted(set(self.workers))
        shared = scatter_to_all(client, (owners, model.patterns), everywhere)
        graph = PinnedGraph(self.run_id)
        keys = [graph.add(w, f"setup-g{a}-p{q}", (setup_part, self.run_id, a, shared, arrays[q], model.bias,
                                                  model.ymax, model.optimizer))
                for a, ws in enumerate(groups) for q, w in enumerate(ws)]
        futures = graph.submit(client, keys)
        watch(client, futures, set(self.workers))
        parts = len(groups[0])
        # (layers, sender, receiver): the entries part p sends part q in layer k, at [k - 1, p, q]
        self.counts = np.stack(gather_watched(client, futures[:parts], self.workers), axis=1)
        if exchange == "auto":
            # a step is two passes of messages (forward, and the errors back), with no alive masks
            exchange = choose_exchange(self.counts, 2 * len(groups), len(self.workers), self.counts.shape[0] + 1
                                       ).transport
        self.exchanges = [exchange_for(exchange, ws) for ws in groups]
        self.exchanges[0].prepare(client)  # (what the transport needs on the workers)
        shared.release()
        x: dict[tuple[int, str], object] = {}  # one copy of a part's pixels per worker, however many groups use it
        for ws in groups:
            for q, w in enumerate(ws):
                if (q, w) not in x:
                    x[(q, w)] = client.scatter(np.ascontiguousarray(xt[owners[0] == q]), workers=[w], hash=False)
        self.x = [[x[(q, w)] for q, w in enumerate(ws)] for ws in groups]
        self.y = {w: client.scatter(labels, workers=[w], hash=False) for w in {ws[0] for ws in groups}}

    def receivers(self, k: int, p: int) -> tuple[int, ...]:
        """The parts part ``p`` sends rows to for layer ``k``."""
        return tuple(int(q) for q in np.flatnonzero(self.counts[k - 1, p, :]))

    def senders(self, k: int, q: int) -> tuple[int, ...]:
        """The parts that send part ``q`` rows for layer ``k``, ascending."""
        return tuple(int(p) for p in np.flatnonzero(self.counts[k - 1, :, q]))

    def run(self, steps: list[np.ndarray], lr: float, first: int) -> list[float]:
        """Run ``steps`` (each a batch's image indices) from step ``first``; the losses, one per step."""
        self.graphs += 1
        graph = PinnedGraph(f"{self.run_id}x{self.graphs}")
        n_groups, parts = len(self.groups), len(self.groups[0])
        if not self.exchanges[0].carries_messages:
            return self._run_in_one_task(graph, steps, lr, first)
        done: list[list[str | None]] = [[None] * parts for _ in self.groups]  # each part's last task
        loss_keys = []
        for s, idx in enumerate(steps, start=first):
            shards = np.array_split(idx, n_groups)
            grads = [self._step(graph, s, a, shards[a], float(idx.size), lr, done[a], n_groups == 1)
                     for a in range(n_groups)]
            if n_groups > 1:
                # part q of every group holds the same columns: sum their gradient values (values only) by a
                # tree pinned to those workers, then every copy applies the same step
                for q in range(parts):
                    root = tree_sum(graph, [grads[a][q] for a in range(n_groups)], [ws[q] for ws in self.groups],
                                    f"allreduce-s{s}-p{q}")
                    for a, ws in enumerate(self.groups):
                        task = PartTask(self.run_id, a, q, s, self.exchanges[a])
                        done[a][q] = graph.add(ws[q], f"state-s{s}-g{a}-p{q}", (apply, task, lr, ref(root)))
            loss_keys.append([done[a][0] for a in range(n_groups)])
        losses = [key for keys in loss_keys for key in keys]
        ends = [key for keys in done for key in keys if key not in losses]  # (waited for too)
        futures = graph.submit(self.client, losses + ends)
        watch(self.client, futures, set(self.workers))
        values = gather_watched(self.client, futures[:len(loss_keys) * n_groups], self.workers)
        # the groups' losses are shares of one batch's loss: their sum, in group order
        return [float(sum(values[i:i + n_groups])) for i in range(0, len(values), n_groups)]

    def _run_in_one_task(self, graph: PinnedGraph, steps: list[np.ndarray], lr: float, first: int) -> list[float]:
        # a transport that delivers messages itself: one task per part for all the steps (run_part_steps)
        n_groups, parts, depth = len(self.groups), len(self.groups[0]), self.template.depth
        shares = [[] for _ in self.groups]
        for s, idx in enumerate(steps, start=first):
            for a, share in enumerate(np.array_split(idx, n_groups)):
                shares[a].append((s, share, float(idx.size)))
        last = first + len(steps) - 1
        keys = []
        for q in range(parts):
            routes = PartRoutes(tuple(self.receivers(k, q) for k in range(1, depth + 1)),
                                tuple(self.senders(k, q) for k in range(1, depth + 1)))
            replicas = exchange_for(self.exchanges[0].name, [ws[q] for ws in self.groups]) if n_groups > 1 else None
            for a, ws in enumerate(self.groups):
                task = PartTask(self.run_id, a, q, first, self.exchanges[a])
                keys.append(graph.add(ws[q], f"steps-s{first}-{last}-g{a}-p{q}", (
                    run_part_steps, task, tuple(shares[a]), self.x[a][q], self.y.get(ws[0]) if q == 0 else None,
                    lr, routes, replicas, None)))
        futures = graph.submit(self.client, keys)
        watch(self.client, futures, set(self.workers))
        by_group = gather_watched(self.client, futures[:n_groups], self.workers)  # part 0 of each group (q == 0 first)
        # the groups' losses are shares of one batch's loss: their sum, in group order
        return [float(sum(values)) for values in zip(*by_group)]

    def _step(self, graph: PinnedGraph, s: int, a: int, idx: np.ndarray, scale: float, lr: float,
              done: list[str | None], update_here: bool) -> list[str]:
        # step s of group a: its parts' chains of tasks; the keys of their gradients (hybrid) or states
        ws, exchange, depth = self.groups[a], self.exchanges[a], self.template.depth
        parts, t = len(ws), f"s{s}-g{a}"

        def add(q: int, name: str, fn, *args, inbox: list | None = None) -> str:
            # part q's next task: after its previous one, with its messages' arguments (where it receives some)
            task = PartTask(self.run_id, a, q, s, exchange)
            task_args = (*args, None if done[q] is None else ref(done[q]))
            if inbox is not None:
                task_args += (refs_of([arg for _, arg in inbox if arg is not None]),)
            done[q] = graph.add(ws[q], name, (fn, task, *task_args))
            return done[q]

        def send(q: int, key: str, recipients: tuple[int, ...], coming: dict, name, personal: bool = True) -> None:
            # each recipient expects a message from part q, with its argument for it (None where none is needed)
            args = exchange.connect(graph, key, q, recipients, name, personal)
            for r in recipients:
                coming[r].append((q, args.get(r)))

        inbox: dict[int, list] = {q: [] for q in range(parts)}
        for q in range(parts):
            recipients = self.receivers(1, q)
            key = add(q, f"batch-{t}-p{q}", batch, self.x[a][q], idx, recipients)
            send(q, key, recipients, inbox, lambda r, q=q: f"send-{t}-l1-p{q}-to{r}")
        for k in range(1, depth + 1):
            coming: dict[int, list] = {q: [] for q in range(parts)}
            for q in range(parts):
                recipients = self.receivers(k + 1, q) if k < depth else ((0,) if q else ())
                key = add(q, f"fwd-{t}-l{k}-p{q}", forward, k, tuple(p for p, _ in inbox[q]), recipients,
                          inbox=inbox[q])
                send(q, key, recipients, coming, lambda r, q=q, k=k: f"send-{t}-l{k + 1}-p{q}-to{r}")
            inbox = coming
        key = add(0, f"loss-{t}", loss, self.y[ws[0]], idx, scale, tuple(p for p, _ in inbox[0]), inbox=inbox[0])
        inbox = {q: [] for q in range(parts)}
        send(0, key, tuple(range(1, parts)), inbox, str, personal=False)  # the logits' error, the same for all
        for k in range(depth, 0, -1):
            coming = {q: [] for q in range(parts)}
            for q in range(parts):
                recipients = self.senders(k, q) if k > 1 else ()  # the inputs' errors go back where they came from
                key = add(q, f"back-{t}-l{k}-p{q}", backward, k, tuple(p for p, _ in inbox[q]), recipients,
                          inbox=inbox[q])
                send(q, key, recipients, coming, lambda r, q=q, k=k: f"ret-{t}-l{k}-p{q}-to{r}")
            inbox = coming
        if update_here:  # model mode: each part updates from its own gradients, no traffic
            return [add(q, f"state-{t}-p{q}", update, lr) for q in range(parts)]
        return [add(q, f"grads-{t}-p{q}", gradients) for q in range(parts)]

    def model(self) -> Model:
        """The model as the parts hold it now (group 0's copy)."""
        graph = PinnedGraph(uuid.uuid4().hex[:8])
        keys = [graph.add(w, f"part-p{q}", (part_arrays, self.run_id, 0, q)) for q, w in enumerate(self.groups[0])]
        futures = graph.submit(self.client, keys)
        return join_model(self.template, gather_watched(self.client, futures, self.groups[0]), self.positions)

    def pushed_bytes(self) -> int:
        """Bytes the transport moved between workers itself, past Dask's transfer counters (0 for the task
        exchange, whose messages Dask moves and counts); read before :meth:`close`."""
        if self.exchanges[0].carries_messages:
            return 0
        return sum(f.get("crossed", 0) for f in self.client.run(run_figures, self.run_id).values())

    def close(self) -> None:
        """Let go of the run on the workers (its parts' states) and of the data scattered for it."""
        for f in [f for xs in self.x for f in xs] + list(self.y.values()):
            f.release()  # (not client.cancel: tasks that used them may still be known to the scheduler)
        self.client.run(close_run, self.run_id, on_error="ignore")

    cancel = close
