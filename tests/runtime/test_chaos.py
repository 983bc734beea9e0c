"""Chaos: a worker SIGKILLed at moments spread over whole runs, setup phases included, on a real cluster (a
``dask scheduler`` process and nanny-managed ``dask worker`` processes). Every run must end with the exact float64
categories (inference) or the uninterrupted run's losses (training), exit 0, and no traceback on stderr.

Each kill is aimed at a phase by the task whose start (or end) triggers it (:class:`chaos.Kill`), and the run's
``recoveries`` must name that phase (where Dask itself recomputed the lost task, as it may for an unpinned
partition task, there is none to name).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import chaos
from chaos import Kill
from dasknn import generate, store

pytestmark = [pytest.mark.slow, pytest.mark.cluster, pytest.mark.subprocess]

DEPTH = 40


@pytest.fixture(scope="module")
def network(tmp_path_factory):
    """A generated 1024 x 40 network with 1,200 images and their float64 truth."""
    return generate.write(tmp_path_factory.mktemp("chaos") / "deep.zarr", 1024, DEPTH, 1200, seed=3, truth=True)


@pytest.fixture(scope="module")
def cluster():
    """A real scheduler and 2 nanny-managed single-threaded workers, and a client of the test's own."""
    from distributed import Client

    with chaos.real_cluster(workers=2) as cl, Client(cl.address) as client:
        yield cl, client


def _run_killing(cluster, kill: Kill, command: list[str]) -> tuple[subprocess.CompletedProcess, dict]:
    # run ``command`` while the plugin kills one worker as ``kill`` says; the cluster is whole again after
    cl, client = cluster
    client.wait_for_workers(2, timeout=60)
    client.register_plugin(chaos.KillOnTask(kill))
    try:
        done = chaos.run_or_explain(command, client)
        fired = client.run_on_scheduler(chaos.fired)
    finally:
        client.run_on_scheduler(chaos.forget)
    client.wait_for_workers(2, timeout=60)
    return done, fired


def _clean(done: subprocess.CompletedProcess) -> None:
    assert done.returncode == 0, done.stderr[-3000:]
    assert not chaos.TRACEBACK.search(done.stderr), done.stderr[-3000:]


# (mode, extra options, the kill, the phases its recovery may be reported in; () where Dask recomputes on its own)
INFERENCE = [
    ("model", [], Kill("partition_task", delay=0.5), ("partition", "plan", "")),
    ("model", [], Kill("partition_task", "memory"), ("partition", "plan", "")),
    ("model", [], Kill("plan-g0-p1", delay=0.05), ("plan",)),
    ("model", [], Kill("plan-g0-p1", "memory"), ("plan",)),  # its plan made, before the client has its counts
    ("model", [], Kill("weights-g0-p0"), ("load",)),
    ("model", [], Kill("images-p1-c0"), ("load", "inference")),
    ("model", ["--exchange", "tasks"], Kill("spmm-l20-p1"), ("inference",)),
    ("model", ["--results", "RESULTS"], Kill("categories-c0"), ("inference",)),
    ("model", ["--stream"], Kill("plan-l10"), ("plan",)),
    ("model", ["--stream", "--exchange", "tasks"], Kill("spmm-l30-p0"), ("inference",)),
    ("model", ["--exchange", "p2p"], Kill("spmm-l1-40-p1"), ("inference",)),
    ("model", ["--exchange", "p2p", "--stream"], Kill("spmm-l1-40-p0"), ("inference",)),
    ("model", ["--exchange", "p2p", "--results", "RESULTS"], Kill("categories-c1"), ("inference",)),
    ("data", [], Kill("weights-w1"), ("load",)),
    ("data", ["--results", "RESULTS"], Kill("spmm-l1-40-p0-c1"), ("inference",)),
    ("pipeline", [], Kill("stage-weights-w1"), ("load",)),
    ("pipeline", [], Kill("stage1-"), ("inference",)),
    ("pipeline", ["--stream", "--results", "RESULTS"], Kill("stage0-", nth=2), ("inference",)),
    ("auto", ["--explain"], Kill("_probe_task", delay=0.05), ("probe",)),
    ("auto", ["--explain"], Kill("loop_timing", delay=0.05), ("probe",)),
]


@pytest.mark.parametrize("mode,options,kill,phases", INFERENCE,
                         ids=[f"{m}{''.join(o[:2])}-{k.name}" for m, o, k, _ in INFERENCE])
