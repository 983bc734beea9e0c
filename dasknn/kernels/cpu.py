"""The fused challenge layer step on the CPU (Numba), and the loop over layers that drops dead images.

Activations are held *transposed and dense*: ``yt`` has one row per neuron and one column per image (``N x B``),
so the inner loop of the sparse product is a contiguous, vectorisable run over images. Dense because once dead
images are dropped the survivors are nearly all nonzero (over the challenge's 120 layers, 93 % of the alive
images' activations are nonzero).
"""

from __future__ import annotations

from collections.abc import Iterable

import numba
import numpy as np

from .arrays import alive


@numba.njit(cache=True, nogil=True, boundscheck=False)
def _layer_step_numba(yt, extra, split, indptr, indices, data, bias, ymax, out, tile):  # pragma: no cover
    # out[j, :] = h(sum_p data[p] * x[indices[p], :]) for the block's columns j, tile by tile of images, where
    # the input rows x are yt's rows followed by extra's (index i >= split reads extra[i - split]): a part in
    # model mode reads its own block and the received rows in place, with no assembled copy.
    # Four entries per pass halve the loads and stores of the accumulator; the sum is still formed left to
    # right in the block's entry order, so results do not depend on the unrolling.
    nout = indptr.size - 1
    nb = yt.shape[1]
    zero = out.dtype.type(0)
    for b0 in range(0, nb, tile):
        b1 = min(b0 + tile, nb)
        n = b1 - b0
        for j in range(nout):
            acc = out[j, b0:b1]
            acc[:] = zero
            p = indptr[j]
            end = indptr[j + 1]
            while p + 4 <= end:
                w0, w1, w2, w3 = data[p], data[p + 1], data[p + 2], data[p + 3]
                i0, i1, i2, i3 = indices[p], indices[p + 1], indices[p + 2], indices[p + 3]
                s0 = yt[i0, b0:b1] if i0 < split else extra[i0 - split, b0:b1]
                s1 = yt[i1, b0:b1] if i1 < split else extra[i1 - split, b0:b1]
                s2 = yt[i2, b0:b1] if i2 < split else extra[i2 - split, b0:b1]
                s3 = yt[i3, b0:b1] if i3 < split else extra[i3 - split, b0:b1]
                for b in range(n):
                    acc[b] = acc[b] + s0[b] * w0 + s1[b] * w1 + s2[b] * w2 + s3[b] * w3
                p += 4
            while p < end:
                w0 = data[p]
                i0 = indices[p]
                s0 = yt[i0, b0:b1] if i0 < split else extra[i0 - split, b0:b1]
                for b in range(n):
                    acc[b] += s0[b] * w0
                p += 1
            for b in range(n):
                v = acc[b]
                if v != zero:  # the bias goes to nonzeros only
                    v = v + bias
                    if v < zero:
                        v = zero
                    elif v > ymax:
                        v = ymax
                    acc[b] = v


def tile_for(inputs: int) -> int:
    """Images per tile: wide tiles amortise the loop over columns, but a tile's inputs should stay in cache
    (measured on the 1024-neuron layers: 2048 images run twice as fast as 256)."""
    return int(max(128, min(4096, (1 << 21) // max(1, inputs))))


def layer_step_numpy(
    yt: np.ndarray, indptr: np.ndarray, indices: np.ndarray, data: np.ndarray, bias: float, ymax: float,
    extra: np.ndarray | None = None,
) -> np.ndarray:
    """One fused layer on the CPU: ``h(W_block^T @ yt)`` for the block's output neurons.

    Parameters
    ----------
    yt
        Input activations, ``inputs x images``, C-contiguous, float32 or float64.
    indptr, indices, data
        The block in CSC form: column ``j`` of the block (an output neuron) lists its inputs as rows of ``yt``.
    bias, ymax
        The rule's constants: the bias is added to nonzero sums only, then ReLU, then the clamp.
    extra
        More input rows (same images and dtype): index ``yt.shape[0] + r`` of ``indices`` reads ``extra[r]``.
        Model mode passes the rows received from other parts here, so they are never copied into ``yt``.

    Returns
    -------
    numpy.ndarray
        ``outputs x images`` activations of the same dtype.
    """
    dtype = yt.dtype
    yt = np.ascontiguousarray(yt)
    extra = yt if extra is None else np.ascontiguousarray(extra, dtype=dtype)
    out = np.empty((indptr.size - 1, yt.shape[1]), dtype=dtype)
    if yt.shape[1] and out.shape[0]:
        _layer_step_numba(yt, extra, yt.shape[0], indptr, indices, data.astype(dtype, copy=False),
                          dtype.type(bias), dtype.type(ymax), out,
                          tile_for(yt.shape[0] + (0 if extra is yt else extra.shape[0])))
    elif out.size:
        out[:] = 0
    return out


def run_layers_numpy(yt: np.ndarray, layers: Iterable[tuple[np.ndarray, np.ndarray, np.ndarray]], bias: float,
                     ymax: float, ids: np.ndarray, compact_every: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """:func:`dasknn.kernels.run_layers` on NumPy activations: a layer step, then the dead images cut out.

    A dead image (an all-zero column) stays dead, so it is cut out of ``yt`` every ``compact_every`` layers
    (by default every layer).

    Parameters
    ----------
    yt
        ``N x B`` activations.
    layers
        Each layer as ``(indptr, indices, data)`` in CSC form (a list, or an iterator that reads them as they
        are needed).
    bias, ymax
        The rule's constants.
    ids
        The images' original indices (length ``B``); they follow the surviving columns.
    compact_every
        Layers between compactions (None: every layer).

    Returns
    -------
    (yt, ids)
        The final activations of the surviving images and their original indices.
    """
    compact_every = compact_every or 1
    k = 0
    for k, (indptr, indices, data) in enumerate(layers, start=1):
        yt = layer_step_numpy(yt, indptr, indices, data, bias, ymax)
        if k % compact_every == 0:
            yt, ids = _compact(yt, ids)
        if yt.shape[1] == 0:
            break
    if k % compact_every:
        yt, ids = _compact(yt, ids)
    return yt, ids


def _compact(yt, ids: np.ndarray):
    keep = alive(yt)
    if keep.all():
        return yt, ids
    return yt[:, keep], ids[keep]


