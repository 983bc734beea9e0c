"""The recorder of a command's named phases (dasknn.timings): they add up to the wall, a nameless stretch shows."""

from __future__ import annotations

import pytest

from dasknn import timings
from dasknn.timings import STARTUP, Timings


class Clock:
    """A clock the test moves by hand."""

    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_phases_run_until_the_next_and_add_up_to_the_wall():
    clock = Clock()
    t = Timings(startup=0.5, clock=clock)
    clock.now += 0.25  # before the first phase: counted nowhere
    t.enter("reading")
    clock.now += 1.0
    t.enter("probe")
    clock.now += 2.0
    t.enter("reading")  # a name entered again adds to its seconds
    clock.now += 0.5
    assert t.seconds() == {STARTUP: 0.5, "reading": 1.5, "probe": 2.0}
    # the wall counts the stretch before the first phase too: the gap is what nobody named
    assert t.wall() == pytest.approx(4.25)
    assert t.wall() - sum(t.seconds().values()) == pytest.approx(0.25)
    assert t.line() == "timings: startup 0.5 s, reading 1.5 s, probe 2.0 s (4.0 s in all)"


def test_a_part_timed_inside_a_phase_and_one_moved_out_of_it():
    clock = Clock()
    t = Timings(clock=clock)
    t.enter("set-up")
    clock.now += 1.0
    with t.phase("compile"):
        clock.now += 3.0
    clock.now += 1.0  # the phase before the block runs again after it
    t.enter("load")
    clock.now += 4.0
    t.move("load", "compile", 1.5)
    t.move("load", "warm", 10.0)  # never more than the phase has
    assert t.as_dict() == {"set-up": 2.0, "compile": 4.5, "load": 0.0, "warm": 2.5}
    assert sum(t.seconds().values()) == pytest.approx(t.wall())


def test_without_a_current_recorder_nothing_is_recorded_and_with_one_it_is():
    timings.enter("probe")  # a library call outside the command line: no error, no record
    with timings.phase("compile"):
        pass
    assert timings.current() is None
    with timings.recording(Timings()) as t:
        timings.enter("probe")
        with timings.phase("compile"):
            pass
        assert timings.current() is t
    assert list(t.seconds()) == ["probe", "compile"] and timings.current() is None


def test_the_startup_of_this_process_is_measured():
    assert 0 < timings.since_process_start() < 24 * 3600
