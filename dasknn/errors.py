"""The one error type dasknn raises for anything a user can fix.

The CLI prints ``str(error)`` on one line and exits non-zero; nothing else is shown to the user.
"""

from __future__ import annotations

import os


class DasknnError(Exception):
    """A problem with the user's input, files or settings, described in one line.

    Parameters
    ----------
    message
        What is wrong, in words a user can act on.
    path
        The file the problem is in, if any.
    line
        The 1-based line number inside ``path``, if it applies.
    """

    def __init__(self, message: str, path: str | os.PathLike[str] | None = None, line: int | None = None):
        self.message = " ".join(str(message).split())  # always one line
        self.path = None if path is None else os.fspath(path)
        self.line = line
        super().__init__(str(self))

    def __str__(self) -> str:
        where = ""
        if self.path is not None:
            where = self.path if self.line is None else f"{self.path}:{self.line}"
            where += ": "
        return where + self.message
