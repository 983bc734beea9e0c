"""Training a sparse network with a fixed sparsity pattern: single process, or on Dask in data or model mode.

The model
---------
The sparse layers are the inference layers, ``Y_next = h(Y @ W + b)`` (challenge orientation, activations held
transposed and dense: ``yt`` is ``neurons x batch``), where ``h`` adds the scalar bias ``b`` to *nonzero* sums
only, then applies ReLU and the optional clamp ``ymax`` (off, ``inf``, by default when training). The bias is a
**fixed scalar** (not trained; 0 by default for training, since the challenge's -0.3 belongs to its 1/16
weights). After layer ``L`` comes a small dense classifier head (``N x classes`` weights plus a bias vector,
both trained) and softmax cross-entropy, averaged over the batch.

Only the stored values of each layer learn: the pattern never changes. Weights, gradients, momentum and Adam
moments are flat arrays aligned with the CSC ``data`` of the layer; the pattern (``indptr, indices``) is held
once and shared by all of them. No dense copy of a sparse layer exists anywhere.

Stored weights are re-initialised for training (the generated networks' values are all 1/16): He-style normal
values with standard deviation ``sqrt(2 / fan_in)`` (fan_in: the column's nonzeros), seeded; ``init="keep"``
keeps the stored values (e.g. a network imported with :func:`import_weights`).

Gradients
---------
With ``delta_k = dL/dY_k * h'(Z_k)`` (``h'`` is 1 where the output is strictly between 0 and ``ymax``), the
weight gradient of a stored entry ``(i, j)`` is ``sum_b Y_{k-1}[i, b] * delta_k[j, b]`` (computed only at the
pattern, by :mod:`dasknn.kernels.grad`), and the error passed down is ``W_k @ delta_k``.

Modes on Dask
-------------
* ``data``: every replica holds the whole model and a shard of each batch; the gradient values (sparse values
  and head, one flat array) are summed by a binary tree of tasks pinned to the replicas' workers, the sum
  travels back worker to worker, and each replica applies the same optimiser step.
* ``model``: the layers' columns are partitioned (:mod:`dasknn.partition`) and each part holds its columns'
  values, their optimiser states and the head rows of the outputs it owns. Forward, parts exchange boundary
  activations as in inference (``plan.send/recv``); the head's partial logits go to part 0, which computes the
  loss and sends the (classes x batch) error back. Backward, each part computes the error contributions for all
  the inputs it needed and sends those owned by others back to their owners, who sum them: the forward volume in
  reverse. Weight gradients need no traffic.
* ``hybrid``: groups of ``group_size`` workers split each batch; each group runs model mode on its share over
  the same partition. Part ``q`` of every group holds the same columns, so the groups all-reduce each part's
  gradient values (values only, a tree of tasks pinned to the parts' workers, as in data mode) and every copy
  applies the same step.

If a worker is lost mid-run, the run is rebuilt on the workers there are from the last checkpoint this run
wrote (or from its start) and continues: the batches depend only on the seed and the step, so nothing is lost
but the recomputed steps.

Replicas and parts are mapped round-robin onto the cluster's workers, so ``workers=4`` runs on a 2-worker
cluster too (two parts per worker).
"""

from __future__ import annotations

import json
import math
import os
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from . import kernels, modes
from .errors import DasknnError
from .kernels import back_input, weight_grad  # dispatched by array type (NumPy: Numba; CuPy: CUDA)
from .network import Network, as_csc_layer
from .runtime import metrics
from .runtime.graph import PinnedGraph, ref, tree_sum
from .runtime.recovery import await_workers, ensure_client, watch, worker_lost

OPTIMIZERS = ("sgd", "momentum", "adam")
MODES = modes.TRAINING
#: Times a run rebuilds itself after losing a worker before it gives up.
MAX_RESTARTS = 3
#: Seconds a training run waits after losing workers for as many to be back before it restarts.
AWAIT_WORKERS_SECONDS = 30.0
MOMENTUM = 0.9
ADAM = (0.9, 0.999, 1e-8)
#: Optimiser state arrays per parameter.
OPT_SLOTS = {"sgd": 0, "momentum": 1, "adam": 2}


# --- kernels on raw arrays ------------------------------------------------------------------------------------


def forward_layer(xin, indptr, indices, data, bias: float, ymax: float) -> np.ndarray:
    """One sparse layer (the inference kernel, float64): ``h(W^T @ xin)``."""
    return kernels.layer_step(np.ascontiguousarray(xin, dtype=np.float64), indptr, indices, data, bias, ymax)


def active(y: np.ndarray, ymax: float) -> np.ndarray:
    """Where the layer rule's derivative is 1 (the output is strictly between 0 and ``ymax``)."""
    return (y > 0) & (y < ymax)


