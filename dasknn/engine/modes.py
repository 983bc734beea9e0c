"""The execution modes and the group size each gives."""

from __future__ import annotations

from ..errors import DasknnError


MODES = ("auto", "data", "model", "hybrid")


def check_mode(mode: str, workers: int, group_size: int | None) -> int:
    if mode not in MODES:
        raise DasknnError(f"--mode must be one of {', '.join(MODES)}, not {mode!r}")
    if mode == "data":
        return 1
    if mode == "model":
        return workers
    g = group_size or (2 if workers % 2 == 0 and workers >= 4 else workers)
    if g < 1 or workers % g:
        raise DasknnError(f"--group-size {g} must divide the {workers} workers")
    return g
