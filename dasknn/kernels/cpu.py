"""The fused challenge layer step on the CPU (Numba), and the loop over layers that drops dead images.

Activations are held *transposed and dense*: ``yt`` has one row per neuron and one column per image (``N x B``),
so the inner loop of the sparse product is a contiguous, vectorisable run over images. Dense because once dead
images are dropped the survivors are nearly all nonzero (over the challenge's 120 layers, 93 % of the alive
images' activations are nonzero).

Both loops work on *tiles* of images small enough that a tile's inputs stay in the core's L2 cache
(:func:`tile_for`): each input value is read by about 32 outputs, so where those reads come from sets the speed.
A single step (:func:`layer_step_numpy`, model mode's parts and training) copies each tile's input rows into a
contiguous buffer first. The loop over layers (:func:`run_layers_numpy`, data mode) goes further: a tile runs
through a whole group of layers before the next tile starts, so its activations never leave L2 between layers,
and its dead images are squeezed out inside the tile after every layer.

Outputs with the same inputs in the same order (*twins*: a RadiX-Net layer is made of them, 16 to 32 outputs on
each set of inputs) are summed four at a time (:func:`_twin_groups` finds them): each input row read feeds four
outputs instead of one, which matters most where a wide layer's inputs come from L3 or memory, so a tile's rows
are kept at least :data:`ROW_BYTES` long however wide the layer is. Clamping after the sums is branch-free, so it
vectorises too.

Every output sums its inputs left to right in the block's entry order, with a separately rounded multiply and add
(no ``fastmath``): the results do not depend on the tiling or the unrolling, and float32 stays bit-equal to the
reference.

These kernels, with the messages' and training's NumPy kernels, are the ``"cpu"`` backend (:class:`CpuBackend`).
"""

from __future__ import annotations

import weakref
from collections.abc import Hashable, Iterable, Iterator
from dataclasses import dataclass
from itertools import islice
from types import ModuleType

import numba
import numpy as np

from .arrays import activations_of_rows, to_host
from .cpu_folds import fold_group, fold_tile, hash_tile
from .folds import Folds, hash_coefficients
from .grad import back_input_numpy, weight_grad_numpy
from .messages import pack_rows_numpy, unpack_rows_numpy
from .scratch import leave_free, left_free, release_scratch, scratch, take_back

#: Bytes a tile's inputs may take: half of this VM's 2 MB L2 per core, leaving room for the tile's outputs.
TILE_BYTES = 1 << 20
#: Bytes a tile's row of images takes at least, however wide the layer: reading an input row then streams 16
#: cache lines, which the prefetcher follows, and the twins that share the row reuse it from L1 (a 65,536-wide
#: layer in tiles of 16 images, its inputs out of L2 either way, ran at a quarter of the speed of tiles of 256).
ROW_BYTES = 1 << 10
#: Bytes one of a tile's buffers (its inputs, its outputs) may take at most, however wide the layer.
TILE_MAX_BYTES = 1 << 26
#: Layer entries gathered into one group of the layer loop: it bounds the memory a streamed group holds
#: (about 12 bytes an entry) while a group of narrow layers stays long enough that tiles rarely refill.
GROUP_ENTRIES = 1 << 21
#: Fewest images a step or loop looks for twins in: finding them costs a few nanoseconds an entry, as much as
#: summing a 32-image batch (training's) that has none.
TWIN_MIN_IMAGES = 128
#: Layers in one group at most: between groups the survivors of all tiles are gathered and tiled afresh, so
#: tiles emptied by dying images fill up again.
GROUP_LAYERS = 16
#: Layers in one group at most while a chunk's looks fold many of its images (its record looks after every layer):
#: its tiles empty fast, and gathering them afresh more often keeps them wide (and folds equal images across them).
FOLDING_GROUP_LAYERS = 8


@numba.njit(cache=True, nogil=True, boundscheck=False)
def _twin_groups(indptr, indices, images, columns):  # pragma: no cover - compiled
    # the block's ``columns`` (ascending) ordered so that twins (columns with the same inputs in the same order)
    # are adjacent: returns (order, starts), group g being columns order[starts[g]:starts[g + 1]], ascending
    # within a group. Below TWIN_MIN_IMAGES images every column is a group of its own: finding twins would cost
    # more than they save
    n = columns.size
    if images < TWIN_MIN_IMAGES:
        return columns.copy(), np.arange(n + 1)
    keys = np.empty(n, dtype=np.uint64)
    for c in range(n):
        j = columns[c]
        h = np.uint64(14695981039346656037) ^ np.uint64(indptr[j + 1] - indptr[j])
        for p in range(indptr[j], indptr[j + 1]):
            h = (h ^ np.uint64(indices[p])) * np.uint64(1099511628211)
        keys[c] = h
    by_key = np.argsort(keys, kind="mergesort")
    order = columns[by_key]
    starts = np.empty(n + 1, dtype=np.int64)
    groups = 0
    head = -1
    for c in range(n):
        j = order[c]
        same = (head >= 0 and keys[by_key[c]] == keys[by_key[starts[groups - 1]]]
                and indptr[j + 1] - indptr[j] == indptr[head + 1] - indptr[head])
        if same:  # equal keys: compare the inputs themselves (a collision starts a group of its own)
            a, b = indptr[j], indptr[head]
            for q in range(indptr[j + 1] - a):
                if indices[a + q] != indices[b + q]:
                    same = False
                    break
        if not same:
            starts[groups] = c
            groups += 1
            head = j
    starts[groups] = n
    return order, starts[:groups + 1]