def softmax_xent(logits: np.ndarray, labels: np.ndarray, scale: float) -> tuple[float, np.ndarray]:
    """Summed cross-entropy of ``logits`` (classes x batch) divided by ``scale``, and its gradient."""
    z = logits - logits.max(axis=0, keepdims=True)
    e = np.exp(z)
    p = e / e.sum(axis=0, keepdims=True)
    cols = np.arange(labels.size)
    loss = float(-np.log(np.maximum(p[labels, cols], 1e-300)).sum() / scale)
    p[labels, cols] -= 1.0
    return loss, p / scale


# --- the model and its optimiser ------------------------------------------------------------------------------


@dataclass
class Model:
    """A trainable network: the shared patterns, the values, the head and the optimiser state.

    ``params`` is ``[values_1, ..., values_L, head_w (N x C), head_b (C)]``; ``slots[s][i]`` is optimiser state
    ``s`` (momentum; or Adam's first and second moments) of ``params[i]``, same shape.
    """

    patterns: list[tuple[np.ndarray, np.ndarray]]
    params: list[np.ndarray]
    neurons: int
    classes: int
    bias: float = 0.0
    ymax: float = math.inf
    optimizer: str = "sgd"
    slots: list[list[np.ndarray]] = field(default_factory=list)
    step: int = 0

    @property
    def depth(self) -> int:
        return len(self.patterns)

    def layer(self, k: int) -> sp.csc_matrix:
        """Layer ``k`` (1-based) as a SciPy matrix."""
        indptr, indices = self.patterns[k - 1]
        return sp.csc_matrix((self.params[k - 1], indices, indptr), shape=(self.neurons, self.neurons))

    def state_bytes(self) -> int:
        """Bytes of weights + gradients + optimiser state as stored: values arrays, the one shared pattern."""
        values = sum(p.nbytes for p in self.params)
        pattern = sum(a.nbytes + b.nbytes for a, b in self.patterns)
        return values * (2 + OPT_SLOTS[self.optimizer]) + pattern

    def dense_masked_state_bytes(self) -> int:
        """The same state kept dense with a mask: ``N^2`` values per layer per array, plus a one-byte mask."""
        n2 = self.neurons * self.neurons
        head = sum(p.nbytes for p in self.params[self.depth:])
        arrays = 2 + OPT_SLOTS[self.optimizer]
        return self.depth * (n2 * 8 * arrays + n2) + head * arrays


def init_model(layers: list[sp.spmatrix], classes: int, *, seed: int = 0, init: str = "he", bias: float = 0.0,
               ymax: float = math.inf, optimizer: str = "sgd") -> Model:
    """A model on the layers' patterns: He-style seeded values (``init="he"``) or the stored ones (``"keep"``)."""
    if optimizer not in OPTIMIZERS:
        raise DasknnError(f"--optimizer must be one of {', '.join(OPTIMIZERS)}, not {optimizer!r}")
    if init not in ("he", "keep"):
        raise DasknnError(f"init must be he or keep, not {init!r}")
    rng = np.random.default_rng(seed)
    patterns, params = [], []
    for w in layers:
        m = as_csc_layer(w, dtype=np.float64)
        patterns.append((m.indptr.astype(np.int64), m.indices.astype(np.int32)))
        if init == "he":
            fan_in = np.maximum(np.diff(m.indptr), 1)
            std = np.repeat(np.sqrt(2.0 / fan_in), np.diff(m.indptr))
            params.append(rng.standard_normal(m.nnz) * std)
        else:
            params.append(m.data.astype(np.float64))
    n = int(layers[0].shape[0])
    params.append(rng.standard_normal((n, classes)) * math.sqrt(1.0 / n))
    params.append(np.zeros(classes))
    model = Model(patterns, params, n, classes, bias, ymax, optimizer)
    model.slots = [[np.zeros_like(p) for p in params] for _ in range(OPT_SLOTS[optimizer])]
    return model


def apply_update(optimizer: str, params: list[np.ndarray], grads: list[np.ndarray], slots: list[list[np.ndarray]],
                 lr: float, step: int) -> tuple[list[np.ndarray], list[list[np.ndarray]]]:
    """One optimiser step (``step`` counts from 1), elementwise, so any split of the arrays gives the same result.
    Returns new arrays (the inputs are not modified)."""
    if optimizer == "sgd":
        return [p - lr * g for p, g in zip(params, grads)], []
    if optimizer == "momentum":
        v = [MOMENTUM * s + g for s, g in zip(slots[0], grads)]
        return [p - lr * s for p, s in zip(params, v)], [v]
    b1, b2, eps = ADAM
    m = [b1 * s + (1 - b1) * g for s, g in zip(slots[0], grads)]
    v = [b2 * s + (1 - b2) * g * g for s, g in zip(slots[1], grads)]
    c1, c2 = 1 - b1 ** step, 1 - b2 ** step
    return [p - lr * (a / c1) / (np.sqrt(b / c2) + eps) for p, a, b in zip(params, m, v)], [m, v]


