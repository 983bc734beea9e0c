"""Training: gradients against a dense float64 NumPy reference, Dask modes against one process, checkpoints."""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.sparse as sp

from dasknn import train as tr

from examples import C, N, random_layers, rel, toy_data


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


@pytest.mark.cluster
@pytest.mark.parametrize("mode,workers,group_size", [("data", 1, None), ("data", 2, None), ("data", 4, None),
                                                     ("model", 1, None), ("model", 2, None), ("model", 4, None),
                                                     ("hybrid", 4, 2), ("hybrid", 2, 1)])
def test_distributed_gradient_and_ten_steps_match_single_process(client, mode, workers, group_size, single_runs):
    # one SGD step with lr 1: the change is the gradient, which must equal the dense reference
    x, y = toy_data(60)
    one = tr.train(random_layers(), (x, y), epochs=1, batch=16, lr=1.0, optimizer="sgd", mode=mode,
                   workers=workers, group_size=group_size, client=client, seed=5, max_steps=1, partition="random")
    start = tr.init_model(random_layers(), C, seed=5)
    x_tr, y_tr, _, _ = tr.split(x, y, 0.2, 5)
    idx = tr.schedule(len(y_tr), 16, 1, 5)[0]
    _, ref = dense_reference(start, np.ascontiguousarray(x_tr[idx].T), y_tr[idx])
    for before, after, r in zip(start.params, one.model.params, ref):
        assert rel(before - after, r) < 1e-6
    # ten momentum steps: the distributed weights equal the single-process ones
    run = small_run(mode, workers, client, group_size=group_size)
    single = single_runs["momentum"]
    assert run.steps == 10
    for a, b in zip(run.model.params, single.model.params):
        assert rel(a, b) < 1e-5
    assert np.allclose(run.losses, single.losses, rtol=1e-6)
    if mode == "hybrid":
        assert run.group_size == group_size


def test_hybrid_all_reduces_between_groups_only(client):
    # 2 groups x 1 part on 2 workers: the groups exchange the part's gradient values, and nothing else
    x, y = toy_data(60)
    run = small_run("hybrid", 2, client, "sgd", steps=4, group_size=1)
    values = sum(p.size for p in run.model.params)
    dense = run.model.depth * N * N + N * C + C
    # up the tree and back: two messages of the values (plus framing, a few kB) per step, far below dense ones
    assert 2 * values * 8 <= run.bytes_sent_per_step < min(2 * values * 8 * 1.5, 0.5 * 2 * dense * 8)


@pytest.mark.parametrize("mode", ["data", "model"])
def test_killed_worker_run_resumes_from_checkpoint(client, tmp_path, mode):
    import os
    import signal

    whole = small_run(mode, 2, client, "adam", steps=12)
    pids = client.run(os.getpid)
    killed = []

    def kill_one(step):
        # after step 6 (the last checkpoint is at step 4): the next chunk meets a dead worker
        if step == 6 and not killed:
            victim = sorted(pids)[len(killed) % len(pids)]
            os.kill(pids[victim], signal.SIGKILL)
            killed.append(victim)

    run = small_run(mode, 2, client, "adam", steps=12, checkpoint=tmp_path / "ck.zarr", checkpoint_every=4,
                    chunk=2, progress=kill_one)
    assert killed and run.restarts == 1 and run.steps == 12
    assert killed[0] not in client.nthreads()  # the worker really went (the nanny restarted a new one)
    for a, b in zip(run.model.params + run.model.slots[1], whole.model.params + whole.model.slots[1]):
        assert np.array_equal(a, b)
    assert run.losses == whole.losses
    assert tr.load_checkpoint(tmp_path / "ck.zarr")[0].step == 12


