"""The fused challenge layer step on the CPU (Numba), and the loop over layers that drops dead images.

Activations are held *transposed and dense*: ``yt`` has one row per neuron and one column per image (``N x B``),
so the inner loop of the sparse product is a contiguous, vectorisable run over images. Dense because once dead
images are dropped the survivors are nearly all nonzero (over the challenge's 120 layers, 93 % of the alive
images' activations are nonzero). Each tile of images is packed into a small contiguous buffer first (see
:func:`tile_for`); the figures against this machine's limits are in BENCHMARKS.md (issue 18).
"""

from __future__ import annotations

from collections.abc import Iterable

import numba
import numpy as np



@numba.njit(cache=True, nogil=True, boundscheck=False)
def _pack(yt, extra, split, cols, b0, n, buf):  # pragma: no cover - compiled
    # The tile's input rows, contiguous: yt's rows then extra's, columns b0 .. b0 + n (or cols[b0 .. b0 + n]
    # when cols is not empty, which is how dead images are dropped: the output holds only the listed ones).
    for i in range(buf.shape[0]):
        src = yt if i < split else extra
        r = i if i < split else i - split
        if cols.size:
            for b in range(n):
                buf[i, b] = src[r, cols[b0 + b]]
        else:
            for b in range(n):
                buf[i, b] = src[r, b0 + b]


@numba.njit(cache=True, nogil=True, boundscheck=False)
def _column(buf, n, start, end, indices, data, acc):  # pragma: no cover - compiled
    # acc[:n] = sum_p data[p] * buf[indices[p], :n], formed left to right in entry order. Eight entries per
    # pass over the tile keep the accumulator's loads and stores to one per eight products; the inner loop runs
    # over contiguous images and vectorises without reordering any image's sum.
    zero = acc.dtype.type(0)
    for b in range(n):
        acc[b] = zero
    p = start
    while p + 8 <= end:
        w0, w1, w2, w3 = data[p], data[p + 1], data[p + 2], data[p + 3]
        w4, w5, w6, w7 = data[p + 4], data[p + 5], data[p + 6], data[p + 7]
        i0, i1, i2, i3 = indices[p], indices[p + 1], indices[p + 2], indices[p + 3]
        i4, i5, i6, i7 = indices[p + 4], indices[p + 5], indices[p + 6], indices[p + 7]
        for b in range(n):
            acc[b] = (acc[b] + buf[i0, b] * w0 + buf[i1, b] * w1 + buf[i2, b] * w2 + buf[i3, b] * w3
                      + buf[i4, b] * w4 + buf[i5, b] * w5 + buf[i6, b] * w6 + buf[i7, b] * w7)
        p += 8
    while p < end:
        w0 = data[p]
        i0 = indices[p]
        for b in range(n):
            acc[b] = acc[b] + buf[i0, b] * w0
        p += 1


@numba.njit(cache=True, nogil=True, boundscheck=False)
def _layer_step_numba(yt, extra, split, cols, indptr, indices, data, bias, ymax, out, buf, acc,
                      live):  # pragma: no cover - compiled
    # out[j, :] = h(sum_p data[p] * x[indices[p], :]) for the block's columns j, tile by tile of images, where
    # the input rows x are yt's rows followed by extra's (index i >= split reads extra[i - split]): a part in
    # model mode reads its own block and the received rows in place, with no assembled copy. Each tile's
    # inputs are first packed into buf (sized to stay in L2), so the sums read contiguous rows of one small
    # array. live[b] is set for each output image with a nonzero activation.
    nout = indptr.size - 1
    nb = out.shape[1]
    tile = buf.shape[1]
    zero = out.dtype.type(0)
    for b0 in range(0, nb, tile):
        n = min(tile, nb - b0)
        _pack(yt, extra, split, cols, b0, n, buf)
        for j in range(nout):
            _column(buf, n, indptr[j], indptr[j + 1], indices, data, acc)
            for b in range(n):
                v = acc[b]
                if v != zero:  # the bias goes to nonzeros only
                    v = v + bias
                    if v < zero:
                        v = zero
                    elif v > ymax:
                        v = ymax
                    if v != zero:
                        live[b0 + b] = 1
                out[j, b0 + b] = v


def tile_for(inputs: int, itemsize: int = 4) -> int:
    """Images per tile: wide tiles amortise the loop over columns, but a tile's inputs (``inputs`` rows of
    ``itemsize`` bytes per image) should stay in the core's L2 cache (about 1 MB of it); at least 256 images, since
    shorter runs cost more in loop overhead than the cache saves (measured on 4,096 .. 65,536 neurons)."""
    return int(max(256, min(4096, (1 << 20) // max(1, inputs * itemsize))) // 16 * 16)


def _step(yt: np.ndarray, indptr: np.ndarray, indices: np.ndarray, data: np.ndarray, bias: float, ymax: float,
          extra: np.ndarray | None, cols: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """The layer step on ``yt``'s columns ``cols`` (all when None): the activations and each image's alive flag."""
    dtype = yt.dtype
    yt = np.ascontiguousarray(yt)
    extra = yt if extra is None else np.ascontiguousarray(extra, dtype=dtype)
    rows = yt.shape[0] + (0 if extra is yt else extra.shape[0])
    cols = np.empty(0, dtype=np.intp) if cols is None else cols
    width = cols.size if cols.size else yt.shape[1]
    out = np.empty((indptr.size - 1, width), dtype=dtype)
    live = np.zeros(width, dtype=np.uint8)
    if width and out.shape[0]:
        tile = min(tile_for(rows, dtype.itemsize), width)
        buf = np.empty((rows, tile), dtype=dtype)  # NumPy asks for huge pages on large buffers
        indptr = indptr.astype(np.int64, copy=False)  # one compiled kernel, with 64-bit entry positions
        _layer_step_numba(yt, extra, yt.shape[0], cols, indptr, indices, data.astype(dtype, copy=False),
                          dtype.type(bias), dtype.type(ymax), out, buf, np.empty(tile, dtype=dtype), live)
    elif out.size:
        out[:] = 0
    return out, live.view(bool)


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
    return _step(yt, indptr, indices, data, bias, ymax, extra, None)[0]


def run_layers_numpy(yt: np.ndarray, layers: Iterable[tuple[np.ndarray, np.ndarray, np.ndarray]], bias: float,
                     ymax: float, ids: np.ndarray, compact_every: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """:func:`dasknn.kernels.run_layers` on NumPy activations: a layer step, then the dead images cut out.

    A dead image (an all-zero column) stays dead, so it is dropped: the step flags each image it leaves alive,
    and the next step packs only those images' columns into its tiles, so dropping them costs no pass of its own.

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
        Layers between compactions on a device; here dead images are dropped at every layer, since it is free
        (accepted so every backend takes the same arguments).

    Returns
    -------
    (yt, ids)
        The final activations of the surviving images and their original indices.
    """
    cols = None  # the columns of yt still alive (None: all of them)
    for indptr, indices, data in layers:
        if cols is not None:
            ids = ids[cols]
        yt, live = _step(yt, indptr, indices, data, bias, ymax, None, cols)
        cols = None if live.all() else np.flatnonzero(live)
        if cols is not None and cols.size == 0:
            break
    if cols is not None:
        yt, ids = yt[:, cols], ids[cols]
    return yt, ids
