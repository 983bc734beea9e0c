"""The Dask dashboard during an inference: readable task names, and the task-stream page loads in a real browser.

The page is loaded in headless Chromium (Debian's ``chromium``, installed by ``.ci/run``) driven over the DevTools
protocol: a plain ``--screenshot`` fires before Bokeh's websocket has delivered the plot. Set
``DASKNN_DOCS_SCREENSHOT=1`` to also save the screenshot as docs/dashboard.png.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from dasknn import engine
from dasknn.cluster import local_client

ROOT = Path(__file__).resolve().parents[2]
# the few task prefixes an inference may show in the dashboard, and what they are
# (partition_task: the block partition, run by whichever test first needs it and kept in the store after)
READABLE = {"warm", "plan", "weights", "images", "spmm", "send", "categories", "state", "partition_task"}
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync", "--window-size=1400,800"]


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def _coloured(png: bytes) -> float:
    """The share of a screenshot's pixels that are coloured: the page's chrome is grey, task rectangles are not."""
    import io

    import numpy as np
    from PIL import Image

    with Image.open(io.BytesIO(png)) as im:
        rgb = np.asarray(im.convert("RGB"), dtype=np.int16)
    return float(((rgb.max(axis=2) - rgb.min(axis=2)) > 60).mean())


async def _load_page(browser: str, url: str, timeout: float = 30.0) -> tuple[list, bytes]:
    """Open ``url`` in headless Chromium; return the Bokeh document's roots (type, name) and a PNG screenshot."""
    from tornado.httpclient import AsyncHTTPClient
    from tornado.websocket import websocket_connect

    # Chromium's helper processes may still write to the profile as it closes: its whole process group is
    # stopped, and what is left of the profile is removed without failing the test
    with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as profile:
        proc = subprocess.Popen([browser, *FLAGS, f"--user-data-dir={profile}", "--remote-debugging-port=0",
                                 "--remote-debugging-address=127.0.0.1", "about:blank"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                                # its own temporary files (an org.chromium.Chromium.* folder stayed behind) go in
                                # the profile, removed with it
                                env={**os.environ, "TMPDIR": profile})
        try:
            port_file = Path(profile) / "DevToolsActivePort"  # Chromium writes its port here once it listens
            deadline = time.monotonic() + timeout
            while not (port_file.exists() and len(port_file.read_text().splitlines()) >= 2):
                assert time.monotonic() < deadline and proc.poll() is None, "Chromium did not start"
                await asyncio.sleep(0.05)
            port = port_file.read_text().splitlines()[0]
            client = AsyncHTTPClient(force_instance=True)
            targets = json.loads((await client.fetch(f"http://127.0.0.1:{port}/json")).body)
            client.close()
            page = next(t for t in targets if t["type"] == "page")
            ws = await websocket_connect(page["webSocketDebuggerUrl"], max_message_size=64 << 20)
            calls = 0

            async def call(method: str, **params) -> dict:
                nonlocal calls
                calls += 1
                await ws.write_message(json.dumps({"id": calls, "method": method, "params": params}))
                while True:
                    msg = json.loads(await ws.read_message())
                    if msg.get("id") == calls:
                        return msg["result"]

            await call("Page.navigate", url=url)
            roots: list = []
            while not roots and time.monotonic() < deadline:
                await asyncio.sleep(0.2)
                found = await call("Runtime.evaluate", returnByValue=True, expression=(
                    "typeof Bokeh !== 'undefined' && Bokeh.documents.length > 0 ? "
                    "JSON.stringify(Bokeh.documents[0].roots().map(r => [r.type, r.name])) : ''"))
                roots = json.loads(found["result"].get("value") or "[]")
            while True:  # until the first data patch has arrived and been drawn (slower on a loaded machine)
                await asyncio.sleep(0.5)
                png = base64.b64decode((await call("Page.captureScreenshot", format="png"))["data"])
                if _coloured(png) > 0.02 or time.monotonic() > deadline:
                    break
            ws.close()
            return roots, png
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=20)


