"""The group size each mode gives the workers (the modes themselves are :mod:`dasknn.modes`)."""

from __future__ import annotations

from ..errors import DasknnError
from ..modes import INFERENCE, group_size_of

#: ``infer``'s modes.
MODES = INFERENCE


def check_mode(mode: str, workers: int, group_size: int | None) -> int:
    """The group size of ``mode`` (not ``auto``) on ``workers`` workers: 1, all of them, or ``group_size`` (by
    default 2 where four or more workers divide evenly, else all) in hybrid mode."""
    if mode not in MODES:
        raise DasknnError(f"--mode must be one of {', '.join(MODES)}, not {mode!r}")
    return group_size_of(mode, workers, group_size)
