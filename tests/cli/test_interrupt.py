"""Ctrl-C on a terminal: the whole foreground process group gets SIGINT, the local cluster's workers too; only the
command acts on it, in one line, with no worker's traceback (issue 42, item 5)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil
import pytest


def spawned_workers(pid: int) -> int:
    """How many worker processes (multiprocessing's spawn) the process ``pid`` has started so far."""
    count = 0
    for child in psutil.Process(pid).children(recursive=True):
        try:
            count += any("spawn_main" in part for part in child.cmdline())
        except psutil.Error:
            pass
    return count


@pytest.mark.cluster
@pytest.mark.subprocess
@pytest.mark.parametrize("after", [0.05, 1.5], ids=["workers-starting", "cluster-up"])
def test_ctrl_c_ends_in_one_line_without_a_worker_traceback(slice_store, tmp_path, after):
    # its own process group, as a shell gives a foreground job: the terminal's Ctrl-C signals the group
    proc = subprocess.Popen([sys.executable, "-m", "dasknn", "infer", "--network", str(slice_store), "--workers", "2"],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    deadline = time.monotonic() + 60
    while spawned_workers(proc.pid) < 2 and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.02)
    time.sleep(after)
    assert proc.poll() is None, "the run ended before the interrupt"
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert err.endswith("dasknn: interrupted; nothing partial was kept\n"), err
