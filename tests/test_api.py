"""The Python API, :func:`dasknn.infer`: every kind of network and batch, the truth check, the activations."""

from __future__ import annotations

import inspect
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import dasknn
from dasknn import io, reference
from dasknn.errors import DasknnError

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def slice_final(slice_paths, slice_images) -> np.ndarray:
    """The reference's final activations of the slice, float64, dense."""
    net = io.read_network(slice_paths["network"])
    return reference.infer(net.layers, slice_images, net.bias, net.ymax, dtype=np.float64).toarray()


def test_signature_and_docstring():
    params = list(inspect.signature(dasknn.infer).parameters)
    assert params[:3] == ["network", "images", "client"]
    assert "truth" in params and "dtype" in params and "mode" in params
    doc = dasknn.infer.__doc__
    assert "0-based" in doc and "1-based" in doc and "dask.array" in doc


@pytest.mark.cluster
def test_help_shows_a_short_signature_and_every_engine_option_is_taken():
    from dasknn.engine.options import OPTION_NAMES

    signature = inspect.signature(dasknn.infer)
    assert len(str(signature)) < 400  # it was 859 characters, every tuning option in it
    summary, blank, usage = dasknn.infer.__doc__.splitlines()[:3]
    assert blank == "" and usage.strip().startswith("``dasknn.infer(network, images, client")
    # the tuning options are the engine's options dasknn.infer does not take by name, each documented
    own = {"images", "mode", "dtype", "keep_activations"}
    assert own <= OPTION_NAMES
    for name in OPTION_NAMES - own:
        assert f"``{name}``" in dasknn.infer.__doc__


@pytest.mark.cluster
def test_a_misspelt_option_is_refused_as_python_refuses_a_keyword():
    with pytest.raises(TypeError, match="unexpected keyword argument 'partiton'"):
        dasknn.infer("nowhere.zarr", partiton="block")


def _images(kind: str, slice_paths, slice_store, slice_images):
    import dask.array as da

    if kind == "store":
        return slice_store
    if kind == "tsv":
        return slice_paths["images"]
    if kind == "scipy.sparse":
        return slice_images
    if kind == "numpy":
        return slice_images.toarray()
    if kind == "dask-numpy":
        return da.from_array(slice_images.toarray(), chunks=(300, 1024))
    return da.from_array(slice_images, chunks=(250, 1024), asarray=False)  # scipy.sparse chunks


@pytest.mark.cluster
@pytest.mark.parametrize("kind", ["store", "tsv", "scipy.sparse", "numpy", "dask-numpy", "dask-scipy.sparse"])
def test_every_input_kind_matches_the_truth(kind, slice_paths, slice_store, slice_images, slice_truth, client):
    images = _images(kind, slice_paths, slice_store, slice_images)
    result = dasknn.infer(slice_store, images, client, truth=slice_truth, mode="data")
    np.testing.assert_array_equal(result.categories, slice_truth)
    assert result.matches_truth is True and result.mismatched == 0
    assert result.images == 1000


@pytest.mark.cluster
@pytest.mark.parametrize("mode", ["data", "model"])
def test_networks_in_memory_and_published(mode, slice_paths, slice_images, slice_truth, client):
    net = io.read_network(slice_paths["network"])
    for network in (net, slice_paths["network"]):
        result = dasknn.infer(network, slice_images, client, truth=slice_paths["truth"], mode=mode)
        np.testing.assert_array_equal(result.categories, slice_truth)
        assert result.matches_truth


@pytest.mark.cluster
@pytest.mark.parametrize("mode", ["data", "model"])
def test_activations_are_a_persisted_dask_array(mode, slice_store, slice_images, slice_final, client):
    import dask.array as da
    from distributed import futures_of

    images = da.from_array(slice_images, chunks=(400, 1024), asarray=False)
    result = dasknn.infer(slice_store, images, client, mode=mode, keep_activations=True)
    act = result.activations
    assert isinstance(act, da.Array)
    assert act.chunks == ((400, 400, 200), (1024,))
    assert len(futures_of(act)) == 3  # persisted: every chunk is a future on the workers
    np.testing.assert_array_equal(act.compute(), slice_final)
    # it composes with dask.array code
    np.testing.assert_array_equal((act.sum(axis=1) > 0).nonzero()[0].compute(), result.categories)


