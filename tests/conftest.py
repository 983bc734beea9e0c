"""Shared fixtures: the shipped slice of the real challenge data, stores made from it, a Dask cluster."""

from __future__ import annotations

import functools
import os
import tempfile
import warnings
from pathlib import Path

import numpy as np
import pytest

DATA = Path(__file__).parent / "data"


def _published_dir() -> Path:
    """The published GraphChallenge files: $DASKNN_GRAPHCHALLENGE_DIR, else ../shared/data/graphchallenge."""
    given = os.environ.get("DASKNN_GRAPHCHALLENGE_DIR")
    return Path(given).expanduser() if given else Path(__file__).resolve().parents[2] / "shared" / "data" / "graphchallenge"


SHARED = _published_dir()
SLICE_LAYERS = 12


@functools.lru_cache(maxsize=1)
def gpu_check() -> tuple[int, str]:
    """CUDA devices visible to CuPy, and why there are none: a real device count, not merely an import.

    Warnings are caught inside the check: with warnings as errors (the test configuration), a warning from
    ``import cupy`` would otherwise read as "no device" and every GPU test would skip with the run still green.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            import cupy

            n = int(cupy.cuda.runtime.getDeviceCount())
        except Exception as e:
            return 0, f"{type(e).__name__}: {e}"
    return n, "" if n else "no CUDA device is visible"


def gpu_count() -> int:
    """CUDA devices visible to CuPy (0 without CuPy or without a device)."""
    return gpu_check()[0]


def gpu_required() -> bool:
    """``DASKNN_REQUIRE_GPU=1`` (the device script sets it): a ``gpu`` test that would skip fails instead."""
    return os.environ.get("DASKNN_REQUIRE_GPU", "") not in ("", "0")


#: Fixtures that are, or start, a Dask cluster: a test that uses one is marked ``cluster``.
CLUSTER_FIXTURES = {"client", "client1", "client4", "small_memory_client", "cold_client", "tls_client", "cluster"}


def pytest_collection_modifyitems(config, items):
    for item in items:
        if CLUSTER_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.cluster)
    if gpu_count() > 0 or gpu_required():
        return
    skip = pytest.mark.skip(reason="no GPU: no CUDA device is visible")
    for item in items:
        if item.get_closest_marker("gpu"):  # the marker, not a keyword: a folder named gpu is one too
            item.add_marker(skip)


def pytest_runtest_setup(item):
    if gpu_required() and item.get_closest_marker("gpu") and gpu_count() == 0:
        pytest.fail(f"DASKNN_REQUIRE_GPU is set but there is no GPU ({gpu_check()[1]})", pytrace=False)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    # under DASKNN_REQUIRE_GPU a gpu test that skips itself (a missing module, say) fails: none may skip
    outcome = yield
    report = outcome.get_result()
    if report.skipped and gpu_required() and item.get_closest_marker("gpu"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        reason = reason.removeprefix("Skipped: ")
        report.outcome = "failed"
        report.longrepr = f"DASKNN_REQUIRE_GPU is set and this gpu test skipped: {reason}"


#: What a run of the tests may not leave behind in the system's temporary folder (``tempfile.gettempdir()``): what
#: dasknn, its command line, the tests and the workers of their clusters (which inherit the folder) name there.
#: A run once left 58 ``dasknn-folder-exchange-*`` folders (483 MB); the tests' own files go under ``tmp_path``.
#: (A dasknn command another process runs at the same moment on the same machine has its own there, until it ends.)
LEFTOVERS = "dasknn*"
_BEFORE = pytest.StashKey[set]()


def _leftovers() -> set[str]:
    return {p.name for p in Path(tempfile.gettempdir()).glob(LEFTOVERS)}


_DASK_SCRATCH = pytest.StashKey[str]()


def pytest_sessionstart(session):
    session.config.stash[_BEFORE] = _leftovers()
    # Dask's workers keep their scratch space (two lock files) in the temporary folder, where it stayed after a
    # run: the session's clusters, and the dasknn commands the tests run (through the environment), keep theirs in
    # a folder of the session's own, removed at its end
    import dask

    scratch = tempfile.mkdtemp(prefix="dasknn-tests-dask-")
    session.config.stash[_DASK_SCRATCH] = scratch
    os.environ["DASK_TEMPORARY_DIRECTORY"] = scratch
    dask.config.set({"temporary-directory": scratch})


@pytest.hookimpl(wrapper=True)
def pytest_sessionfinish(session, exitstatus):
    # after every fixture's teardown (the clusters closed), and every plugin's own end of the session (pytest's
    # removing a passing run's tmp_path folders): what is new there fails the run, named
    import shutil

    yield
    scratch = session.config.stash.get(_DASK_SCRATCH, None)
    if scratch is not None:
        shutil.rmtree(scratch, ignore_errors=True)
    _remove_pytest_folder(session)
    before = session.config.stash.get(_BEFORE, None)
    left = sorted(_leftovers() - before) if before is not None else []
    if not left:
        return
    line = (f"the tests left {len(left)} new {LEFTOVERS} entr{'y' if len(left) == 1 else 'ies'} in "
            f"{tempfile.gettempdir()}: {', '.join(left[:8])}{' ...' if len(left) > 8 else ''}")
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write("\n")
        reporter.write_line(f"FAILED (left behind): {line}", red=True, bold=True)
    else:
        print(line)
    session.exitstatus = pytest.ExitCode.TESTS_FAILED


def _remove_pytest_folder(session) -> None:
    # once pytest removed a passing run's tmp_path folders (tmp_path_retention_policy "failed"): its own folder in
    # the temporary folder, pytest-of-<user>, where it holds nothing more than dead links to removed runs' folders
    # (another run's folders, a failed run's, or a --basetemp of the user's own are left alone)
    import getpass

    if session.config.option.basetemp is not None:
        return
    folder = Path(tempfile.gettempdir()) / f"pytest-of-{getpass.getuser()}"
    try:
        entries = list(folder.iterdir())
        if all(e.is_symlink() and not e.exists() for e in entries):
            for e in entries:
                e.unlink()
            folder.rmdir()
    except OSError:  # (gone already, or another run's folder appeared meanwhile)
        pass


@pytest.fixture(scope="session")
def slice_paths() -> dict[str, Path]:
    """The shipped slice: the first 12 layers of the real n1024 network, 1,000 real images, their truth."""
    return {
        "network": DATA / f"neuron1024-l{SLICE_LAYERS}.tar.gz",
        "images": DATA / "sparse-images-1024.tsv.gz",
        "truth": DATA / f"neuron1024-l{SLICE_LAYERS}-categories.tsv",
    }


@pytest.fixture(scope="session")
def slice_store(slice_paths, tmp_path_factory) -> Path:
    """The slice imported into a store (with its inputs and truth)."""
    from dasknn.cli import import_network

    out = tmp_path_factory.mktemp("slice") / "slice.zarr"
    return import_network(slice_paths["network"], out, slice_paths["images"], slice_paths["truth"])


@pytest.fixture(scope="session")
def slice_truth(slice_paths) -> np.ndarray:
    from dasknn import io

    return io.read_categories(slice_paths["truth"])


@pytest.fixture(scope="session")
def client():
    """A local cluster of 2 single-threaded worker processes, shared by the tests that need Dask."""
    from dasknn.cluster import local_client

    with local_client(workers=2, threads_per_worker=1) as c:
        yield c


@pytest.fixture(scope="module")
def client4():
    """A local cluster of 4 single-threaded workers (parts that send to several others), one per test module."""
    from dasknn.cluster import local_client

    with local_client(workers=4, threads_per_worker=1) as c:
        yield c


@pytest.fixture
def fresh_store(slice_store, tmp_path):
    """A copy of the slice store with no partition or plan kept in it."""
    import shutil

    out = tmp_path / "fresh.zarr"
    shutil.copytree(slice_store, out, ignore=shutil.ignore_patterns("partitions", "plans"))
    return out


@pytest.fixture(scope="module")
def slice_images(slice_paths):
    """The slice's images as a SciPy CSR matrix (rows are images)."""
    from dasknn import io

    return io.read_images(slice_paths["images"], neurons=1024)