@pytest.mark.cluster
def test_a_worker_never_replaced_costs_time_and_training_goes_on_on_the_workers_left_saying_so(monkeypatch, tmp_path):
    # three in-process workers (no nanny: a closed one stays gone); one closed for good after step 6: after the wait
    # the run restarts from its checkpoint on the two left, with the losses of a whole run, and says so in one line
    import sys

    from distributed import Client, LocalCluster

    from dasknn.cli.common import loss_lines

    monkeypatch.setattr(sys.modules["dasknn.train.driver"], "AWAIT_WORKERS_SECONDS", 1.0)
    whole = small_run("data", 3, None, "adam", steps=12)
    with LocalCluster(n_workers=3, threads_per_worker=1, processes=False, dashboard_address=None) as cluster, \
            Client(cluster) as client:
        victim = sorted(cluster.workers)[-1]
        closed = []

        def close_one(step):
            if step == 6 and not closed:
                worker = cluster.workers[victim]
                closed.append(worker.address)
                client.sync(worker.close)

        run = small_run("data", 3, client, "adam", steps=12, checkpoint=tmp_path / "ck.zarr", checkpoint_every=4,
                        chunk=2, progress=close_one)
        assert closed and closed[0] not in client.nthreads() and len(client.nthreads()) == 2
    assert run.steps == 12 and run.restarts == 1
    np.testing.assert_allclose(run.losses, whole.losses, rtol=1e-12, atol=0)
    [loss] = run.recoveries
    assert loss["lost"] == closed and loss["phase"] == "steps" and loss["restart_from_step"] == 4
    assert loss["workers_now"] == 2 and loss["waited_seconds"] >= 1.0
    assert run.summary()["recoveries"] == run.recoveries
    line = loss_lines(run.recoveries)
    assert line.startswith(f"lost {closed[0]} in the steps phase: waited ") and "\n" not in line
    assert "went on with 2 workers (restart from step 4)" in line


@pytest.mark.parametrize("mode", ["single", "model"])
def test_checkpoint_resume_is_exact(client, tmp_path, mode):
    ck = tmp_path / "ck.zarr"
    whole = small_run(mode, 2, client, "adam", steps=8)
    part = small_run(mode, 2, client, "adam", steps=4, checkpoint=ck, checkpoint_every=2)
    assert part.steps == 4 and tr.load_checkpoint(ck)[0].step == 4
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp left behind
    rest = small_run(mode, 2, client, "adam", steps=8, checkpoint=ck, resume=True)
    assert rest.steps == 4
    for a, b in zip(rest.model.params + rest.model.slots[1], whole.model.params + whole.model.slots[1]):
        assert np.array_equal(a, b)
    assert rest.losses == whole.losses[4:]


def test_import_weights_prunes_by_magnitude(tmp_path):
    from dasknn.store import open_store

    rng = np.random.default_rng(0)
    ws = [rng.standard_normal((20, 20)) for _ in range(2)]
    np.savez(tmp_path / "m.npz", a=ws[0], b=ws[1])
    out = tr.import_weights(tmp_path / "m.npz", tmp_path / "s.zarr", 0.9)
    s = open_store(out)
    assert s.depth == 2 and s.neurons == 20
    for k, w in enumerate(ws, start=1):
        layer = s.layer(k)
        assert layer.nnz == 40
        kept = np.abs(layer.toarray()[layer.toarray() != 0])
        assert kept.min() >= np.sort(np.abs(w).ravel())[-40]
    m = tr.init_model(s.network().layers, 3, init="keep")
    assert np.array_equal(m.layer(1).toarray(), s.layer(1).toarray().astype(np.float64))
    ws[0][ws[0] < 0] = 0
    np.savez(tmp_path / "z.npz", ws[0])
    assert open_store(tr.import_weights(tmp_path / "z.npz", tmp_path / "z.zarr")).layer(1).nnz == (ws[0] != 0).sum()


def test_import_weights_from_pytorch_state_dict(tmp_path):
    torch = pytest.importorskip("torch")
    from dasknn.store import open_store

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 16))
    torch.save(net.state_dict(), tmp_path / "m.pt")
    s = open_store(tr.import_weights(tmp_path / "m.pt", tmp_path / "s.zarr", 0.75))
    assert s.depth == 2 and s.neurons == 16  # the biases (1-D) are not layers
    x = torch.rand(5, 16, dtype=torch.float64)
    for k, lin in enumerate([net[0], net[2]], start=1):
        w = lin.weight.detach().double()
        layer = s.layer(k).toarray().astype(np.float64)
        assert (layer != 0).sum() == 64
        # nn.Linear computes x @ W.T; the store's layer is in the challenge orientation (x @ layer)
        keep = torch.from_numpy(layer != 0)
        assert np.allclose(x.numpy() @ layer, (x @ (w.T * keep)).numpy(), atol=1e-6)
        assert np.abs(layer[layer != 0]).min() >= np.sort(np.abs(w.numpy()).ravel())[-64] - 1e-7


