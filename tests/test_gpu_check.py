"""The GPU tests' own guard: a device check that warnings cannot fool, and ``DASKNN_REQUIRE_GPU``, under which a
``gpu`` test that would skip fails instead (``benchmarks/gpu_check.sh`` sets it). Run in a child pytest with a
stand-in CuPy that warns on import and reports a chosen number of devices, so it needs no GPU."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

STAND_IN = """
import warnings

warnings.warn("a stand-in CuPy warns on import", UserWarning)


class _Runtime:
    @staticmethod
    def getDeviceCount():
        return {count}


class cuda:
    runtime = _Runtime
"""

TESTS = """
import pytest


@pytest.mark.gpu
def test_needs_a_device():
    pass


@pytest.mark.gpu
def test_skips_itself():
    pytest.skip("a module is missing")


def test_plain():
    pass
"""


def child_pytest(tmp_path: Path, devices: int, require: bool) -> subprocess.CompletedProcess:
    """pytest on :data:`TESTS` with the project's conftest and configuration (warnings as errors)."""
    (tmp_path / "cupy").mkdir(exist_ok=True)
    (tmp_path / "cupy" / "__init__.py").write_text(STAND_IN.format(count=devices))
    (tmp_path / "test_guarded.py").write_text(TESTS)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), str(ROOT / "tests"), str(ROOT)]),
               DASKNN_REQUIRE_GPU="1" if require else "")
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "-p", "conftest",
                           "-c", str(ROOT / "pyproject.toml"), "--rootdir", str(tmp_path), "test_guarded.py"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.subprocess
def test_a_warning_on_import_does_not_hide_the_device(tmp_path):
    r = child_pytest(tmp_path, devices=1, require=False)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "2 passed, 1 skipped" in r.stdout and "a module is missing" in r.stdout  # the device was seen


@pytest.mark.subprocess
def test_without_a_device_gpu_tests_skip(tmp_path):
    r = child_pytest(tmp_path, devices=0, require=False)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "1 passed, 2 skipped" in r.stdout and "no GPU: no CUDA device is visible" in r.stdout


@pytest.mark.subprocess
@pytest.mark.parametrize("devices", [0, 1])
def test_require_gpu_turns_skips_into_failures(tmp_path, devices):
    r = child_pytest(tmp_path, devices=devices, require=True)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "skipped" not in r.stdout.splitlines()[-1]
    if devices == 0:  # every gpu test errors in its setup, saying why
        assert "1 passed, 2 errors" in r.stdout and "DASKNN_REQUIRE_GPU is set but there is no GPU" in r.stdout
    else:  # the device is there; the test that skipped itself fails
        assert "1 failed, 2 passed" in r.stdout
        assert "DASKNN_REQUIRE_GPU is set and this gpu test skipped: a module is missing" in r.stdout