@numba.njit(cache=True, nogil=True, boundscheck=False, inline="always")
def _sum_four(src, dst, t, j0, j1, j2, j3, p0, p1, p2, p3, n, indices, data):  # pragma: no cover - compiled
    # dst[jk, :t] = sum_q data[pk + q] * src[indices[p0 + q], :t] for four twins (the same n inputs): each input
    # row read once feeds four outputs; each output still adds its terms left to right in entry order
    zero = dst.dtype.type(0)
    for b in range(t):
        dst[j0, b] = zero
        dst[j1, b] = zero
        dst[j2, b] = zero
        dst[j3, b] = zero
    q = 0
    while q + 4 <= n:
        i0, i1, i2, i3 = indices[p0 + q], indices[p0 + q + 1], indices[p0 + q + 2], indices[p0 + q + 3]
        a0, a1, a2, a3 = data[p0 + q], data[p0 + q + 1], data[p0 + q + 2], data[p0 + q + 3]
        b0, b1, b2, b3 = data[p1 + q], data[p1 + q + 1], data[p1 + q + 2], data[p1 + q + 3]
        c0, c1, c2, c3 = data[p2 + q], data[p2 + q + 1], data[p2 + q + 2], data[p2 + q + 3]
        d0, d1, d2, d3 = data[p3 + q], data[p3 + q + 1], data[p3 + q + 2], data[p3 + q + 3]
        for b in range(t):
            s0, s1, s2, s3 = src[i0, b], src[i1, b], src[i2, b], src[i3, b]
            dst[j0, b] = dst[j0, b] + s0 * a0 + s1 * a1 + s2 * a2 + s3 * a3
            dst[j1, b] = dst[j1, b] + s0 * b0 + s1 * b1 + s2 * b2 + s3 * b3
            dst[j2, b] = dst[j2, b] + s0 * c0 + s1 * c1 + s2 * c2 + s3 * c3
            dst[j3, b] = dst[j3, b] + s0 * d0 + s1 * d1 + s2 * d2 + s3 * d3
        q += 4
    while q < n:
        i0 = indices[p0 + q]
        a0, b0, c0, d0 = data[p0 + q], data[p1 + q], data[p2 + q], data[p3 + q]
        for b in range(t):
            s0 = src[i0, b]
            dst[j0, b] += s0 * a0
            dst[j1, b] += s0 * b0
            dst[j2, b] += s0 * c0
            dst[j3, b] += s0 * d0
        q += 1


@numba.njit(cache=True, nogil=True, boundscheck=False, inline="always")
def _sum_one(src, dst, t, j, p, end, indices, data):  # pragma: no cover - compiled
    # dst[j, :t] = sum_p data[p] * src[indices[p], :t]; eight entries per pass cut the accumulator's loads and
    # stores to a quarter of one per entry; the expression still adds left to right in entry order
    zero = dst.dtype.type(0)
    for b in range(t):
        dst[j, b] = zero
    while p + 8 <= end:
        w0, w1, w2, w3 = data[p], data[p + 1], data[p + 2], data[p + 3]
        w4, w5, w6, w7 = data[p + 4], data[p + 5], data[p + 6], data[p + 7]
        i0, i1, i2, i3 = indices[p], indices[p + 1], indices[p + 2], indices[p + 3]
        i4, i5, i6, i7 = indices[p + 4], indices[p + 5], indices[p + 6], indices[p + 7]
        for b in range(t):
            dst[j, b] = (dst[j, b] + src[i0, b] * w0 + src[i1, b] * w1 + src[i2, b] * w2
                               + src[i3, b] * w3 + src[i4, b] * w4 + src[i5, b] * w5 + src[i6, b] * w6
                               + src[i7, b] * w7)
        p += 8
    while p < end:
        w0 = data[p]
        i0 = indices[p]
        for b in range(t):
            dst[j, b] += src[i0, b] * w0
        p += 1


@numba.njit(cache=True, nogil=True, boundscheck=False, inline="always")
def _sum_four_apart(src, dst, b, j0, j1, j2, j3, indptr, indices, data):  # pragma: no cover - compiled
    # dst[jk, b] for four outputs with inputs of their own, their sums interleaved: in a tile of one or two images
    # (a chunk whose images have folded into one) each output's sum is a chain of dependent adds, and four chains
    # side by side keep the core busy; each still adds its terms left to right in entry order
    p0, p1, p2, p3 = indptr[j0], indptr[j1], indptr[j2], indptr[j3]
    n0, n1, n2, n3 = indptr[j0 + 1] - p0, indptr[j1 + 1] - p1, indptr[j2 + 1] - p2, indptr[j3 + 1] - p3
    zero = dst.dtype.type(0)
    s0, s1, s2, s3 = zero, zero, zero, zero
    m = min(min(n0, n1), min(n2, n3))
    for q in range(m):
        s0 = s0 + src[indices[p0 + q], b] * data[p0 + q]
        s1 = s1 + src[indices[p1 + q], b] * data[p1 + q]
        s2 = s2 + src[indices[p2 + q], b] * data[p2 + q]
        s3 = s3 + src[indices[p3 + q], b] * data[p3 + q]
    for q in range(m, n0):
        s0 = s0 + src[indices[p0 + q], b] * data[p0 + q]
    for q in range(m, n1):
        s1 = s1 + src[indices[p1 + q], b] * data[p1 + q]
    for q in range(m, n2):
        s2 = s2 + src[indices[p2 + q], b] * data[p2 + q]
    for q in range(m, n3):
        s3 = s3 + src[indices[p3 + q], b] * data[p3 + q]
    dst[j0, b], dst[j1, b], dst[j2, b], dst[j3, b] = s0, s1, s2, s3


