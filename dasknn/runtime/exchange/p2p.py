"""The peer-to-peer exchange: a message is pushed by the task that built it straight to the worker of the part that
reads it, over Dask's own comms (the workers' TCP, TLS or UCX connections), after distributed's P2P shuffle
(``distributed/shuffle/_comms.py``, ``_worker_plugin.py``, ``_limiter.py``). The scheduler never sees a message: no
task per message, no task per pair of parts; a receiving task takes no argument for it and waits for it out of its
worker's thread slot (:meth:`~dasknn.runtime.exchange.Endpoint.take`).

The sending task encodes its messages (pickled, in its own thread) and leaves them in its worker's
:class:`_Outbox`, which writes them from the worker's event loop: one stream (a connection of Dask's comms) to each
peer, opened on first use, every message queued for that peer written in one frame, no answer awaited. The task does
not wait for the writes (a hand-over to the event loop and back per step cost more than the message), only for room
while the messages queued on its worker and not yet written take more than :data:`OUTBOX_BYTES` (back-pressure). A
message that cannot be written (its peer gone or cut off) fails the run's endpoint on the sending worker: its parts
stop with :class:`~dasknn.runtime.exchange.PeerUnreachable` at their next message, and the recovery policy follows.

On the receiving end a stream handler (``dasknn_exchange``, added to every worker by the ``PeerPlugin``) reads the
frames as they come, finds each message's run by the spec it carries (making the run's object if no task of the run
has run there yet) and keeps the message, still encoded, in the run's :class:`~dasknn.runtime.exchange.Endpoint` (a
duplicate dropped, a message for a run already closed there dropped); the receiving task decodes it. While the
messages kept and not yet read take more than :data:`BUFFER_BYTES`, it stops reading (unless a part there waits for
that very message): the stream fills and the sender's writes wait.
"""

from __future__ import annotations

import asyncio
import os
import pickle
import threading
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any, ClassVar

from . import Endpoint, PeerUnreachable, seceded

def encoded(value: Any) -> bytes:
    """A message's head or payload as it goes down a stream (encoded by the sending task, in its own thread)."""
    return pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)


def decoded(data: bytes) -> Any:
    """What :func:`encoded` made, back (by the task that collects it, or the handler for a head): only ever bytes
    a peer of the same run sent."""
    return pickle.loads(data)


#: The handler's name on every worker: a peer opens a stream with it, then writes messages down that stream.
HANDLER = "dasknn_exchange"
#: The plugin's name (registered once per cluster).
PLUGIN = "dasknn-peer-exchange"
#: The worker's outbox (its open streams to its peers, the messages queued for them), among its extensions.
STREAMS = "dasknn-peer-streams"
#: Seconds a write down a stream may take before its messages' runs fail here (a peer cut off: the run's recovery
#: follows rather than a write stuck for as long as TCP retries); a sending task waits as long for room in the
#: outbox.
WRITE_SECONDS = 30.0
#: Bytes of messages a worker keeps unread before it stops reading its streams (the senders then wait, as TCP does:
#: back-pressure); ``DASKNN_EXCHANGE_BUFFER`` overrides it.
BUFFER_BYTES = int(os.environ.get("DASKNN_EXCHANGE_BUFFER", str(1 << 30)))
#: Bytes of messages a worker keeps queued and not yet written before a sending task waits for room;
#: ``DASKNN_EXCHANGE_OUTBOX`` overrides it.
OUTBOX_BYTES = int(os.environ.get("DASKNN_EXCHANGE_OUTBOX", str(256 << 20)))


def _plugin_class():
    # made here so importing dasknn does not import distributed
    from distributed.diagnostics.plugin import WorkerPlugin

    class PeerPlugin(WorkerPlugin):
        """Adds the exchange's stream handler to a worker, and closes its streams with it."""

        name = PLUGIN
        idempotent = True

        def setup(self, worker) -> None:
            worker.handlers[HANDLER] = _handler(worker)

        async def teardown(self, worker) -> None:
            outbox = worker.extensions.pop(STREAMS, None)
            if outbox is not None:
                await outbox.close()

    return PeerPlugin