def test_inference_survives_a_worker_killed_in_any_phase(network, cluster, tmp_path, mode, options, kill, phases):
    run_store = tmp_path / "net.zarr"
    shutil.copytree(network, run_store)  # no partition or part plan kept yet: every phase runs
    options = [str(tmp_path / "run.zarr") if o == "RESULTS" else o for o in options]
    done, fired = _run_killing(cluster, kill, [
        sys.executable, "-m", "dasknn", "infer", "--scheduler", cluster[0].address, "--network", str(run_store),
        "--mode", mode, "--chunks", "2", "--json", *options])
    assert fired is not None, f"no task {kill.prefix}* reached {kill.state}: the kill never happened"
    _clean(done)
    report = json.loads(done.stdout)
    assert report["matches_truth"] is True and report["mismatched"] == 0
    seen = [r["phase"] for r in report["recoveries"]]
    assert (len(seen) == 1 and seen[0] in phases) or (not seen and "" in phases), report["recoveries"]
    for r in report["recoveries"]:
        assert r["lost"] == [fired["worker"]]
        if mode == "pipeline" and r["phase"] == "inference" and "--stream" not in options:
            # the worker left holds its stage's layers still; only the lost stage is loaded again
            assert (r["stages_kept"], r["stages_reloaded"]) == (1, 1), r
        if mode == "model" and r["phase"] == "inference" and "--stream" not in options:
            # the worker left holds its part still (the partition and its plan kept): only the lost part is planned
            # and loaded again, on the worker that replaced it
            assert (r["parts_kept"], r["parts_reloaded"]) == (1, 1), r
        if mode == "data" and r["phase"] == "inference":
            assert (r["networks_kept"], r["networks_reloaded"]) == (1, 1), r
    if "--results" in options:
        ids = store.read_results(options[options.index("--results") + 1], range(report["chunks"]))
        np.testing.assert_array_equal(np.sort(np.concatenate(list(ids.values()))),
                                      store.open_inputs(run_store).truth(np.float64))


TRAIN = textwrap.dedent("""
    import json, sys
    from dasknn.train import train
    from distributed import Client

    with Client(sys.argv[1]) as client:
        run = train(sys.argv[2], "digits", mode=sys.argv[3], workers=2, client=client, epochs=1, batch=64,
                    max_steps=24, chunk=4, checkpoint=sys.argv[4], checkpoint_every=8, optimizer="adam", lr=1e-3,
                    exchange=sys.argv[5])
    print(json.dumps({"losses": run.losses, "restarts": run.restarts}))
""")

# (mode, exchange, the kill, whether a restart must be counted)
TRAINING = [
    ("model", "tasks", Kill("partition_task", delay=0.2), False),
    ("model", "tasks", Kill("tuple-", "scattered"), True),
    ("model", "tasks", Kill("setup-g0-p1"), True),
    ("model", "tasks", Kill("setup-g0-p1", "memory"), True),  # set up, before the client has its counts
    ("model", "tasks", Kill("fwd-s13-g0-l2-p1"), True),
    ("model", "p2p", Kill("steps-s12-15-g0-p1", delay=0.05), True),
    ("data", "tasks", Kill("Model-", "scattered"), True),
    ("data", "tasks", Kill("grad-s5-r1"), True),
    ("data", "tasks", Kill("grad-s17-r0"), True),
    ("pipeline", "tasks", Kill("psetup-r0-s1"), True),
    ("pipeline", "tasks", Kill("psetup-r0-s1", "memory"), True),  # set up, before the client has heard
    ("pipeline", "tasks", Kill("pf-t13-r0-s1-m1"), True),
    ("pipeline", "tasks", Kill("pb-t6-r0-s0-m2"), True),
    ("pipeline", "tasks", Kill("pupdate-t17-r0-s0", "memory"), True),  # updated, its state lost with it
]


def _train(cluster, network, mode: str, checkpoint, kill: Kill | None = None, exchange: str = "tasks") -> dict:
    # the training script's losses and restarts, with ``kill`` done on the way
    command = [sys.executable, "-c", TRAIN, cluster[0].address, str(network), mode, str(checkpoint), exchange]
    if kill is None:
        done, fired = chaos.run_or_explain(command, cluster[1]), None
    else:
        done, fired = _run_killing(cluster, kill, command)
        assert fired is not None, f"no task {kill.prefix}* reached {kill.state}: the kill never happened"
    _clean(done)
    return json.loads(done.stdout)


@pytest.fixture(scope="module")
def train_network(tmp_path_factory, cluster):
    """A 1024 x 4 network whose hypergraph partition for 2 parts is kept in it (a run on a copy partitions
    nothing), and the single process's losses on it."""
    pytest.importorskip("sklearn")  # the digits
    from dasknn.train import train

    folder = tmp_path_factory.mktemp("train")
    path = generate.write(folder / "net4.zarr", 1024, 4, seed=1)
    _train(cluster, path, "model", folder / "ck.zarr")  # (partitions it, on the cluster)
    single = train(str(path), "digits", mode="single", epochs=1, batch=64, max_steps=24, optimizer="adam", lr=1e-3)
    return path, single.losses


@pytest.mark.parametrize("mode,exchange,kill,restarted", TRAINING,
                         ids=[f"{m}-{e}-{k.name}" for m, e, k, _ in TRAINING])
def test_training_survives_a_worker_killed_in_any_phase(train_network, cluster, tmp_path, mode, exchange, kill,
                                                        restarted):
    path, single = train_network
    shutil.copytree(path, tmp_path / "net.zarr")
    if kill.prefix.startswith("partition"):  # the partition is computed again, on the cluster, while it is killed
        shutil.rmtree(tmp_path / "net.zarr" / "partitions")
    run = _train(cluster, tmp_path / "net.zarr", mode, tmp_path / "ck.zarr", kill, exchange)
    # the batches depend on the seed and the step only: the single process's losses, but for the last bit (the
    # parts' sums run in the same order; NumPy's matrix products may round their last bit by where their arrays
    # lie in memory, which differs with the placement of the parts)
    np.testing.assert_allclose(run["losses"], single, rtol=1e-12, atol=0)
    assert run["restarts"] == 1 if restarted else run["restarts"] <= 1