#: Images in a tile at most for which the layer step sums four outputs' chains side by side (_sum_four_apart)
#: rather than running along the images.
NARROW_TILE = 2


@numba.njit(cache=True, nogil=True, boundscheck=False, inline="always")
def _clamp_row(dst, j, t, bias, ymax, live):  # pragma: no cover - compiled
    # the rule on a summed row: the bias goes to nonzeros only, then ReLU and the clamp; branch-free, so that it
    # vectorises. live[b] is set when the output of image b is nonzero
    zero = dst.dtype.type(0)
    for b in range(t):
        v = dst[j, b]
        u = v + bias
        u = u if u > zero else zero
        u = u if u < ymax else ymax
        u = u if v != zero else zero
        dst[j, b] = u
        live[b] = live[b] | (u != zero)


@numba.njit(cache=True, nogil=True, boundscheck=False)
def _sum_tile(src, dst, t, indptr, indices, data, columns, order, starts, bias, ymax,
              live):  # pragma: no cover - compiled
    # dst[j, b] = h(sum_p data[p] * src[indices[p], b]) for the block's columns j (ascending) and the tile's t
    # images, twins (order, starts: _twin_groups of columns) four at a time; live[b] is set when any output of
    # image b is nonzero
    for b in range(t):
        live[b] = False
    if t <= NARROW_TILE:
        c = 0
        while c + 4 <= columns.size:
            for b in range(t):
                _sum_four_apart(src, dst, b, columns[c], columns[c + 1], columns[c + 2], columns[c + 3], indptr,
                                indices, data)
            c += 4
        while c < columns.size:
            j = columns[c]
            _sum_one(src, dst, t, j, indptr[j], indptr[j + 1], indices, data)
            c += 1
    for g in range(starts.size - 1 if t > NARROW_TILE else 0):
        c, end = starts[g], starts[g + 1]
        while c + 4 <= end:
            j0, j1, j2, j3 = order[c], order[c + 1], order[c + 2], order[c + 3]
            _sum_four(src, dst, t, j0, j1, j2, j3, indptr[j0], indptr[j1], indptr[j2], indptr[j3],
                      indptr[j0 + 1] - indptr[j0], indices, data)
            c += 4
        while c < end:
            j = order[c]
            _sum_one(src, dst, t, j, indptr[j], indptr[j + 1], indices, data)
            c += 1
    # the rule after all the sums, rows in ascending order (clamped as each row was summed, the sums ran slower)
    for c in range(columns.size):
        _clamp_row(dst, columns[c], t, bias, ymax, live)


@numba.njit(cache=True, nogil=True, boundscheck=False)
def _pack_tile(yt, extra, split, rows, b0, t, buf):  # pragma: no cover - compiled
    # buf[:rows, :t] = the tile's input rows: yt's, then extra's (row i >= split is extra[i - split])
    for i in range(split):
        for b in range(t):
            buf[i, b] = yt[i, b0 + b]
    for i in range(rows - split):
        for b in range(t):
            buf[split + i, b] = extra[i, b0 + b]


@numba.njit(cache=True, nogil=True, boundscheck=False)
def _layer_step_numba(yt, extra, split, rows, indptr, indices, data, bias, ymax, out, tile, columns, buf,
                      sums):  # pragma: no cover - compiled
    # out[j] for the block's columns j in columns (ascending); out's other rows are left as they are. buf
    # (rows x min(tile, images)) holds a tile's inputs, sums (outputs x tile) its outputs when there are several
    # tiles: both unused (and may be empty) for one tile without received rows
    nb = yt.shape[1]
    live = np.empty(min(tile, nb), dtype=np.bool_)
    order, starts = _twin_groups(indptr, indices, nb, columns)
    if nb <= tile and rows == split:
        # one tile, no received rows: yt already is a contiguous tile (a training batch, a small chunk)
        _sum_tile(yt, out, nb, indptr, indices, data, columns, order, starts, bias, ymax, live)
        return
    if nb <= tile:
        sums = out
    for b0 in range(0, nb, tile):
        t = min(tile, nb - b0)
        _pack_tile(yt, extra, split, rows, b0, t, buf)
        _sum_tile(buf, sums, t, indptr, indices, data, columns, order, starts, bias, ymax, live)
        if nb > tile:  # the sums go to the tile's columns of out (written in place they ran slower)
            for j in columns:
                for b in range(t):
                    out[j, b0 + b] = sums[j, b]


@numba.njit(cache=True, nogil=True, boundscheck=False)
def _pack_tiles(yt, extra, split, rows, tiles):  # pragma: no cover - compiled
    # tiles[i, :rows, :t] = the input rows (yt's, then extra's) of the i-th tile's t images
    tile = tiles.shape[2]
    for i in range(tiles.shape[0]):
        b0 = i * tile
        _pack_tile(yt, extra, split, rows, b0, min(tile, yt.shape[1] - b0), tiles[i])