def forward(model: Model, xt: np.ndarray) -> list[np.ndarray]:
    """Activations ``[Y_0, ..., Y_L]``, each transposed (``N x batch``), float64."""
    ys = [np.ascontiguousarray(xt, dtype=np.float64)]
    for (indptr, indices), values in zip(model.patterns, model.params):
        ys.append(forward_layer(ys[-1], indptr, indices, values, model.bias, model.ymax))
    return ys


def logits(model: Model, xt: np.ndarray) -> np.ndarray:
    """Class scores (classes x batch)."""
    y = forward(model, xt)[-1]
    return model.params[-2].T @ y + model.params[-1][:, None]


def gradients(model: Model, xt: np.ndarray, labels: np.ndarray, scale: float | None = None) -> tuple[float, list[np.ndarray]]:
    """Loss and gradients of every parameter (aligned with ``model.params``) on one batch.

    ``scale`` divides the summed loss (the batch size by default; a replica passes the global batch size)."""
    scale = float(labels.size if scale is None else scale)
    ys = forward(model, xt)
    hw, hb = model.params[-2], model.params[-1]
    loss, dlog = softmax_xent(hw.T @ ys[-1] + hb[:, None], labels, scale)
    grads: list[np.ndarray] = [None] * len(model.params)  # type: ignore[list-item]
    grads[-2] = ys[-1] @ dlog.T
    grads[-1] = dlog.sum(axis=1)
    g = hw @ dlog
    for k in range(model.depth, 0, -1):
        indptr, indices = model.patterns[k - 1]
        delta = g * active(ys[k], model.ymax)
        grads[k - 1] = weight_grad(indptr, indices, ys[k - 1], delta)
        if k > 1:
            g = back_input(indptr, indices, model.params[k - 1], delta, model.neurons)
    return loss, grads


def sgd_step(model: Model, xt: np.ndarray, labels: np.ndarray, lr: float) -> float:
    """One training step in this process; returns the batch loss."""
    loss, grads = gradients(model, xt, labels)
    model.step += 1
    model.params, model.slots = apply_update(model.optimizer, model.params, grads, model.slots, lr, model.step)
    return loss


def accuracy(model: Model, xt: np.ndarray, labels: np.ndarray) -> float:
    """Share of images (columns of ``xt``) whose highest score is their label."""
    return float((logits(model, xt).argmax(axis=0) == labels).mean()) if labels.size else float("nan")


# --- data -------------------------------------------------------------------------------------------------------


def load_digits_1024() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's 8x8 digits (1,797 images), each pixel repeated 4 x 4 to 32 x 32 = 1024 inputs, in [0, 1]."""
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        raise DasknnError("--data digits needs scikit-learn: pip install scikit-learn") from None
    d = load_digits()
    imgs = np.kron(d.images, np.ones((1, 4, 4))) / 16.0
    return imgs.reshape(len(imgs), 1024), d.target.astype(np.int64)


def load_data(data, neurons: int) -> tuple[np.ndarray, np.ndarray]:
    """``(x, y)``: images (count x neurons, float64) and integer labels, from ``"digits"``, an ``.npz`` with arrays
    ``x`` and ``y``, or a pair of arrays."""
    if isinstance(data, tuple):
        x, y = data
    elif str(data) == "digits":
        x, y = load_digits_1024()
    else:
        try:
            with np.load(data, allow_pickle=False) as f:
                x, y = f["x"], f["y"]
        except (OSError, KeyError, ValueError) as e:
            raise DasknnError(f"cannot read training data: an .npz with arrays x and y is needed ({e})", data) from None
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y).astype(np.int64)
    if x.ndim != 2 or x.shape[1] != neurons:
        raise DasknnError(f"the training images have {x.shape[-1]} pixels, the network {neurons} neurons")
    if y.shape != (x.shape[0],) or y.min() < 0:
        raise DasknnError("the labels must be one non-negative integer per image")
    return x, y


def split(x: np.ndarray, y: np.ndarray, test_share: float, seed: int):
    """A seeded hold-out split: ``(x_train, y_train, x_test, y_test)``."""
    perm = np.random.default_rng([seed, 7]).permutation(len(y))
    n_test = int(round(test_share * len(y)))
    te, trn = perm[:n_test], perm[n_test:]
    return x[trn], y[trn], x[te], y[te]


