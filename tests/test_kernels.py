"""CPU kernels on raw arrays against SciPy: the fused layer step with received rows, and boundary messages."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from dasknn import kernels


def _challenge_layer(yt: np.ndarray, w: sp.csc_matrix, bias: float, ymax: float) -> np.ndarray:
    z = (w.T @ yt).astype(yt.dtype)
    return np.where(z != 0, np.clip(z + bias, 0, ymax), 0).astype(yt.dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("received", [0, 1, 37])
@pytest.mark.parametrize("images", [1, 5, 300])
def test_layer_step_reads_received_rows_in_place(dtype, received, images):
    rng = np.random.default_rng(received + images)
    own, outputs = 40, 25
    w = sp.random(own + received, outputs, density=0.3, format="csc", random_state=rng, dtype=np.float64)
    w.data = rng.choice([-1.0, 0.5, 1 / 16, 2.0], w.nnz)
    x = (rng.random((own + received, images)) < 0.6) * rng.random((own + received, images)) * 40
    x = x.astype(dtype)
    expected = _challenge_layer(x, w, -0.3, 32.0)
    got = kernels.layer_step(np.ascontiguousarray(x[:own]), w.indptr, w.indices.astype(np.int32), w.data,
                             -0.3, 32.0, extra=np.ascontiguousarray(x[own:]))
    assert got.dtype == dtype
    np.testing.assert_allclose(got, expected, rtol=1e-5 if dtype == np.float32 else 1e-12, atol=1e-5)
    whole = kernels.layer_step(x, w.indptr, w.indices.astype(np.int32), w.data, -0.3, 32.0)
    np.testing.assert_array_equal(got, whole)  # same order of sums: the split changes nothing


@pytest.mark.parametrize("density", [0.0, 0.02, 0.5, 1.0])
@pytest.mark.parametrize("constant", [False, True])
@pytest.mark.parametrize("columns", ["all", "some"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_messages_round_trip_in_their_smallest_form(density, constant, columns, dtype):
    rng = np.random.default_rng(7)
    block = ((rng.random((60, 257)) < density) * (32.0 if constant else rng.random((60, 257)) + 0.1)).astype(dtype)
    rows = rng.choice(60, 23, replace=False)
    cols = None if columns == "all" else np.sort(rng.choice(257, 100, replace=False))
    expected = block[rows] if cols is None else block[np.ix_(rows, cols)]
    dense = kernels.pack_rows(block, rows, cols, compact=False)
    compact = kernels.pack_rows(block, rows, cols)
    for msg in (dense, compact):
        out = np.full(expected.shape, -1, dtype=dtype)
        kernels.unpack_rows(msg, out)
        np.testing.assert_array_equal(out, expected)
    assert kernels.message_bytes(compact) <= kernels.message_bytes(dense)
    nnz = np.count_nonzero(expected)
    bitmap = (expected.size + 7) // 8
    if nnz and constant:
        assert kernels.message_bytes(compact) == bitmap + 24 + block.itemsize  # bitmap, header, one value
    elif density == 1.0:
        assert int(compact[0][2]) == kernels.DENSE  # a bitmap would only add to it
    else:
        assert kernels.message_bytes(compact) == bitmap + 24 + nnz * block.itemsize
