"""One value from the client onto several workers, under one key, without the scheduler's ``replicate``.

``client.scatter(..., broadcast=True)`` makes its copies with the scheduler's ``replicate``, which fixes the
workers it copies to when it starts and retries a copy that failed until it lands: a worker that dies during the
copy is retried for ever (a connection attempt of ``distributed.comm.timeouts.connect`` each time), and the scatter
never returns (``tests/runtime/test_scatter.py`` shows the case; a worker SIGKILLed as it received a 1 GB copy left
the scatter waiting over 120 s on a real cluster). A CI chaos run of training's model mode, a worker killed as the
run partitioned, just before such a scatter, hung for 10 minutes.

Here the client scatters to one worker and asks the others to fetch the value from the workers that hold it, in
rounds that double the holders (the tree ``replicate`` makes), each worker asked once: a worker that does not
answer is left out, and the caller's :func:`~dasknn.runtime.recovery.watch` reports it lost.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

#: Workers each holder serves in a round (``replicate``'s branching factor).
BRANCHING = 2


def scatter_to_all(client, value: object, workers: Sequence[str], key: str | None = None):
    """``value`` scattered to every one of ``workers`` under one key (``key``, or a new one): its future.

    The first worker gets it from the client, the others from the workers that have it. A worker that is lost
    meanwhile is left without a copy; the others have theirs.
    """
    from ..errors import DasknnError

    workers = list(dict.fromkeys(workers))
    if not workers:
        raise DasknnError("the Dask cluster has no workers to scatter to")
    if key is None:
        [future] = client.scatter([value], workers=workers[:1], hash=False)
    else:
        future = client.scatter({key: value}, workers=workers[:1])[key]
    if len(workers) > 1:
        client.sync(_copy, client, future.key, workers[0], workers[1:])
    return future


async def _copy(client, key: str, first: str, rest: list[str]) -> None:
    # rounds of copies: each holder serves BRANCHING workers a round. A worker asked to gather fetches the value
    # from a holder and keeps it under ``key``; the scheduler is then told it holds it (as ``replicate`` does),
    # so that its tasks use that copy and a release frees it there too.
    import asyncio

    holders = [first]
    while rest:
        now, rest = rest[:BRANCHING * len(holders)], rest[BRANCHING * len(holders):]
        answers = await asyncio.gather(*(client.rpc(w).gather(who_has={key: list(holders)}) for w in now),
                                       return_exceptions=True)
        copied = [w for w, a in zip(now, answers) if isinstance(a, dict) and a.get("status") == "OK"]
        with contextlib.suppress(Exception):  # one of them lost since: the scheduler refuses it, watch reports it
            await client.scheduler.update_data(who_has={key: copied}, nbytes={})
        holders += copied