def schedule(n_train: int, batch: int, epochs: int, seed: int) -> list[np.ndarray]:
    """Every step's batch (indices into the training set): a seeded permutation per epoch, so a resumed run
    sees exactly the batches an uninterrupted one would."""
    steps = []
    for e in range(epochs):
        perm = np.random.default_rng([seed, 11, e]).permutation(n_train)
        steps += [np.sort(perm[i:i + batch]) for i in range(0, n_train, batch)]
    return steps


# --- checkpoints ------------------------------------------------------------------------------------------------


def save_checkpoint(path, model: Model, extra: dict | None = None) -> Path:
    """Write the model (patterns, values, head, optimiser state, step) as a Zarr group, atomically."""
    import zarr

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.partial-{uuid.uuid4().hex[:8]}")
    root = zarr.open_group(tmp, mode="w", zarr_format=3)

    def put(name, a):
        arr = root.create_array(name, shape=a.shape, dtype=a.dtype, chunks=a.shape if a.size else (1,) * a.ndim)
        if a.size:
            arr[...] = a

    for k, (indptr, indices) in enumerate(model.patterns, start=1):
        put(f"pattern/{k}/indptr", indptr)
        put(f"pattern/{k}/indices", indices)
    for i, p in enumerate(model.params):
        put(f"params/{i}", p)
        for s, slot in enumerate(model.slots):
            put(f"slots/{s}/{i}", slot[i])
    root.attrs["dasknn-train"] = {"step": model.step, "neurons": model.neurons, "classes": model.classes,
                                  "bias": model.bias, "ymax": None if math.isinf(model.ymax) else model.ymax,
                                  "optimizer": model.optimizer, "depth": model.depth, **(extra or {})}
    from .store import replace_atomically

    replace_atomically(tmp, path)
    return path


def load_checkpoint(path) -> tuple[Model, dict]:
    """A model saved by :func:`save_checkpoint`, and its attributes."""
    import zarr

    try:
        root = zarr.open_group(Path(path), mode="r", zarr_format=3)
        a = dict(root.attrs["dasknn-train"])
    except Exception as e:
        raise DasknnError(f"not a dasknn training checkpoint ({type(e).__name__})", path) from None
    depth = a["depth"]
    patterns = [(np.asarray(root[f"pattern/{k}/indptr"][...]), np.asarray(root[f"pattern/{k}/indices"][...]))
                for k in range(1, depth + 1)]
    params = [np.asarray(root[f"params/{i}"][...]) for i in range(depth + 2)]
    slots = [[np.asarray(root[f"slots/{s}/{i}"][...]) for i in range(depth + 2)]
             for s in range(OPT_SLOTS[a["optimizer"]])]
    model = Model(patterns, params, a["neurons"], a["classes"], a["bias"],
                  math.inf if a["ymax"] is None else a["ymax"], a["optimizer"], slots, a["step"])
    return model, a


# --- data mode tasks (run on workers) ---------------------------------------------------------------------------


def _flat(arrays: list[np.ndarray]) -> np.ndarray:
    return np.concatenate([a.ravel() for a in arrays])


def _unflat(flat: np.ndarray, like: list[np.ndarray]) -> list[np.ndarray]:
    out, at = [], 0
    for a in like:
        out.append(flat[at:at + a.size].reshape(a.shape))
        at += a.size
    return out


def _d_grad(model: Model, xt: np.ndarray, labels: np.ndarray, idx: np.ndarray, scale: float) -> np.ndarray:
    # this replica's share of the batch; the loss rides along as the last value, so the reduction sums it too
    loss, grads = gradients(model, np.ascontiguousarray(xt[:, idx]), labels[idx], scale)
    return np.append(_flat(grads), loss)


def _d_update(model: Model, total: np.ndarray, lr: float) -> Model:
    grads = _unflat(total[:-1], model.params)
    step = model.step + 1
    params, slots = apply_update(model.optimizer, model.params, grads, model.slots, lr, step)
    return Model(model.patterns, params, model.neurons, model.classes, model.bias, model.ymax, model.optimizer,
                 slots, step)


def _last(a: np.ndarray) -> float:
    return float(a[-1])


# --- model mode: splitting a model into parts, and the tasks ----------------------------------------------------


def _positions(indptr: np.ndarray, cols: np.ndarray) -> np.ndarray:
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
            p = _positions(indptr, pl.outputs)
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
    return _flat(grads)


def _m_apply(state: dict, lr: float, total: np.ndarray) -> dict:
    step = state["step"] + 1
    params, slots = apply_update(state["optimizer"], state["params"], _unflat(total, state["params"]),
                                 state["slots"], lr, step)
    return {**state, "params": params, "slots": slots, "step": step}


