"""The task exchange: a message is the sending task's result, and Dask moves it to the tasks that take it as an
argument. Tasks are pinned to their parts' workers, so those transfers are the only traffic between parts; a task
that sends to several parts gets one small pick task per recipient, so each receives only its own message."""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any, ClassVar

from dask.sizeof import sizeof

from ..graph import ref
from . import Endpoint


def pick(output: tuple, q: int) -> tuple:
    """One recipient's share of a sending task's output: the shared part, and its message if it has one."""
    shared, messages = output
    return shared, {q: messages[q]} if q in messages else {}


@dataclass(frozen=True)
class TaskExchange:
    """Messages as task results (see the module's description)."""

    workers: tuple[str, ...]
    name: ClassVar[str] = "tasks"
    carries_messages: ClassVar[bool] = True

    def prepare(self, client) -> None:
        return None  # Dask moves the messages: nothing to set up

    def connect(self, graph, key: str, sender: int, recipients: tuple[int, ...], pick_name: Callable[[int], str],
                personal: bool = True) -> dict[int, Any]:
        if len(recipients) == 1 or not personal:  # (what all share is the task's result itself)
            return {r: ref(key) for r in recipients}
        return {r: ref(graph.add(self.workers[sender], pick_name(r), (pick, ref(key), r))) for r in recipients}

    def post(self, endpoint: Endpoint, tag: Hashable, sender: int, recipients: tuple[int, ...],
             messages: dict[int, Any], shared: Any = None) -> tuple:
        out = (shared, messages)
        for r in recipients:
            if self.workers[r] != self.workers[sender]:  # what Dask will move to another worker
                endpoint.count(tag, sender, r, sizeof(out if len(recipients) == 1 or not messages else pick(out, r)))
        return out

    def collect(self, endpoint: Endpoint, tag: Hashable, receiver: int, senders: tuple[int, ...],
                args: list) -> list[tuple[Any, Any]]:
        return [(shared, messages.get(receiver)) for shared, messages in args]
