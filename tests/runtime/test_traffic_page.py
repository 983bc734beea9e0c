"""dasknn's page on the Dask dashboard: the last model-mode inference's boundary traffic, layer by layer."""

from __future__ import annotations

import json
import urllib.request

import pytest

from dasknn import engine
from dasknn.runtime.dashboard import JSON_PAGE, PAGE, render


def _get(client, path: str) -> str:
    # the dashboard's HTTP server: the host and port of client.dashboard_link
    base = client.dashboard_link.rsplit("/", 1)[0]
    with urllib.request.urlopen(base + path, timeout=20) as r:
        return r.read().decode()


def test_the_page_before_any_run_says_so_and_shows_every_layer_after():
    assert "No model- or hybrid-mode inference has run here yet" in render(None)
    page = render({"mode": "model", "group_size": 2, "exchange": "p2p", "workers": 2, "images": 10, "seconds": 1.5,
                   "bytes_sent": 300, "exchange_bytes": [100, 0, 200], "dense_message_bytes": [400, 0, 400],
                   "exchange_pairs": [[0, 120], [180, 0]], "finished": "2026-12-04 14:00:00"})
    assert page.count("<tr><td>") == 3 and "<td>200</td>" in page and "<td>180</td>" in page
    assert "width:300px" in page and "width:150px" in page  # the busiest layer's bar is the longest


@pytest.mark.cluster
def test_a_model_mode_run_shows_its_traffic_on_the_dashboard(client, slice_store):
    result = engine.infer(slice_store, client=client, mode="model", exchange="p2p", dtype="float64")
    figures = json.loads(_get(client, JSON_PAGE))
    assert figures["exchange_bytes"] == result.exchange_bytes and sum(figures["exchange_bytes"]) > 0
    assert figures["exchange_pairs"] == result.exchange_pairs and figures["exchange"] == "p2p"
    page = _get(client, PAGE)
    assert page.count("<tr><td>") == result.layers and f"{max(result.exchange_bytes):,}" in page
    # a data-mode run has no boundary traffic: the page keeps the last model-mode run's
    engine.infer(slice_store, client=client, mode="data", dtype="float64")
    assert json.loads(_get(client, JSON_PAGE)) == figures
