"""Hidden partials: what a writer writes under a temporary sibling name, renamed into place only when whole.

A partial of ``NAME`` is ``.NAME.partial-PID-XXXXXXXX`` (a file or a folder): the writing process's pid, then a
random tail so that two writes of one process never meet. A writer removes its partial when it fails or is
interrupted; one killed outright (SIGKILL, a crash, a lost machine) cannot, so the next write of ``NAME`` removes
the partials whose writer is gone. Knows nothing of what is written: stores, TSV files and arrays alike.
"""

from __future__ import annotations

import os
import re
import shutil
import time
import uuid
from pathlib import Path

#: What follows ``.NAME.partial-`` in a partial's name: the writer's pid, the random tail, an optional suffix
#: (``.npy``, which NumPy insists on).
_TAIL = re.compile(r"(\d+)-[0-9a-f]{8}(?:\.\w+)?")


def new_partial(path: str | os.PathLike[str], suffix: str = "") -> Path:
    """A fresh partial for ``path``, once the stale partials of ``path`` are removed.

    Parameters
    ----------
    path
        What will be written (the partial is its hidden sibling, renamed onto it when whole).
    suffix
        Appended to the partial's name (``".npy"`` for :func:`numpy.save`, which adds it otherwise).
    """
    path = Path(path)
    remove_stale_partials(path)
    return path.with_name(f".{path.name}.partial-{os.getpid()}-{uuid.uuid4().hex[:8]}{suffix}")


#: Seconds a removed partial must stay gone before :func:`remove_partial` trusts that nothing still writes into it
#: (a thread descheduled on a loaded machine can land its write well after 50 ms).
QUIET_SECONDS = 0.25


def remove_partial(partial: str | os.PathLike[str], patience: float = 5.0) -> None:
    """Remove a partial this process was writing, once whatever is still writing into it has stopped.

    An interrupted write can leave I/O in flight on another thread (Zarr's writes run on its own event loop, and
    Ctrl-C or SIGTERM interrupts only the main thread's wait for them): files can appear after a first removal.
    So remove, and again, until the partial has stayed gone for :data:`QUIET_SECONDS` (for at most ``patience``
    seconds); a partial that is not there (a write that succeeded) returns at once.
    """
    partial = Path(partial)
    deadline = time.monotonic() + patience
    removed_at = None  # when the partial was last found and removed
    while True:
        if partial.exists() or partial.is_symlink():
            if partial.is_dir() and not partial.is_symlink():
                shutil.rmtree(partial, ignore_errors=True)
            else:
                partial.unlink(missing_ok=True)
            removed_at = time.monotonic()
        elif removed_at is None or time.monotonic() - removed_at >= QUIET_SECONDS:
            return
        if time.monotonic() > deadline:
            return
        time.sleep(0.05)  # what was in flight lands now, or never


def remove_stale_partials(path: str | os.PathLike[str]) -> list[Path]:
    """Remove the partials of ``path`` whose writer is gone; return what was removed.

    A partial's writer is gone when no process has its pid, or when the process that has it now started after the
    partial was last written to (the pid was reused). Partials of live writers, and hidden files not named as
    partials are, are left alone.
    """
    path = Path(path)
    prefix = f".{path.name}.partial-"
    try:
        siblings = [p for p in path.parent.iterdir() if p.name.startswith(prefix)]
    except OSError:  # no such folder yet: nothing to sweep
        return []
    removed = []
    for partial in siblings:
        tail = _TAIL.fullmatch(partial.name[len(prefix):])
        if tail is None or not _writer_gone(int(tail.group(1)), partial):
            continue
        if partial.is_dir() and not partial.is_symlink():
            shutil.rmtree(partial, ignore_errors=True)
        else:
            partial.unlink(missing_ok=True)
        removed.append(partial)
    return removed


def _writer_gone(pid: int, partial: Path) -> bool:
    # psutil (a dependency of distributed) asks the system portably; os.kill(pid, 0) would end the process on Windows
    import psutil

    try:
        written = partial.lstat().st_mtime
        started = psutil.Process(pid).create_time()
    except psutil.NoSuchProcess:
        return True
    except (psutil.Error, OSError):  # another user's process, or the partial went meanwhile: not ours to judge
        return False
    return started > written + 1.0  # a second's margin: clocks round; a live writer started long before