def _item(t, i):
    return t[i]


# --- the driver -------------------------------------------------------------------------------------------------


@dataclass
class TrainResult:
    """What a training run did and measured."""

    model: Model
    mode: str
    workers: int
    steps: int
    seconds: float
    losses: list[float]
    train_loss: float
    test_accuracy: float
    train_accuracy: float
    bytes_sent: int = 0
    partition: str = ""
    restarts: int = 0
    group_size: int = 0

    @property
    def bytes_sent_per_step(self) -> float:
        return self.bytes_sent / self.steps if self.steps else 0.0

    def summary(self) -> dict:
        """The figures ``dasknn train --json`` prints."""
        return {"mode": self.mode, "workers": self.workers, "partition": self.partition, "steps": self.steps,
                "seconds": round(self.seconds, 4),
                "steps_per_second": round(self.steps / self.seconds, 3) if self.seconds > 0 else None,
                "train_loss": self.train_loss, "train_accuracy": self.train_accuracy,
                "test_accuracy": self.test_accuracy, "state_bytes": self.model.state_bytes(),
                "dense_masked_state_bytes": self.model.dense_masked_state_bytes(),
                "bytes_sent_per_step": self.bytes_sent_per_step, "optimizer": self.model.optimizer,
                "group_size": self.group_size, "restarts": self.restarts}


def _layers_of(network) -> tuple[list[sp.csc_matrix], str | None]:
    if isinstance(network, Network):
        return list(network.layers), None
    if isinstance(network, (list, tuple)):
        return list(network), None
    from .store import open_store

    path = str(Path(network).resolve())
    return open_store(path).network().layers, path


class _DataRunner:
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
        losses = self.client.gather(futures[r:])
        self.replicas = futures[:r]
        return losses

    def model(self) -> Model:
        return self.replicas[0].result()

    def cancel(self) -> None:
        self.client.cancel(list(self.replicas) + list(self.x.values()) + list(self.y.values()))


class _ModelRunner:
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


