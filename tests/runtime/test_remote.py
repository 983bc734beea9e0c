"""Stores read through URLs (fsspec): a file:// URL and a store served over HTTP, by the workers themselves."""

from __future__ import annotations

import functools
import http.server
import threading
import time

import numpy as np
import pytest

from dasknn import engine, store
from dasknn.errors import DasknnError
from dasknn.locations import are_files


@pytest.fixture(scope="module")
def http_root(slice_store):
    """The slice store's folder served read-only over HTTP on 127.0.0.1."""
    handler = functools.partial(_QuietHandler, directory=str(slice_store.parent))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:  # keep the test output clean
        pass


@pytest.mark.cluster
def test_file_url_reads_like_the_path(client, slice_store, slice_truth):
    url = f"file://{slice_store}"
    s = store.open_store(url, check="full")
    local = store.open_store(slice_store)
    assert (s.neurons, s.depth, s.edges) == (local.neurons, local.depth, local.edges)
    assert (s.layer(3) != local.layer(3)).nnz == 0
    result = engine.infer(url, client=client, dtype="float64")
    np.testing.assert_array_equal(result.categories, slice_truth)


@pytest.mark.cluster
def test_a_store_served_over_http(client, slice_store, slice_truth, http_root):
    pytest.importorskip("aiohttp", reason="fsspec's HTTP filesystem needs aiohttp (pip install 'dasknn[remote]')")
    url = f"{http_root}/{slice_store.name}"
    assert store.is_store(url)
    s = store.open_store(url, check="full")
    np.testing.assert_array_equal(s.inputs.truth("float64"), slice_truth)
    for mode in ("data", "model"):
        result = engine.infer(url, client=client, mode=mode, partition="block", dtype="float64")
        np.testing.assert_array_equal(result.categories, slice_truth)


@pytest.mark.cluster
def test_model_mode_out_of_core_from_http_needs_a_plan_store(client, slice_store, slice_truth, http_root, tmp_path):
    pytest.importorskip("aiohttp", reason="fsspec's HTTP filesystem needs aiohttp (pip install 'dasknn[remote]')")
    url = f"{http_root}/{slice_store.name}"
    with pytest.raises(DasknnError, match="give --plan-store DIR"):
        engine.infer(url, client=client, mode="model", partition="block", resident=False)
    result = engine.infer(url, client=client, mode="model", partition="block", resident=False, dtype="float64",
                          plan_store=tmp_path / "plan")
    np.testing.assert_array_equal(result.categories, slice_truth)


def test_http_errors_are_one_line(http_root, slice_store):
    pytest.importorskip("aiohttp", reason="fsspec's HTTP filesystem needs aiohttp (pip install 'dasknn[remote]')")
    with pytest.raises(DasknnError, match="no such store"):
        store.open_store(f"{http_root}/nothing-here.zarr")


@pytest.mark.cluster
def test_cli_reads_a_url(slice_store, capsys):
    import json

    from dasknn.cli import main

    assert main(["infer", "--network", f"file://{slice_store}", "--workers", "1", "--json", "--dtype", "float64"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["matches_truth"] is True


class _CountingHandler(_QuietHandler):
    """Answers each request after a pause, counting the most requests the server had in hand at once."""

    lock = threading.Lock()
    now = 0
    most = 0

    def send_head(self):
        cls = type(self)
        with cls.lock:
            cls.now += 1
            cls.most = max(cls.most, cls.now)
        try:
            time.sleep(0.05)  # an object store's wait before its answer
            return super().send_head()
        finally:
            with cls.lock:
                cls.now -= 1


class _ManyConnections(http.server.ThreadingHTTPServer):
    request_queue_size = 128  # (the default 5 would drop connections asked for together, retried a second later)


@pytest.fixture()
def counting_root(slice_store):
    """The slice store's folder served over HTTP by a server that counts the requests it has in hand at once."""
    handler = functools.partial(_CountingHandler, directory=str(slice_store.parent))
    server = _ManyConnections(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", _CountingHandler
    server.shutdown()
    server.server_close()


def test_a_layer_behind_a_url_is_asked_for_side_by_side(counting_root, slice_store):
    # behind an object store's latency, what a read asks for one request at a time waits once a request: a layer's
    # three arrays (their metadata, their chunk files' checks, their chunks) are each asked for together
    pytest.importorskip("aiohttp", reason="fsspec's HTTP filesystem needs aiohttp (pip install 'dasknn[remote]')")
    root, counter = counting_root
    url = f"{root}/{slice_store.name}"
    s = store.open_store(url, check="metadata")
    counter.most = 0
    remote = s.layer(5)
    assert counter.most >= 3
    assert (remote != store.open_store(slice_store).layer(5)).nnz == 0
    counter.most = 0
    names = ["layers/5/values/c/0", "layers/5/indices_1/c/0", "layers/5/values/c/9", "zarr.json"]
    assert are_files(url, names) == [True, True, False, True]
    assert counter.most >= 3
    counter.most = 0
    again = store.open_store(url, check="metadata")  # every layer's metadata and chunk files asked for together
    assert counter.most >= 8
    assert again.layer_entries().tolist() == s.layer_entries().tolist()
