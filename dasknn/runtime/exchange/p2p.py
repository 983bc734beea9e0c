"""The peer-to-peer exchange: a message is pushed by the task that built it straight to the worker of the part that
reads it, over Dask's own comms (the workers' TCP, TLS or UCX connections), after distributed's P2P shuffle
(``distributed/shuffle/_comms.py``, ``_worker_plugin.py``, ``_limiter.py``). The scheduler never sees a message: no
task per message, no task per pair of parts; a receiving task takes no argument for it and waits for it out of its
worker's thread slot (:meth:`~dasknn.runtime.exchange.Endpoint.take`).

Each worker keeps one stream (a connection of Dask's comms) to each peer it sends to, opened on first use, and
writes its messages down it one after another without awaiting an answer. On the receiving end a stream handler
(``dasknn_exchange``, added to every worker by the ``PeerPlugin``) reads them as they come, finds each message's run
by the spec it carries (making the run's object if no task of the run has run there yet) and keeps the message in
the run's :class:`~dasknn.runtime.exchange.Endpoint` (a duplicate dropped, a message for a run already closed there
dropped). While the messages kept and not yet read take more than :data:`BUFFER_BYTES`, it stops reading (unless a
part there waits for that very message): the stream fills and the sender's write waits (back-pressure).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any, ClassVar

from . import Endpoint

#: The handler's name on every worker: a peer opens a stream with it, then writes messages down that stream.
HANDLER = "dasknn_exchange"
#: The plugin's name (registered once per cluster).
PLUGIN = "dasknn-peer-exchange"
#: The worker's open streams to its peers, among its extensions.
STREAMS = "dasknn-peer-streams"
#: Seconds a write down a stream may take before the sending task fails (a peer cut off: the run's recovery follows
#: rather than a thread stuck for as long as TCP retries).
WRITE_SECONDS = 30.0
#: Bytes of messages a worker keeps unread before it stops reading its streams (the senders then wait, as TCP does:
#: back-pressure); ``DASKNN_EXCHANGE_BUFFER`` overrides it.
BUFFER_BYTES = int(os.environ.get("DASKNN_EXCHANGE_BUFFER", str(1 << 30)))


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
            streams = worker.extensions.pop(STREAMS, None)
            if streams is not None:
                await streams.close()

    return PeerPlugin


def _handler(worker):
    # a stream from one peer: keep each message in its run's endpoint as it arrives; stop reading while this
    # worker holds too much unread (unless a part waits for that very message)
    from distributed.comm import CommClosedError

    from ..worker_runs import runs_of

    async def stream_in(comm, **_) -> None:
        from distributed.protocol import deserialize_bytes

        while not comm.closed():
            try:
                message = await comm.read()
            except (CommClosedError, OSError):
                return
            spec, tag, sender, receiver, nbytes = deserialize_bytes(message["head"])
            found = runs_of(worker).get_open(spec)
            if found is None:  # a message for a run that ended here already (a late one): nothing waits for it
                continue
            endpoint: Endpoint = found.endpoint
            while (endpoint.unread_bytes > BUFFER_BYTES and not endpoint.awaits(tag, receiver)
                   and endpoint.failed is None):
                await asyncio.sleep(0.005)
            # (the payload stays bytes here: the receiving task decodes it, off the worker's event loop)
            endpoint.deliver(tag, sender, receiver, Encoded(message["body"]), nbytes)

    return stream_in


@dataclass(frozen=True)
class Encoded:
    """A message's payload as it came off the stream (Dask's serialisation, as bytes), decoded by the task that
    collects it (:meth:`PeerExchange.collect`)."""

    data: bytes


class _Streams:
    """One worker's streams to its peers: one connection each, opened on first use, messages written one after
    another (no answer awaited: the receiver's reading paces the sender)."""

    def __init__(self, worker) -> None:
        self.worker = worker
        self.comms: dict[str, object] = {}
        self.locks: dict[str, asyncio.Lock] = {}

    async def send(self, address: str, message) -> None:
        from distributed.comm import CommClosedError, connect

        lock = self.locks.setdefault(address, asyncio.Lock())
        async with lock:  # (two tasks' messages to one peer: whole frames, one after the other)
            comm = self.comms.get(address)
            try:
                if comm is None or comm.closed():
                    comm = await connect(address, **self.worker.connection_args)
                    await comm.write({"op": HANDLER, "reply": False})
                    self.comms[address] = comm
                await asyncio.wait_for(comm.write(message), WRITE_SECONDS)
            except (CommClosedError, OSError, asyncio.TimeoutError):
                # a peer that left or was cut off: the task fails, the run's recovery follows; the stream, maybe
                # cut in the middle of a frame, is not used again
                dropped = self.comms.pop(address, None)
                if dropped is not None:
                    dropped.abort()
                raise

    async def close(self) -> None:
        for comm in self.comms.values():
            await comm.close()
        self.comms.clear()


def _streams(worker) -> _Streams:
    # this worker's streams (made on first use, in its extensions)
    return worker.extensions.setdefault(STREAMS, _Streams(worker))


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
        from distributed.protocol import serialize_bytes
        from distributed.utils import sync

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
            remote.append((self.workers[r], {"head": serialize_bytes((endpoint.owner, tag, sender, r, nbytes)),
                                             "body": serialize_bytes(payload)}))
        if remote:
            sync(worker.loop, _send_all, _streams(worker), remote)

    def collect(self, endpoint: Endpoint, tag: Hashable, receiver: int, senders: tuple[int, ...],
                args: list) -> list[tuple[Any, Any]]:
        from distributed.protocol import deserialize_bytes

        return [deserialize_bytes(m.data) if isinstance(m, Encoded) else m
                for m in endpoint.take(tag, receiver, senders)]


async def _send_all(streams: _Streams, remote: list[tuple[str, object]]) -> None:
    # every message at once, each down its peer's stream
    await asyncio.gather(*(streams.send(address, message) for address, message in remote))
