"""Partitions kept with the network: ``partitions/NAME``, an owners array and its report, so a partition is
computed once per store."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import zarr

from ..errors import DasknnError
from .common import WRITE_ALL, check_array, codecs, has_group, is_url, location

def partition_name(method: str, parts: int, seed: int = 0, epsilon: float = 0.03) -> str:
    """The name a computed partition is saved under in a store."""
    return f"{method}-k{parts}-s{seed}-e{epsilon:g}"


def save_partition(path: str | os.PathLike[str], name: str, owners: np.ndarray, report: dict | None = None) -> None:
    """Save an owners array (and its metrics) in the store's ``partitions/NAME`` group.

    The ``complete`` attribute is written last, so a partition whose saving was interrupted is never loaded.
    """
    root = zarr.open_group(Path(path), mode="r+", zarr_format=3)
    group = f"partitions/{name}"
    if group in root:
        del root[group]
    g = root.require_group(group)
    arr = g.create_array("owners", shape=owners.shape, chunks=owners.shape, dtype=np.int32, compressors=codecs(),
                         config=WRITE_ALL)
    arr[:] = owners.astype(np.int32)
    g.attrs.update({"report": report or {}, "complete": True})


def load_partition(path: str | os.PathLike[str], name: str) -> tuple[np.ndarray, dict] | None:
    """A saved partition's owners and report, or None if the store has none of that name."""
    path = location(path)
    root = zarr.open_group(path if is_url(path) else Path(path), mode="r", zarr_format=3)
    group = f"partitions/{name}"
    if not has_group(path, group) or not dict(root[group].attrs).get("complete"):
        return None
    try:
        owners = np.asarray(check_array(root[f"{group}/owners"], f"partition {name}", path, "iu")[:])
    except Exception as e:  # a damaged chunk: recompute rather than trust it
        raise DasknnError(f"partition {name} is damaged ({type(e).__name__}); delete it or recompute", path) from None
    return owners, dict(dict(root[group].attrs).get("report", {}))
