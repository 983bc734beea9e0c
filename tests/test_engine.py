"""Inference on a Dask cluster gives the reference's categories."""

from __future__ import annotations

import numpy as np
import pytest

from dasknn import engine, generate, reference, store
from dasknn.errors import DasknnError


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("chunks", [1, 3, 8])
def test_slice_matches_reference(client, slice_store, slice_truth, dtype, chunks):
    result = engine.infer(slice_store, client=client, chunks=chunks, dtype=dtype)
    s = store.open_store(slice_store)
    expected = reference.infer_categories(s.iter_layers(), s.inputs.rows(), s.bias, s.ymax, np.dtype(dtype))
    np.testing.assert_array_equal(result.categories, expected)
    if dtype == "float64":
        np.testing.assert_array_equal(result.categories, slice_truth)
    assert result.images == 1000 and result.layers == 12 and result.workers == 2
    assert result.chunks == chunks and result.seconds > 0
    assert result.edges_per_second == pytest.approx(1000 * s.edges / result.seconds)


def test_batch_prefix_and_separate_inputs(client, tmp_path):
    net = generate.network(1024, 6, seed=4)
    im = generate.images(300, 1024, seed=4)
    path = store.write_network(tmp_path / "n.zarr", net)
    inputs = store.write_inputs_store(tmp_path / "i.zarr", im)
    result = engine.infer(path, inputs, client, images=120, chunks=5)
    expected = reference.infer_categories(net.layers, im[:120], net.bias, net.ymax, np.float32)
    np.testing.assert_array_equal(result.categories, expected)


def test_bad_batch_and_width(client, slice_store, tmp_path):
    with pytest.raises(DasknnError, match="--batch must be between 1 and 1000"):
        engine.infer(slice_store, client=client, images=5000)
    other = store.write_inputs_store(tmp_path / "i.zarr", generate.images(10, 4096))
    with pytest.raises(DasknnError, match="4096 pixels per image, the network 1024"):
        engine.infer(slice_store, other, client)


def test_chunk_bounds_cover_everything():
    for images, chunks in [(10, 3), (7, 7), (5, 9), (1000, 8)]:
        bounds = engine.chunk_bounds(images, chunks)
        assert bounds[0][0] == 0 and bounds[-1][1] == images
        assert all(a < b for a, b in bounds) and all(b == c for (_, b), (c, _) in zip(bounds, bounds[1:]))