def train(
    network,
    data="digits",
    *,
    epochs: int = 1,
    batch: int = 64,
    lr: float = 0.01,
    optimizer: str = "sgd",
    mode: str = "model",
    partition: str | np.ndarray = "hypergraph",
    workers: int = 2,
    group_size: int | None = None,
    client=None,
    checkpoint_every: int = 0,
    checkpoint: str | os.PathLike[str] | None = None,
    resume: bool = False,
    seed: int = 0,
    bias: float = 0.0,
    ymax: float = math.inf,
    init: str = "he",
    max_steps: int | None = None,
    test_share: float = 0.2,
    chunk: int = 50,
    progress: Callable[[int], None] | None = None,
) -> TrainResult:
    """Train a sparse network (fixed pattern) with a dense classifier head; see the module's description.

    Parameters
    ----------
    network
        A store path, a :class:`~dasknn.network.Network` or a list of sparse layers (only the pattern matters
        with ``init="he"``).
    data
        ``"digits"`` (needs 1024 neurons and scikit-learn), an ``.npz`` with ``x`` (images x neurons) and ``y``,
        or a pair ``(x, y)``. A seeded ``test_share`` is held out.
    mode
        ``"single"`` (this process, no Dask), ``"data"``, ``"model"`` or ``"hybrid"``.
    workers
        Replicas (data), parts (model) or groups x parts (hybrid), mapped round-robin onto the cluster's
        workers.
    group_size
        Hybrid mode: parts per group (2 by default where the workers divide evenly); the groups split each
        batch.
    checkpoint, checkpoint_every, resume
        Save the model (atomically) every ``checkpoint_every`` steps and at the end; with ``resume``, continue
        from the checkpoint: the batches depend only on the seed and the step, so the result is that of an
        uninterrupted run.
    max_steps
        Stop after this many steps in all (of the ``epochs`` scheduled).
    chunk
        Steps per submitted task graph.
    progress
        Called with the number of steps done (in all) after every chunk.

    Notes
    -----
    If a worker leaves the cluster during a Dask run (killed, or lost with its node), the run rebuilds itself
    on the workers there are (waiting up to 30 s for a nanny to restart the lost one) from the last checkpoint
    written by this run, or from the start without one, at most :data:`MAX_RESTARTS` times: the result is that
    of an uninterrupted run.
    """
    if mode not in MODES:
        raise DasknnError(f"--mode must be one of {', '.join(MODES)}, not {mode!r}")
    if epochs < 1 or batch < 1 or workers < 1 or not lr > 0:
        raise DasknnError("--epochs, --batch and --workers must be at least 1 and --lr positive")
    parts = {"single": 1, "data": 1, "model": workers}.get(mode) or group_size or (
        2 if workers % 2 == 0 and workers >= 4 else workers)
    if parts < 1 or workers % parts:
        raise DasknnError(f"--group-size {parts} must divide the {workers} workers")
    if (checkpoint_every or resume) and checkpoint is None:
        raise DasknnError("--checkpoint-every and --resume need --checkpoint STORE")
    layers, path = _layers_of(network)
    neurons = int(layers[0].shape[0])
    x, y = load_data(data, neurons)
    x_tr, y_tr, x_te, y_te = split(x, y, test_share, seed)
    classes = int(y.max()) + 1
    if resume and checkpoint is not None and Path(checkpoint).exists():
        model, _ = load_checkpoint(checkpoint)
        if model.optimizer != optimizer or model.depth != len(layers) or model.neurons != neurons:
            raise DasknnError("the checkpoint was made with another network or optimiser", checkpoint)
    else:
        model = init_model(layers, classes, seed=seed, init=init, bias=bias, ymax=ymax, optimizer=optimizer)
    plan_steps = schedule(len(y_tr), batch, epochs, seed)
    if max_steps is not None:
        plan_steps = plan_steps[:max_steps]
    todo = plan_steps[model.step:]
    xt = np.ascontiguousarray(x_tr.T)
    losses: list[float] = []
    bytes_sent = restarts = 0
    part_name = ""

    start = model.step

    def bounds():
        size = checkpoint_every if checkpoint_every else chunk
        at = 0
        while at < len(todo):
            step0 = start + at
            stop = min(len(todo), at + min(chunk, size - step0 % size if checkpoint_every else chunk))
            yield at, stop
            at = stop

    t0 = time.perf_counter()
    if mode == "single":
        for a, b in bounds():
            for idx in todo[a:b]:
                losses.append(sgd_step(model, np.ascontiguousarray(xt[:, idx]), y_tr[idx], lr))
            if checkpoint_every and model.step % checkpoint_every == 0:
                save_checkpoint(checkpoint, model, {"seed": seed})
            if progress is not None:
                progress(model.step)
        seconds = time.perf_counter() - t0
    else:
        if client is None:
            with ensure_client(workers=min(workers, os.cpu_count() or 1)) as c:
                return train(network if path is None else path, data, epochs=epochs, batch=batch, lr=lr,
                             optimizer=optimizer, mode=mode, partition=partition, workers=workers, client=c,
                             checkpoint_every=checkpoint_every, checkpoint=checkpoint, resume=resume, seed=seed,
                             bias=bias, ymax=ymax, init=init, max_steps=max_steps, test_share=test_share,
                             chunk=chunk, group_size=group_size, progress=progress)
        plan = None
        if mode != "data":
            from .partition import partition_network
            from .plan import build_plan

            if isinstance(partition, np.ndarray):
                owners, part_name = partition, "given"
            elif parts == 1:
                owners, part_name = np.zeros((len(layers) + 1, neurons), dtype=np.int32), "single"
            elif path is not None:
                from .engine import resolve_partition

                owners, part_name = resolve_partition(path, partition, parts, seed), str(partition)
            else:
                owners, part_name = partition_network(layers, parts, str(partition), seed=seed), str(partition)
            plan = build_plan(layers, owners)  # computed once: a restart after a lost worker reuses it

        def start_on_cluster(m: Model):
            names = sorted(client.nthreads())
            if not names:
                raise DasknnError("the Dask cluster has no workers")
            ws = [names[i % len(names)] for i in range(workers)]
            if mode == "data":
                return _DataRunner(client, ws, m, xt, y_tr), len(names)
            return _ModelRunner(client, [ws[i:i + parts] for i in range(0, workers, parts)], m, plan, xt,
                                y_tr), len(names)

        runner, n_workers = start_on_cluster(model)
        sent0 = client.run(metrics.bytes_sent)
        t0 = time.perf_counter()
        done = model.step
        chunks = list(bounds())
        at_chunk = {a: i for i, (a, _) in enumerate(chunks)}
        saved = False  # whether this run has written a checkpoint to restart from
        i, final = 0, None
        while final is None:
            try:
                if i < len(chunks):
                    a, b = chunks[i]
                    out = runner.run(todo[a:b], lr, done + a)
                    if checkpoint_every and (done + b) % checkpoint_every == 0:
                        save_checkpoint(checkpoint, runner.model(), {"seed": seed})
                        saved = True
                else:
                    # the figures before the model comes back to the client (the gather is counted as sent)
                    seconds = time.perf_counter() - t0
                    sent1 = client.run(metrics.bytes_sent)
                    final = runner.model()
                    break
            except Exception as e:
                if not worker_lost(client, set(runner.workers), e):
                    raise
                restarts += 1
                if restarts > MAX_RESTARTS:
                    raise DasknnError(f"workers were lost {restarts} times during training; giving up") from e
                runner.cancel()
                # a nanny restarts a killed worker; after the wait, carry on with the workers there are
                await_workers(client, n_workers, AWAIT_WORKERS_SECONDS)
                back = load_checkpoint(checkpoint)[0] if saved else model
                losses = losses[:back.step - done]
                i = at_chunk.get(back.step - done, len(chunks))
                runner, n_workers = start_on_cluster(back)
                continue
            losses += out
            i += 1
            if progress is not None:
                progress(done + b)
        # a lost worker's counter is lost with it; a restarted one counts from zero
        bytes_sent = sum(sent1[w] - sent0.get(w, 0) for w in sent1)
        model = final
    if checkpoint is not None and todo:
        save_checkpoint(checkpoint, model, {"seed": seed})
    xte = np.ascontiguousarray(x_te.T)
    return TrainResult(model=model, mode=mode, workers=1 if mode == "single" else workers, steps=len(todo),
                       seconds=seconds, losses=[float(v) for v in losses],
                       train_loss=float(np.mean(losses[-10:])) if losses else float("nan"),
                       test_accuracy=accuracy(model, xte, y_te), train_accuracy=accuracy(model, xt, y_tr),
                       bytes_sent=bytes_sent, partition=part_name, restarts=restarts,
                       group_size=parts if mode == "hybrid" else 0)


