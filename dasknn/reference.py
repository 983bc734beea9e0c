"""The plain SciPy layer loop: the ground truth every other path is checked against.

Deliberately simple and single-threaded: one sparse product per layer on the whole batch, then the challenge's
rule. Nothing here is tuned; it is what "correct" means.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import scipy.sparse as sp


def layer_step(y: sp.csr_matrix, w: sp.spmatrix, bias: float, ymax: float) -> sp.csr_matrix:
    """One challenge layer: ``min(max(Y @ W + b, 0), ymax)``, with ``b`` added only to the nonzeros of ``Y @ W``.

    ``y`` and ``w`` must share a dtype; the result has it too.
    """
    z = sp.csr_matrix(y @ w.tocsr())
    # SciPy leaves the product's rows unsorted, and the next layer then sums each output in that arbitrary
    # order. Sorting (8 % of the loop's time) makes every output a sum in ascending input order, a canonical
    # order any implementation can follow: images that sit exactly on the threshold then come out the same.
    z.sort_indices()
    z.eliminate_zeros()  # a product that cancels to 0 is not a nonzero: it gets no bias
    z.data += z.data.dtype.type(bias)
    np.clip(z.data, 0, ymax, out=z.data)
    z.eliminate_zeros()
    return z


def infer(
    layers: Iterable[sp.spmatrix],
    images: sp.spmatrix,
    bias: float,
    ymax: float = 32.0,
    dtype: np.dtype | type = np.float32,
    alive: list[int] | None = None,
) -> sp.csr_matrix:
    """Run every layer on every image and return the final activations (``images x N``, CSR).

    Parameters
    ----------
    layers
        ``W_1 .. W_L`` in the challenge's orientation (any SciPy sparse format); an iterator is read one layer
        at a time, so a store's :meth:`~dasknn.store.NetworkStore.iter_layers` works out of core.
    images
        The inputs, one row per image.
    bias, ymax
        The layer rule's constants.
    dtype
        float32 (the challenge's usual choice) or float64 (exact against the published truth).
    alive
        If given, the number of images still alive after each layer is appended to it (for work counts).
    """
    dtype = np.dtype(dtype)
    y = sp.csr_matrix(images, dtype=dtype)
    for w in layers:
        y = layer_step(y, w.astype(dtype, copy=False), bias, ymax)
        if alive is not None:
            alive.append(int(np.count_nonzero(np.diff(y.indptr))))
    return y


def categories(activations: sp.spmatrix) -> np.ndarray:
    """0-based indices of the images whose final row has any nonzero (the challenge's categories)."""
    a = sp.csr_matrix(activations)
    a.eliminate_zeros()
    return np.flatnonzero(np.diff(a.indptr)).astype(np.int64)


def infer_categories(
    layers: Iterable[sp.spmatrix],
    images: sp.spmatrix,
    bias: float,
    ymax: float = 32.0,
    dtype: np.dtype | type = np.float32,
) -> np.ndarray:
    """:func:`infer` followed by :func:`categories`."""
    return categories(infer(layers, images, bias, ymax, dtype))
