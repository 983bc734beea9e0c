"""Partitioning on the Dask cluster: segments of layers partitioned on different workers and stitched."""

from __future__ import annotations

import numpy as np
import pytest

from dasknn import generate, store
from dasknn import partition as P
from dasknn.errors import DasknnError
from dasknn.partition import cluster as PC
from dasknn.partition import segments as PG
from dasknn.store import common as store_common
from dasknn.store import partitions as saved

DEPTH = 30


@pytest.fixture(scope="module")
def deep_store(tmp_path_factory):
    path = tmp_path_factory.mktemp("deep") / "n256-l30.zarr"
    store.write_network(path, generate.network(256, DEPTH, bias=-0.3))
    return path


@pytest.fixture(scope="module")
def deep_layers(deep_store):
    return store.open_store(deep_store).network().layers


@pytest.mark.parametrize("segments", [2, 3])
@pytest.mark.parametrize("method", ["hypergraph", "fast"])
def test_segments_stitch_into_one_balanced_partition_whose_report_the_workers_measured(
        client, deep_store, deep_layers, method, segments):
    whole, _ = PC.partition_on_cluster(client, str(deep_store), 4, method, segments=1)
    owners, report = PC.partition_on_cluster(client, str(deep_store), 4, method, segments=segments)
    assert owners.dtype == np.uint8 and owners.shape == (DEPTH + 1, 256)
    P.validate_partition(owners, DEPTH, 256, 4)
    # the workers measured their own layers; the figures are those of the stitched owners as a whole
    want = P.partition_report(deep_layers, owners.astype(np.int32), method, 0.0)
    assert report["volume_per_layer"] == want["volume_per_layer"]
    assert report["max_part_send"] == want["max_part_send"]
    assert report["imbalance_max"] == pytest.approx(want["imbalance_max"])
    assert P.layer_imbalance(deep_layers, owners.astype(np.int32)).max() <= 0.03 + 1e-12
    # the seams cost little (measured: 0.92-1.19 of the whole's volume, seams at most its worst layer), and the
    # partition stays far better than random (0.15-0.21 of it): segments whose labels did not follow would not
    whole_volumes = P.layer_volumes(deep_layers, whole.astype(np.int32))
    assert report["volume_total"] <= 1.3 * whole_volumes.sum()
    random = P.layer_volumes(deep_layers, P.partition_network(deep_layers, 4, "random")).sum()
    assert report["volume_total"] <= 0.3 * random
    for a, _ in PG.bounds(DEPTH, segments)[1:]:
        assert max(report["volume_per_layer"][a - 1:a + 1]) <= 1.25 * whole_volumes.max()


def test_relabel_chain_undoes_each_segments_own_labels():
    rng = np.random.default_rng(3)
    rows = rng.integers(0, 4, size=(4, 100)).astype(np.int32)  # the shared rows, in the first segment's labels
    perms = [np.arange(4), np.array([2, 0, 3, 1]), np.array([1, 3, 0, 2])]
    inverse = [np.argsort(p) for p in perms]
    # segment s holds shared rows s and s + 1, in its own labels: perms[s][own] is the first segment's label
    firsts = [inverse[s][rows[s]] for s in range(3)]
    lasts = [inverse[s][rows[s + 1]] for s in range(3)]
    chain = PG.relabel_chain(firsts, lasts, 4)
    for s in range(3):
        np.testing.assert_array_equal(chain[s], perms[s])


def test_a_network_is_cut_into_segments_only_when_large_and_deep():
    big = store_common.FULL_CHECK_ENTRIES + 1
    assert PC.segment_count(1920, big, 2, "hypergraph") == 2
    assert PC.segment_count(1920, big, 8, "fast") == 8
    assert PC.segment_count(100, big, 8, "hypergraph") == 100 // PC.MIN_SEGMENT_LAYERS
    assert PC.segment_count(1920, store_common.FULL_CHECK_ENTRIES, 2, "hypergraph") == 1  # in memory: one task
    assert PC.segment_count(1920, big, 2, "hypergraph-layered") == 1  # sweeps span every row
    assert PC.segment_count(1920, big, 1, "hypergraph") == 1


def test_segments_are_refused_for_a_method_that_does_not_stitch(client, deep_store):
    with pytest.raises(DasknnError, match="not partitioned in segments"):
        PC.partition_on_cluster(client, str(deep_store), 2, "hypergraph-shared", segments=2)


def test_owners_travel_in_the_smallest_type():
    assert PC.owner_dtype(2) == np.uint8 and PC.owner_dtype(256) == np.uint8
    assert PC.owner_dtype(257) == np.uint16
    assert PC.compact(np.array([[0, 3]], dtype=np.int32), 4).dtype == np.uint8


def test_lazy_layers_read_a_range(deep_store):
    s = store.open_store(deep_store)
    part = s.lazy_layers(5, 7)
    assert len(part) == 3
    assert (part[0] != s.layer(5)).nnz == 0 and (part[-1] != s.layer(7)).nnz == 0
    with pytest.raises(IndexError):
        part[3]
    for first, last in ((0, 3), (4, 3), (29, 31)):
        with pytest.raises(DasknnError, match="outside"):
            s.lazy_layers(first, last)


def test_a_partition_is_saved_in_chunks_of_rows(deep_store, monkeypatch):
    monkeypatch.setattr(saved, "PARTITION_CHUNK_CELLS", 256 * 4)  # four rows a chunk: eight chunks
    owners = np.random.default_rng(0).integers(0, 3, size=(DEPTH + 1, 256)).astype(np.uint8)
    store.save_partition(deep_store, "chunked", owners)
    loaded, _ = store.load_partition(deep_store, "chunked")
    assert loaded.dtype == np.int32
    np.testing.assert_array_equal(loaded, owners)
    import zarr

    assert zarr.open_group(deep_store, mode="r")["partitions/chunked/owners"].chunks == (4, 256)


@pytest.mark.parametrize("segments", [1, 3])
def test_the_client_sees_the_rows_the_workers_finish(client, deep_store, segments):
    seen = []
    PC.partition_on_cluster(client, str(deep_store), 2, "hypergraph", segments=segments,
                            progress=lambda done, total: seen.append((done, total)))
    assert seen and all(total == DEPTH + 1 and 0 <= done <= total for done, total in seen)
    assert seen[-1] == (DEPTH + 1, DEPTH + 1)