def _handler(worker):
    # a stream from one peer: keep each message in its run's endpoint as it arrives; stop reading while this
    # worker holds too much unread (unless a part waits for that very message)
    from distributed.comm import CommClosedError

    from ..worker_runs import runs_of

    async def stream_in(comm, **_) -> None:
        spec_seen, endpoint = None, None  # the run of the last message (most messages of a stream are of one run)
        while not comm.closed():
            try:
                frame = await comm.read()
            except (CommClosedError, OSError):
                return
            parts = frame["messages"]
            for head, body in zip(parts[::2], parts[1::2]):
                spec, tag, sender, receiver, nbytes = decoded(head)
                if spec != spec_seen or endpoint.failed is not None:
                    found = runs_of(worker).get_open(spec)
                    if found is None:  # a message for a run that ended here already (a late one): nothing waits
                        spec_seen = None
                        continue
                    spec_seen, endpoint = spec, found.endpoint
                while (endpoint.unread_bytes > BUFFER_BYTES and not endpoint.awaits(tag, receiver)
                       and endpoint.failed is None):
                    await asyncio.sleep(0.005)
                # (the payload stays bytes here: the receiving task decodes it, off the worker's event loop)
                endpoint.deliver(tag, sender, receiver, Encoded(body), nbytes)

    return stream_in


@dataclass(frozen=True)
class Encoded:
    """A message's payload as it came off the stream (pickled), decoded by the task that collects it
    (:meth:`PeerExchange.collect`)."""

    data: bytes


@dataclass(frozen=True)
class Outgoing:
    """A message queued in a worker's outbox: its head (run, tag, sender, receiver, bytes) and payload, encoded, and
    the sending run's endpoint (failed here if the message cannot be written)."""

    head: bytes
    body: bytes
    endpoint: Endpoint

    @property
    def size(self) -> int:
        return len(self.head) + len(self.body)


class _Outbox:
    """One worker's messages on their way out: queued by peer by the sending tasks (any thread), written by the
    worker's event loop, each peer's queue in one frame down that peer's stream (see the module's description)."""

    def __init__(self, worker) -> None:
        self.worker = worker
        self.comms: dict[str, object] = {}
        self._queued: dict[str, list[Outgoing]] = {}
        self._bytes = 0  # queued or being written
        self._flush_due = False  # a flush is scheduled on the event loop
        #: each peer's writer (a task of the event loop, made on first use) and what wakes it
        self._writers: dict[str, tuple[asyncio.Task, asyncio.Event]] = {}
        self._room = threading.Condition()

    def put(self, messages: list[tuple[str, Outgoing]]) -> None:
        """Queue ``messages`` (each with its peer's address) from a task's thread, once the outbox has room."""
        size = sum(m.size for _, m in messages)
        with self._room:
            full = self._bytes + size > OUTBOX_BYTES and self._bytes > 0
        if full:
            # out of the thread slot while the writes make room (they may wait on peers that wait on this worker's
            # tasks), and the lock let go before the slot is taken back (the event loop's writers take the lock)
            with seceded():
                with self._room:
                    roomy = self._room.wait_for(lambda: self._bytes + size <= OUTBOX_BYTES or self._bytes == 0,
                                                WRITE_SECONDS)
            if not roomy:
                raise PeerUnreachable(f"the exchange's messages found no room in {WRITE_SECONDS:.0f} s: "
                                      f"{self._bytes} bytes were still waiting to be written to peers")
        with self._room:
            for address, message in messages:
                self._queued.setdefault(address, []).append(message)
            self._bytes += size
            schedule, self._flush_due = not self._flush_due, True
        if schedule:
            self.worker.loop.add_callback(self._flush)

    def _flush(self) -> None:
        # on the event loop: wake the writer of each peer with messages queued (made on first use)
        with self._room:
            self._flush_due = False
            ready = [a for a, queue in self._queued.items() if queue]
        for address in ready:
            if address not in self._writers:
                wake = asyncio.Event()
                self._writers[address] = (asyncio.ensure_future(self._write(address, wake)), wake)
            self._writers[address][1].set()

    async def _write(self, address: str, wake: asyncio.Event) -> None:
        # one peer's writer: down its stream, every message queued for it, one frame at a time
        from distributed.comm import CommClosedError, connect

        while True:
            await wake.wait()
            wake.clear()
            while True:
                with self._room:
                    batch = self._queued.pop(address, None)
                if not batch:
                    break
                try:
                    comm = self.comms.get(address)
                    if comm is None or comm.closed():
                        comm = await connect(address, **self.worker.connection_args)
                        await comm.write({"op": HANDLER, "reply": False})
                        self.comms[address] = comm
                    await _written(comm, {"messages": [part for m in batch for part in (m.head, m.body)]})
                except Exception as error:  # noqa: BLE001 - a writer that died would leave its peer's messages unsent
                    # a peer that left or was cut off: the runs of these messages fail here, their recovery follows;
                    # the stream, maybe cut in the middle of a frame, is not used again
                    dropped = self.comms.pop(address, None)
                    if dropped is not None:
                        dropped.abort()
                    reason = f"could not send to {address}: {type(error).__name__}: {error}"
                    unreachable = isinstance(error, (CommClosedError, OSError, asyncio.TimeoutError))
                    for endpoint in {id(m.endpoint): m.endpoint for m in batch}.values():
                        endpoint.fail(reason, unreachable=unreachable)
                finally:
                    with self._room:
                        self._bytes -= sum(m.size for m in batch)
                        self._room.notify_all()

    async def close(self) -> None:
        for writer, _ in self._writers.values():
            writer.cancel()
        self._writers.clear()
        for comm in self.comms.values():
            await comm.close()
        self.comms.clear()


