"""Partitions kept with the network: ``partitions/NAME``, an owners array and its report, so a partition is
computed once per store."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np

from ..errors import DasknnError
from .common import WRITE_ALL, check_array, codecs, has_group, is_url, location, open_group

#: Owners per chunk of a saved partition (``int32``: 16 MB), so a large partition is written and read in pieces.
PARTITION_CHUNK_CELLS = 1 << 22


def partition_name(method: str, parts: int, seed: int = 0, epsilon: float = 0.03) -> str:
    """The name a computed partition is saved under in a store."""
    return f"{method}-k{parts}-s{seed}-e{epsilon:g}"


def save_partition(path: str | os.PathLike[str], name: str, owners: np.ndarray, report: dict | None = None) -> None:
    """Save an owners array (and its metrics) in the store's ``partitions/NAME`` group.

    In a local store the group is written whole under a hidden name and then renamed into place, so a saving
    that is interrupted leaves nothing that loads (and an earlier partition of that name stays until the new one
    is complete). Elsewhere (a URL) the ``complete`` attribute is written last, so an interrupted saving is never
    loaded. The network's shape (``layers``, ``neurons``) and the ``parts`` are kept beside the owners, so a
    partition that does not match its network is refused by name.
    """
    owners = np.asarray(owners)
    attrs = {"report": report or {}, "layers": int(owners.shape[0]) - 1, "neurons": int(owners.shape[1]),
             "parts": int(owners.max()) + 1 if owners.size else 0, "complete": True}
    loc = location(path)
    if is_url(loc):
        _write_group(open_group(loc, mode="r+"), f"partitions/{name}", owners, attrs)
        return
    root = open_group(loc, mode="r+")
    folder = Path(loc) / "partitions"
    for left in folder.glob(f".{name}.*"):  # what an earlier, interrupted saving left
        shutil.rmtree(left, ignore_errors=True)
    partial = f"partitions/.{name}.{os.getpid()}.partial"
    _write_group(root, partial, owners, attrs)
    _publish(Path(loc) / partial, folder / name)


def _publish(partial: Path, final: Path) -> None:
    # renames only: the group is whole or absent, never half written (an earlier one is moved aside first)
    old = final.with_name(f".{final.name}.{os.getpid()}.old")
    if final.exists():
        os.replace(final, old)
    os.replace(partial, final)
    shutil.rmtree(old, ignore_errors=True)


def _write_group(root, group: str, owners: np.ndarray, attrs: dict) -> None:
    if group in root:
        del root[group]
    g = root.require_group(group)
    rows = max(1, min(owners.shape[0], PARTITION_CHUNK_CELLS // max(1, owners.shape[1])))
    arr = g.create_array("owners", shape=owners.shape, chunks=(rows, owners.shape[1]), dtype=np.int32,
                         compressors=codecs(), config=WRITE_ALL)
    for start in range(0, owners.shape[0], rows):  # a chunk at a time: never a whole int32 copy of a large one
        arr[start:start + rows] = owners[start:start + rows].astype(np.int32)
    g.attrs.update(attrs)  # last: what has no "complete" is never loaded


def load_partition(path: str | os.PathLike[str], name: str) -> tuple[np.ndarray, dict] | None:
    """A saved partition's owners and report, or None if the store has none of that name."""
    path = location(path)
    root = open_group(path, mode="r")
    group = f"partitions/{name}"
    if not has_group(path, group) or not dict(root[group].attrs).get("complete"):
        return None
    try:
        owners = np.asarray(check_array(root[f"{group}/owners"], f"partition {name}", path, "iu")[:])
    except Exception as e:  # a damaged chunk: recompute rather than trust it
        raise DasknnError(f"partition {name} is damaged ({type(e).__name__}); delete it or recompute", path) from None
    return owners, dict(dict(root[group].attrs).get("report", {}))


def stored_partitions(root) -> list[dict]:
    """The complete partitions kept in a network store (its open root group), by name: each one's ``name`` and
    ``parts`` (a saving under way or interrupted, hidden or without its ``complete`` mark, is not one)."""
    if "partitions" not in root:
        return []
    kept = []
    for name, group in sorted(root["partitions"].groups()):
        attrs = dict(group.attrs)
        if not name.startswith(".") and attrs.get("complete"):
            kept.append({"name": name, "parts": int(attrs.get("parts", 0))})
    return kept
