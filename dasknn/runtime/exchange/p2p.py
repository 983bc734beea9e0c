"""The peer-to-peer exchange: a message is pushed by the task that built it straight to the worker of the part that
reads it, over Dask's own comms (the workers' TCP, TLS or UCX connections), after distributed's P2P shuffle
(``distributed/shuffle/_comms.py``, ``_worker_plugin.py``, ``_limiter.py``). The scheduler never sees a message: no
task per message, no task per pair of parts; a receiving task takes no argument for it and waits for it out of its
worker's thread slot (:meth:`~dasknn.runtime.exchange.Endpoint.take`).

On the receiving worker a comm handler (``dasknn_exchange``, added to every worker by :class:`PeerPlugin`) finds
the run's object by the spec the message carries (making it if no task of the run has run there yet), keeps the
message in the run's :class:`~dasknn.runtime.exchange.Endpoint` (a retried send's duplicate dropped) and answers;
while the messages kept there and not yet read take more than :data:`BUFFER_BYTES`, it answers only once they take
less (the sender's task waits: back-pressure), unless a part there is waiting for that very message.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any, ClassVar

from . import Endpoint

#: The handler's name on every worker.
HANDLER = "dasknn_exchange"
#: The plugin's name (registered once per cluster).
PLUGIN = "dasknn-peer-exchange"
#: Bytes of messages a worker keeps unread before senders wait (``DASKNN_EXCHANGE_BUFFER`` overrides it).
BUFFER_BYTES = int(os.environ.get("DASKNN_EXCHANGE_BUFFER", str(1 << 30)))
#: Tries of a send that fails on its connection (the receiver drops a duplicate), and the first pause between.
SEND_TRIES, SEND_PAUSE = 3, 0.05


def _plugin_class():
    # made here so importing dasknn does not import distributed
    from distributed.diagnostics.plugin import WorkerPlugin

    class PeerPlugin(WorkerPlugin):
        """Adds the exchange's comm handler to a worker."""

        name = PLUGIN
        idempotent = True

        def setup(self, worker) -> None:
            worker.handlers[HANDLER] = _handler(worker)

    return PeerPlugin


def _handler(worker):
    # the handler of one worker: keep a message in its run's endpoint, then answer (later, when the buffer is full)
    from ..worker_runs import runs_of

    async def receive(message: tuple) -> dict:
        spec, tag, sender, receiver, payload, nbytes = message  # (Dask's comms deserialised it)
        found = runs_of(worker).get_open(spec)
        if found is None:  # a message for a run that ended here already (a late one): nothing waits for it
            return {"status": "OK"}
        endpoint: Endpoint = found.endpoint
        while endpoint.unread_bytes > BUFFER_BYTES and not endpoint.awaits(tag, receiver) and endpoint.failed is None:
            await asyncio.sleep(0.005)  # back-pressure: the sender's task waits for the answer
        endpoint.deliver(tag, sender, receiver, payload, nbytes)
        return {"status": "OK"}

    return receive


@dataclass(frozen=True)
class PeerExchange:
    """Messages pushed worker to worker (see the module's description)."""

    workers: tuple[str, ...]
    name: ClassVar[str] = "p2p"
    carries_messages: ClassVar[bool] = False

    def prepare(self, client) -> None:
        """Add the comm handler to every worker of ``client``'s cluster (and to those that join later)."""
        client.register_plugin(_plugin_class()(), name=PLUGIN)

    def connect(self, graph, key: str, sender: int, recipients: tuple[int, ...], pick_name: Callable[[int], str],
                personal: bool = True) -> dict[int, Any]:
        return {}  # no task argument: the message goes straight to the recipient's worker

    def post(self, endpoint: Endpoint, tag: Hashable, sender: int, recipients: tuple[int, ...],
             messages: dict[int, Any], shared: Any = None) -> None:
        from dask.sizeof import sizeof
        from distributed import get_worker
        from distributed.protocol import to_serialize
        from distributed.utils import sync

        worker = get_worker()
        remote = []
        for r in recipients:
            payload = (shared, messages.get(r))
            nbytes = sizeof(payload)
            if self.workers[r] == worker.address:  # a part on this worker: no connection to cross
                endpoint.deliver(tag, sender, r, payload, nbytes)
                continue
            endpoint.count(tag, nbytes)
            remote.append((self.workers[r], to_serialize((endpoint.owner, tag, sender, r, payload, nbytes))))
        if remote:
            sync(worker.loop, _send_all, worker, remote)

    def collect(self, endpoint: Endpoint, tag: Hashable, receiver: int, senders: tuple[int, ...],
                args: list) -> list[tuple[Any, Any]]:
        return endpoint.take(tag, receiver, senders)


async def _send_all(worker, remote: list[tuple[str, object]]) -> None:
    # every message at once, each to its worker, tried again where its connection fails
    await asyncio.gather(*(_send(worker, address, message) for address, message in remote))


async def _send(worker, address: str, message) -> None:
    for attempt in range(SEND_TRIES):
        try:
            answer = await worker.rpc(address).dasknn_exchange(message=message)
        except OSError:
            if attempt == SEND_TRIES - 1:
                raise
            await asyncio.sleep(SEND_PAUSE * 2 ** attempt)
            continue
        if answer.get("status") != "OK":
            raise RuntimeError(f"the exchange's handler on {address} answered {answer}")
        return
