"""Faults survived: a damaged chunk, the client process killed mid-run (infer and train), many runs on one cluster."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psutil
import pytest

from dasknn import engine, generate, store
from dasknn import train as tr
from dasknn.cli import main

ROOT = Path(__file__).resolve().parents[2]


def test_flipped_byte_names_layer_and_chunk_and_nothing_is_computed(slice_store, tmp_path, capsys):
    bad = tmp_path / "bad.zarr"
    shutil.copytree(slice_store, bad)
    chunk = bad / "layers" / "7" / "indices_1" / "c" / "0"
    data = bytearray(chunk.read_bytes())
    data[len(data) // 3] ^= 0x10
    chunk.write_bytes(bytes(data))
    with pytest.raises(store.DasknnError, match=r"layer 7: cannot read entries \(indices_1 chunk 0, entries 0\.\."):
        store.open_store(bad, check="metadata").columns(7, 0, 1024)
    out = tmp_path / "cats.tsv"
    assert main(["infer", "--network", str(bad), "--workers", "1", "--out", str(out), "--results",
                 str(tmp_path / "run.zarr")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "layer 7" in err and "indices_1 chunk 0" in err
    assert not out.exists()
    assert not (tmp_path / "run.zarr").exists() or store.read_results(tmp_path / "run.zarr") == {}


def _spawn(argv: list[str], tmp: Path) -> subprocess.Popen:
    # its temporary files under ``tmp`` (the test's tmp_path): a client SIGKILLed cannot remove its own
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(tmp)}
    return subprocess.Popen([sys.executable, "-m", "dasknn", *argv], env=env, cwd=ROOT, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _kill_client_and_orphans(proc: subprocess.Popen) -> None:
    """SIGKILL the client process, then whatever it started (its process group: the cluster's workers)."""
    family = psutil.Process(proc.pid).children(recursive=True)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(10)
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    psutil.wait_procs(family, timeout=10)
    assert not [p for p in family if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


def _written(results: Path) -> int:
    # polled while the run puts its results store in place (written hidden, then renamed): a folder that vanishes
    # between the listing and the reading is one not written yet
    try:
        return sum('"complete": true' in p.read_text() for p in results.glob("chunk-*/zarr.json"))
    except FileNotFoundError:
        return 0


def _wait_for(predicate, proc: subprocess.Popen, timeout: float = 120) -> None:
    t0 = time.monotonic()
    while not predicate():
        assert proc.poll() is None, proc.communicate()[1].decode()[-2000:]
        assert time.monotonic() - t0 < timeout
        time.sleep(0.005)


@pytest.mark.cluster
@pytest.mark.subprocess
def test_client_killed_during_infer_resumes(slice_store, slice_truth, tmp_path):
    results = tmp_path / "run.zarr"
    chunks = 40
    argv = ["infer", "--network", str(slice_store), "--workers", "1", "--chunks", str(chunks), "--dtype", "float64",
            "--results", str(results), "--json"]
    proc = _spawn(argv, tmp_path)
    try:
        _wait_for(lambda: _written(results) >= 2, proc)
    finally:
        _kill_client_and_orphans(proc)
    done = set(store.read_results(results))
    assert 2 <= len(done) < chunks  # killed part way
    out = tmp_path / "cats.tsv"
    again = subprocess.run([sys.executable, "-m", "dasknn", *argv, "--resume", "--out", str(out)], cwd=ROOT,
                           env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    report = json.loads(again.stdout)
    assert report["matches_truth"] is True and report["chunks"] == chunks
    assert report["computed_chunks"] == chunks - len(done)  # only what was not written
    from dasknn import io

    np.testing.assert_array_equal(io.read_categories(out), slice_truth)


def _train_data(path: Path, n: int) -> None:
    rng = np.random.default_rng(3)
    x = rng.random((300, n)) * (rng.random((300, n)) < 0.3)
    np.savez(path, x=x, y=rng.integers(0, 4, 300))


@pytest.mark.cluster
@pytest.mark.subprocess
def test_client_killed_during_train_resumes_to_the_same_weights(tmp_path):
    n = 64
    layers = [generate.butterfly_layer(n, k) for k in range(1, 4)]
    net = store.write_network(tmp_path / "net.zarr", generate.Network(layers, bias=-0.1))
    _train_data(tmp_path / "d.npz", n)
    argv = ["train", "--network", str(net), "--data", str(tmp_path / "d.npz"), "--mode", "single", "--epochs", "120",
            "--batch", "16", "--optimizer", "adam", "--lr", "0.01", "--checkpoint-every", "50"]
    ck = tmp_path / "ck.zarr"
    proc = _spawn([*argv, "--checkpoint", str(ck)], tmp_path)
    try:
        _wait_for(ck.exists, proc)
    finally:
        _kill_client_and_orphans(proc)
    step = tr.load_checkpoint(ck)[0].step
    total = 120 * -(-240 // 16)
    assert 0 < step < total
    # a kill that lands while a checkpoint is written leaves its partial (a writer killed outright cannot remove
    # it); the next write of the checkpoint does (dasknn/partials.py). One such is made here, so that the check
    # after the resumed run does not depend on where the kill landed
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    (tmp_path / f".ck.zarr.partial-{int(gone.stdout)}-0badc0de").mkdir()
    again = subprocess.run([sys.executable, "-m", "dasknn", *argv, "--checkpoint", str(ck), "--resume", "--json"],
                           cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
                           timeout=300)
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["steps"] == total - step  # resumed, not restarted
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no partial checkpoint left
    whole = tr.train(str(net), str(tmp_path / "d.npz"), mode="single", epochs=120, batch=16, optimizer="adam",
                     lr=0.01)
    resumed = tr.load_checkpoint(ck)[0]
    assert resumed.step == total
    for a, b in zip(resumed.params, whole.model.params):
        assert np.array_equal(a, b)


# --- load: many small inferences on one cluster ---------------------------------------------------------------

def _cluster_state(client) -> dict:
    """Scheduler tasks; the largest worker's RSS, open files and bounded Dask histories; the client's open files.

    ``history`` is the length of the worker's profile history (one entry a second, up to
    ``distributed.admin.low-level-log-length``), ``key_cache`` the entries of ``dask.utils.key_split``'s LRU cache
    (one per distinct key, up to 100,000): the two things that grow in a worker running many small graphs."""
    def worker_state(dask_worker):
        import gc

        import psutil
        from dask.utils import key_split

        gc.collect()
        p = psutil.Process()
        return (p.memory_info().rss, p.num_fds(), len(dask_worker.profile_history),
                key_split.cache_info().currsize)

    per_worker = list(client.run(worker_state).values())
    return {"tasks": client.run_on_scheduler(lambda dask_scheduler: len(dask_scheduler.tasks)),
            "rss": max(w[0] for w in per_worker), "fds": max(w[1] for w in per_worker),
            "history": min(w[2] for w in per_worker), "key_cache": max(w[3] for w in per_worker),
            "client_fds": psutil.Process().num_fds()}


def many_inferences(client, folder: Path, runs: int, warmup: int = 5, every: int = 0,
                    samples: list | None = None) -> tuple[dict, dict]:
    """Run ``runs`` small inferences on one cluster, each checked against SciPy; the state before and after
    (and, with ``every``, appended to ``samples`` every ``every`` runs)."""
    from dasknn.reference import infer_categories

    net = generate.network(256, 6, seed=11, bias=-0.3)
    images = generate.images(64, 256, seed=11)
    path = store.write_network(folder / "small.zarr", net, images)
    expected = infer_categories(net.layers, images, net.bias, net.ymax, np.float32)
    for _ in range(warmup):  # imports, compiled kernels and caches settle first
        engine.infer(path, client=client, chunks=2)
    before = _cluster_state(client)
    t0 = time.perf_counter()
    for k in range(runs):
        mode = ("data", "model")[k % 2]
        got = engine.infer(path, client=client, mode=mode, partition="block", chunks=2 + k % 3, images=64)
        np.testing.assert_array_equal(got.categories, expected)
        if every and samples is not None and (k + 1) % every == 0:
            samples.append({"runs": k + 1, "seconds": round(time.perf_counter() - t0, 1), **_cluster_state(client)})
    return before, _cluster_state(client)


def test_fifty_inferences_on_one_cluster(client, tmp_path):
    before, after = many_inferences(client, tmp_path, 50)
    assert after["tasks"] <= before["tasks"]  # nothing left behind on the scheduler
    assert after["rss"] - before["rss"] < 64 * 2**20
    assert after["fds"] - before["fds"] <= 4 and after["client_fds"] - before["client_fds"] <= 4
