"""Part plans (model mode out of core): per layer ``l{k}`` and part ``p{q}``, the part's block of the layer
(binsparse CSC over the rows it reads) and its exchange lists, so a part reads its own columns only."""

from __future__ import annotations

import hashlib
import os
from typing import Any

import numpy as np
import scipy.sparse as sp

from ..errors import DasknnError
from ..locations import as_location, remove
from .common import (VERSION, WRITE_ALL, NewArray, check_array, codecs, create_together, location, open_group,
                     open_root, open_together, raised)
from .held import held_opener
from .sparse import MATRIX_ARRAYS, Sparse, sparse_arrays, sparse_attributes

PLAN_FORMAT = "dasknn-part-plan"


def plan_digest(network: str, owners: np.ndarray) -> str:
    """A name for the part plan of ``network`` under ``owners`` (the same network and owners, the same name)."""
    h = hashlib.sha256(str(network).encode())
    h.update(np.ascontiguousarray(owners, dtype=np.int32).tobytes())
    return h.hexdigest()[:16]


def create_plan_store(path: str | os.PathLike[str], network: str, owners: np.ndarray) -> None:
    """Start an empty part plan store for ``network`` partitioned by ``owners`` (layers are added by
    :func:`write_plan_layer`, then :func:`finish_plan_store` marks it complete)."""
    path = as_location(path)
    remove(path)
    root = open_group(path, mode="w")
    # a row per chunk: the task that writes layer k reads rows k - 1 and k only
    arr = root.create_array("owners", shape=owners.shape, chunks=(1, owners.shape[1]), dtype=np.int32,
                            compressors=codecs(), config=WRITE_ALL)
    arr[:] = owners.astype(np.int32)
    root.attrs["dasknn"] = {"format": PLAN_FORMAT, "version": VERSION, "network": str(network),
                            "digest": plan_digest(network, owners), "layers": int(owners.shape[0] - 1),
                            "neurons": int(owners.shape[1]), "parts": int(owners.max()) + 1, "complete": False}


def read_plan_owners(path: str | os.PathLike[str], start: int, stop: int) -> np.ndarray:
    """Rows ``start:stop`` of the owners of a part plan (complete or being written)."""
    root = open_group(location(path), mode="r")
    # (only the chunk files of those rows asked for: a task per layer reads two rows of the plan being written)
    return np.asarray(check_array(root["owners"], "owners", location(path), "iu", (start, stop))[start:stop])


#: The lists of a PartLayer, in the order they are packed into one array per part and layer.
_LISTS = ("outputs", "inputs", "local_dst", "local_src")


def write_plan_layer(path: str | os.PathLike[str], k: int, row: list, blocks: list[sp.csc_matrix]) -> None:
    """Write layer ``k`` of a part plan: every part's :class:`~dasknn.plan.PartLayer` (``row``) and its block
    of the layer, indexed into the rows it reads (``blocks``, from :func:`dasknn.plan.local_block`)."""
    root = open_group(path, mode="r+")
    # the layer's group made afresh (what a lost task left of it goes), marked complete once all of it is there
    layer = root.create_group(f"l{k}", overwrite=True)
    groups: dict[str, dict] = {}
    arrays: list[NewArray] = []
    for q, (pl, block) in enumerate(zip(row, blocks)):
        lists = [pl.outputs, pl.inputs, pl.local[0], pl.local[1]]
        lists += [pl.recv[p] for p in sorted(pl.recv)] + [pl.send[p] for p in sorted(pl.send)]
        flat = np.concatenate([np.asarray(a, dtype=np.int64) for a in lists])
        groups[f"p{q}"] = {"lists": {"sizes": [int(np.asarray(a).size) for a in lists],
                                     "recv": sorted(int(p) for p in pl.recv), "send": sorted(int(p) for p in pl.send)}}
        groups[f"p{q}/block"] = sparse_attributes("CSC", block)
        arrays += [NewArray(f"p{q}/lists", flat, max(1, flat.size)), *sparse_arrays(block, f"p{q}/block")]
    # every part's nodes side by side: behind a URL, a few waves of answers instead of ~100 in a row
    create_together(layer, groups, arrays)
    layer.attrs["complete"] = True


def resume_plan_store(path: str | os.PathLike[str], network: str, owners: np.ndarray) -> dict[int, np.ndarray]:
    """The layers an interrupted writing of the part plan of ``network`` under ``owners`` at ``path`` finished, each
    with its counts (:func:`dasknn.plan.layer_counts`, read back from the lists' sizes): what a writing continued
    after a lost worker keeps. Empty where there is no such unfinished plan (none, another, or a complete one)."""
    try:
        root = open_group(path, mode="r")
        attrs = dict(root.attrs).get("dasknn")
    except Exception:  # nothing there, or not a group: nothing to continue
        return {}
    if (not isinstance(attrs, dict) or attrs.get("format") != PLAN_FORMAT or attrs.get("version") != VERSION
            or attrs.get("complete") or attrs.get("digest") != plan_digest(network, owners)):
        return {}
    parts = int(owners.max()) + 1
    done: dict[int, np.ndarray] = {}
    for k in range(1, int(owners.shape[0])):
        try:
            if not dict(root[f"l{k}"].attrs).get("complete"):
                continue
            counts = np.zeros((parts, parts), dtype=np.int64)
            for q in range(parts):
                desc = dict(root[f"l{k}/p{q}"].attrs)["lists"]
                sends = desc["sizes"][len(_LISTS) + len(desc["recv"]):]
                counts[q, list(desc["send"])] = sends
        except Exception:  # a layer the lost task left half written: written again
            continue
        done[k] = counts
    return done