# --- importing dense weights, and the command line -------------------------------------------------------------


def _torch_weights(path) -> list[np.ndarray]:
    """The 2-D tensors of a PyTorch ``state_dict`` file, in order, transposed to the challenge orientation."""
    try:
        import torch
    except ImportError:
        raise DasknnError("reading a .pt file needs PyTorch (pip install torch); or save the weights as an .npz "
                          "(numpy.savez)", path) from None
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        raise DasknnError(f"cannot read the weights as a PyTorch state_dict ({type(e).__name__})", path) from None
    if not isinstance(state, dict):
        raise DasknnError(f"a .pt file must hold a state_dict (a dict of tensors), not a {type(state).__name__}", path)
    # nn.Linear keeps out x in (y = x @ W.T); a dasknn layer is in x out (Y @ W). 1-D tensors (biases) are
    # skipped: a dasknn network has one scalar bias (--bias).
    return [t.detach().to(torch.float64).numpy().T.copy() for t in state.values()
            if isinstance(t, torch.Tensor) and t.ndim == 2]


def import_weights(model_npz, out, sparsity: float | None = None, *, bias: float = 0.0, overwrite: bool = False) -> Path:
    """Dense layer weights pruned by magnitude to ``sparsity`` (the share of zeros; per layer, ties broken by
    position), or with their zeros kept when ``sparsity`` is None, written as a dasknn store.

    ``model_npz`` is an ``.npz`` of square arrays in the order stored (challenge orientation, ``Y @ W``), or,
    where PyTorch is installed, a ``.pt``/``.pth`` ``state_dict`` whose 2-D tensors (``nn.Linear`` weights,
    ``out x in``, transposed on reading) are the layers in order."""
    from .store import write_network

    if Path(model_npz).suffix in (".pt", ".pth"):
        arrays = _torch_weights(model_npz)
    else:
        try:
            with np.load(model_npz, allow_pickle=False) as f:
                arrays = [np.asarray(f[name], dtype=np.float64) for name in f.files]
        except (OSError, ValueError) as e:
            raise DasknnError(f"cannot read the weights ({e})", model_npz) from None
    if not arrays:
        raise DasknnError("the file holds no 2-D weight arrays", model_npz)
    if sparsity is not None and not 0 <= sparsity < 1:
        raise DasknnError(f"--sparsity must be in [0, 1), not {sparsity}")
    layers = []
    for k, a in enumerate(arrays, start=1):
        if a.ndim != 2 or a.shape[0] != a.shape[1] or a.shape != arrays[0].shape:
            raise DasknnError(f"array {k} is {a.shape}; the layers must be square and of one size", model_npz)
        if sparsity is not None:
            keep = a.size - int(round(sparsity * a.size))
            order = np.argsort(-np.abs(a), axis=None, kind="stable")[:keep]
            mask = np.zeros(a.size, dtype=bool)
            mask[order] = True
            a = np.where(mask.reshape(a.shape), a, 0.0)
        layers.append(sp.csc_matrix(a))
    return write_network(out, Network(layers, bias, source=f"import-weights {Path(model_npz).name}"),
                         overwrite=overwrite)


