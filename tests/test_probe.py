"""The cost model's probe samples a batch wherever it is: an inputs store, or rows in memory (issue 17).

In memory, the probe task is given the scattered batch or a dask.array's first chunk (NumPy, ``scipy.sparse`` or
CuPy rows); what it measures of the batch (images alive at each layer, message sizes) must be what it measures
from the same images stored.
"""

from __future__ import annotations

import pytest
import scipy.sparse as sp

from dasknn import cost

SAMPLED = ("alive", "distinct", "message_factor", "probe_layers", "probe_images")


@pytest.fixture(scope="module")
def stored(slice_store) -> dict:
    return cost.probe(str(slice_store), str(slice_store), 1000, "float64")


class _CupyStandIn:
    """Rows as CuPy holds them, for a machine without a GPU: its type's module is ``cupy``, ``get()`` copies
    them to the host (as ``cupy.ndarray`` and ``cupyx.scipy.sparse`` matrices do)."""

    __module__ = "cupy"

    def __init__(self, host):
        self.host = host
        self.shape = host.shape

    def __getitem__(self, key):
        return _CupyStandIn(self.host[key])

    def get(self):
        return self.host


@pytest.mark.parametrize("kind", ["numpy", "csr", "coo", "csr_array", "cupy"])
def test_probe_from_rows_in_memory_measures_what_it_measures_stored(kind, slice_store, slice_images, stored):
    rows = {"numpy": lambda: slice_images.toarray(), "csr": lambda: slice_images,
            "coo": lambda: slice_images.tocoo(),  # no row slices: converted first
            "csr_array": lambda: sp.csr_array(slice_images),
            "cupy": lambda: _CupyStandIn(slice_images.toarray())}[kind]()
    got = cost.probe(str(slice_store), rows, 1000, "float64")
    assert {k: got[k] for k in SAMPLED} == {k: stored[k] for k in SAMPLED}
    assert got["kernel_rate"] > 0 and got["read_rate"] > 0


def test_probe_of_a_small_first_chunk_samples_its_rows(slice_store, slice_images, stored):
    chunk = slice_images[:40]  # a dask.array's first chunk, narrower than the probe's sample
    got = cost.probe(str(slice_store), chunk, 1000, "float64")
    assert got["probe_images"] == 40
    assert got["probe_layers"] >= 1 and all(0 <= a <= 1 for a in got["alive"])
    # the same as the store's first 40 images
    narrow = cost.probe(str(slice_store), str(slice_store), 40, "float64")
    assert {k: got[k] for k in SAMPLED} == {k: narrow[k] for k in SAMPLED}


def test_the_probe_counts_the_distinct_vectors_among_the_alive_images(stored, slice_store):
    # the real slice's images converge by its last layers: fewer distinct vectors than alive images there, never
    # more anywhere; the count is exact (a loop over the sample's columns agrees)
    import numpy as np

    from dasknn import kernels, store

    alive, distinct = np.array(stored["alive"]), np.array(stored["distinct"])
    assert alive.size == distinct.size == stored["probe_layers"]
    assert (distinct <= alive).all() and distinct[-1] < alive[-1] * 0.75
    s = store.open_store(slice_store)
    width = stored["probe_images"]
    yt = np.ascontiguousarray(s.inputs.rows(0, width).toarray().T)
    for k, w in enumerate(s.iter_layers(), start=1):
        if k == stored["probe_layers"]:
            live = yt[:, yt.any(axis=0)]
            assert np.unique(live.T, axis=0).shape[0] == round(distinct[-1] * width)
            break
        yt = kernels.layer_step(yt, w.indptr, w.indices, w.data, s.bias, s.ymax)


def test_the_probe_stops_once_its_images_are_one_vector_and_the_predictions_see_the_same_layers(tmp_path,
                                                                                                 monkeypatch):
    # images equal after a layer stay equal after every later one: a probe that carried on past the collapse
    # learnt nothing the padded figures do not say (a generated 1,024 x 60 network's 64 images are one vector
    # from layer 14)
    import numpy as np

    from dasknn import generate

    path = str(generate.write(tmp_path / "g.zarr", 1024, 60, 64, seed=3))
    stopped = cost.probe(path, path, 64, "float64")
    monkeypatch.setattr(cost, "PROBE_MIN_LAYERS", 10**6)  # (a local store: only the collapse's stop waits for it)
    monkeypatch.setattr(cost, "PROBE_TAIL_BUDGET", 1e15)
    carried = cost.probe(path, path, 64, "float64")
    assert stopped["probe_layers"] < 20 and carried["probe_layers"] == 60
    assert round(stopped["distinct"][-1] * 64) == 1
    for name in ("alive", "distinct"):
        assert np.array_equal(cost._per_layer(stopped[name], 60), cost._per_layer(carried[name], 60)), name


def test_the_probe_given_the_largest_layer_reads_the_metadata_of_the_layers_it_runs_only(tmp_path, monkeypatch):
    # every layer's metadata took 1 s of a 65,536 x 480 network's probe: the client knows the largest layer
    from dasknn import generate, rates
    from dasknn.store import NetworkStore, open_store

    path = str(generate.write(tmp_path / "g.zarr", 1024, 60, 64, seed=3))
    whole = cost.probe(path, path, 64, "float64")
    opened = set()
    meta = NetworkStore._layer_meta
    monkeypatch.setattr(NetworkStore, "_layer_meta", lambda self, k: opened.add(k) or meta(self, k))
    layer_bytes = rates.probe_layer_bytes(open_store(path), 8)
    opened.clear()
    lazily = cost.probe(path, path, 64, "float64", layer_bytes=layer_bytes)
    assert opened and max(opened) == lazily["probe_layers"] < 60
    assert {k: lazily[k] for k in SAMPLED} == {k: whole[k] for k in SAMPLED}
