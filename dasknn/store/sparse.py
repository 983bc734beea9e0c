"""One sparse matrix as a store holds it: a binsparse group (``pointers_to_1``, ``indices_1``, ``values``),
written whole and read back by blocks of rows or columns, every read checked."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp
import zarr

from ..errors import DasknnError
from . import common
from .common import (NewArray, array_problems, is_url, open_each, raised, read_together, remote_error_line)

def _binsparse(fmt: str, shape: tuple[int, int], nnz: int, values: np.dtype) -> dict[str, Any]:
    return {
        "version": "0.1",
        "format": fmt,
        "shape": [int(shape[0]), int(shape[1])],
        "number_of_stored_values": int(nnz),
        "data_types": {"pointers_to_1": "int64", "indices_1": "int32", "values": np.dtype(values).name},
    }


def sparse_arrays(m: sp.csc_matrix | sp.csr_matrix, under: str = "") -> list[NewArray]:
    """The three arrays of ``m`` as a binsparse group ``under`` holds them, with their chunks' lengths: written
    with the group's :func:`sparse_attributes` by :func:`~dasknn.store.common.create_together`."""
    # the chunk sizes are read from common at each call: a test shrinks them there
    nnz = int(m.nnz)
    prefix = f"{under}/" if under else ""
    return [NewArray(f"{prefix}pointers_to_1", m.indptr.astype(np.int64, copy=False),
                     min(common.CHUNK_ROWS + 1, m.indptr.size)),
            NewArray(f"{prefix}indices_1", m.indices.astype(np.int32, copy=False),
                     max(1, min(common.CHUNK_ENTRIES, nnz))),
            NewArray(f"{prefix}values", m.data, max(1, min(common.CHUNK_ENTRIES, nnz)))]


def sparse_attributes(fmt: str, m: sp.csc_matrix | sp.csr_matrix) -> dict[str, Any]:
    """The attributes of the binsparse ``fmt`` ("CSC" or "CSR") group that holds ``m``."""
    return {"binsparse": _binsparse(fmt, m.shape, int(m.nnz), m.data.dtype)}


#: A stored matrix's arrays, in its group (what :meth:`Sparse.from_nodes` takes after the group itself).
MATRIX_ARRAYS = ("pointers_to_1", "indices_1", "values")