@pytest.mark.cluster
@pytest.mark.slow
def test_dashboard_task_stream_after_an_inference(slice_store, slice_truth, tmp_path):
    pytest.importorskip("bokeh", reason="bokeh is not installed: the dashboard needs it (pip install 'dasknn[test]')")
    browser = _chromium()
    if browser is None:
        pytest.skip("no chromium: apt-get install chromium (.ci/run does)")
    with local_client(workers=2) as client:
        assert client.dashboard_link.startswith("http://127.0.0.1:")
        client.get_task_stream(start=0, stop=0)  # the scheduler records the stream from now on
        result = engine.infer(slice_store, slice_store, client, mode="model", partition="block", images=400,
                              dtype="float64", exchange="tasks")
        prefixes = set(client.run_on_scheduler(lambda dask_scheduler: list(dask_scheduler.task_prefixes)))
        keys = [t["key"] for t in client.get_task_stream(start=0)]
        url = client.dashboard_link.replace("/status", "/tasks")
        roots, png = asyncio.run(_load_page(browser, url))
    assert set(result.categories) == set(slice_truth[slice_truth < 400])
    # few, readable prefixes; keys that name layer, part and chunk
    assert {"spmm", "send", "images", "weights"} <= prefixes <= READABLE, prefixes
    assert any(re.fullmatch(r"spmm-l\d+-p\d+-c\d+-\w+", k) for k in keys), keys[:10]
    assert any(re.fullmatch(r"send-l\d+-p\d+-to\d+-c\d+-\w+", k) for k in keys), keys[:10]
    # the page's Bokeh document is the task stream, and it was drawn
    assert ["Figure", "task_stream"] in roots, roots
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    (tmp_path / "dashboard.png").write_bytes(png)
    coloured = _coloured(png)  # an undrawn plot has next to no colour
    assert coloured > 0.02, f"the screenshot is blank ({coloured:.2%} coloured): the task stream was not drawn"
    if os.environ.get("DASKNN_DOCS_SCREENSHOT"):
        shutil.copy(tmp_path / "dashboard.png", ROOT / "docs" / "dashboard.png")


@pytest.mark.cluster
def test_infer_report_is_written(slice_store, client, tmp_path, capsys):
    pytest.importorskip("bokeh", reason="bokeh is not installed: the report needs it")
    from dasknn.cli import main

    report = tmp_path / "infer.html"
    code = main(["infer", "--network", str(slice_store), "--batch", "200", "--mode", "model", "--partition", "block",
                 "--scheduler", client.scheduler.address, "--report", str(report), "--json"])
    assert code == 0, capsys.readouterr().err
    assert json.loads(capsys.readouterr().out)["images"] == 200
    html = report.read_text()
    assert html.lstrip().lower().startswith("<!doctype html") and "Bokeh" in html
    for prefix in ("spmm", "send", "images", "weights"):  # the task stream and the prefixes' names
        assert prefix in html, prefix


@pytest.mark.cluster
def test_train_report_is_written(client, tmp_path, capsys):
    pytest.importorskip("bokeh", reason="bokeh is not installed: the report needs it")
    import numpy as np

    from dasknn import generate
    from dasknn.cli import main

    generate.write(tmp_path / "n.zarr", 1024, 2)
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "d.npz", x=rng.random((64, 1024)).astype(np.float32), y=rng.integers(0, 4, 64))
    report = tmp_path / "train.html"
    code = main(["train", "--network", str(tmp_path / "n.zarr"), "--data", str(tmp_path / "d.npz"), "--epochs", "1",
                 "--batch", "16", "--mode", "data", "--workers", "2", "--scheduler", client.scheduler.address,
                 "--report", str(report), "--json"])
    assert code == 0, capsys.readouterr().err
    assert json.loads(capsys.readouterr().out)["steps"] >= 1
    html = report.read_text()
    assert "Bokeh" in html and "grad" in html and "allreduce" in html


@pytest.mark.parametrize("argv, message", [
    (["infer", "--report", "r.txt"], "give a PATH.html"),
    (["infer", "--report", "no/such/dir/r.html"], "does not exist"),
    (["train", "--network", "n.zarr", "--mode", "single", "--report", "r.html"], "not single"),
])
def test_report_errors_are_one_line(argv, message, capsys, tmp_path, monkeypatch):
    pytest.importorskip("bokeh", reason="bokeh is not installed")
    from dasknn.cli import main

    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("dasknn: error: ") and message in err and err.count("\n") == 1
