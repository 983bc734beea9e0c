"""The SciPy reference against a dense NumPy statement of the challenge's rule."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from dasknn import reference


def dense_rule(y: np.ndarray, w: np.ndarray, bias: float, ymax: float) -> np.ndarray:
    z = y @ w
    return np.where(z != 0, np.minimum(np.maximum(z + bias, 0), ymax), 0)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("density", [0.02, 0.2, 0.8])
@pytest.mark.parametrize("bias", [-0.3, -0.05, 0.0])
@pytest.mark.parametrize("ymax", [32.0, 1.0])
def test_layers_match_dense(dtype, density, bias, ymax):
    rng = np.random.default_rng(int(density * 100) + int(-bias * 100))
    layers = [sp.random(48, 48, density=density, random_state=rng, format="csc", dtype=dtype) * 2 for _ in range(4)]
    y0 = (rng.random((30, 48)) < 0.3).astype(dtype)
    y = y0.copy()
    for w in layers:
        y = dense_rule(y, w.toarray(), dtype(bias), ymax).astype(dtype)
    out = reference.infer(layers, sp.csr_matrix(y0), bias, ymax, dtype)
    assert out.dtype == dtype
    np.testing.assert_allclose(out.toarray(), y, rtol=1e-6 if dtype == np.float32 else 1e-12)
    np.testing.assert_array_equal(reference.categories(out), np.flatnonzero(y.any(axis=1)))


def test_bias_only_on_nonzeros():
    # a positive bias must not switch on entries where Y @ W is zero
    w = sp.csc_matrix(np.array([[1.0, 0.0], [0.0, 0.0]]))
    out = reference.infer([w], sp.csr_matrix(np.array([[1.0, 1.0]])), bias=0.5, ymax=32.0, dtype=np.float64)
    np.testing.assert_array_equal(out.toarray(), [[1.5, 0.0]])


def test_cancelled_product_gets_no_bias():
    # 1*1 + 1*(-1) = 0 is not a nonzero of Y @ W, even though it is stored
    w = sp.csc_matrix(np.array([[1.0], [-1.0]]))
    out = reference.infer([w], sp.csr_matrix(np.array([[1.0, 1.0]])), bias=0.5, ymax=32.0, dtype=np.float64)
    assert out.nnz == 0


def test_clamp():
    w = sp.csc_matrix(np.full((4, 1), 20.0))
    out = reference.infer([w], sp.csr_matrix(np.ones((1, 4))), bias=-0.3, ymax=32.0, dtype=np.float64)
    np.testing.assert_array_equal(out.toarray(), [[32.0]])


def test_sums_follow_ascending_input_order():
    # float32 sums depend on order; the reference's is ascending input index whatever SciPy's product leaves
    rng = np.random.default_rng(5)
    w1 = sp.random(40, 40, density=0.5, random_state=rng, format="csc", dtype=np.float32)
    w2 = sp.random(40, 40, density=0.5, random_state=rng, format="csc", dtype=np.float32)
    y0 = sp.random(8, 40, density=0.7, random_state=rng, format="csr", dtype=np.float32)
    y1 = reference.layer_step(y0, w1, -0.01, 32.0)
    assert y1.has_sorted_indices
    out = reference.layer_step(y1, w2, -0.01, 32.0).toarray()
    d1, d2 = y1.toarray(), w2.toarray()
    expected = np.zeros((8, 40), dtype=np.float32)
    for r in range(8):
        for j in range(40):
            acc = np.float32(0)
            for i in range(40):  # ascending input order, one float32 rounding per term
                if d1[r, i] != 0 and d2[i, j] != 0:
                    acc = np.float32(acc + d1[r, i] * d2[i, j])
            expected[r, j] = min(max(acc - np.float32(0.01), 0), 32) if acc != 0 else 0
    np.testing.assert_array_equal(out, expected)


def test_real_slice_matches_its_truth(slice_paths, slice_truth):
    from dasknn import io

    net = io.read_network(slice_paths["network"])
    im = io.read_images(slice_paths["images"])
    np.testing.assert_array_equal(reference.infer_categories(net.layers, im, net.bias, net.ymax, np.float64),
                                  slice_truth)