def add_train_parser(subparsers) -> None:
    """Add ``dasknn train`` to an argparse subparsers object."""
    p = subparsers.add_parser("train", help="train a sparse network (fixed pattern) with a dense classifier head")
    p.add_argument("--network", required=True, metavar="STORE", help="a dasknn store: the fixed sparsity pattern")
    p.add_argument("--data", default="digits", help="digits (scikit-learn) or an .npz with arrays x and y")
    p.add_argument("--epochs", type=int, default=5, help="passes over the training set (default 5)")
    p.add_argument("--batch", type=int, default=64, help="images per step (default 64)")
    p.add_argument("--lr", type=float, default=1e-3, help="learning rate (default 1e-3)")
    p.add_argument("--optimizer", choices=OPTIMIZERS, default="adam",
                   help="optimiser; its state is stored for the nonzeros only (default adam)")
    p.add_argument("--mode", choices=MODES, default="model",
                   help="single process, data (replicas all-reduce gradient values), model (partitioned layers; "
                        "default) or hybrid (groups split the batch, model mode in each)")
    p.add_argument("--partition", default="hypergraph", metavar="METHOD",
                   help="model mode: partition method or owners .npy (default hypergraph)")
    p.add_argument("--workers", type=int, default=2, help="replicas, parts, or groups x parts (default 2)")
    p.add_argument("--group-size", type=int, default=None, metavar="G",
                   help="hybrid mode: parts per group; the groups split each batch (default 2 where it divides)")
    p.add_argument("--scheduler", default=None, help="address of an existing Dask scheduler")
    from .cluster import add_tls_arguments

    add_tls_arguments(p)
    p.add_argument("--checkpoint-every", type=int, default=0, metavar="N", help="write a checkpoint every N steps")
    p.add_argument("--checkpoint", default=None, metavar="STORE", help="the checkpoint (a Zarr group, written atomically)")
    p.add_argument("--resume", action="store_true", help="continue exactly from --checkpoint")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--report", metavar="PATH.html", help="write Dask's performance report of the training to this HTML file")
    p.add_argument("--seed", type=int, default=0, help="seed of the initialisation, split and shuffling (default 0)")
    p.add_argument("--bias", type=float, default=0.0, help="the fixed scalar bias of the sparse layers")
    p.add_argument("--init", choices=("he", "keep"), default="he",
                   help="he: re-initialise the stored values (He, seeded); keep: train from the stored values")
    p.set_defaults(func=run_train)


def run_train(args) -> int:
    """``dasknn train``: run, print the figures (JSON with ``--json``), return the exit code."""
    common = dict(epochs=args.epochs, batch=args.batch, lr=args.lr, optimizer=args.optimizer, mode=args.mode,
                  partition=args.partition, workers=args.workers, group_size=args.group_size,
                  checkpoint_every=args.checkpoint_every,
                  checkpoint=args.checkpoint, resume=args.resume, seed=args.seed, bias=args.bias, init=args.init)
    tls = getattr(args, "tls", False) or getattr(args, "tls_ca", None)
    if args.mode != "single" and (getattr(args, "scheduler", None) or tls):
        from .cluster import local_client, tls_options

        with local_client(workers=None if args.scheduler else min(args.workers, os.cpu_count() or 1),
                          scheduler=args.scheduler, **tls_options(args)) as c:
            result = train(args.network, args.data, client=c, **common)
    else:
        result = train(args.network, args.data, **common)
    s = result.summary()
    if args.json:
        print(json.dumps(s))
    else:
        print(f"{s['steps']} steps in {s['seconds']:.2f} s ({s['mode']}, {s['workers']} workers): "
              f"train loss {s['train_loss']:.4f}, test accuracy {100 * s['test_accuracy']:.2f} %, "
              f"state {s['state_bytes']:,} B (dense with mask {s['dense_masked_state_bytes']:,} B), "
              f"{s['bytes_sent_per_step']:,.0f} B sent per step")
    return 0


def add_import_weights_parser(subparsers) -> None:
    """Add ``dasknn import-weights`` to an argparse subparsers object."""
    p = subparsers.add_parser("import-weights", help="dense weights (.npz, or .pt with PyTorch) pruned by magnitude "
                                                      "into a store")
    p.add_argument("model", metavar="MODEL.npz|MODEL.pt")
    p.add_argument("--sparsity", type=float, default=None, help="share of zeros; default: keep the zeros given")
    p.add_argument("--out", required=True, metavar="STORE")
    p.add_argument("--bias", type=float, default=0.0)
    p.add_argument("--overwrite", action="store_true")
    p.set_defaults(func=run_import_weights)


def run_import_weights(args) -> int:
    path = import_weights(args.model, args.out, args.sparsity, bias=args.bias, overwrite=args.overwrite)
    print(path)
    return 0
