"""Several hosts, really: the scheduler, the client and each worker in a network namespace of its own, every link a
real interface limited to 1 Gbit/s (``tests/support/netns.py``). Model-mode inference and training complete and match
across them, with 1 ms added on one worker's traffic by a relay, and with one worker's link cut mid-run."""

from __future__ import annotations

import json
import shutil
import textwrap

import numpy as np
import pytest

import chaos
import netns
from chaos import Kill
from dasknn import generate, store

pytestmark = [pytest.mark.slow, pytest.mark.cluster, pytest.mark.subprocess]

WHY_NOT = netns.available()
if WHY_NOT:
    pytest.skip(f"no network namespaces: {WHY_NOT}", allow_module_level=True)


@pytest.fixture(scope="module")
def network(tmp_path_factory):
    """A generated 1024 x 40 network with 1,200 images and their float64 truth."""
    return generate.write(tmp_path_factory.mktemp("netns") / "deep.zarr", 1024, 40, 1200, seed=3, truth=True)


def _infer(cluster, path, *options) -> dict:
    done = cluster.run_client(["-m", "dasknn", "infer", "--scheduler", cluster.scheduler, "--network", str(path),
                               "--json", *options], chaos.environment())
    assert done.returncode == 0, done.stderr[-3000:]
    assert not chaos.TRACEBACK.search(done.stderr), done.stderr[-3000:]
    return json.loads(done.stdout)


def test_a_namespace_behind_one_link_serves_at_the_links_rate(tmp_path):
    # the rate-limited store's harness (benchmarks/bench_rate_limited_store.py): what crosses the link is paced by
    # its token bucket and counted on its near end
    import time
    import urllib.request

    payload = np.random.default_rng(0).bytes(3_000_000)
    (tmp_path / "blob").write_bytes(payload)
    with netns.namespace_behind_link("40mbit") as link, netns.http_server(link.host, tmp_path) as root:
        before = link.bytes_in()
        t0 = time.perf_counter()
        got = urllib.request.urlopen(f"{root}/blob", timeout=30).read()
        seconds = time.perf_counter() - t0
        crossed = link.bytes_in() - before
    assert got == payload
    assert len(payload) <= crossed < 1.1 * len(payload)
    assert seconds > 0.8 * len(payload) * 8 / 40e6  # 0.6 s at 40 Mbit/s; unpaced, a few ms


def test_the_namespaced_server_answers_what_fsspec_asks(tmp_path):
    # fsspec's HTTP file system asks for sizes (HEAD), byte ranges and listings; the server answers them on one
    # kept-alive connection (python -m http.server opens a connection a request and ignores ranges)
    import http.client

    import fsspec

    payload = np.random.default_rng(1).bytes(1_000_000)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "blob").write_bytes(payload)
    with netns.namespace_behind_link("1gbit") as link, netns.http_server(link.host, tmp_path) as root:
        fs = fsspec.filesystem("http", skip_instance_cache=True)
        assert fs.info(f"{root}/sub/blob")["size"] == len(payload)
        assert fs.cat_file(f"{root}/sub/blob", start=1000, end=250_000) == payload[1000:250_000]
        assert [e["name"] for e in fs.ls(f"{root}/sub/")] == [f"{root}/sub/blob"]
        conn = http.client.HTTPConnection(link.host.address, int(root.rsplit(":", 1)[1]), timeout=10)
        answers = []
        for wanted in ("bytes=-10", "bytes=999990-2000000", "bytes=2000000-"):
            conn.request("GET", "/sub/blob", headers={"Range": wanted})
            r = conn.getresponse()
            answers.append((r.status, r.getheader("Content-Range"), r.read()))
        sockets = conn.sock
        conn.request("GET", "/sub/blob")
        whole = conn.getresponse().read()
        assert conn.sock is sockets  # the same connection throughout
        conn.close()
    assert answers == [(206, "bytes 999990-999999/1000000", payload[-10:]),
                       (206, "bytes 999990-999999/1000000", payload[-10:]),
                       (416, "bytes */1000000", b"")]
    assert whole == payload


@pytest.mark.parametrize("exchange", ["p2p", "tasks"])
def test_model_mode_across_hosts_matches_the_truth(network, tmp_path, exchange):
    shutil.copytree(network, tmp_path / "net.zarr")
    with netns.namespaced_cluster(workers=3, env=chaos.environment()) as cluster:
        report = _infer(cluster, tmp_path / "net.zarr", "--mode", "model", "--exchange", exchange, "--chunks", "3")
    assert report["matches_truth"] is True and report["workers"] == 3
    assert report["bytes_sent"] == pytest.approx(report["message_bytes"], rel=0.15)


def test_model_mode_with_a_slow_link_matches_the_truth(network, tmp_path):
    # every byte to and from worker 1 held 1 ms by a relay, both ways
    shutil.copytree(network, tmp_path / "net.zarr")
    with netns.namespaced_cluster(workers=2, delay_worker=1, delay_seconds=0.001, env=chaos.environment()) as cluster:
        report = _infer(cluster, tmp_path / "net.zarr", "--mode", "model", "--exchange", "p2p")
    assert report["matches_truth"] is True


def test_a_worker_cut_off_mid_run_costs_time_only(network, tmp_path):
    from distributed import Client

    shutil.copytree(network, tmp_path / "net.zarr")
    env = chaos.environment(DASK_DISTRIBUTED__SCHEDULER__WORKER_TTL="5s")  # a silent worker is dropped in 5 s
    with netns.namespaced_cluster(workers=2, env=env) as cluster, Client(cluster.scheduler, timeout="30s") as watch:
        cut = tuple(cluster.namespaces().items())
        # cut as part 1's segment starts: it cannot finish without messages across the link (0.3 s later, a
        # warm kernel had sometimes finished the chunk, and there was nothing left to recover)
        watch.register_plugin(chaos.KillOnTask(Kill("spmm-l1-40-p1", cut=cut)))
        report = _infer(cluster, tmp_path / "net.zarr", "--mode", "model", "--exchange", "p2p", "--chunks", "2")
        fired = watch.run_on_scheduler(chaos.fired)
    assert fired is not None, "the link was never cut"
    assert report["matches_truth"] is True
    assert [r["phase"] for r in report["recoveries"]] == ["inference"]
    np.testing.assert_equal(report["categories"], len(store.open_inputs(tmp_path / "net.zarr").truth(np.float64)))


TRAIN = textwrap.dedent("""
    import json, sys
    from dasknn.train import train
    from distributed import Client

    with Client(sys.argv[1]) as client:
        run = train(sys.argv[2], "digits", mode="model", workers=2, client=client, epochs=1, batch=64, max_steps=16,
                    chunk=8, optimizer="adam", lr=1e-3, exchange="p2p", partition="random")
    print(json.dumps(run.losses))
""")


def test_training_across_hosts_gives_the_single_process_losses(tmp_path):
    pytest.importorskip("sklearn")  # the digits
    from dasknn.train import train

    path = generate.write(tmp_path / "net4.zarr", 1024, 4, seed=1)
    single = train(str(path), "digits", mode="single", epochs=1, batch=64, max_steps=16, optimizer="adam", lr=1e-3)
    with netns.namespaced_cluster(workers=2, env=chaos.environment()) as cluster:
        done = cluster.run_client(["-c", TRAIN, cluster.scheduler, str(path)], chaos.environment())
    assert done.returncode == 0, done.stderr[-3000:]
    np.testing.assert_allclose(json.loads(done.stdout), single.losses, rtol=1e-12, atol=0)
