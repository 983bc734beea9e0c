"""The exchange: how the parts of a run send each other messages, behind one seam that inference's model mode and
training's model and hybrid modes both use.

An exchange is a frozen description (:class:`Exchange`: its name, and the worker of each part) with three calls:

* graph side, :meth:`Exchange.connect`: a task ``key`` on part ``sender``'s worker sends to ``recipients``; what
  does each recipient's task take as an argument to receive it?
* worker side, in the sending task, :meth:`Exchange.post`: hand the messages over (``shared`` goes to every
  recipient, e.g. an alive mask); returns the task's result;
* worker side, in the receiving task, :meth:`Exchange.collect`: the messages ``senders`` sent this part under
  ``tag``, in the senders' order.

Each run keeps one :class:`Endpoint` per worker (in its run object): the bytes each tag sent to parts on other
workers, counted by the exchange itself, so no one reads transfers back from task keys.

One module per transport: :mod:`.tasks` (messages are task results, moved by Dask; the default). A new transport is
one module here, registered in :data:`EXCHANGES`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from typing import Any, Protocol


class Endpoint:
    """One run's end of the exchange on one worker: the bytes sent to parts on other workers, by tag."""

    def __init__(self) -> None:
        self.sent: dict[Hashable, int] = {}
        self._lock = threading.Lock()

    def count(self, tag: Hashable, nbytes: int) -> None:
        """Count ``nbytes`` sent under ``tag`` to a part on another worker."""
        with self._lock:
            self.sent[tag] = self.sent.get(tag, 0) + int(nbytes)

    def close(self) -> None:
        """Let go of what the endpoint holds."""
        with self._lock:
            self.sent.clear()


class Exchange(Protocol):
    """A transport for the messages between a run's parts (see the module's description)."""

    #: the transport's name (``--exchange``)
    name: str
    #: the worker of each part, by part
    workers: tuple[str, ...]

    def connect(self, graph, key: str, sender: int, recipients: tuple[int, ...], pick_name: Callable[[int], str],
                personal: bool = True) -> dict[int, Any]:
        """Graph side: task ``key``, on part ``sender``'s worker, sends to ``recipients`` (each its own message, or,
        not ``personal``, only what it shares with all). Returns, by recipient, what its receiving task takes as an
        argument (a transport that needs none returns no entry); a task it adds to ``graph`` is named
        ``pick_name(recipient)``."""

    def post(self, endpoint: Endpoint, tag: Hashable, sender: int, recipients: tuple[int, ...],
             messages: dict[int, Any], shared: Any = None) -> Any:
        """Worker side, in the sending task: send ``messages`` (by recipient; a recipient without one gets only
        ``shared``) and ``shared`` to ``recipients`` under ``tag``. Returns the sending task's result."""

    def collect(self, endpoint: Endpoint, tag: Hashable, receiver: int, senders: tuple[int, ...],
                args: list) -> list[tuple[Any, Any]]:
        """Worker side, in the receiving task: ``(shared, message or None)`` from each of ``senders`` under ``tag``,
        in their order. ``args`` are what :meth:`connect` gave the task."""


def _tasks(workers: tuple[str, ...]) -> Exchange:
    from .tasks import TaskExchange

    return TaskExchange(workers)


#: The transports by name: each makes its exchange for the workers of the parts.
EXCHANGES: dict[str, Callable[[tuple[str, ...]], Exchange]] = {"tasks": _tasks}


def exchange_for(name: str, workers: list[str] | tuple[str, ...]) -> Exchange:
    """The ``name`` transport between parts on ``workers`` (by part)."""
    if name not in EXCHANGES:
        from ...errors import DasknnError

        raise DasknnError(f"--exchange must be one of {', '.join(sorted(EXCHANGES))}, not {name!r}")
    return EXCHANGES[name](tuple(workers))
