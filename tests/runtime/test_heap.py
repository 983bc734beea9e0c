"""dasknn.runtime.heap: large arrays from glibc's heap inside a task, the nanny's settings restored after."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from dasknn.runtime import heap


class _FakeLibc:
    """Records ``mallopt`` and ``malloc_trim`` calls."""

    def __init__(self):
        self.calls: list[tuple] = []

    def mallopt(self, param: int, value: int) -> int:
        self.calls.append(("mallopt", param, value))
        return 1

    def malloc_trim(self, pad: int) -> int:
        self.calls.append(("malloc_trim", pad))
        return 1


@pytest.fixture
def fake_libc(monkeypatch) -> _FakeLibc:
    libc = _FakeLibc()
    monkeypatch.setattr(heap, "_libc", lambda: libc)
    return libc


def test_nothing_changes_where_glibc_adapts_its_thresholds(fake_libc, monkeypatch):
    monkeypatch.delenv("MALLOC_TRIM_THRESHOLD_", raising=False)
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_", raising=False)
    with heap.large_array_heap():
        pass
    assert fake_libc.calls == []


@pytest.mark.parametrize("value", ["not a number", str(2**31), "-1"])
def test_a_threshold_mallopt_could_not_take_back_changes_nothing(fake_libc, monkeypatch, value):
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", value)
    with heap.large_array_heap():
        pass
    assert fake_libc.calls == []


def test_the_nannys_thresholds_come_back_after_the_last_block(fake_libc, monkeypatch):
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "65536")
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_", raising=False)
    large = [("mallopt", heap.M_MMAP_THRESHOLD, heap.LARGE_MMAP_THRESHOLD),
             ("mallopt", heap.M_TRIM_THRESHOLD, heap.LARGE_TRIM_THRESHOLD)]
    with heap.large_array_heap():
        assert fake_libc.calls == large
        with heap.large_array_heap():  # a second task on the same worker: nothing more, nothing restored early
            pass
        assert fake_libc.calls == large
    assert fake_libc.calls == large + [("mallopt", heap.M_MMAP_THRESHOLD, heap.DEFAULT_THRESHOLD),
                                       ("mallopt", heap.M_TRIM_THRESHOLD, 65536), ("malloc_trim", 0)]


def test_restored_when_the_task_raises(fake_libc, monkeypatch):
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "65536")
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "1048576")

    @heap.large_array_heap()
    def task():
        raise ValueError("bad layer")

    with pytest.raises(ValueError, match="bad layer"):
        task()
    assert fake_libc.calls[-3:] == [("mallopt", heap.M_MMAP_THRESHOLD, 1048576),
                                    ("mallopt", heap.M_TRIM_THRESHOLD, 65536), ("malloc_trim", 0)]
    assert heap._USERS == 0


@pytest.mark.subprocess
@pytest.mark.skipif(heap._libc() is None, reason="glibc only")
def test_large_arrays_stop_faulting_in_fresh_pages():
    # the real effect, in a process started as a nanny starts a worker: page faults of 200 arrays of 1 MiB
    code = textwrap.dedent("""
        import resource, numpy as np
        from dasknn.runtime.heap import large_array_heap

        def faults():
            before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            for _ in range(200):
                a = np.ones(1 << 17)  # 1 MiB: over the 128 KiB mmap threshold, under a 2 MiB huge page
                del a
            return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

        outside = faults()
        with large_array_heap():
            inside = faults()
        after = faults()
        print(outside, inside, after)
    """)
    env = dict(os.environ, MALLOC_TRIM_THRESHOLD_="65536")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    outside, inside, after = map(int, out.split())
    # (ratios: how many faults an array costs depends on the kernel's fault-around)
    assert inside * 10 < outside  # the heap reuses one array's pages; outside, each array faults in fresh ones
    assert inside * 10 < after  # and the nanny's behaviour is back
