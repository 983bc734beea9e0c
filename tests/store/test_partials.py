"""Hidden partials named by their writer's pid: the next write removes those whose writer is gone, no other."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import psutil
import pytest

from dasknn.partials import new_partial, remove_partial, remove_stale_partials


def _dead_pid() -> int:
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True)
    return int(done.stdout)


def test_a_new_partial_is_named_by_this_process(tmp_path):
    partial = new_partial(tmp_path / "x.npy", suffix=".npy")
    assert partial.parent == tmp_path and partial.name.startswith(f".x.npy.partial-{os.getpid()}-")
    assert partial.suffix == ".npy" and not partial.exists()
    assert new_partial(tmp_path / "x.npy") != new_partial(tmp_path / "x.npy")  # two writes of one process


@pytest.mark.subprocess
def test_only_partials_whose_writer_is_gone_are_removed(tmp_path):
    target = tmp_path / "n.zarr"
    dead = tmp_path / f".n.zarr.partial-{_dead_pid()}-0123abcd"
    live = tmp_path / f".n.zarr.partial-{os.getpid()}-89abcdef"
    # our pid, but written to long before this process started: the pid was reused, its writer is gone
    reused = tmp_path / f".n.zarr.partial-{os.getpid()}-fedcba98"
    unnamed = tmp_path / ".n.zarr.partial-abcdef12"  # no pid (an older dasknn's): nobody can tell, kept
    other = tmp_path / f".m.zarr.partial-{_dead_pid()}-0123abcd"  # another target's
    for folder in (dead, live, reused, unnamed, other):
        folder.mkdir()
        (folder / "zarr.json").write_text("{}")
    long_ago = psutil.Process().create_time() - 3600
    os.utime(reused, (long_ago, long_ago))
    assert sorted(remove_stale_partials(target)) == sorted([dead, reused])
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in (live, unnamed, other))
    assert remove_stale_partials(tmp_path / "missing" / "n.zarr") == []  # no folder, nothing to do


@pytest.mark.subprocess
def test_a_file_partial_of_a_dead_writer_goes_with_the_next_new_partial(tmp_path):
    dead = tmp_path / f".c.tsv.partial-{_dead_pid()}-0123abcd"
    dead.write_text("1\n")
    new_partial(tmp_path / "c.tsv")
    assert not dead.exists()


def test_a_partial_still_written_to_by_another_thread_is_removed_once_it_stops(tmp_path):
    # as Zarr's I/O thread finishing the writes an interrupted main thread had queued: files land after a removal
    import threading

    partial = new_partial(tmp_path / "n.zarr")
    partial.mkdir()
    stop_at = time.monotonic() + 0.4

    def late_writes() -> None:
        k = 0
        while time.monotonic() < stop_at:
            try:
                (partial / "layers" / str(k)).mkdir(parents=True, exist_ok=True)
                (partial / "layers" / str(k) / "c").write_bytes(b"x")
            except FileNotFoundError:
                pass  # the folder was removed between the two: as a real late write can find it
            k += 1
            time.sleep(0.01)

    writer = threading.Thread(target=late_writes)
    writer.start()
    remove_partial(partial)
    writer.join()
    assert not partial.exists()