@numba.njit(cache=True, nogil=True, boundscheck=False)
def _step_tiles(tiles, nb, indptr, indices, data, bias, ymax, out, columns):  # pragma: no cover - compiled
    # out[j] for the block's columns j in columns (ascending), from inputs packed by _pack_tiles
    tile = tiles.shape[2]
    live = np.empty(tile, dtype=np.bool_)
    order, starts = _twin_groups(indptr, indices, nb, columns)
    if tiles.shape[0] == 1:
        _sum_tile(tiles[0], out, nb, indptr, indices, data, columns, order, starts, bias, ymax, live)
        return
    sums = np.empty((out.shape[0], tile), dtype=out.dtype)
    for i in range(tiles.shape[0]):
        b0 = i * tile
        t = min(tile, nb - b0)
        _sum_tile(tiles[i], sums, t, indptr, indices, data, columns, order, starts, bias, ymax, live)
        for j in columns:
            for b in range(t):
                out[j, b0 + b] = sums[j, b]


@numba.njit(cache=True, nogil=True, boundscheck=False)
def _squeeze(buf, rows, t, live, ids, weights):  # pragma: no cover - compiled
    # move the tile's live columns (and their ids and weights) to the front, in order; returns how many there are.
    # Row by row from the first dead column: moving a column at a time strode through every row of the tile (in
    # L2), 3.5x slower where one image of 256 had died
    first = 0
    while first < t and live[first]:
        first += 1
    if first == t:
        return t
    kept = np.empty(t - first, dtype=np.int64)
    n = 0
    for b in range(first, t):
        if live[b]:
            ids[first + n] = ids[b]
            weights[first + n] = weights[b]
            kept[n] = b
            n += 1
    for i in range(rows):  # (kept[j] >= first + j: a write never reaches a column still to be read)
        for j in range(n):
            buf[i, first + j] = buf[i, kept[j]]
    return first + n


@numba.njit(cache=True, nogil=True, boundscheck=False)
def _run_group(yt, ids, weights, indptrs, ptr_starts, indices, data, entry_starts, orders, group_starts,
               twin_starts, bias, ymax, src, dst, out, out_ids, out_weights, looks, coef, out_hashes, fold_merged,
               fold_into, folded, columns, alive):  # pragma: no cover - compiled
    # every tile of yt's images through the group's layers (layer l: indptrs[ptr_starts[l]:ptr_starts[l + 1]],
    # its entries from entry_starts[l], its twins orders[ptr_starts[l] - l:] and
    # group_starts[twin_starts[l]:twin_starts[l + 1]]), its dead images squeezed out after each layer; the
    # survivors go to out / out_ids / out_weights in tile order; src and dst: the two tile buffers (rows x tile,
    # rows the most any layer's input or output has). weights: the images each column stands for (folds); layer
    # l's columns computed and images alive after it are added to columns[l] and alive[l]. Where looks[l], the
    # tile's columns equal to an earlier one of the tile are folded into it after layer l (_fold_tile: the images
    # go to fold_merged / fold_into from folded[0] on: cpu_folds.fold_tile), but after the group's last layer,
    # where the survivors' hashes go to out_hashes for a look over every tile. Returns how many survived.
    layers = ptr_starts.size - 1
    rows, tile = src.shape
    live = np.empty(tile, dtype=np.bool_)
    tile_ids = np.empty(tile, dtype=ids.dtype)
    tile_weights = np.empty(tile, dtype=weights.dtype)
    tile_hashes = np.empty(tile if coef.size else 0, dtype=np.float64)
    last = layers - 1
    everything = np.arange(rows)  # a layer's columns: its first indptr.size - 1
    total = 0
    for b0 in range(0, yt.shape[1], tile):
        t = min(tile, yt.shape[1] - b0)
        _pack_tile(yt, yt, yt.shape[0], yt.shape[0], b0, t, src)
        tile_ids[:t] = ids[b0:b0 + t]
        tile_weights[:t] = weights[b0:b0 + t]
        width = yt.shape[0]
        for k in range(layers):
            indptr = indptrs[ptr_starts[k]:ptr_starts[k + 1]]
            e0, e1 = entry_starts[k], entry_starts[k + 1]
            order = orders[ptr_starts[k] - k:ptr_starts[k + 1] - k - 1]
            starts = group_starts[twin_starts[k]:twin_starts[k + 1]]
            columns[k] += t
            _sum_tile(src, dst, t, indptr, indices[e0:e1], data[e0:e1], everything[:indptr.size - 1], order, starts,
                      bias, ymax, live)
            width = indptr.size - 1
            t = _squeeze(dst, width, t, live, tile_ids, tile_weights)
            for b in range(t):
                alive[k] += tile_weights[b]
            src, dst = dst, src
            if t == 0:
                break
            if looks[k] and k < last and t > 1:
                hash_tile(src, width, t, coef, tile_hashes)
                before = folded[0]
                fold_tile(src, width, t, tile_hashes, tile_ids, tile_weights, live, fold_merged, fold_into, folded)
                if folded[0] != before:
                    t = _squeeze(src, width, t, live, tile_ids, tile_weights)
        if looks[last] and t:
            hash_tile(src, width, t, coef, tile_hashes)
            out_hashes[total:total + t] = tile_hashes[:t]
        for i in range(width):
            for b in range(t):
                out[i, total + b] = src[i, b]
        out_ids[total:total + t] = tile_ids[:t]
        out_weights[total:total + t] = tile_weights[:t]
        total += t
    return total