@dataclass(frozen=True)
class Sparse:
    """One stored binsparse matrix, opened lazily; reads check what they read."""

    pointers: zarr.Array
    indices: zarr.Array
    values: zarr.Array
    shape: tuple[int, int]
    fmt: str
    name: str
    store: Path

    @classmethod
    def open(cls, root: zarr.Group, name: str, fmt: str, shape: tuple[int, int], label: str, store: Path) -> Sparse:
        """The matrix in group ``name`` of ``root``, its metadata checked (``label`` names it in errors)."""
        return cls.open_all(root, [(name, label)], fmt, shape, store)[0]

    @classmethod
    def open_all(cls, root: zarr.Group, matrices: list[tuple[str, str]], fmt: str, shape: tuple[int, int],
                 store: Path) -> list[Sparse]:
        """:meth:`open` of each ``(name, label)``, refused in their order as opening them one by one would; their
        metadata read, and their chunk files asked for, side by side (behind a URL, a store of 480 layers waits
        for a few waves of answers, not for 3,360 answers in a row)."""
        opened = open_each(root, [(name, ["", *MATRIX_ARRAYS]) for name, _ in matrices])
        return cls.from_nodes([(nodes, label) for nodes, (_, label) in zip(opened, matrices)], fmt,
                              [shape] * len(matrices), store)

    @classmethod
    def from_nodes(cls, matrices: list[tuple[list[Any], str]], fmt: str, shapes: list[tuple[int, int]], store: Path,
                   beside: list[tuple[zarr.Array, str, str]] = ()) -> list[Sparse]:
        """The matrices of ``(nodes, label)``, each's nodes as :func:`~dasknn.store.common.open_each` opened them
        (its group, then its ``pointers_to_1``, ``indices_1`` and ``values``), checked as :meth:`open` checks them;
        ``beside``: other arrays, each with its label and the kinds of numbers it may hold
        (:func:`~dasknn.store.common.array_problems`), checked with them and refused first."""
        opened: list[tuple | DasknnError] = []
        for nodes, label in matrices:
            try:
                g, p, i, v = (raised(node) for node in nodes)
                opened.append((g, p, i, v, dict(g.attrs)["binsparse"]))
            except KeyError as e:
                opened.append(DasknnError(f"{label} is missing or incomplete ({e})", store))
            except Exception as e:  # metadata zarr cannot parse (a mangled zarr.json, an unknown codec)
                opened.append(DasknnError(f"{label}: damaged metadata ({type(e).__name__}: {e})", store))
        checked = list(beside) + [(node, f"{label}: {a}") for (_, label), got in zip(matrices, opened)
                                  if not isinstance(got, DasknnError) for a, node in zip(MATRIX_ARRAYS, got[1:4])]
        problems = iter(array_problems(checked, store))
        for problem in [next(problems) for _ in beside]:
            if problem is not None:
                raise problem
        out = []
        for (_, label), got, shape in zip(matrices, opened, shapes):
            if isinstance(got, DasknnError):
                raise got
            for problem in [next(problems) for _ in MATRIX_ARRAYS]:
                if problem is not None:
                    raise problem
            out.append(cls._described(*got[1:], fmt, shape, label, store))
        return out

    @classmethod
    def _described(cls, p: zarr.Array, i: zarr.Array, v: zarr.Array, desc: Any, fmt: str, shape: tuple[int, int],
                   label: str, store: Path) -> Sparse:
        # the matrix, once its binsparse descriptor ``desc`` agrees with its arrays and what the caller expects
        if not isinstance(desc, dict) or not isinstance(desc.get("shape"), list):
            raise DasknnError(f"{label}: the binsparse descriptor is damaged", store)
        if desc.get("format") != fmt or list(desc.get("shape", [])) != list(shape):
            raise DasknnError(f"{label}: expected a {fmt} matrix of shape {list(shape)}, the descriptor says "
                              f"{desc.get('format')} {desc.get('shape')}", store)
        nnz = desc.get("number_of_stored_values")
        if type(nnz) is not int or nnz < 0:
            raise DasknnError(f"{label}: number_of_stored_values is {nnz!r}, not a count", store)
        major = shape[1] if fmt == "CSC" else shape[0]
        if p.shape != (major + 1,):
            raise DasknnError(f"{label}: pointers_to_1 has {p.shape[0]} entries, expected {major + 1}", store)
        if i.shape != (nnz,) or v.shape != (nnz,):
            raise DasknnError(f"{label}: indices_1 and values must both hold {nnz} entries", store)
        if not np.issubdtype(p.dtype, np.integer) or not np.issubdtype(i.dtype, np.integer):
            raise DasknnError(f"{label}: pointers and indices must be integers", store)
        if not np.issubdtype(v.dtype, np.floating):
            raise DasknnError(f"{label}: values must be floating point, not {v.dtype}", store)
        return cls(p, i, v, tuple(shape), fmt, label, store)

    @property
    def nnz(self) -> int:
        return int(self.values.shape[0])

    def read(self, start: int, stop: int, beside: Sequence[zarr.Array] = ()) -> tuple:
        """Read rows (CSR) or columns (CSC) ``start:stop``: (pointers from 0, indices, values), checked.

        ``beside``: other arrays read whole in the same call (behind a URL, their answers wait with the matrix's),
        each following the three as a NumPy array, or as the exception its read raised, for the caller to raise
        under its own name (:func:`~dasknn.store.common.raised`)."""
        minor = self.shape[0] if self.fmt == "CSC" else self.shape[1]
        try:
            # a whole matrix's three arrays are read side by side; a block's entries once its pointers are known
            whole = start == 0 and stop == self.pointers.shape[0] - 1
            got = read_together([(self.pointers, slice(start, stop + 1))]
                                + ([(self.indices, slice(0, self.nnz)), (self.values, slice(0, self.nnz))]
                                   if whole else []) + [(arr, slice(None)) for arr in beside],
                                side_by_side=is_url(self.store))
            extra = got[len(got) - len(beside):]
            got = got[:len(got) - len(beside)]
            ptr = np.asarray(raised(got[0]), dtype=np.int64)
            if ptr.size and (np.any(np.diff(ptr) < 0) or ptr[0] < 0 or ptr[-1] > self.nnz):
                raise DasknnError(f"{self.name}: pointers_to_1 is not monotone within 0..nnz", self.store)
            if start == 0 and ptr.size and ptr[0] != 0:
                raise DasknnError(f"{self.name}: pointers_to_1 must start at 0", self.store)
            if stop == self.pointers.shape[0] - 1 and ptr.size and ptr[-1] != self.nnz:
                raise DasknnError(f"{self.name}: pointers_to_1 must end at the number of entries", self.store)
            a, b = int(ptr[0]), int(ptr[-1])
            if not whole:
                got += read_together([(self.indices, slice(a, b)), (self.values, slice(a, b))],
                                     side_by_side=is_url(self.store))
            idx = np.asarray(raised(got[1]), dtype=np.int32)
            val = np.asarray(raised(got[2]))
        except DasknnError:
            raise
        except Exception as e:  # a checksum mismatch or a missing/garbled chunk; or a store behind a URL not answering
            remote = remote_error_line(e) if is_url(self.store) else None
            if remote is not None:
                raise DasknnError(f"{self.name}: {remote}", self.store) from None
            raise DasknnError(f"{self.name}: cannot read entries ({self._bad_chunk(start, stop)}{type(e).__name__}: "
                              f"{e}); the store is damaged", self.store) from None
        if idx.size and (idx.min() < 0 or idx.max() >= minor):
            raise DasknnError(f"{self.name}: an index is outside 0..{minor - 1}", self.store)
        if not np.all(np.isfinite(val)):
            raise DasknnError(f"{self.name}: a value is NaN or infinite", self.store)
        return (ptr - a, idx, val, *extra)

    def _bad_chunk(self, start: int, stop: int) -> str:
        """Which chunk a failed read of ``start:stop`` could not decode (read again one chunk at a time)."""
        ranges = [("pointers_to_1", self.pointers, start, stop + 1)]
        try:
            ptr = np.asarray(self.pointers[start : stop + 1], dtype=np.int64)
            ranges += [("indices_1", self.indices, int(ptr[0]), int(ptr[-1])),
                       ("values", self.values, int(ptr[0]), int(ptr[-1]))]
        except Exception:
            pass  # the pointers themselves are damaged: one of their chunks is named below
        for name, arr, a, b in ranges:
            size = max(1, int(arr.chunks[0]))
            for c in range(a // size, -(-b // size)):
                try:
                    arr[c * size : min((c + 1) * size, arr.shape[0])]
                except Exception:
                    return f"{name} chunk {c}, entries {c * size}..{min((c + 1) * size, arr.shape[0]) - 1}: "
        return ""
