"""Where a command's wall time went: one recorder of named phases per command run (:class:`Timings`).

The command line makes the recorder at its entry and makes it current (:func:`recording`); every step of a run
names the phase it starts (:func:`enter`: the default network, the cluster's start, reading, the probe, the
partition, the plan, the load, the inference, training's steps, ...), the way a :class:`~dasknn.runtime.recovery.
Recovery` policy is told its phases, which tells this recorder too. Each phase runs until the next is entered, so
the phases add up to the time since the recorder started: a step nobody named is counted in the phase before it,
and time before the first phase (or after the figures are read) shows as the gap between their sum and the wall
time a clock outside measures.

Without a current recorder (a library call outside the command line), :func:`enter` and :func:`phase` do nothing.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import time
from collections.abc import Iterator

#: The phase the interpreter's own start counts in: from the process's start to the recorder's (imports included).
STARTUP = "startup"


class Timings:
    """Named phases of one command run, in seconds, each running from its :meth:`enter` to the next.

    Parameters
    ----------
    startup
        Seconds of the run before this recorder was made (the interpreter starting, its imports), counted as the
        phase :data:`STARTUP`; 0 counts none.
    clock
        The clock, in seconds (a test gives its own).
    """

    def __init__(self, startup: float = 0.0, clock=time.perf_counter):
        self._clock = clock
        self._started = clock()
        self._totals: dict[str, float] = {STARTUP: startup} if startup > 0 else {}
        self._open: str | None = None
        self._since = self._started

    @property
    def current(self) -> str | None:
        """The phase running now (None before the first)."""
        return self._open

    def enter(self, name: str) -> None:
        """End the phase running now and start ``name`` (a name entered again adds to its seconds)."""
        now = self._clock()
        if self._open is not None:
            self._totals[self._open] = self._totals.get(self._open, 0.0) + now - self._since
        self._open, self._since = name, now

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """``name`` for the block, then the phase that ran before it again (a part timed inside a phase)."""
        before = self._open
        self.enter(name)
        try:
            yield
        finally:
            if before is not None:
                self.enter(before)

    def move(self, source: str, target: str, seconds: float) -> None:
        """Count ``seconds`` of phase ``source`` as ``target`` instead (a part measured inside it, such as the
        kernels' compiling inside the load): at most what ``source`` has so far."""
        had = self.seconds().get(source, 0.0)
        seconds = min(max(seconds, 0.0), had)
        if seconds <= 0:
            return
        self._totals[source] = self._totals.get(source, 0.0) - seconds
        self._totals[target] = self._totals.get(target, 0.0) + seconds

    def seconds(self) -> dict[str, float]:
        """Each phase's seconds so far (the one running now up to this moment), in the order first entered."""
        totals = dict(self._totals)
        if self._open is not None:
            totals[self._open] = totals.get(self._open, 0.0) + self._clock() - self._since
        return totals

    def wall(self) -> float:
        """Seconds since the run started (the startup included): what the phases add up to."""
        return self._totals.get(STARTUP, 0.0) + self._clock() - self._started

    def as_dict(self) -> dict[str, float]:
        """The phases' seconds, rounded to the millisecond (the JSON's ``timings``)."""
        return {name: round(s, 3) for name, s in self.seconds().items()}

    def line(self) -> str:
        """The phases on one line: ``"timings: startup 0.9 s, cluster start 2.1 s, ... (8.4 s in all)"``."""
        parts = self.seconds()
        return ("timings: " + ", ".join(f"{name} {s:.1f} s" for name, s in parts.items())
                + f" ({sum(parts.values()):.1f} s in all)")


_CURRENT: contextvars.ContextVar[Timings | None] = contextvars.ContextVar("dasknn_timings", default=None)


@contextlib.contextmanager
def recording(timings: Timings) -> Iterator[Timings]:
    """Make ``timings`` the current recorder for the block (the command line's run)."""
    token = _CURRENT.set(timings)
    try:
        yield timings
    finally:
        _CURRENT.reset(token)


def current() -> Timings | None:
    """The current recorder, or None outside a command run."""
    return _CURRENT.get()


def enter(name: str) -> None:
    """Start phase ``name`` in the current recorder, if any."""
    timings = _CURRENT.get()
    if timings is not None:
        timings.enter(name)


def phase(name: str) -> contextlib.AbstractContextManager:
    """:meth:`Timings.phase` of the current recorder, or a block that records nothing."""
    timings = _CURRENT.get()
    return timings.phase(name) if timings is not None else contextlib.nullcontext()


def since_process_start() -> float:
    """Seconds since this process started (the interpreter's start-up and imports before a command's entry); 0
    where the system does not say."""
    try:
        import psutil

        return max(0.0, time.time() - psutil.Process(os.getpid()).create_time())
    except Exception:  # no psutil, or no /proc: the startup is then counted nowhere
        return 0.0


def move(source: str, target: str, seconds: float) -> None:
    """:meth:`Timings.move` in the current recorder, if any."""
    timings = _CURRENT.get()
    if timings is not None:
        timings.move(source, target, seconds)