def test_import_weights_pt_without_torch_says_what_to_do(tmp_path, monkeypatch):
    import sys

    from dasknn.errors import DasknnError

    monkeypatch.setitem(sys.modules, "torch", None)  # importing it raises ImportError
    (tmp_path / "m.pt").write_bytes(b"not read")
    with pytest.raises(DasknnError, match="pip install torch.*npz"):
        tr.import_weights(tmp_path / "m.pt", tmp_path / "s.zarr", 0.5)


def test_cli_parsers(tmp_path, capsys):
    import argparse
    import json

    from dasknn import store
    from dasknn.cli import train as cli_train

    x, y = toy_data(60)
    np.savez(tmp_path / "d.npz", x=x, y=y)
    store.write_network(tmp_path / "n.zarr", __import__("dasknn").network.Network(random_layers(), 0.0))
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="command")
    cli_train.add_train_parser(sub)
    cli_train.add_import_weights_parser(sub)
    args = p.parse_args(["train", "--network", str(tmp_path / "n.zarr"), "--data", str(tmp_path / "d.npz"),
                         "--epochs", "2", "--batch", "16", "--mode", "single", "--json"])
    assert args.func(args) == 0
    out = json.loads(capsys.readouterr().out)
    for key in ("steps", "seconds", "train_loss", "test_accuracy", "state_bytes", "dense_masked_state_bytes",
                "bytes_sent_per_step"):
        assert key in out
    assert out["steps"] == 6
    args = p.parse_args(["train", "--network", "n.zarr", "--mode", "hybrid", "--workers", "4", "--group-size", "2"])
    assert args.mode == "hybrid" and args.group_size == 2
    args = p.parse_args(["import-weights", "m.npz", "--sparsity", "0.5", "--out", "o.zarr"])
    assert args.sparsity == 0.5 and args.func is cli_train.run_import_weights


@pytest.mark.cluster
@pytest.mark.parametrize("kind", ["scipy.sparse", "dask.array"])
def test_training_data_as_sparse_or_dask_arrays_trains_the_same(kind):
    import dask.array as da

    x, y = toy_data()
    given = (sp.csr_matrix(x), y) if kind == "scipy.sparse" else (da.from_array(x, chunks=(7, N)),
                                                                   da.from_array(y, chunks=7))
    expected = tr.train(random_layers(), (x, y), mode="single", epochs=2, batch=8)
    got = tr.train(random_layers(), given, mode="single", epochs=2, batch=8)
    assert got.losses == expected.losses and len(got.losses) > 0
    for a, b in zip(got.model.params, expected.model.params):
        np.testing.assert_array_equal(a, b)


@pytest.mark.cluster
def test_user_errors():
    from dasknn.errors import DasknnError

    with pytest.raises(DasknnError, match="optimizer"):
        tr.init_model(random_layers(), C, optimizer="lbfgs")
    with pytest.raises(DasknnError, match="pixels"):
        tr.train(random_layers(), (np.zeros((10, 3)), np.zeros(10)), mode="single")
    with pytest.raises(DasknnError, match="checkpoint"):
        tr.train(random_layers(), toy_data(), mode="single", resume=True)
    with pytest.raises(DasknnError, match="group-size"):
        tr.train(random_layers(), toy_data(), mode="hybrid", workers=4, group_size=3)


@pytest.mark.cluster
def test_digits_learn_in_data_mode(client):
    pytest.importorskip("sklearn")
    from dasknn import generate

    r = tr.train(generate.network(1024, 4, seed=0), "digits", epochs=3, batch=64, lr=1e-3, optimizer="adam",
                 mode="data", workers=2, client=client, seed=0)
    assert r.test_accuracy >= 0.95
    assert r.bytes_sent_per_step > 0


def _numpy_cupy():
    # a stand-in CuPy backed by NumPy: backend="gpu" runs its device path (arrays moved, steps, moved back)
    import types

    fake = types.ModuleType("cupy")
    for name in ("asarray", "ascontiguousarray", "concatenate", "float64", "exp", "log", "maximum", "arange", "sqrt"):
        setattr(fake, name, getattr(np, name))
    return fake


