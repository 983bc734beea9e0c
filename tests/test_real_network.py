"""The whole real n1024-l120 network against the published truth, where the shared data is beside the checkout."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import SHARED
from dasknn import engine, io, reference
from dasknn.ingest import import_network

IMAGES = 600

needs_data = pytest.mark.skipif(not (SHARED / "neuron1024.tar.gz").exists(),
                                reason="the full challenge data is not here: put it in ../shared/data/graphchallenge "
                                       "or point DASKNN_GRAPHCHALLENGE_DIR at it")


@pytest.mark.subprocess
def test_the_data_folder_is_taken_from_the_environment(tmp_path):
    env = {**os.environ, "DASKNN_GRAPHCHALLENGE_DIR": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-c", "import conftest; print(conftest.SHARED)"], capture_output=True,
                          text=True, cwd=Path(__file__).parent, env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(tmp_path)


@pytest.fixture(scope="module")
def real(tmp_path_factory):
    net = io.read_network(SHARED / "neuron1024.tar.gz")
    images = io.read_images(SHARED / "sparse-images-1024.tsv.gz")
    truth = io.read_categories(SHARED / "neuron1024-l120-categories.tsv")
    return net, images, truth[truth < IMAGES]


@needs_data
def test_reference_float64_matches_published_truth(real):
    net, images, truth = real
    assert net.depth == 120 and net.edges == 120 * 32 * 1024 and images.shape == (60000, 1024)
    got = reference.infer_categories(net.layers, images[:IMAGES], net.bias, net.ymax, np.float64)
    np.testing.assert_array_equal(got, truth)


@pytest.mark.cluster
@needs_data
def test_engine_float64_matches_published_truth(real, client, tmp_path):
    net, images, truth = real
    store = import_network(SHARED / "neuron1024.tar.gz", tmp_path / "real.zarr")
    from dasknn.store import write_inputs_store

    inputs = write_inputs_store(tmp_path / "in.zarr", images[:IMAGES])
    result = engine.infer(store, inputs, client, dtype="float64")
    np.testing.assert_array_equal(result.categories, truth)