@numba.njit(cache=True, nogil=True, boundscheck=False)
def _keep_columns_flat(flat, rows, cols, kept):  # pragma: no cover - compiled
    # a row-major rows x cols array becomes rows x kept.size in the same memory: a write at i * m + j never
    # reaches an entry still to be read (at i * cols + kept[j] or later, since m <= cols and kept[j] >= j)
    m = kept.size
    for i in range(rows):
        src = i * cols
        dst = i * m
        for j in range(m):
            flat[dst + j] = flat[src + kept[j]]


def keep_columns_numpy(a: np.ndarray, keep: np.ndarray) -> np.ndarray:
    """``a[:, keep]`` written over ``a`` itself (a C-contiguous 2-D array), as a view of ``a``'s first entries.

    Model mode drops dead images from a part's block and received rows this way: a copy of a block of 32,768 rows
    x 1,000 images is 131 MB more, freshly mapped, and NumPy's column selection is slower than one pass here.
    ``a`` must not be used afterwards except through the view returned.
    """
    if not a.flags.c_contiguous or a.ndim != 2:
        raise ValueError("keep_columns needs a C-contiguous 2-D array")
    kept = np.flatnonzero(keep)
    flat = a.reshape(-1)
    _keep_columns_flat(flat, a.shape[0], a.shape[1], kept)
    return flat[:a.shape[0] * kept.size].reshape(a.shape[0], kept.size)