@pytest.mark.parametrize("mode,workers", [("single", 1), ("data", 2)])
def test_gpu_backend_path_with_numpy_standin(client, monkeypatch, mode, workers, single_runs):
    import sys

    fake = _numpy_cupy()
    monkeypatch.setitem(sys.modules, "cupy", fake)
    assert tr.device.array_module(np.zeros(1)) is np and tr.device.array_module([0.0]) is fake
    run = small_run(mode, workers, client if mode == "data" else None, backend="gpu")
    single = single_runs["momentum"]
    for a, b in zip(run.model.params + run.model.slots[0], single.model.params + single.model.slots[0]):
        assert isinstance(a, np.ndarray) and rel(a, b) < 1e-12
    assert np.allclose(run.losses, single.losses, rtol=1e-12)


@pytest.mark.cluster
def test_gpu_without_cupy_or_in_model_mode_is_one_line(tmp_path, monkeypatch, capsys):
    import sys

    from dasknn import cli, store
    from dasknn.errors import DasknnError

    monkeypatch.setitem(sys.modules, "cupy", None)  # importing it raises ImportError
    with pytest.raises(DasknnError, match="--gpu needs CuPy"):
        tr.train(random_layers(), toy_data(), mode="single", backend="gpu")
    with pytest.raises(DasknnError, match="single or data mode"):
        tr.train(random_layers(), toy_data(), mode="model", backend="gpu")
    store.write_network(tmp_path / "n.zarr", __import__("dasknn").network.Network(random_layers(), 0.0))
    x, y = toy_data(60)
    np.savez(tmp_path / "d.npz", x=x, y=y)
    code = cli.main(["train", "--network", str(tmp_path / "n.zarr"), "--data", str(tmp_path / "d.npz"),
                     "--mode", "single", "--gpu"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "--gpu needs CuPy" in err


@pytest.mark.gpu
@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_training_step_on_cupy_matches_the_cpu_step(optimizer):
    cupy = pytest.importorskip("cupy")
    x, y = toy_data()
    host = tr.init_model(random_layers(), C, seed=3, bias=-0.05, ymax=1.5, optimizer=optimizer)
    device = host.on("gpu")
    xt = x.T.copy()
    for _ in range(3):
        want = tr.sgd_step(host, xt, y, 0.05)
        got = tr.sgd_step(device, cupy.asarray(xt), cupy.asarray(y), 0.05)
        assert got == pytest.approx(want, rel=1e-5)
    assert isinstance(device.params[0], cupy.ndarray)
    back = device.on("cpu")
    for a, b in zip(back.params + [s for slot in back.slots for s in slot],
                    host.params + [s for slot in host.slots for s in slot]):
        assert isinstance(a, np.ndarray) and rel(a, b) < 1e-5


@pytest.mark.cluster
@pytest.mark.parametrize("fits", [True, False])
def test_a_stored_networks_partition_is_made_on_the_cluster_where_a_worker_has_the_memory(
        client, tmp_path, monkeypatch, fits):
    from dasknn.engine import sizing
    from dasknn.network import Network
    from dasknn.partition import cluster as PC
    from dasknn.store import load_partition, partition_name, write_network

    path = write_network(tmp_path / "net.zarr", Network(random_layers(), 0.0, math.inf))
    on_cluster = []

    def spy(*args, **kwargs):
        on_cluster.append(args[1:4])
        return real(*args, **kwargs)

    real = PC.partition_on_cluster
    monkeypatch.setattr(PC, "partition_on_cluster", spy)
    monkeypatch.setattr(sizing, "partition_fits_worker", lambda neurons, memory: fits)
    x, y = toy_data(60)
    kw = dict(epochs=1, batch=16, lr=0.05, mode="model", workers=2, client=client, seed=5, max_steps=2,
              partition="hypergraph")
    first = tr.train(str(path), (x, y), **kw)
    assert on_cluster == ([(str(path), 2, "hypergraph")] if fits else [])
    saved = load_partition(path, partition_name("hypergraph", 2, 5))
    assert saved is not None and first.partition == "hypergraph"
    # the next run reuses the stored partition and trains the same
    again = tr.train(str(path), (x, y), **kw)
    assert len(on_cluster) == (1 if fits else 0)
    for a, b in zip(first.model.params, again.model.params):
        assert np.array_equal(a, b)
