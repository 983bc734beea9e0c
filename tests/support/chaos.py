"""A real Dask cluster of separate processes (``dask scheduler``, ``dask worker`` under nannies) and a scheduler plugin
that SIGKILLs the worker running a chosen task: the chaos tests' harness.

The scheduler imports this module (its ``PYTHONPATH`` holds the test support folder), so the plugin is registered from the
test's client by reference. Every process is on 127.0.0.1; the kill finds the worker by the pid it reported.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from distributed.diagnostics.plugin import SchedulerPlugin

from dasknn.testing import Cluster, process_cluster

SUPPORT = Path(__file__).resolve().parent  # where chaos (and its plugin) is importable from


@dataclass(frozen=True)
class Kill:
    """Which worker to kill and when: the one a task whose key starts with ``prefix`` reaches ``state`` on
    (``processing``: it started; ``memory``: it finished; ``scattered``: data a client scattered arrived, which
    the scheduler learns without a transition), the ``nth`` such task, ``delay`` seconds after."""

    prefix: str
    state: str = "processing"
    nth: int = 1
    delay: float = 0.0
    #: instead of a SIGKILL, cut the worker's link: its address (no port) to its network namespace (tests/support/netns.py)
    cut: tuple[tuple[str, str], ...] = ()

    @property
    def name(self) -> str:
        return f"{self.prefix}{self.state[:3]}{self.nth}+{self.delay:g}"


class KillOnTask(SchedulerPlugin):
    """On the scheduler: SIGKILL the worker a task of :class:`Kill` reaches its state on, once."""

    name = "chaos-kill"

    def __init__(self, kill: Kill):
        self.kill = kill
        self.seen = 0
        self.fired: dict | None = None
        self.scheduler = None

    async def start(self, scheduler) -> None:
        self.scheduler = scheduler
        if self.kill.state == "scattered":
            from tornado.ioloop import PeriodicCallback

            self.looking = PeriodicCallback(self._look, 2)
            self.looking.start()

    async def close(self) -> None:
        if self.kill.state == "scattered":
            self.looking.stop()

    def _look(self) -> None:
        # scattered keys enter the scheduler in memory, with no transition: look for them
        if self.fired is not None:
            self.looking.stop()
            return
        for key, ts in list(self.scheduler.tasks.items()):
            if isinstance(key, str) and key.startswith(self.kill.prefix) and ts.who_has:
                self._fire(key, next(iter(ts.who_has)))
                return

    def transition(self, key, start, finish, *args, **kwargs) -> None:
        if self.fired is not None or finish != self.kill.state:
            return
        if not isinstance(key, str) or not key.startswith(self.kill.prefix):
            return
        ts = self.scheduler.tasks.get(key)
        self._fire(key, ts.processing_on if finish == "processing" else next(iter(ts.who_has or ()), None))

    def _fire(self, key: str, ws) -> None:
        if ws is None or not ws.pid:
            return
        self.seen += 1
        if self.seen < self.kill.nth:
            return
        self.fired = {"key": key, "worker": ws.address, "pid": ws.pid, "at": time.time()}
        if self.kill.cut:
            ns = dict(self.kill.cut)[ws.address.split("://")[-1].rsplit(":", 1)[0]]
            self.scheduler.loop.call_later(self.kill.delay, _cut, ns)
        else:
            self.scheduler.loop.call_later(self.kill.delay, _kill, ws.pid)


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def _cut(ns: str) -> None:
    subprocess.run(["ip", "netns", "exec", ns, "ip", "link", "set", "eth0", "down"], check=False)


def fired(dask_scheduler) -> dict | None:
    """What the kill plugin did (run with ``client.run_on_scheduler``): None if it has not fired."""
    plugin = dask_scheduler.plugins.get(KillOnTask.name)
    return None if plugin is None else plugin.fired


def forget(dask_scheduler) -> None:
    """Remove the kill plugin (run with ``client.run_on_scheduler``)."""
    dask_scheduler.plugins.pop(KillOnTask.name, None)


def environment(**extra: str) -> dict[str, str]:
    """The processes' environment: this one, the test support folder importable, and ``extra``."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(SUPPORT), *filter(None, [env.get("PYTHONPATH")])])
    env.update(extra)
    return env


@contextlib.contextmanager
def real_cluster(workers: int = 2, memory_limit: str = "2GB") -> Iterator[Cluster]:
    """:func:`dasknn.testing.process_cluster` whose processes import this module (the scheduler loads the plugin)."""
    with process_cluster(workers, memory_limit, env=environment()) as cluster:
        yield cluster


def run_or_explain(command: list[str], client, timeout: float = 600) -> subprocess.CompletedProcess:
    """Run ``command`` (a run against the cluster of ``client``) with the support folder importable; where it is
    still running after ``timeout`` seconds, fail the test with what was stuck: every thread's stack in the command
    (its faulthandler, on SIGABRT) and the cluster's tasks in flight and their workers' stacks."""
    import pytest  # (not at the top: the scheduler imports this module for its plugin)

    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env=environment(PYTHONFAULTHANDLER="1"))
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGABRT)
        out, err = process.communicate()
        try:
            cluster = (f"processing: {client.processing()}\nworkers' stacks: {client.call_stack()}\n"
                       f"the scheduler's tasks: {client.run_on_scheduler(_tasks_held)}")
        except Exception as e:  # the cluster is unreachable too
            cluster = f"the cluster did not answer: {e!r}"
        # the main thread's stack first: a report that shows only the message's head must still show where it hung
        logged, _, stacks = err.partition("Fatal Python error")
        pytest.fail(f"{command[:3]} still ran after {timeout:.0f} s\nits main thread:\n{_main_stack(stacks)}\n"
                    f"{cluster}\nits stderr before the abort:\n{logged[-6000:]}\nevery thread:\n{stacks[-12000:]}")
    return subprocess.CompletedProcess(command, process.returncode, out, err)


def _main_stack(stacks: str) -> str:
    # the block faulthandler heads "Current thread" (the thread the SIGABRT interrupted, the main one as a rule),
    # else its last (the oldest thread: the main one)
    start = stacks.find("Current thread")
    if start < 0:
        start = stacks.rfind("Thread 0x")
    if start < 0:
        return "(not found)"
    end = stacks.find("\n\n", start)
    return stacks[start:end if end >= 0 else None]


def _tasks_held(dask_scheduler) -> dict:
    # the scheduler's tasks by state, and those not in memory with where they may run (run on the scheduler)
    from collections import Counter

    tasks = dask_scheduler.tasks.values()
    waiting = [(ts.key, ts.state, sorted(ts.worker_restrictions or ()), ts.loose_restrictions)
               for ts in tasks if ts.state != "memory"][:40]
    return {"states": dict(Counter(ts.state for ts in tasks)), "not in memory": waiting,
            "workers": sorted(dask_scheduler.workers)}


#: What a traceback looks like in a process's stderr.
TRACEBACK = re.compile(r"Traceback \(most recent call last\)")
