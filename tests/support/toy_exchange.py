"""A toy transport, in the tests only: each message is a file in a folder every worker can read (a shared file
system), written atomically by the sender and waited for by the receiver, out of its worker's thread slot. No task
argument carries a message, as with a transport that pushes messages itself. That it runs the engine's and
training's shared tests unchanged is the proof that a transport is one room (``tests/runtime/test_exchanges.py``)."""

from __future__ import annotations

import hashlib
import os
import pickle
import tempfile
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from dasknn.runtime.exchange import Endpoint, register_exchange, seceded


@dataclass(frozen=True)
class FolderExchange:
    """Messages as files in ``folder`` (one folder per exchange: per chunk's group, or per training run)."""

    workers: tuple[str, ...]
    folder: str
    name: ClassVar[str] = "folder"
    carries_messages: ClassVar[bool] = False

    def prepare(self, client) -> None:
        return None  # the folder is there

    def connect(self, graph, key: str, sender: int, recipients: tuple[int, ...], pick_name: Callable[[int], str],
                personal: bool = True) -> dict[int, Any]:
        return {}  # no argument: the receiver waits for the file

    def _path(self, tag: Hashable, sender: int, receiver: int) -> Path:
        return Path(self.folder) / f"{hashlib.sha1(repr(tag).encode()).hexdigest()}-{sender}-{receiver}"

    def post(self, endpoint: Endpoint, tag: Hashable, sender: int, recipients: tuple[int, ...],
             messages: dict[int, Any], shared: Any = None) -> None:
        for r in recipients:
            data = pickle.dumps((shared, messages.get(r)))
            path = self._path(tag, sender, r)
            tmp = path.with_suffix(f".{os.getpid()}.partial")
            tmp.write_bytes(data)
            os.replace(tmp, path)  # whole or not there
            if self.workers[r] != self.workers[sender]:
                endpoint.count(tag, sender, r, len(data))

    def collect(self, endpoint: Endpoint, tag: Hashable, receiver: int, senders: tuple[int, ...],
                args: list) -> list[tuple[Any, Any]]:
        paths = [self._path(tag, p, receiver) for p in senders]
        deadline = time.monotonic() + 120
        with seceded():
            while not all(p.exists() for p in paths):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"no message {tag} in {self.folder}")
                time.sleep(0.002)
        return [pickle.loads(p.read_bytes()) for p in paths]  # (a file it wrote itself, in the tests)


def register(under: os.PathLike[str] | str) -> None:
    """Make the toy transport available as ``"folder"`` (in this process: the client's choice), each exchange's
    folder made under ``under`` (a test's ``tmp_path``: a folder of its own in the system's temporary folder was
    never removed, and a run of the suite left 58 of them, 483 MB)."""

    def folder_exchange(workers: tuple[str, ...]) -> FolderExchange:
        return FolderExchange(workers, tempfile.mkdtemp(prefix="exchange-", dir=under))

    register_exchange("folder", folder_exchange)
