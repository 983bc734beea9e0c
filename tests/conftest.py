"""Shared fixtures: the shipped slice of the real challenge data, stores made from it, a Dask cluster."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

DATA = Path(__file__).parent / "data"
SHARED = Path(__file__).resolve().parents[2] / "shared" / "data" / "graphchallenge"
SLICE_LAYERS = 12


def gpu_count() -> int:
    """CUDA devices visible to CuPy (0 without CuPy or without a device): a real check, not an import."""
    try:
        import cupy

        return int(cupy.cuda.runtime.getDeviceCount())
    except Exception:
        return 0


def pytest_collection_modifyitems(config, items):
    if gpu_count() > 0:
        return
    skip = pytest.mark.skip(reason="no GPU: no CUDA device is visible")
    for item in items:
        if item.get_closest_marker("gpu"):  # the marker, not a keyword: a folder named gpu is one too
            item.add_marker(skip)


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
