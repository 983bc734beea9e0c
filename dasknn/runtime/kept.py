"""Results a run leaves on its workers after it ends (inference's ``keep_activations``), detached from the run's
pinned tasks.

A pinned task's result that Dask loses with its worker is computed again from its task, which may run on the lost
worker alone: the key waits in ``no-worker`` for ever, and so does whatever computes it, long after the run that
made it has returned. So each kept result is taken over by a task of its own that depends on nothing and that any
worker may run (:func:`detach`): on the worker that holds the result it takes it from that worker's memory; run
again elsewhere after a loss, it computes the result again where the run says how (``again``: from stores every
worker reads), or fails at once with a line that says what was lost.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass

from ..errors import DasknnError


@dataclass(frozen=True)
class HeldKey:
    """The key of a result in a worker's memory (wrapped: a task's argument that looks like a key is taken for
    a reference to it)."""

    key: Hashable


def take_held(held: HeldKey, again: Callable[[], object] | None, lost: str):
    """The result of ``held`` from this worker's memory; where this worker does not hold it (its worker was lost,
    and this task runs again elsewhere), what ``again()`` computes, or where it cannot (None, or it returns None),
    a :class:`~dasknn.errors.DasknnError` with the line ``lost``."""
    from distributed import get_worker

    data = get_worker().data
    if held.key in data:
        return data[held.key]
    out = again() if again is not None else None
    if out is None:
        raise DasknnError(lost)
    return out


def detach(client, futures: dict[Hashable, object], name: str, lost: dict[Hashable, str],
           again: dict[Hashable, Callable[[], object]] | None = None) -> dict[Hashable, object]:
    """Futures of the same results as ``futures`` (by the same labels), each from a task of its own (key
    ``{name}-{label}``) that depends on nothing: it takes the result from the memory of the worker that holds it,
    and, run again after that worker is lost, returns ``again[label]()`` where there is one and it can, else fails
    with ``lost[label]``. ``futures`` are released."""
    from distributed import wait

    again = again or {}
    who = client.who_has(list(futures.values()))
    detached = {label: client.submit(take_held, HeldKey(f.key), again.get(label), lost[label], key=f"{name}-{label}",
                                     workers=list(who.get(f.key, ())) or None, allow_other_workers=True, pure=False)
                for label, f in futures.items()}
    wait(list(detached.values()))  # (taken over before the run's own are let go)
    for f in futures.values():
        f.release()
    return detached