@pytest.mark.cluster
@pytest.mark.parametrize("images_from", ["store", "dask.array"])
def test_activations_held_by_a_worker_lost_after_the_run(images_from, slice_store, slice_images, slice_final):
    # before: each chunk's activations were the result of the run's pinned tasks; their worker killed after the run,
    # Dask waited in no-worker for it to come back, and computing the array waited for ever. Now the chunks the
    # other worker holds compute as before, and the lost ones are run again from the stores (images in the store)
    # or fail at once with a line (images given as a dask.array)
    import os
    import signal
    import threading

    import dask.array as da
    from distributed import futures_of

    from dasknn.cluster import local_client

    with local_client(workers=2, threads_per_worker=1) as client:
        images = None if images_from == "store" else da.from_array(slice_images, chunks=(250, 1024), asarray=False)
        chunks = {"chunks": 4} if images is None else {}  # (a dask.array's are its row chunks: 4 of 250 rows)
        result = dasknn.infer(slice_store, images, client, mode="data", keep_activations=True, **chunks)
        act = result.activations
        assert act.numblocks[0] == 4
        holders = client.who_has(futures_of(act))
        where = {c: holders[f.key][0] for c, f in enumerate(futures_of(act))}
        victim = where[0]
        assert set(where.values()) == set(client.nthreads())  # (both workers hold some)
        os.kill(client.run(os.getpid, workers=[victim])[victim], signal.SIGKILL)
        box: dict = {}

        def compute() -> None:
            for c in sorted(where):
                try:
                    box[c] = act.blocks[c].compute(scheduler=client)
                except Exception as e:  # noqa: BLE001 - handed to the test's thread
                    box[c] = e

        t = threading.Thread(target=compute, daemon=True)
        t.start()
        t.join(90)
        assert not t.is_alive(), "computing the activations still waited for the lost worker after 90 s"
        rows = np.cumsum((0,) + act.chunks[0])
        for c, w in where.items():
            if w == victim and images_from == "dask.array":
                assert isinstance(box[c], DasknnError), box[c]
                assert re.fullmatch(rf"keep_activations: the final activations of chunk {c} \(images {rows[c]}\.\."
                                    rf"{rows[c + 1] - 1}\) were lost with the worker that held them after the "
                                    r"inference: run it again to have them", str(box[c]))
            else:
                np.testing.assert_array_equal(box[c], slice_final[rows[c]:rows[c + 1]])


@pytest.mark.cluster
def test_dask_array_is_never_gathered(monkeypatch, slice_store, slice_images, slice_truth, client):
    import dask.array as da

    from dasknn.engine.inputs import load_images
    from dasknn.runtime.graph import PinnedGraph

    images = client.persist(da.from_array(slice_images.toarray(), chunks=(250, 1024)))
    chunk_keys = {row[0] for row in images.__dask_keys__()}

    def refuse(*args, **kwargs):
        raise AssertionError("the dask.array was brought to the client")

    monkeypatch.setattr(da.Array, "compute", refuse)
    monkeypatch.setattr(da.Array, "__array__", refuse)
    graphs = []
    submit = PinnedGraph.submit

    def recording(self, c, keys):
        graphs.append(dict(task for d in self.by_worker.values() for task in d.items()))
        return submit(self, c, keys)

    monkeypatch.setattr(PinnedGraph, "submit", recording)
    result = dasknn.infer(slice_store, images, client, truth=slice_truth, mode="data")
    assert result.matches_truth
    loads = {k: t for g in graphs for k, t in g.items() if isinstance(k, str) and k.startswith("images-c")}
    assert len(loads) == 4
    # each image-loading task takes one of the array's chunks, a future of its persisted key
    assert all(t[0] is load_images for t in loads.values())
    assert {t[2].key for t in loads.values()} == chunk_keys


@pytest.mark.cluster
@pytest.mark.parametrize("kind, sampled", [("scipy.sparse", 1000), ("dask-numpy", 300)])
def test_auto_and_explain_probe_inputs_in_memory(kind, sampled, slice_paths, slice_store, slice_images, slice_truth,
                                                 client):
    # the cost model's probe samples the scattered batch, or the dask.array's first chunk (300 rows), as it
    # samples stored inputs: auto weighs the modes' predictions, not sizes alone, and explain shows them
    images = _images(kind, slice_paths, slice_store, slice_images)
    result = dasknn.infer(slice_store, images, client, truth=slice_truth, mode="auto", explain=True)
    assert result.matches_truth
    assert {p.mode for p in result.predictions} == {"data", "model"}
    best = min((p for p in result.predictions if p.fits), key=lambda p: p.seconds)
    assert (result.mode, result.group_size) == (best.mode, best.group_size)
    cal = result.calibration
    assert cal.probe_images == sampled and len(cal.alive) == cal.probe_layers
    stored = dasknn.infer(slice_store, None, client, batch=sampled, mode="auto", explain=True).calibration
    assert (cal.alive, cal.message_factor) == (stored.alive, stored.message_factor)


@pytest.mark.cluster
def test_truth_mismatch_is_reported(slice_store, slice_images, slice_truth, client):
    wrong = slice_truth[1:]  # one image missing
    result = dasknn.infer(slice_store, slice_images, client, truth=wrong, mode="data")
    assert result.matches_truth is False and result.mismatched == 1
    np.testing.assert_array_equal(result.categories, slice_truth)


@pytest.mark.cluster
def test_bad_batches_are_refused(slice_store, client):
    with pytest.raises(DasknnError, match="pixels per image"):
        dasknn.infer(slice_store, np.ones((4, 10)), client)
    with pytest.raises(DasknnError, match="keep_activations needs a client"):
        dasknn.infer(slice_store, keep_activations=True)


def _readme_snippets() -> list[str]:
    text = (ROOT / "README.md").read_text()
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


@pytest.mark.subprocess
@pytest.mark.parametrize("i", range(len(_readme_snippets())))
def test_readme_python_snippets_run_as_scripts(i, tmp_path):
    script = tmp_path / "snippet.py"
    script.write_text(_readme_snippets()[i])
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
