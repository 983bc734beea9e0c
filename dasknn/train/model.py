"""The trainable model: shared sparse patterns, values, a dense head, optimiser state; its forward and backward
passes and optimiser step, on raw arrays (see :mod:`dasknn.train` for the rule and the gradients)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from types import MappingProxyType

import numpy as np
import scipy.sparse as sp

from .. import kernels
from ..errors import DasknnError
from ..kernels import back_input, to_host, weight_grad  # the backend's of the arrays (NumPy: Numba; CuPy: CUDA)
from ..network import as_csc_layer
from .device import array_module

OPTIMIZERS = ("sgd", "momentum", "adam")
MOMENTUM = 0.9
ADAM = (0.9, 0.999, 1e-8)
#: Optimiser state arrays per parameter (read-only: a constant, not state).
OPT_SLOTS = MappingProxyType({"sgd": 0, "momentum": 1, "adam": 2})


def forward_layer(xin, indptr, indices, data, bias: float, ymax: float) -> np.ndarray:
    """One sparse layer (the inference kernel, float64): ``h(W^T @ xin)``."""
    xp = array_module(xin)
    return kernels.layer_step(xp.ascontiguousarray(xin, dtype=xp.float64), indptr, indices, data, bias, ymax)


def active(y: np.ndarray, ymax: float) -> np.ndarray:
    """Where the layer rule's derivative is 1 (the output is strictly between 0 and ``ymax``)."""
    return (y > 0) & (y < ymax)


def softmax_xent(logits: np.ndarray, labels: np.ndarray, scale: float) -> tuple[float, np.ndarray]:
    """Summed cross-entropy of ``logits`` (classes x batch) divided by ``scale``, and its gradient."""
    xp = array_module(logits)
    z = logits - logits.max(axis=0, keepdims=True)
    e = xp.exp(z)
    p = e / e.sum(axis=0, keepdims=True)
    cols = xp.arange(labels.size)
    loss = float(-xp.log(xp.maximum(p[labels, cols], 1e-300)).sum() / scale)
    p[labels, cols] -= 1.0
    return loss, p / scale



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

    def on(self, backend: str) -> Model:
        """This model with every array (patterns, values, optimiser state) on the backend's device
        (``"cpu"``: NumPy; ``"gpu"``: CuPy); arrays already there are not copied."""
        move = kernels.backend_named(backend).to_device
        return Model([(move(a), move(b)) for a, b in self.patterns], [move(p) for p in self.params], self.neurons,
                     self.classes, self.bias, self.ymax, self.optimizer,
                     [[move(s) for s in slot] for slot in self.slots], self.step)

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
    xp = array_module(params[0])
    return [p - lr * (a / c1) / (xp.sqrt(b / c2) + eps) for p, a, b in zip(params, m, v)], [m, v]


def forward(model: Model, xt: np.ndarray) -> list[np.ndarray]:
    """Activations ``[Y_0, ..., Y_L]``, each transposed (``N x batch``), float64."""
    xp = array_module(xt)
    ys = [xp.ascontiguousarray(xt, dtype=xp.float64)]
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
    hits = to_host(logits(model, xt).argmax(axis=0)) == to_host(labels)
    return float(hits.mean()) if labels.size else float("nan")


def flatten(arrays: list[np.ndarray]) -> np.ndarray:
    """The arrays' values as one flat array (gradients travel between workers this way)."""
    return array_module(arrays[0]).concatenate([a.ravel() for a in arrays])


def unflatten(flat: np.ndarray, like: list[np.ndarray]) -> list[np.ndarray]:
    """The inverse of :func:`flatten`: views of ``flat`` shaped as the arrays of ``like``."""
    out, at = [], 0
    for a in like:
        out.append(flat[at:at + a.size].reshape(a.shape))
        at += a.size
    return out
