"""Training checkpoints: a model with its optimiser state and step, as a Zarr group written atomically.

A local checkpoint is written beside its path and renamed into place. Object stores have no rename, so behind a URL
the checkpoint is a root group whose attribute ``dasknn-checkpoint`` names the current generation, a group under it
(``step-{step}-{random}``): a new one is written whole under a new name, then the root's one small object is
rewritten to name it (the switch; one PUT, which S3 makes visible whole or not at all), and only then are the older
generations removed. A write cut short at any point leaves the root naming a complete checkpoint, and what it left
(a generation never switched to, or one switched away from) is swept by the next write.
"""

from __future__ import annotations

import math
import uuid
from pathlib import Path

import numpy as np

from ..errors import DasknnError
from ..kernels import to_host
from ..locations import as_location, child_names, exists, is_url, join, remove
from .model import OPT_SLOTS, Model

#: The root attribute of a checkpoint behind a URL that names its current generation.
POINTER = "dasknn-checkpoint"
#: The attribute of a complete checkpoint's group (a local one's root, a URL's generation).
ATTRIBUTES = "dasknn-train"


def save_checkpoint(path, model: Model, extra: dict | None = None) -> Path | str:
    """Write the model (patterns, values, head, optimiser state, step) as a Zarr group, atomically: a local one
    renamed into place, one behind a URL as a new generation its root is then switched to (see the module)."""
    # (here: the store imports Zarr, which `dasknn --help` need not load)
    from ..store.common import discard, open_group, publish, staging

    path = as_location(path)
    if is_url(path):
        _save_generation(path, model, extra)
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = staging(path)
    try:
        _write_checkpoint(open_group(tmp, mode="w"), model, extra)
        publish(tmp, path)
    except BaseException:
        discard(tmp)
        raise
    return path


def _write_checkpoint(root, model: Model, extra: dict | None) -> None:

    def put(name, a):
        a = to_host(a)  # a model trained on the GPU is written from the host
        arr = root.create_array(name, shape=a.shape, dtype=a.dtype, chunks=a.shape if a.size else (1,) * a.ndim)
        if a.size:
            arr[...] = a

    for k, (indptr, indices) in enumerate(model.patterns, start=1):
        put(f"pattern/{k}/indptr", indptr)
        put(f"pattern/{k}/indices", indices)
    for i, p in enumerate(model.params):
        put(f"params/{i}", p)
        for s, slot in enumerate(model.slots):
            put(f"slots/{s}/{i}", slot[i])
    root.attrs[ATTRIBUTES] = {"step": model.step, "neurons": model.neurons, "classes": model.classes,
                              "bias": model.bias, "ymax": None if math.isinf(model.ymax) else model.ymax,
                              "optimizer": model.optimizer, "depth": model.depth, **(extra or {})}


def _save_generation(url: str, model: Model, extra: dict | None) -> None:
    # behind a URL: the new generation written whole, the root switched to it, then the others removed
    from ..store.common import open_group, require_writable

    require_writable(url)
    before = [name for name in child_names(url) if name != "zarr.json"]
    name = f"step-{model.step:09d}-{uuid.uuid4().hex[:8]}"
    new = join(url, name)
    try:
        _write_checkpoint(open_group(new, mode="w"), model, extra)
    except BaseException:
        remove(new)
        raise
    open_group(url, mode="a").attrs.put({POINTER: name})  # the switch: the root's one object, written whole
    for old in before:  # (a checkpoint of before this layout: its arrays beside the root's attributes)
        remove(join(url, old))


def has_checkpoint(path) -> bool:
    """Whether a complete checkpoint is at ``path``: behind a URL, one its root names (a first write cut short
    left none)."""
    path = as_location(path)
    if not exists(path) or not is_url(path):
        return exists(path)
    from ..store.common import open_group

    try:
        attrs = open_group(path, mode="r").attrs
    except DasknnError:  # (an object store's refusal, said in one line)
        raise
    except Exception:  # (no root yet: nothing was ever switched to)
        return False
    return POINTER in attrs or ATTRIBUTES in attrs


def _complete_group(path):
    # the group of the complete checkpoint at ``path``: itself, or behind a URL the generation its root names
    from ..store.common import open_group

    root = open_group(path, mode="r")
    current = root.attrs.get(POINTER)
    return root if current is None else open_group(join(path, current), mode="r")


def load_checkpoint(path) -> tuple[Model, dict]:
    """A model saved by :func:`save_checkpoint`, and its attributes."""
    try:
        root = _complete_group(as_location(path))
        a = dict(root.attrs[ATTRIBUTES])
    except DasknnError:
        raise
    except Exception as e:
        raise DasknnError(f"not a dasknn training checkpoint ({type(e).__name__})", path) from None
    depth = a["depth"]
    patterns = [(np.asarray(root[f"pattern/{k}/indptr"][...]), np.asarray(root[f"pattern/{k}/indices"][...]))
                for k in range(1, depth + 1)]
    params = [np.asarray(root[f"params/{i}"][...]) for i in range(depth + 2)]
    slots = [[np.asarray(root[f"slots/{s}/{i}"][...]) for i in range(depth + 2)]
             for s in range(OPT_SLOTS[a["optimizer"]])]
    model = Model(patterns, params, a["neurons"], a["classes"], a["bias"],
                  math.inf if a["ymax"] is None else a["ymax"], a["optimizer"], slots, a["step"])
    return model, a