def tile_for(inputs: int, itemsize: int = 4) -> int:
    """Images per tile: as many as keep a tile's ``inputs`` rows within :data:`TILE_BYTES` (the L2 cache), but
    never so few that a row of the tile is under :data:`ROW_BYTES`, nor so many that a tile's buffer is over
    :data:`TILE_MAX_BYTES`; a multiple of 16 (whole vectors) between 16 and 4096."""
    row = max(1, inputs * itemsize)
    images = min(max(TILE_BYTES // row, ROW_BYTES // itemsize), TILE_MAX_BYTES // row)
    return int(max(16, min(4096, images - images % 16)))


def layer_step_numpy(
    yt: np.ndarray, indptr: np.ndarray, indices: np.ndarray, data: np.ndarray, bias: float, ymax: float,
    extra: np.ndarray | None = None, columns: np.ndarray | None = None, out: np.ndarray | None = None,
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
        Model mode passes the rows received from other parts here; they are read tile by tile with ``yt``'s.
    columns
        Compute only these columns of the block (ascending): row ``j`` of the result for each ``j`` in
        ``columns``. Model mode computes the outputs other parts wait for first, the rest after.
    out
        Where to write (``outputs x images``, C-contiguous, ``yt``'s dtype); its rows outside ``columns`` are
        left as they are. A new array when None.

    Returns
    -------
    numpy.ndarray
        ``outputs x images`` activations of the same dtype (``out`` when given).
    """
    dtype = yt.dtype
    yt = np.ascontiguousarray(yt)
    extra = yt if extra is None else np.ascontiguousarray(extra, dtype=dtype)
    if out is None:
        out = np.empty((indptr.size - 1, yt.shape[1]), dtype=dtype)
    elif out.shape != (indptr.size - 1, yt.shape[1]) or out.dtype != dtype or not out.flags.c_contiguous:
        raise ValueError(f"out must be a C-contiguous {dtype} array of shape {(indptr.size - 1, yt.shape[1])}")
    columns = np.arange(out.shape[0]) if columns is None else np.asarray(columns, dtype=np.int64)
    if yt.shape[1] and columns.size:
        rows = yt.shape[0] + (0 if extra is yt else extra.shape[0])
        tile, nb = tile_for(rows, dtype.itemsize), yt.shape[1]
        # the tiles' buffers no wider than the batch, in this thread's scratch (fresh ones each call cost page
        # faults: a small batch notices a megabyte, a 65,536-wide part's step 75 MB)
        buf_shape = (0, 0) if nb <= tile and rows == yt.shape[0] else (rows, min(tile, nb))
        sums_shape = (out.shape[0], tile) if nb > tile else (0, 0)
        work = scratch(buf_shape[0] * buf_shape[1] + sums_shape[0] * sums_shape[1], dtype)
        buf = work[:buf_shape[0] * buf_shape[1]].reshape(buf_shape)
        sums = work[buf.size:buf.size + sums_shape[0] * sums_shape[1]].reshape(sums_shape)
        _layer_step_numba(yt, extra, yt.shape[0], rows, indptr, indices, data.astype(dtype, copy=False),
                          dtype.type(bias), dtype.type(ymax), out, tile, columns, buf, sums)
    elif columns.size:
        out[columns] = 0
    return out


def tile_inputs(yt: np.ndarray, extra: np.ndarray | None = None, space: np.ndarray | None = None) -> np.ndarray:
    """A batch's input rows (``yt``'s, then ``extra``'s) packed once, tile by tile, for several
    :func:`layer_step_tiles` calls on the same inputs: ``tiles x rows x images per tile`` (:func:`tile_for`).

    Model mode's overlapped steps compute a layer's outputs in two sets; packing the inputs for each set cost more
    than the split saved. ``space``: a flat array of ``yt``'s dtype to pack into where it is large enough (a
    part's previous layer's, so that a fresh array's pages are not faulted in every layer).
    """
    yt = np.ascontiguousarray(yt)
    extra = yt[:0] if extra is None else np.ascontiguousarray(extra, dtype=yt.dtype)
    rows, nb = yt.shape[0] + extra.shape[0], yt.shape[1]
    tile = min(tile_for(rows, yt.dtype.itemsize), max(1, nb))
    shape = (-(-nb // tile), rows, tile)
    size = shape[0] * shape[1] * shape[2]
    if space is None or space.size < size or space.dtype != yt.dtype:
        space = np.empty(size + size // 8, dtype=yt.dtype)  # room for a layer that reads a few more rows
    tiles = space[:size].reshape(shape)
    if nb:
        _pack_tiles(yt, extra, yt.shape[0], rows, tiles)
    return tiles


def layer_step_tiles(tiles: np.ndarray, images: int, indptr: np.ndarray, indices: np.ndarray, data: np.ndarray,
                     bias: float, ymax: float, columns: np.ndarray, out: np.ndarray) -> np.ndarray:
    """:func:`layer_step_numpy` for the block's ``columns`` on inputs packed by :func:`tile_inputs` (``images``
    of them), written into ``out`` (``outputs x images``; its other rows are left as they are)."""
    dtype = tiles.dtype
    if out.shape != (indptr.size - 1, images) or out.dtype != dtype or not out.flags.c_contiguous:
        raise ValueError(f"out must be a C-contiguous {dtype} array of shape {(indptr.size - 1, images)}")
    columns = np.asarray(columns, dtype=np.int64)
    if images and columns.size:
        _step_tiles(tiles, images, indptr, indices, data.astype(dtype, copy=False), dtype.type(bias),
                    dtype.type(ymax), out, columns)
    elif columns.size:
        out[columns] = 0
    return out


def run_layers_numpy(yt: np.ndarray, layers: Iterable[tuple[np.ndarray, np.ndarray, np.ndarray]], bias: float,
                     ymax: float, ids: np.ndarray, compact_every: int | None = None, folds: Folds | None = None):
    """:func:`dasknn.kernels.run_layers` on NumPy activations: tile by tile through groups of layers, the dead
    images squeezed out of each tile after every layer.

    Parameters
    ----------
    yt
        ``N x B`` activations.
    layers
        Each layer as ``(indptr, indices, data)`` in CSC form (a list, or an iterator that reads them as they
        are needed: a group of them, :data:`GROUP_LAYERS` at most, is held at once).
    bias, ymax
        The rule's constants.
    ids
        The images' original indices (length ``B``); they follow the surviving columns.
    compact_every
        Accepted for the common signature; on the CPU the tiles drop dead images after every layer, which
        costs a pass over a tile already in cache.
    folds
        The chunk's :class:`~dasknn.kernels.folds.Folds`: where given, after each layer the record says to look at,
        each tile's columns are hashed while the tile is in L2 and those equal to an earlier one of the tile are
        folded into it (compared, never trusted to the hash); after a group's last layer, the same over every
        tile's survivors. Looks never end a group early. Every layer is counted in the record.

    Returns
    -------
    (yt, ids) or (yt, ids, folds)
        The final activations of the surviving images (of their representatives, with ``folds``) and their
        original indices; with ``folds``, the record after these layers.
    """
    dtype = yt.dtype
    yt = np.ascontiguousarray(yt)
    handed = take_back(yt)  # the buffer yt lies in, where the caller handed it over (ends.run_layers_remembering)
    ids = np.asarray(ids)
    if yt.shape[1] == 0:
        return (yt, ids) if folds is None else (yt, ids, folds)
    weights = np.ones(ids.size, dtype=np.int64) if folds is None else folds.weights(ids)
    layers = iter(layers)
    # the memory is reused from group to group (a group is a single layer at 65,536 neurons): fresh arrays of this
    # size are fresh mappings, their pages zeroed on first touch, which cost as much system time as the kernel's
    # own (measured on 65,536-wide layers under a Dask nanny's malloc settings)
    # and from call to call on a thread (ends.run_layers_remembering runs a chunk 32 layers a call): the buffer the
    # last call left free is taken up, and the one this call leaves free is left for the next
    # the flat buffer yt is in (once an output here, or handed over), and one free for reuse
    ours, spare = handed, left_free(dtype)
    while group := _next_group(layers, _group_layers(folds)):
        indptrs, ptr_starts, indices, data, entry_starts, orders, group_starts, twin_starts = \
            _concatenated(group, dtype, yt.shape[1])
        rows = max(yt.shape[0], int(np.diff(ptr_starts).max()) - 1)
        tile = min(tile_for(rows, dtype.itemsize), yt.shape[1])  # no tile wider than the batch
        tiles = scratch(2 * rows * tile, dtype)  # this thread's own: nothing else runs on it meanwhile
        shape = (group[-1][0].size - 1, yt.shape[1])
        size = shape[0] * shape[1]
        buffer = spare if spare is not None and spare.size >= size else np.empty(size, dtype=dtype)
        out = buffer[:size].reshape(shape)
        out_ids, out_weights = np.empty_like(ids), np.empty_like(weights)
        looks = folds.looks(len(group)) if folds is not None else np.zeros(len(group), dtype=bool)
        coef = hash_coefficients(rows) if looks.any() else _NO_HASH
        hashes = np.empty(yt.shape[1] if looks[-1] else 0)
        fold_merged, fold_into = (np.empty(yt.shape[1] if looks.any() else 0, dtype=np.int64) for _ in range(2))
        folded = np.zeros(1, dtype=np.int64)
        columns, alive = np.zeros(len(group), dtype=np.int64), np.zeros(len(group), dtype=np.int64)
        src, dst = (tiles[i * rows * tile:(i + 1) * rows * tile].reshape(rows, tile) for i in (0, 1))
        entering = yt.shape[1]
        survivors = _run_group(yt, ids, weights, indptrs, ptr_starts, indices, data, entry_starts, orders,
                               group_starts, twin_starts, dtype.type(bias), dtype.type(ymax), src, dst, out, out_ids,
                               out_weights, looks, coef, hashes, fold_merged, fold_into, folded, columns, alive)
        spare, ours = ours, buffer  # the input's buffer is free now (never the caller's own, unless handed over)
        yt, ids, weights = out[:, :survivors], out_ids[:survivors], out_weights[:survivors]
        if folds is not None:
            n, before = int(folded[0]), folds.merged.size
            folds = folds.counted(columns, alive).folded(fold_merged[:n], fold_into[:n])
            if looks[-1]:
                yt, ids, weights, folds = fold_group(out, survivors, hashes, ids, weights, folds)
            folds = folds.ran(len(group), (folds.merged.size - before) / max(1, entering))
        if survivors == 0:
            break
    if not yt.flags.c_contiguous and spare is not None and spare.size >= yt.size and ours is not None:
        # the survivors gathered into the free buffer: the one they were in is free then
        gathered = spare[:yt.size].reshape(yt.shape)
        np.copyto(gathered, yt)
        yt, spare = gathered, ours
    yt = np.ascontiguousarray(yt)
    leave_free(spare)
    return (yt, ids) if folds is None else (yt, ids, folds)


def _group_layers(folds: Folds | None) -> int:
    # the next group's layers at most: fewer while the chunk's looks fold many of its images
    return FOLDING_GROUP_LAYERS if folds is not None and folds.enabled and folds.every == 1 else GROUP_LAYERS


#: No hash coefficients: the layer loop does not look.
_NO_HASH = np.empty(0, dtype=np.float64)


def _next_group(layers: Iterator, most: int) -> list:
    # the next consecutive layers, up to ``most`` of them or GROUP_ENTRIES entries (at least one layer; none at the
    # end)
    group: list = []
    entries = 0
    for layer in islice(layers, most):
        group.append(layer)
        entries += layer[1].size
        if entries >= GROUP_ENTRIES:
            break
    return group


#: The twins of each layer met before, by the id of its indices array, while that array lives (a weak reference's
#: callback drops the entry): a resident layer meets the loop once per chunk, and finding its twins again cost
#: 20 ms of a 65,536-wide layer's 70 ms step on 250 images.
_TWINS_SEEN: dict[int, tuple[weakref.ref, weakref.ref, np.ndarray, np.ndarray]] = {}


def _layer_twins(layer: tuple, indptr: np.ndarray, indices: np.ndarray, images: int) -> tuple[np.ndarray, ...]:
    # _twin_groups of all the columns of ``layer`` (indptr, indices: its arrays rebased, in the loop's types), kept for the
    # layer's arrays while they live; below TWIN_MIN_IMAGES every column is its own group, as _twin_groups gives
    columns = np.arange(indptr.size - 1)
    if images < TWIN_MIN_IMAGES:
        return _twin_groups(indptr, indices, images, columns)
    own_ptr, own_ix = layer[0], layer[1]
    key = id(own_ix)
    seen = _TWINS_SEEN.get(key)
    if seen is not None and seen[0]() is own_ix and seen[1]() is own_ptr:
        return seen[2], seen[3]
    order, starts = _twin_groups(indptr, indices, images, columns)
    try:
        refs = (weakref.ref(own_ix, lambda _, key=key: _TWINS_SEEN.pop(key, None)), weakref.ref(own_ptr))
    except TypeError:  # (not an array a weak reference can follow: found again next time)
        return order, starts
    # kept: 8 bytes a column for the order (0.5 MB for a 65,536-wide layer of 25 MB) and the groups' starts, copied
    # out of the column-long array they are a view of
    starts = starts.copy()
    _TWINS_SEEN[key] = (*refs, order, starts)
    return order, starts


#: The layer loop's row indices: a layer's rows number fewer than 2**31.
_INDEX = np.dtype(np.int32)


def packed_layers(layers: Iterable[tuple[np.ndarray, np.ndarray, np.ndarray]], entries: int,
                  dtype) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """The layers, for holding: their indices (32-bit) and data (``dtype``) copied into two flat arrays of
    ``entries`` items, each layer's a view of them after the one before, so that :func:`run_layers_numpy` reads
    a group of consecutive layers where they are instead of gathering it for every chunk."""
    flat_indices, flat_data = np.empty(entries, dtype=_INDEX), np.empty(entries, dtype=dtype)
    out, start = [], 0
    for indptr, indices, data in layers:
        stop = start + indices.size
        if stop > entries:
            raise ValueError(f"packed_layers: the layers hold more than {entries:,} entries")
        flat_indices[start:stop] = indices
        flat_data[start:stop] = data
        out.append((np.asarray(indptr, dtype=np.int64), flat_indices[start:stop], flat_data[start:stop]))
        start = stop
    if start != entries:
        raise ValueError(f"packed_layers: the layers hold {start:,} entries, not {entries:,}")
    return out


def _in_place(arrays: list[np.ndarray], dtype: np.dtype) -> np.ndarray | None:
    # one view spanning ``arrays`` where they lie one after another in one flat array of ``dtype`` (as
    # packed_layers leaves them); None otherwise
    base = arrays[0].base
    if base is None or base.ndim != 1 or base.dtype != dtype or not base.flags.c_contiguous:
        return None
    start = (arrays[0].ctypes.data - base.ctypes.data) // dtype.itemsize
    at = start
    for a in arrays:
        if a.base is not base or a.dtype != dtype or a.ctypes.data != base.ctypes.data + at * dtype.itemsize:
            return None
        at += a.size
    return base[start:at]


def _concatenated(group: list, dtype: np.dtype, images: int) -> tuple[np.ndarray, ...]:
    # the group's layers as flat arrays: each layer's pointers rebased to its own entries, and where each starts;
    # then each layer's twins (_twin_groups), its orders and group starts concatenated likewise
    indptrs = [np.asarray(p, dtype=np.int64) - int(p[0]) for p, _, _ in group]
    ptr_starts = np.zeros(len(group) + 1, dtype=np.int64)
    ptr_starts[1:] = np.cumsum([p.size for p in indptrs])
    entry_starts = np.zeros(len(group) + 1, dtype=np.int64)
    entry_starts[1:] = np.cumsum([ix.size for _, ix, _ in group])
    # into this thread's scratch: fresh arrays of megabytes per group are fresh mappings whose pages fault in, which
    # under a Dask nanny's malloc settings cost twice the kernel's own time on a 1,920-layer network of one live
    # column (and the group is done with them before the next is gathered)
    # layers held packed (packed_layers) are read in place; others are gathered as 32-bit rows (what the store
    # holds): where a converged chunk's single column makes every layer a pass through memory, 64-bit indices
    # were half the loop's bytes and the gathering as long as the loop
    entries = int(entry_starts[-1])
    indices = _in_place([ix for _, ix, _ in group], _INDEX)
    if indices is None:
        indices = np.concatenate([ix for _, ix, _ in group], out=scratch(entries, _INDEX, "indices")[:entries],
                                 casting="unsafe")
    data = _in_place([d for _, _, d in group], dtype)
    if data is None:
        data = np.concatenate([d for _, _, d in group], out=scratch(entries, dtype, "data")[:entries])
    twins = [_layer_twins(layer, p, indices[entry_starts[k]:entry_starts[k + 1]], images)
             for k, (layer, p) in enumerate(zip(group, indptrs))]
    twin_starts = np.zeros(len(group) + 1, dtype=np.int64)
    twin_starts[1:] = np.cumsum([s.size for _, s in twins])
    return (np.concatenate(indptrs), ptr_starts, indices, data, entry_starts, np.concatenate([o for o, _ in twins]),
            np.concatenate([s for _, s in twins]), twin_starts)


@dataclass(frozen=True)
class CpuBackend:
    """The ``"cpu"`` backend (:class:`~dasknn.kernels.backend.Backend`): NumPy arrays and the Numba kernels. Its
    members in the contract's order."""

    name: str = "cpu"
    reuse_space: bool = True
    #: the layer loop folds equal images itself, hashing each tile as it leaves L2 (:func:`run_layers_numpy`)
    folds_in_loop: bool = True

    def missing(self) -> str | None:
        return None

    def array_types(self) -> tuple[type, ...]:
        return (np.ndarray,)

    def array_module(self) -> ModuleType:
        return np

    def to_device(self, a) -> np.ndarray:
        return to_host(a)  # a NumPy array as it is; another backend's copied to the host

    def to_host(self, a: np.ndarray) -> np.ndarray:
        return a

    def empty(self, shape: tuple[int, ...], dtype) -> np.ndarray:
        return np.empty(shape, dtype=dtype)

    activations_of_rows = staticmethod(activations_of_rows)
    layer_step = staticmethod(layer_step_numpy)
    run_layers = staticmethod(run_layers_numpy)
    keep_columns = staticmethod(keep_columns_numpy)

    def alive(self, yt: np.ndarray) -> np.ndarray:
        return yt.any(axis=0)

    pack_rows = staticmethod(pack_rows_numpy)  # in their smallest form
    unpack_rows = staticmethod(unpack_rows_numpy)
    weight_grad = staticmethod(weight_grad_numpy)
    back_input = staticmethod(back_input_numpy)

    def keep_on_device(self, key: Hashable, first: int, layers: Iterable[tuple]) -> Iterable[tuple]:
        return layers  # the host is where the layers are read into

    hold_layers = staticmethod(packed_layers)

    release = staticmethod(release_scratch)


#: The backend this module registers as ``"cpu"`` (:mod:`dasknn.kernels.dispatch`).
BACKEND = CpuBackend()
