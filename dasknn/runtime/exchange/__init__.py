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

One module per transport: :mod:`.tasks` (messages are task results, moved by Dask) and :mod:`.p2p` (messages pushed
worker to worker over Dask's comms, the scheduler out of the exchange). A new transport is one module here,
registered in :data:`EXCHANGES`.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Hashable, Iterator
from typing import Any, Protocol

#: Seconds a part waits for a message before the run ends with one line (a peer that never sends must not hang the
#: run; a lost worker ends it much sooner, through the recovery policy). ``DASKNN_EXCHANGE_WAIT`` overrides it.
WAIT_SECONDS = float(os.environ.get("DASKNN_EXCHANGE_WAIT", "600"))


#: Seconds a part waits for its messages holding its worker's thread slot before it leaves it (and the worker runs
#: another task meanwhile): a slot left and taken back costs the worker's state machine a round of its own.
HOLD_SECONDS = 0.05


class ExchangeFailed(Exception):
    """The run this endpoint belongs to was failed (a lost worker, its end): a part waiting for messages stops."""


class PeerUnreachable(ExchangeFailed, ConnectionError):
    """A message of the run could not be written to its receiver's worker (gone, or cut off): a connection error,
    so the recovery policy looks for a lost worker as it does after any failed connection."""


class Endpoint:
    """One run's end of the exchange on one worker: the bytes sent from here to parts on other workers, by message
    (tag, sender, receiver), and (for a transport that delivers messages itself, not as task arguments) the
    messages delivered here, waiting to be collected, at most once each."""

    def __init__(self, owner: Any = None) -> None:
        #: the spec of the run it belongs to (a message to another worker carries it, to find the run there)
        self.owner = owner
        self.sent: dict[tuple[Hashable, int, int], int] = {}
        self.inbox: dict[tuple[Hashable, int, int], tuple[Any, int]] = {}  # message, and its bytes
        self.delivered: set[tuple[Hashable, int, int]] = set()  # (a retried send is dropped)
        #: by (tag, receiver) a part waits for now, the messages it waits for
        self.waiting: dict[tuple[Hashable, int], list[tuple[Hashable, int, int]]] = {}
        self.unread_bytes = 0
        self.failed: str | None = None
        self._failure: type[ExchangeFailed] = ExchangeFailed
        self._ready = threading.Condition()

    def count(self, tag: Hashable, sender: int, receiver: int, nbytes: int) -> None:
        """Count a message of ``nbytes`` that ``sender`` sent ``receiver`` (on another worker) under ``tag``."""
        key = (tag, sender, receiver)
        with self._ready:
            self.sent[key] = self.sent.get(key, 0) + int(nbytes)

    def deliver(self, tag: Hashable, sender: int, receiver: int, payload: Any, nbytes: int = 0) -> bool:
        """Keep a message (of ``nbytes``) for its receiver; False (and dropped) when it was delivered before."""
        key = (tag, sender, receiver)
        with self._ready:
            if key in self.delivered:
                return False
            self.delivered.add(key)
            self.inbox[key] = (payload, nbytes)
            self.unread_bytes += nbytes
            wanted = self.waiting.get((tag, receiver))
            # the waiting part is woken once, by its last message (a wake-up per message cost every part a thread
            # switch per sender and layer)
            if wanted is not None and all(k in self.inbox for k in wanted):
                self._ready.notify_all()
            return True

    def awaits(self, tag: Hashable, receiver: int) -> bool:
        """Whether a part here waits for messages under ``tag`` now (they are let in past a full buffer)."""
        return (tag, receiver) in self.waiting

    def check(self) -> None:
        """Raise what failed the run here, if it was failed (a sending task stops at once)."""
        if self.failed is not None:
            raise self._failure(self.failed)

    def _pop(self, keys: list) -> list:
        # the messages of keys, no longer kept (the lock held)
        out = []
        for k in keys:
            payload, nbytes = self.inbox.pop(k)
            self.unread_bytes -= nbytes
            out.append(payload)
        return out

    def take(self, tag: Hashable, receiver: int, senders: tuple[int, ...], timeout: float = WAIT_SECONDS) -> list:
        """The messages of ``senders`` to ``receiver`` under ``tag``, in the senders' order, waiting for them (out of
        the worker's thread slot) as long as ``timeout``; they are no longer kept."""
        keys = [(tag, p, receiver) for p in senders]
        with self._ready:
            self.waiting[(tag, receiver)] = keys
            # a short wait keeps the thread's slot: leaving the pool and coming back costs more than most waits
            # (the parts run in step, so the last message of a layer is seldom far behind)
            self._ready.wait_for(lambda: self.failed is not None or all(k in self.inbox for k in keys),
                                 HOLD_SECONDS)
            if self.failed is None and all(k in self.inbox for k in keys):
                del self.waiting[(tag, receiver)]
                return self._pop(keys)
        deadline = time.monotonic() + timeout
        with seceded(), self._ready:
            while True:
                self.check()
                missing = [k for k in keys if k not in self.inbox]
                if not missing:
                    del self.waiting[(tag, receiver)]
                    return self._pop(keys)
                left = deadline - time.monotonic()
                if left <= 0:
                    from ...errors import DasknnError

                    raise DasknnError(f"part {receiver} waited {timeout:.0f} s for the message {tag} from part "
                                      f"{missing[0][1]}, which never came; see that part's worker's log")
                self._ready.wait(min(left, 1.0))

    def fail(self, reason: str, unreachable: bool = False) -> None:
        """Fail the run here: every part waiting for a message stops with :class:`ExchangeFailed` (with
        :class:`PeerUnreachable` where a message could not be written to its receiver's worker)."""
        with self._ready:
            if self.failed is None:
                self.failed = reason
                self._failure = PeerUnreachable if unreachable else ExchangeFailed
            self._ready.notify_all()

    def close(self) -> None:
        """Let go of what the endpoint holds (a part still waiting stops)."""
        self.fail("the run has ended")
        with self._ready:
            self.sent.clear()
            self.inbox.clear()
            self.unread_bytes = 0


@contextlib.contextmanager
def seceded() -> Iterator[None]:
    """Inside a task, leave the worker's thread slot while waiting, and take one again after: a part that waits for
    messages must not hold the slot the task sending them may need (several chunks on a one-thread worker)."""
    try:
        from distributed import get_worker, rejoin, secede

        get_worker()
    except (ImportError, ValueError):  # not in a Dask task: nothing to leave
        yield
        return
    secede()
    try:
        yield
    finally:
        rejoin()


class Exchange(Protocol):
    """A transport for the messages between a run's parts (see the module's description)."""

    #: the transport's name (``--exchange``)
    name: str
    #: whether a message is a task's result that the receiving task takes as an argument (then every step that
    #: receives is a task of its own); False where the transport delivers messages itself
    carries_messages: bool
    #: the worker of each part, by part
    workers: tuple[str, ...]

    def prepare(self, client) -> None:
        """Graph side, before a graph that uses it is submitted: set up what the transport needs on the workers."""

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


def _p2p(workers: tuple[str, ...]) -> Exchange:
    from .p2p import PeerExchange

    return PeerExchange(workers)


#: The transports by name: each makes its exchange for the workers of the parts.
EXCHANGES: dict[str, Callable[[tuple[str, ...]], Exchange]] = {"tasks": _tasks, "p2p": _p2p}


def register_exchange(name: str, make: Callable[[tuple[str, ...]], Exchange]) -> None:
    """Make the transport ``make`` (given the parts' workers, it returns an :class:`Exchange`) available as
    ``name``. Its exchanges travel to the workers inside the tasks' specs: their class must import there."""
    EXCHANGES[name] = make


def exchange_for(name: str, workers: list[str] | tuple[str, ...]) -> Exchange:
    """The ``name`` transport between parts on ``workers`` (by part)."""
    if name not in EXCHANGES:
        from ...errors import DasknnError

        raise DasknnError(f"--exchange must be one of {', '.join(sorted(EXCHANGES))}, not {name!r}")
    return EXCHANGES[name](tuple(workers))