def finish_plan_store(path: str | os.PathLike[str], counts: np.ndarray) -> None:
    """Mark a part plan complete, with its exchange counts ``(L, parts, parts)``, once every layer is written."""
    root = open_group(path, mode="r+")
    arr = root.create_array("counts", shape=counts.shape, chunks=counts.shape, dtype=np.int64, compressors=codecs(),
                            config=WRITE_ALL, overwrite=True)
    arr[:] = counts
    root.attrs["dasknn"] = {**dict(root.attrs)["dasknn"], "complete": True}


class PlanStore:
    """A part plan opened for reading: what each part of a model-mode run reads, layer by layer, instead of the
    whole layer (its own columns, already indexed into the rows it reads, and its exchange lists)."""

    def __init__(self, path: str | os.PathLike[str], hold_bytes: int = 0):
        self.path = location(path)
        self.root, attrs = open_root(self.path, (PLAN_FORMAT,), held_opener(hold_bytes))
        #: with ``hold_bytes``: the reads kept in memory (:class:`~dasknn.store.held.HeldReads`), else None
        self.held = self.root.store if hold_bytes > 0 else None
        try:
            self.parts, self.depth, self.neurons = int(attrs["parts"]), int(attrs["layers"]), int(attrs["neurons"])
            self.network, self.digest = str(attrs["network"]), str(attrs["digest"])
        except (KeyError, TypeError, ValueError) as e:
            raise DasknnError(f"part plan attributes are damaged ({e})", self.path) from None

    def owners(self) -> np.ndarray:
        """The partition the plan was made for."""
        return np.asarray(check_array(self.root["owners"], "owners", self.path, "iu")[:])

    def counts(self) -> np.ndarray:
        """``(L, parts, parts)``: entries part p sends part q in layer k, at ``[k - 1, p, q]``."""
        return np.asarray(check_array(self.root["counts"], "counts", self.path, "iu")[:])

    def part_layer(self, q: int, k: int, dtype: str | np.dtype) -> tuple[Any, tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """Part ``q``'s PartLayer and block (CSC raw arrays, values as ``dtype``) in layer ``k``."""
        from ..plan import PartLayer

        label = f"part plan layer {k} part {q}"
        try:
            # the part's nodes opened side by side, their chunk files asked for together, its arrays read in one
            # call: behind a URL each call into Zarr waits for its answers (common.open_each)
            names = ["", "lists", "block", *(f"block/{a}" for a in MATRIX_ARRAYS)]
            nodes = open_together(self.root, f"l{k}/p{q}", names)
            g, lists, block = (raised(node) for node in nodes[:3])
            desc = dict(g.attrs)["lists"]
            sizes, recv, send = list(desc["sizes"]), list(desc["recv"]), list(desc["send"])
            shape = tuple(dict(block.attrs)["binsparse"]["shape"])
        except DasknnError:
            raise
        except Exception as e:  # a missing group or chunk, damaged metadata, a checksum
            raise DasknnError(f"{label}: missing or damaged ({type(e).__name__}: {e})", self.path) from None
        (matrix,) = Sparse.from_nodes([(nodes[2:], f"{label}: block")], "CSC", [shape], self.path,
                                      beside=[(lists, f"{label}: lists", "iu")])
        indptr, indices, data, got = matrix.read(0, shape[1], beside=[lists])  # (the lists with the block's arrays)
        try:
            flat = np.asarray(raised(got), dtype=np.int64)
        except Exception as e:  # a missing or damaged chunk, a checksum
            raise DasknnError(f"{label}: missing or damaged ({type(e).__name__}: {e})", self.path) from None
        if len(sizes) != len(_LISTS) + len(recv) + len(send) or sum(sizes) != flat.size:
            raise DasknnError(f"{label}: its lists do not match their sizes", self.path)
        lists = np.split(flat, np.cumsum(sizes)[:-1])
        pl = PartLayer(outputs=lists[0], inputs=lists[1], local=(lists[2], lists[3]),
                       recv=dict(zip(recv, lists[4:4 + len(recv)])), send=dict(zip(send, lists[4 + len(recv):])))
        return pl, (indptr, indices, data.astype(dtype, copy=False))


def open_plan_store(path: str | os.PathLike[str], network: str, owners: np.ndarray) -> PlanStore | None:
    """The complete part plan at ``path`` if it was made for ``network`` and ``owners``; None otherwise."""
    try:
        plan = PlanStore(path)
    except DasknnError:
        return None
    if plan.digest != plan_digest(network, owners):
        return None
    return plan
