"""Training: gradients against a dense float64 NumPy reference, Dask modes against one process, checkpoints."""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.sparse as sp

from dasknn import train as tr

N, C = 48, 5


def random_layers(depth=3, n=N, density=0.25, seed=1):
    rng = np.random.default_rng(seed)
    out = []
    for k in range(depth):
        m = sp.random(n, n, density=density, format="csc", random_state=rng, dtype=np.float64)
        m = m.tocsc()
        m.data[:] = 1.0
        out.append(m)
    return out


def toy_data(count=40, n=N, seed=2):
    rng = np.random.default_rng(seed)
    x = rng.random((count, n)) * (rng.random((count, n)) < 0.5)
    y = rng.integers(0, C, count)
    return x, y


def dense_reference(model, xt, labels):
    """Dense float64 forward and backward; the weight gradient picked at the pattern."""
    ws = [model.layer(k).toarray() for k in range(1, model.depth + 1)]
    ys = [xt]
    for w in ws:
        z = w.T @ ys[-1]
        ys.append(np.where(z != 0, np.clip(z + model.bias, 0, model.ymax), 0))
    hw, hb = model.params[-2], model.params[-1]
    lg = hw.T @ ys[-1] + hb[:, None]
    p = np.exp(lg - lg.max(0)) / np.exp(lg - lg.max(0)).sum(0)
    b = labels.size
    loss = -np.log(p[labels, np.arange(b)]).mean()
    p[labels, np.arange(b)] -= 1
    dlog = p / b
    grads = [None] * len(model.params)
    grads[-2], grads[-1] = ys[-1] @ dlog.T, dlog.sum(1)
    g = hw @ dlog
    for k in range(model.depth, 0, -1):
        delta = g * ((ys[k] > 0) & (ys[k] < model.ymax))
        dw = ys[k - 1] @ delta.T
        m = model.layer(k).tocoo()
        grads[k - 1] = dw[m.row, m.col][np.lexsort((m.row, m.col))]  # CSC order: by column, then row
        g = ws[k - 1] @ delta
    return loss, grads


def rel(a, b):
    return np.abs(a - b).max() / max(np.abs(b).max(), 1e-300)


@pytest.mark.parametrize("bias,ymax", [(0.0, math.inf), (-0.05, 1.5)])
def test_gradients_match_dense_reference(bias, ymax):
    model = tr.init_model(random_layers(), C, seed=3, bias=bias, ymax=ymax)
    x, y = toy_data()
    loss, grads = tr.gradients(model, x.T.copy(), y)
    ref_loss, ref = dense_reference(model, x.T.copy(), y)
    assert loss == pytest.approx(ref_loss, rel=1e-12)
    for g, r in zip(grads, ref):
        assert g.shape == r.shape
        assert rel(g, r) < 1e-6
    assert any(np.abs(g).max() > 0 for g in grads[:-2])


def test_optimizers_and_state_bytes():
    x, y = toy_data()
    for opt in tr.OPTIMIZERS:
        model = tr.init_model(random_layers(), C, seed=3, optimizer=opt)
        first = tr.sgd_step(model, x.T.copy(), y, 0.05)
        for _ in range(30):
            last = tr.sgd_step(model, x.T.copy(), y, 0.05)
        assert last < first
        assert len(model.slots) == tr.OPT_SLOTS[opt]
        assert all(p.shape == s.shape for slot in model.slots for p, s in zip(model.params, slot))
        assert model.state_bytes() < model.dense_masked_state_bytes()


def test_adam_matches_formula():
    p, g = [np.array([1.0, -2.0])], [np.array([0.5, 0.25])]
    new, slots = tr.apply_update("adam", p, g, [[np.zeros(2)], [np.zeros(2)]], 0.1, 1)
    # first Adam step moves every value by lr * sign(g) (up to eps)
    assert np.allclose(new[0], p[0] - 0.1 * np.sign(g[0]), atol=1e-6)
    assert np.allclose(slots[0][0], 0.1 * g[0]) and np.allclose(slots[1][0], 0.001 * g[0] ** 2)


def small_run(mode, workers, client, optimizer="momentum", steps=10, **kw):
    x, y = toy_data(60)
    return tr.train(random_layers(), (x, y), epochs=4, batch=16, lr=0.05, optimizer=optimizer, mode=mode,
                    workers=workers, client=client, seed=5, max_steps=steps, partition=kw.pop("partition", "random"),
                    **kw)


@pytest.fixture(scope="module")
def single_runs():
    return {opt: small_run("single", 1, None, opt) for opt in ("momentum", "adam")}


@pytest.mark.parametrize("mode,workers", [("data", 1), ("data", 2), ("data", 4), ("model", 1), ("model", 2),
                                          ("model", 4)])
def test_distributed_gradient_and_ten_steps_match_single_process(client, mode, workers, single_runs):
    # one SGD step with lr 1: the change is the gradient, which must equal the dense reference
    x, y = toy_data(60)
    one = tr.train(random_layers(), (x, y), epochs=1, batch=16, lr=1.0, optimizer="sgd", mode=mode,
                   workers=workers, client=client, seed=5, max_steps=1, partition="random")
    start = tr.init_model(random_layers(), C, seed=5)
    x_tr, y_tr, _, _ = tr.split(x, y, 0.2, 5)
    idx = tr.schedule(len(y_tr), 16, 1, 5)[0]
    _, ref = dense_reference(start, np.ascontiguousarray(x_tr[idx].T), y_tr[idx])
    for before, after, r in zip(start.params, one.model.params, ref):
        assert rel(before - after, r) < 1e-6
    # ten momentum steps: the distributed weights equal the single-process ones
    run = small_run(mode, workers, client)
    single = single_runs["momentum"]
    assert run.steps == 10
    for a, b in zip(run.model.params, single.model.params):
        assert rel(a, b) < 1e-5
    assert np.allclose(run.losses, single.losses, rtol=1e-6)