async def _written(comm, frame: dict) -> None:
    # a write that may take WRITE_SECONDS at most; asyncio.timeout (3.11) makes no task per write, as wait_for does
    if hasattr(asyncio, "timeout"):
        async with asyncio.timeout(WRITE_SECONDS):
            await comm.write(frame)
    else:
        await asyncio.wait_for(comm.write(frame), WRITE_SECONDS)


def _outbox(worker) -> _Outbox:
    # this worker's outbox (made on first use, in its extensions)
    return worker.extensions.setdefault(STREAMS, _Outbox(worker))


@dataclass(frozen=True)
class PeerExchange:
    """Messages pushed worker to worker (see the module's description)."""

    workers: tuple[str, ...]
    name: ClassVar[str] = "p2p"
    carries_messages: ClassVar[bool] = False

    def prepare(self, client) -> None:
        """Add the stream handler to every worker of ``client``'s cluster (and to those that join later)."""
        client.register_plugin(_plugin_class()(), name=PLUGIN)

    def connect(self, graph, key: str, sender: int, recipients: tuple[int, ...], pick_name: Callable[[int], str],
                personal: bool = True) -> dict[int, Any]:
        return {}  # no task argument: the message goes straight to the recipient's worker

    def post(self, endpoint: Endpoint, tag: Hashable, sender: int, recipients: tuple[int, ...],
             messages: dict[int, Any], shared: Any = None) -> None:
        from dask.sizeof import sizeof
        from distributed import get_worker

        endpoint.check()  # (a message of the run could not be sent before: stop here, not at the next wait)
        worker = get_worker()
        remote = []
        for r in recipients:
            payload = (shared, messages.get(r))
            nbytes = sizeof(payload)
            if self.workers[r] == worker.address:  # a part on this worker: no connection to cross
                endpoint.deliver(tag, sender, r, payload, nbytes)
                continue
            endpoint.count(tag, sender, r, nbytes)
            # encoded here, in the task's thread, not by the event loop every stream of the worker shares
            remote.append((self.workers[r], Outgoing(
                encoded((endpoint.owner, tag, sender, r, nbytes)), encoded(payload), endpoint)))
        if remote:
            _outbox(worker).put(remote)

    def collect(self, endpoint: Endpoint, tag: Hashable, receiver: int, senders: tuple[int, ...],
                args: list) -> list[tuple[Any, Any]]:
        return [decoded(m.data) if isinstance(m, Encoded) else m
                for m in endpoint.take(tag, receiver, senders)]
