"""Results written chunk by chunk (resumable runs): each chunk's categories, and optionally its final
activations, each counted as written only once its ``complete`` attribute is set."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import scipy.sparse as sp
import zarr

from ..errors import DasknnError
from ..locations import Location, as_location, child_names, exists, join, remove
from .common import VERSION, WRITE_ALL, NewArray, check_array, codecs, create_together, open_group

RESULTS_FORMAT = "dasknn-results"


def open_results(path: str | os.PathLike[str], run: dict[str, Any], resume: bool,
                 activations: bool = False) -> tuple[list, set[int]]:
    """Create (or, with ``resume``, reopen) a results store for a run; return its chunk bounds and the chunks
    already written.

    ``run`` describes the run (network, inputs, images, chunk bounds, dtype); a store made for another run is
    refused rather than mixed. A chunk counts as written only once its ``complete`` attribute is set, which is
    written after its data. With ``activations``, the group the workers write them into is made here, once:
    workers that each made it when missing raced (one of them found it made and failed).
    """
    path = as_location(path)
    if exists(path):
        if not resume:
            raise DasknnError("already exists; pass --resume to continue that run, or choose another --results", path)
        try:
            root = open_group(path, mode="r+")
            attrs = dict(root.attrs).get("dasknn", {})
        except Exception as e:
            raise DasknnError(f"not a results store ({type(e).__name__})", path) from None
        if attrs.get("format") != RESULTS_FORMAT:
            raise DasknnError("not a dasknn results store", path)
        saved = attrs.get("run", {})
        for key in ("network", "inputs", "images", "dtype"):
            if saved.get(key) != run.get(key):
                raise DasknnError(f"was written by another run ({key}: {saved.get(key)!r}, now {run.get(key)!r}); "
                                  f"choose another --results", path)
        bounds = [tuple(b) for b in saved["chunks"]]
        if activations:
            root.require_group("activations")
        return bounds, set(_written_chunks(root, path))
    root = open_group(path, mode="w")
    root.attrs["dasknn"] = {"format": RESULTS_FORMAT, "version": VERSION, "run": run}
    if activations:
        root.require_group("activations")
    return [tuple(b) for b in run["chunks"]], set()


def write_chunk_result(path: str, chunk: int, ids: np.ndarray, activations: sp.spmatrix | None = None) -> None:
    """Write one chunk's categories (original 0-based image indices) into a results store, and, when given,
    the final activations of those images (rows in the order of ``ids``) before the chunk counts as written."""
    root = open_group(path, mode="r+")
    ids = np.asarray(ids, dtype=np.int64)
    # what a killed writer left of this chunk (maybe a half-written zarr.json zarr cannot even overwrite) goes first
    remove(join(as_location(path), f"chunk-{chunk}"))
    remove(join(as_location(path), "activations", f"chunk-{chunk}"))
    if activations is not None:
        rows = sp.csr_matrix(activations)
        # the chunk's group (under "activations", made by open_results) and its four arrays side by side
        under = f"activations/chunk-{chunk}"
        create_together(root, {under: {"neurons": int(rows.shape[1])}},
                        [NewArray(f"{under}/{name}", a, max(1, a.size)) for name, a in (
                            ("ids", ids), ("indptr", rows.indptr.astype(np.int64)),
                            ("indices", rows.indices.astype(np.int32)), ("values", rows.data))])
    arr = root.create_array(f"chunk-{chunk}", shape=ids.shape, chunks=(max(1, ids.size),), dtype=np.int64,
                            compressors=codecs(), overwrite=True, config=WRITE_ALL)
    if ids.size:
        arr[:] = ids
    arr.attrs["complete"] = True


def _written_chunks(root: zarr.Group, path: Location) -> dict[int, zarr.Array]:
    """A results store's chunks whose writing finished (their ``complete`` attribute is set). A chunk whose
    metadata a killed writer left half written is not written: it is computed again."""
    out = {}
    for name in child_names(as_location(path), "chunk-"):
        try:
            c = int(name.split("-")[1])
            a = root[name]
            complete = isinstance(a, zarr.Array) and dict(a.attrs).get("complete") is True
        except Exception:  # a truncated zarr.json, a name that is not ours
            continue
        if complete:
            out[c] = a
    return out


def read_results(path: str | os.PathLike[str], chunks: set[int] | None = None) -> dict[int, np.ndarray]:
    """The written chunks' categories, by chunk."""
    root = open_group(path, mode="r")
    return {c: np.asarray(check_array(a, f"chunk-{c}", as_location(path), "iu")[:], dtype=np.int64)
            for c, a in _written_chunks(root, as_location(path)).items() if chunks is None or c in chunks}


def read_activations(path: str | os.PathLike[str], images: int | None = None) -> sp.csr_matrix:
    """The final activations a run wrote (``--activations``): ``images x neurons`` CSR, the rows of images
    that died all zero. ``images`` defaults to the run's batch size."""
    path = as_location(path)
    root = open_group(path, mode="r")
    if "activations" not in root:
        raise DasknnError("holds no activations (run with --activations)", path)
    run = dict(root.attrs).get("dasknn", {}).get("run", {})
    n_images = images if images is not None else int(run.get("images", 0))
    done = set(read_results(path))
    blocks, neurons = [], None
    for name, group in root["activations"].groups():
        if int(name.split("-")[1]) not in done:
            continue  # a chunk whose categories were not written did not finish
        neurons = int(group.attrs["neurons"])
        part = {k: check_array(group[k], f"activations/{name}/{k}", path)[:] for k in ("ids", "indptr", "indices", "values")}
        blocks.append(part)
    if neurons is None:
        return sp.csr_matrix((n_images, 0))
    coo_rows, coo_cols, coo_vals = [], [], []
    for b in blocks:
        counts = np.diff(b["indptr"])
        coo_rows.append(np.repeat(b["ids"], counts))
        coo_cols.append(b["indices"])
        coo_vals.append(b["values"])
    return sp.csr_matrix((np.concatenate(coo_vals), (np.concatenate(coo_rows), np.concatenate(coo_cols))),
                         shape=(n_images, neurons))
