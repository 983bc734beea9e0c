"""The training kernels (``dasknn.kernels.grad``): Numba against SciPy, the CUDA kernels' Python transcription
against Numba bit for bit (the GPU kernels sum in the same order), and on a GPU, CuPy against NumPy."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from dasknn.kernels import grad

SHAPES = [(16, 16, 0.3, 5), (40, 24, 0.1, 1), (24, 40, 0.5, 9), (30, 30, 0.0, 4), (12, 20, 0.4, 0)]


def _case(n_in: int, n_out: int, density: float, nb: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    w = sp.random(n_in, n_out, density=density, format="csc", random_state=seed, dtype=np.float64)
    w.data = rng.standard_normal(w.nnz)
    w.indices = w.indices.astype(np.int32)
    xin = rng.standard_normal((n_in, nb)) * (rng.random((n_in, nb)) < 0.7)
    delta = rng.standard_normal((n_out, nb))
    return w, xin, delta


def _wgrad_transcribed(xin, delta, indptr, indices):
    # dasknn_wgrad_f64, one loop iteration per thread (entry p)
    col = grad.entry_columns(indptr)
    out = np.empty(indices.size)
    for p in range(indices.size):
        s = 0.0
        for b in range(xin.shape[1]):
            s = s + xin[indices[p], b] * delta[col[p], b]
        out[p] = s
    return out


def _backin_transcribed(delta, indptr, indices, data, n_in):
    # dasknn_backin_f64, one loop iteration per thread (t = i * nb + b)
    rowptr, perm, col = grad.transposed_pattern(indptr, indices, n_in)
    nb = delta.shape[1]
    out = np.empty((n_in, nb))
    for t in range(n_in * nb):
        i, b = divmod(t, nb)
        s = 0.0
        for r in range(rowptr[i], rowptr[i + 1]):
            s = s + data[perm[r]] * delta[col[r], b]
        out[i, b] = s
    return out


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("seed", [0, 1])
def test_numba_kernels_match_scipy(shape, seed):
    w, xin, delta = _case(*shape, seed=seed)
    rows, cols = w.nonzero()  # (CSC order of a canonical matrix)
    expected = (xin @ delta.T)[w.indices, grad.entry_columns(w.indptr)]
    np.testing.assert_allclose(grad.weight_grad(w.indptr, w.indices, xin, delta), expected, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(grad.back_input(w.indptr, w.indices, w.data, delta, shape[0]), w @ delta,
                               rtol=1e-12, atol=1e-12)
    assert rows.size == w.nnz


@pytest.mark.parametrize("shape", SHAPES)
def test_cuda_transcriptions_match_numba_bit_for_bit(shape):
    w, xin, delta = _case(*shape)
    np.testing.assert_array_equal(_wgrad_transcribed(xin, delta, w.indptr, w.indices),
                                  grad.weight_grad(w.indptr, w.indices, xin, delta))
    np.testing.assert_array_equal(_backin_transcribed(delta, w.indptr, w.indices, w.data, shape[0]),
                                  grad.back_input(w.indptr, w.indices, w.data, delta, shape[0]))


def test_transposed_pattern_lists_each_row_in_ascending_output_order():
    w = sp.csc_matrix(np.array([[1.0, 0, 2.0], [0, 0, 0], [3.0, 4.0, 5.0]]))
    rowptr, perm, col = grad.transposed_pattern(w.indptr, w.indices, 3)
    assert rowptr.tolist() == [0, 2, 2, 5]
    assert w.data[perm].tolist() == [1.0, 2.0, 3.0, 4.0, 5.0] and col.tolist() == [0, 2, 0, 1, 2]
    assert grad.entry_columns(np.array([0, 0, 2, 3])).tolist() == [1, 1, 2]


def test_grid_covers_every_item():
    for items in (0, 1, 255, 256, 257, 10**9):
        blocks = grad.grid_for(items)
        assert blocks >= 1 and (blocks * grad.GRAD_THREADS >= items or blocks == 65535 * 32)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", SHAPES)
def test_gpu_kernels_equal_numba(shape):
    import cupy

    w, xin, delta = _case(*shape)
    got = grad.weight_grad(cupy.asarray(w.indptr), cupy.asarray(w.indices), cupy.asarray(xin), cupy.asarray(delta))
    assert isinstance(got, cupy.ndarray)
    np.testing.assert_array_equal(cupy.asnumpy(got), grad.weight_grad(w.indptr, w.indices, xin, delta))
    back = grad.back_input(cupy.asarray(w.indptr), cupy.asarray(w.indices), cupy.asarray(w.data),
                           cupy.asarray(delta), shape[0])
    np.testing.assert_array_equal(cupy.asnumpy(back), grad.back_input(w.indptr, w.indices, w.data, delta, shape[0]))
