"""Training checkpoints: a model with its optimiser state and step, as a Zarr group written atomically."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from ..errors import DasknnError
from ..kernels import to_host
from ..locations import as_location, is_url
from .model import OPT_SLOTS, Model


def save_checkpoint(path, model: Model, extra: dict | None = None) -> Path | str:
    """Write the model (patterns, values, head, optimiser state, step) as a Zarr group, atomically (behind a URL:
    in place, its attributes written last, so a checkpoint cut short is never loaded)."""
    # (here: the store imports Zarr, which `dasknn --help` need not load)
    from ..store.common import discard, open_group, publish, staging

    path = as_location(path)
    if not is_url(path):
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
    root.attrs["dasknn-train"] = {"step": model.step, "neurons": model.neurons, "classes": model.classes,
                                  "bias": model.bias, "ymax": None if math.isinf(model.ymax) else model.ymax,
                                  "optimizer": model.optimizer, "depth": model.depth, **(extra or {})}


def load_checkpoint(path) -> tuple[Model, dict]:
    """A model saved by :func:`save_checkpoint`, and its attributes."""
    from ..store.common import open_group

    try:
        root = open_group(as_location(path), mode="r")
        a = dict(root.attrs["dasknn-train"])
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

