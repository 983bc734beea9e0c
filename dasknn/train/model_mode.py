"""Model and hybrid mode on Dask: the layers' columns split into parts (values, optimiser state and head rows
per part), boundary activations exchanged forward as in inference and the errors sent back in reverse; in hybrid
mode, groups of parts split each batch and all-reduce each part's gradient values."""

from __future__ import annotations

import uuid

import numpy as np

from ..runtime.graph import PinnedGraph, ref, tree_sum
from ..runtime.recovery import watch
from ..kernels import back_input, weight_grad
from .model import Model, active, apply_update, flatten, forward_layer, softmax_xent, unflatten


def column_positions(indptr: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """Positions in a CSC ``data`` array of the entries of columns ``cols`` (in order)."""
    if cols.size == 0:
        return np.empty(0, dtype=np.int64)
    starts, ends = indptr[cols], indptr[cols + 1]
    lens = ends - starts
    return (np.repeat(starts - np.cumsum(lens) + lens, lens) + np.arange(lens.sum())).astype(np.int64)


def split_model(model: Model, plan) -> tuple[list[dict], list[list[np.ndarray]]]:
    """Each part's state (its columns' values and optimiser state, re-indexed into its input space; its head
    rows; the head bias on part 0) and, per part, the positions of its values in the global arrays."""
    parts, depth = plan.parts, model.depth
    states, positions = [], []
    last_out = [plan.layers[depth - 1][q].outputs for q in range(parts)]
    for q in range(parts):
        pls = plan.part(q)
        pat, pos = [], []
        for k, pl in enumerate(pls, start=1):
            indptr, indices = model.patterns[k - 1]
            p = column_positions(indptr, pl.outputs)
            lens = indptr[pl.outputs + 1] - indptr[pl.outputs]
            local_ptr = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
            pat.append((local_ptr, np.searchsorted(pl.inputs, indices[p]).astype(np.int32)))
            pos.append(p)
        pos.append(last_out[q])

        def take(arrays):
            out = [a[i] for a, i in zip(arrays[:depth], pos[:depth])]
            out.append(arrays[depth][last_out[q]])
            out.append(arrays[depth + 1] if q == 0 else arrays[depth + 1][:0])
            return out

        states.append({"part": q, "pl": pls, "pat": pat, "params": take(model.params),
                       "slots": [take(s) for s in model.slots], "step": model.step, "bias": model.bias,
                       "ymax": model.ymax, "optimizer": model.optimizer})
        positions.append(pos)
    return states, positions


def join_model(model: Model, states: list[dict], positions: list[list[np.ndarray]]) -> Model:
    """The global model back from its parts (``model`` gives the patterns and the shapes)."""
    depth = model.depth

    def put(arrays_of):
        out = [np.empty_like(p) for p in model.params]
        for st, pos in zip(states, positions):
            arrays = arrays_of(st)
            for k in range(depth):
                out[k][pos[k]] = arrays[k]
            out[depth][pos[depth]] = arrays[depth]
            if st["part"] == 0:
                out[depth + 1][:] = arrays[depth + 1]
        return out

    slots = [put(lambda st, s=s: st["slots"][s]) for s in range(len(model.slots))]
    return Model(model.patterns, put(lambda st: st["params"]), model.neurons, model.classes, model.bias,
                 model.ymax, model.optimizer, slots, states[0]["step"])


def _m_batch(x_part: np.ndarray, idx: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x_part[:, idx])


def _y(block):
    return block[1] if isinstance(block, tuple) else block


def _m_send(state: dict, k: int, q: int, block) -> np.ndarray:
    return np.ascontiguousarray(_y(block)[state["pl"][k - 1].send[q]])


def _m_fwd(state: dict, k: int, block, senders: tuple[int, ...], *messages) -> tuple[np.ndarray, np.ndarray]:
    pl = state["pl"][k - 1]
    prev = _y(block)
    xin = np.empty((pl.inputs.size, prev.shape[1]))
    xin[pl.local[0]] = prev[pl.local[1]]
    for p, msg in zip(senders, messages):
        xin[pl.recv[p]] = msg
    indptr, indices = state["pat"][k - 1]
    return xin, forward_layer(xin, indptr, indices, state["params"][k - 1], state["bias"], state["ymax"])


def _m_partial_logits(state: dict, last) -> np.ndarray:
    return state["params"][-2].T @ _y(last)


def _m_loss(state: dict, labels: np.ndarray, idx: np.ndarray, scale: float, *partials) -> tuple:
    lg = partials[0].copy()
    for p in partials[1:]:
        lg += p
    loss, dlog = softmax_xent(lg + state["params"][-1][:, None], labels[idx], scale)
    return dlog, loss


def _m_head_back(state: dict, last, lossres) -> tuple[np.ndarray, np.ndarray]:
    dlog = lossres[0]
    return state["params"][-2] @ dlog, _y(last) @ dlog.T


def _m_back(state: dict, k: int, fwd, g) -> tuple[np.ndarray, np.ndarray | None]:
    g = g[0] if isinstance(g, tuple) else g
    xin, y = fwd
    indptr, indices = state["pat"][k - 1]
    delta = g * active(y, state["ymax"])
    wg = weight_grad(indptr, indices, xin, delta)
    gin = back_input(indptr, indices, state["params"][k - 1], delta, xin.shape[0]) if k > 1 else None
    return wg, gin


def _m_return(state: dict, k: int, p: int, back) -> np.ndarray:
    # the error contributions for inputs part p owns: the forward message from p, in reverse
    return np.ascontiguousarray(back[1][state["pl"][k - 1].recv[p]])


def _m_gather(state: dict, k: int, n_prev: int, back, senders: tuple[int, ...], *messages) -> np.ndarray:
    # the error of this part's outputs of layer k-1: its own contributions plus those folded back by the others
    pl = state["pl"][k - 1]
    gin = back[1]
    g = np.zeros((n_prev, gin.shape[1]))
    g[pl.local[1]] += gin[pl.local[0]]
    for q, msg in zip(senders, messages):
        g[pl.send[q]] += msg
    return g


def _m_update(state: dict, lr: float, head, lossres, *backs) -> dict:
    grads = [b[0] for b in backs] + [head[1]]
    grads.append(lossres[0].sum(axis=1) if state["part"] == 0 else state["params"][-1][:0])
    step = state["step"] + 1
    params, slots = apply_update(state["optimizer"], state["params"], grads, state["slots"], lr, step)
    return {**state, "params": params, "slots": slots, "step": step}


def _m_grads(state: dict, head, lossres, *backs) -> np.ndarray:
    # hybrid mode: this part's gradient values as one flat array, for the all-reduce between groups
    grads = [b[0] for b in backs] + [head[1]]
    grads.append(lossres[0].sum(axis=1) if state["part"] == 0 else state["params"][-1][:0])
    return flatten(grads)


def _m_apply(state: dict, lr: float, total: np.ndarray) -> dict:
    step = state["step"] + 1
    params, slots = apply_update(state["optimizer"], state["params"], unflatten(total, state["params"]),
                                 state["slots"], lr, step)
    return {**state, "params": params, "slots": slots, "step": step}


def _item(t, i):
    return t[i]



class ModelRunner:
    """Model mode (one group of parts) and hybrid mode (several groups, each a model-mode copy of the partitioned
    model on its share of the batch, the gradient values of corresponding parts all-reduced between groups)."""

    def __init__(self, client, groups: list[list[str]], model, plan, xt, labels):
        self.client, self.groups, self.plan, self.template = client, groups, plan, model
        self.workers = [w for ws in groups for w in ws]
        states, self.positions = split_model(model, plan)
        # a list of one: scattering a dict would scatter its values one by one
        self.states = [[client.scatter([st], workers=[w], hash=False)[0] for st, w in zip(states, ws)]
                       for ws in groups]
        x: dict[tuple[int, str], object] = {}  # one copy of a part's pixels per worker, however many groups use it
        for ws in groups:
            for q, w in enumerate(ws):
                if (q, w) not in x:
                    x[(q, w)] = client.scatter(np.ascontiguousarray(xt[plan.inputs_owned[q]]), workers=[w],
                                               hash=False)
        self.x = [[x[(q, w)] for q, w in enumerate(ws)] for ws in groups]
        self.y = {w: client.scatter(labels, workers=[w], hash=False) for w in {ws[0] for ws in groups}}

    def run(self, steps: list[np.ndarray], lr: float, first: int) -> list[float]:
        graph = PinnedGraph(uuid.uuid4().hex[:8])
        plan, parts, depth, n_groups = self.plan, self.plan.parts, self.template.depth, len(self.groups)
        cur = [list(states) for states in self.states]
        loss_keys = []
        for s, idx in enumerate(steps, start=first):
            shards = np.array_split(idx, n_groups)
            grads = []
            for a, ws in enumerate(self.groups):
                def st(q, a=a):
                    return ref(cur[a][q]) if isinstance(cur[a][q], str) else cur[a][q]

                t = f"s{s}-g{a}"
                sid = shards[a]
                blocks = [graph.add(ws[q], f"batch-{t}-p{q}", (_m_batch, self.x[a][q], sid)) for q in range(parts)]
                fwd = [blocks]
                for k in range(1, depth + 1):
                    layer = plan.layers[k - 1]
                    sends = {(p, q): graph.add(ws[p], f"send-{t}-l{k}-p{p}-to{q}",
                                               (_m_send, st(p), k, q, ref(fwd[-1][p])))
                             for p in range(parts) for q in layer[p].send}
                    new = []
                    for q in range(parts):
                        senders = tuple(sorted(layer[q].recv))
                        new.append(graph.add(ws[q], f"fwd-{t}-l{k}-p{q}",
                                             (_m_fwd, st(q), k, ref(fwd[-1][q]), senders,
                                              *(ref(sends[(p, q)]) for p in senders))))
                    fwd.append(new)
                partial = [graph.add(ws[q], f"logits-{t}-p{q}", (_m_partial_logits, st(q), ref(fwd[-1][q])))
                           for q in range(parts)]
                # the loss and its error are scaled by the whole batch, so the groups' gradients add up
                lossres = graph.add(ws[0], f"loss-{t}", (_m_loss, st(0), self.y[ws[0]], sid, float(idx.size),
                                                         *(ref(k) for k in partial)))
                loss_keys.append(graph.add(ws[0], f"lossv-{t}", (_item, ref(lossres), 1)))
                head = [graph.add(ws[q], f"head-{t}-p{q}", (_m_head_back, st(q), ref(fwd[-1][q]), ref(lossres)))
                        for q in range(parts)]
                g = head
                backs = [[None] * parts for _ in range(depth)]
                for k in range(depth, 0, -1):
                    for q in range(parts):
                        backs[k - 1][q] = graph.add(ws[q], f"back-{t}-l{k}-p{q}",
                                                    (_m_back, st(q), k, ref(fwd[k][q]), ref(g[q])))
                    if k == 1:
                        break
                    layer = plan.layers[k - 1]
                    rets = {(q, p): graph.add(ws[q], f"ret-{t}-l{k}-p{q}-to{p}",
                                              (_m_return, st(q), k, p, ref(backs[k - 1][q])))
                            for q in range(parts) for p in layer[q].recv}
                    g = []
                    for p in range(parts):
                        senders = tuple(sorted(layer[p].send))
                        n_prev = plan.layers[k - 2][p].outputs.size
                        g.append(graph.add(ws[p], f"gerr-{t}-l{k - 1}-p{p}",
                                           (_m_gather, st(p), k, n_prev, ref(backs[k - 1][p]), senders,
                                            *(ref(rets[(q, p)]) for q in senders))))
                pieces = [(ref(head[q]), ref(lossres), *(ref(backs[k][q]) for k in range(depth)))
                          for q in range(parts)]
                if n_groups == 1:  # model mode: each part updates from its own gradients, no traffic
                    cur[a] = [graph.add(ws[q], f"state-{t}-p{q}", (_m_update, st(q), lr, *pieces[q]))
                              for q in range(parts)]
                else:
                    grads.append([graph.add(ws[q], f"grads-{t}-p{q}", (_m_grads, st(q), *pieces[q]))
                                  for q in range(parts)])
            if n_groups > 1:
                # part q of every group holds the same columns: sum their gradient values (values only) by a
                # tree pinned to those workers, then every copy applies the same step
                for q in range(parts):
                    root = tree_sum(graph, [grads[a][q] for a in range(n_groups)],
                                     [ws[q] for ws in self.groups], f"allreduce-s{s}-p{q}")
                    for a, ws in enumerate(self.groups):
                        prev = ref(cur[a][q]) if isinstance(cur[a][q], str) else cur[a][q]
                        cur[a][q] = graph.add(ws[q], f"state-s{s}-g{a}-p{q}", (_m_apply, prev, lr, ref(root)))
        flat_cur = [k for states in cur for k in states]
        futures = graph.submit(self.client, flat_cur + loss_keys)
        watch(self.client, futures, set(self.workers))
        values = self.client.gather(futures[len(flat_cur):])
        self.states = [futures[a * parts:(a + 1) * parts] for a in range(n_groups)]
        # the groups' losses are shares of one batch's loss: their sum, in group order
        return [float(sum(values[i:i + n_groups])) for i in range(0, len(values), n_groups)]

    def model(self) -> Model:
        return join_model(self.template, self.client.gather(self.states[0]), self.positions)

    def cancel(self) -> None:
        self.client.cancel([f for states in self.states for f in states]
                           + [f for xs in self.x for f in xs] + list(self.y.values()))

