"""The CPU kernels' memory kept per thread between calls: scratch arrays by use, and the activations buffer the
layer loop left free, all let go by :func:`release_scratch` after a run.

Fresh arrays of megabytes are fresh mappings whose pages fault in (zeroed) on first touch; under a Dask nanny's
malloc settings that cost as much system time as the kernels' own, so a thread keeps what it used.
"""

from __future__ import annotations

import threading

import numpy as np

#: Per thread (by ident): the flat scratch arrays :func:`~dasknn.kernels.cpu.layer_step_numpy` tiles into and the
#: layer loop gathers a group's layers into, by use and dtype (and the buffer the loop left free, as use "free"),
#: kept between calls until :func:`release_scratch`.
_SCRATCH: dict[int, dict[tuple[str, np.dtype], np.ndarray]] = {}


def scratch(size: int, dtype: np.dtype, use: str = "tiles") -> np.ndarray:
    """At least ``size`` items of ``dtype`` for one use, this thread's own, grown as needed."""
    held = _SCRATCH.setdefault(threading.get_ident(), {})
    work = held.get((use, dtype))
    if work is None or work.size < size:
        work = held[use, dtype] = np.empty(size, dtype=dtype)
    return work


def left_free(dtype) -> np.ndarray | None:
    """The flat buffer of ``dtype`` the last layer loop on this thread left free (taken: the caller's now)."""
    return _SCRATCH.setdefault(threading.get_ident(), {}).pop(("free", np.dtype(dtype)), None)


def leave_free(buffer: np.ndarray | None) -> None:
    """A flat buffer nothing refers to any more, for the next layer loop on this thread."""
    if buffer is not None:
        _SCRATCH.setdefault(threading.get_ident(), {})[("free", buffer.dtype)] = buffer


def hand_over(a) -> None:
    """Tell the next layer loop on this thread that its input ``a`` is its caller's no more once the loop has read
    it: the flat buffer ``a`` lies in may then take the loop's later outputs (instead of a fresh buffer, whose pages
    fault in). Only a buffer a layer loop made (flat, its own data) is handed over."""
    base = getattr(a, "base", None)
    if isinstance(base, np.ndarray) and base.ndim == 1 and base.flags.owndata:
        _SCRATCH.setdefault(threading.get_ident(), {})[("handed", base.dtype)] = base


def take_back(a) -> np.ndarray | None:
    """The flat buffer ``a`` lies in where ``a`` was handed over (:func:`hand_over`), else None; the hand-over is
    taken back either way (it never reaches a later loop)."""
    held = _SCRATCH.setdefault(threading.get_ident(), {})
    handed = [held.pop(key) for key in [key for key in held if key[0] == "handed"]]
    base = getattr(a, "base", None)
    return base if any(b is base for b in handed) else None


def release_scratch() -> None:
    """Let go of every thread's scratch (after a run; a call still using one keeps it until it returns)."""
    _SCRATCH.clear()
