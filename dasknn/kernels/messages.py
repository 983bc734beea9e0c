"""Boundary messages of model mode: some rows of a part's activations for some images, in their smallest form.

A message carries some rows of a part's activations for some images. Dense rows are wasteful: once images die or
neurons fall silent the rows are sparse, and once activations saturate at the clamp they share one value. So a
message is ``(header, bits, values)``: header = [rows, images, kind]; kind 0: values holds the dense rows (bits
empty); 1: bits marks the nonzeros (row-major, packed), values lists them; 2: as 1, but every nonzero equals
values[0]. The packer picks the smallest. Tuples of NumPy arrays: Dask sizes and serialises them without
pickling their data.

:func:`pack_rows` and :func:`unpack_rows` are the backend's of the block: on the host the smallest form
(:func:`pack_rows_numpy`, :func:`unpack_rows_numpy`); on a device dense rows, which never leave it
(:func:`pack_rows_dense`, :func:`unpack_rows_dense`).
"""

from __future__ import annotations

import numba
import numpy as np

from .dispatch import backend_of

DENSE, SPARSE, CONSTANT = 0, 1, 2


@numba.njit(cache=True, nogil=True, boundscheck=False)
def _scan_numba(block, rows, cols, whole, bits):  # pragma: no cover - compiled
    # pass 1, without branches on the data: the nonzero bitmap (MSB first, as np.unpackbits reads it), built a
    # byte at a time in a register; the nonzero count; the least and greatest nonzero (equal: one value)
    width = block.shape[1] if whole else cols.size
    zero = block.dtype.type(0)
    big = block.dtype.type(np.inf)
    least, most = big, -big
    nnz = 0
    t = 0
    byte = 0
    for r in rows:
        row = block[r]
        for j in range(width):
            v = row[j] if whole else row[cols[j]]
            nz = v != zero
            byte = (byte << 1) | nz
            nnz += nz
            least = min(least, v if nz else big)
            most = max(most, v if nz else -big)
            t += 1
            if (t & 7) == 0:
                bits[(t >> 3) - 1] = byte
                byte = 0
    if t & 7:
        bits[t >> 3] = byte << (8 - (t & 7))
    return nnz, least, most


@numba.njit(cache=True, nogil=True, boundscheck=False)
def _gather_numba(block, rows, cols, whole, values):  # pragma: no cover - compiled
    # pass 2, only when the values differ: the nonzeros in bitmap order
    width = block.shape[1] if whole else cols.size
    zero = block.dtype.type(0)
    n = 0
    for r in rows:
        for j in range(width):
            v = block[r, j] if whole else block[r, cols[j]]
            if v != zero:
                values[n] = v
                n += 1


@numba.njit(cache=True, nogil=True, boundscheck=False)
def _unpack_numba(bits, values, constant, out):  # pragma: no cover - compiled
    # a byte of 8 entries at a time; all-zero and all-set bytes (most, once activations saturate) skip the bits
    count = out.size
    flat = out.reshape(count)
    zero = out.dtype.type(0)
    c0 = values[0] if values.size else zero
    n = 0
    t = 0
    while t < count:
        b = bits[t >> 3]
        if t + 8 <= count and (b == 0 or b == 255):
            if b == 0:
                for i in range(8):
                    flat[t + i] = zero
            elif constant:
                for i in range(8):
                    flat[t + i] = c0
            else:
                for i in range(8):
                    flat[t + i] = values[n + i]
                n += 8
        else:
            for i in range(min(8, count - t)):
                if b & (128 >> i):
                    flat[t + i] = c0 if constant else values[n]
                    n += 1
                else:
                    flat[t + i] = zero
        t += 8


def pack_rows(block, rows: np.ndarray, cols: np.ndarray | None = None, compact: bool = True) -> tuple:
    """The message holding ``block[rows][:, cols]`` (all columns when ``cols`` is None), as the backend of
    ``block`` packs it: in its smallest form on the host (``compact``), as dense rows on a device (CuPy blocks
    are sent without leaving the device)."""
    return backend_of(block).pack_rows(block, rows, cols, compact)


def unpack_rows(message: tuple, out) -> None:
    """Write a message's rows into ``out`` (``rows x images``, preallocated: a slice of the receive buffer), as
    the backend of ``out`` unpacks it."""
    backend_of(out).unpack_rows(message, out)


def pack_rows_numpy(block: np.ndarray, rows: np.ndarray, cols: np.ndarray | None = None,
                    compact: bool = True) -> tuple:
    """:func:`pack_rows` on a NumPy block: its smallest form (``compact``), or dense rows."""
    if not compact:
        return pack_rows_dense(block, rows, cols)
    width = block.shape[1] if cols is None else cols.size
    header = np.array([rows.size, width, DENSE], dtype=np.int64)
    count = rows.size * width
    bits = np.empty((count + 7) // 8, dtype=np.uint8)
    rows_ = rows.astype(np.int64, copy=False)
    cols_ = np.empty(0, np.int64) if cols is None else cols.astype(np.int64, copy=False)
    nnz, least, most = _scan_numba(block, rows_, cols_, cols is None, bits)
    item = block.dtype.itemsize
    if nnz == 0 or least == most:
        header[2] = CONSTANT if nnz else SPARSE
        return header, bits, np.full(1 if nnz else 0, least, dtype=block.dtype)
    if bits.nbytes + nnz * item < count * item:
        header[2] = SPARSE
        values = np.empty(nnz, dtype=block.dtype)
        _gather_numba(block, rows_, cols_, cols is None, values)
        return header, bits, values
    dense = block[rows] if cols is None else block[np.ix_(rows, cols)]
    return header, np.empty(0, np.uint8), np.ascontiguousarray(dense).ravel()


def pack_rows_dense(block, rows: np.ndarray, cols: np.ndarray | None = None, compact: bool = True) -> tuple:
    """:func:`pack_rows` as dense rows, on ``block``'s device (``compact`` is accepted for the common signature:
    a device block is not scanned on the host). The header is a NumPy array, the values ``block``'s kind."""
    width = block.shape[1] if cols is None else cols.size
    header = np.array([rows.size, width, DENSE], dtype=np.int64)
    dense = block[rows] if cols is None else block[rows][:, cols]
    return header, np.empty(0, np.uint8), dense.ravel()


def message_bytes(message: tuple) -> int:
    """Bytes a message's arrays take (what crosses between workers, less a few bytes of framing)."""
    return int(sum(a.nbytes for a in message))


def unpack_rows_numpy(message: tuple, out: np.ndarray) -> None:
    """:func:`unpack_rows` into a NumPy array: a message of any form."""
    header, bits, values = message
    if int(header[2]) == DENSE:
        unpack_rows_dense(message, out)
    else:
        _unpack_numba(bits, values, int(header[2]) == CONSTANT, out)


def unpack_rows_dense(message: tuple, out) -> None:
    """:func:`unpack_rows` of dense rows, into an array of any device (what :func:`pack_rows_dense` packs)."""
    header, _, values = message
    if int(header[2]) != DENSE:
        raise ValueError("a compact message (bitmap and values) unpacks into a host array only")
    out[...] = values.reshape(out.shape)
