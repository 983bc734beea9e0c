"""CPU kernels on raw arrays against SciPy: the fused layer step with received rows, and boundary messages."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from dasknn import kernels, reference
from dasknn.kernels import cpu, scratch


def _challenge_layer(yt: np.ndarray, w: sp.csc_matrix, bias: float, ymax: float) -> np.ndarray:
    z = (w.T @ yt).astype(yt.dtype)
    return np.where(z != 0, np.clip(z + bias, 0, ymax), 0).astype(yt.dtype)


def test_a_layers_twins_are_found_once_while_it_lives_and_forgotten_with_it(monkeypatch):
    # the loop over layers finds a resident layer's twins on its first call only; an equal layer in other arrays,
    # or the same one after it is gone, is searched afresh; the results as the uncached loop's
    import gc

    rng = np.random.default_rng(5)
    blocks = [_twin_block(rng, 40, [4, 3, 8, 5, 12, 8], [3, 5, 2, 4, 6, 1]) for _ in range(3)]
    layers = [(w.indptr, w.indices, w.data) for w in blocks]
    images = cpu.TWIN_MIN_IMAGES + 3
    yt = rng.random((40, images)) * (rng.random((40, images)) < 0.3)
    searched = []
    find = cpu._twin_groups
    monkeypatch.setattr(cpu, "_twin_groups", lambda *a: searched.append(a[2]) or find(*a))
    first = cpu.run_layers_numpy(yt.copy(), layers, -0.1, 32.0, np.arange(images))
    assert len(searched) == 3
    again = cpu.run_layers_numpy(yt.copy(), layers, -0.1, 32.0, np.arange(images))
    assert len(searched) == 3  # (all three kept)
    np.testing.assert_array_equal(first[0], again[0])
    np.testing.assert_array_equal(first[1], again[1])
    copies = [(p.copy(), ix.copy(), d) for p, ix, d in layers]
    fresh = cpu.run_layers_numpy(yt.copy(), copies, -0.1, 32.0, np.arange(images))
    assert len(searched) == 6
    np.testing.assert_array_equal(first[0], fresh[0])
    kept = len(cpu._TWINS_SEEN)
    del copies
    gc.collect()
    assert len(cpu._TWINS_SEEN) == kept - 3  # forgotten with their arrays
    # below TWIN_MIN_IMAGES no search and nothing kept
    narrow = yt[:, :cpu.TWIN_MIN_IMAGES - 1].copy()
    cpu.run_layers_numpy(narrow, [(p.copy(), ix.copy(), d) for p, ix, d in layers], -0.1, 32.0,
                         np.arange(narrow.shape[1]))
    assert len(cpu._TWINS_SEEN) == kept - 3


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("received", [0, 1, 37])
@pytest.mark.parametrize("images", [1, 5, 300])
def test_layer_step_reads_received_rows_in_place(dtype, received, images):
    rng = np.random.default_rng(received + images)
    own, outputs = 40, 25
    w = sp.random(own + received, outputs, density=0.3, format="csc", random_state=rng, dtype=np.float64)
    w.data = rng.choice([-1.0, 0.5, 1 / 16, 2.0], w.nnz)
    x = (rng.random((own + received, images)) < 0.6) * rng.random((own + received, images)) * 40
    x = x.astype(dtype)
    expected = _challenge_layer(x, w, -0.3, 32.0)
    got = kernels.layer_step(np.ascontiguousarray(x[:own]), w.indptr, w.indices.astype(np.int32), w.data,
                             -0.3, 32.0, extra=np.ascontiguousarray(x[own:]))
    assert got.dtype == dtype
    np.testing.assert_allclose(got, expected, rtol=1e-5 if dtype == np.float32 else 1e-12, atol=1e-5)
    whole = kernels.layer_step(x, w.indptr, w.indices.astype(np.int32), w.data, -0.3, 32.0)
    np.testing.assert_array_equal(got, whole)  # same order of sums: the split changes nothing


def _random_block(rng, inputs: int, outputs: int, density: float, empty_columns: bool) -> sp.csc_matrix:
    w = sp.random(inputs, outputs, density=density, format="csc", random_state=rng, dtype=np.float64)
    w.data = rng.standard_normal(w.nnz) / 4
    if empty_columns:  # some outputs with no inputs at all
        w = w.tolil()
        w[:, ::3] = 0
        w = w.tocsc()
        w.eliminate_zeros()
    w.sort_indices()
    return w


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("inputs", [40, 3000])  # one tile of images, and several (a tile: 256 images here)
@pytest.mark.parametrize("images", [0, 1, 7, 17, 601])
@pytest.mark.parametrize("empty_columns", [False, True])
def test_layer_step_is_bit_equal_to_the_reference(dtype, inputs, images, empty_columns):
    # Each output sums its inputs in ascending input order, multiply and add rounded separately: the same
    # numbers as the SciPy reference, to the bit, in float32 too, whatever the tiling and the vector length.
    rng = np.random.default_rng(inputs + images)
    w = _random_block(rng, inputs, 29, 12 / inputs, empty_columns).astype(dtype)
    x = ((rng.random((images, inputs)) < 0.5) * rng.random((images, inputs)) * 8).astype(dtype)
    x[::5] = 0  # some images with no activation at all
    want = reference.layer_step(sp.csr_matrix(x), w, -0.3, 4.0).toarray().T
    got = kernels.layer_step(np.ascontiguousarray(x.T), w.indptr, w.indices, w.data, -0.3, 4.0)
    assert got.dtype == dtype and got.shape == (29, images)
    np.testing.assert_array_equal(got, want)
    if inputs > 7:  # the same sums with the last rows received from other parts
        split = inputs - 7
        parts = kernels.layer_step(np.ascontiguousarray(x.T[:split]), w.indptr, w.indices, w.data, -0.3, 4.0,
                                   extra=np.ascontiguousarray(x.T[split:]))
        np.testing.assert_array_equal(parts, want)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("images", [0, 1, 9, 260])
def test_run_layers_drops_dead_images_and_matches_the_reference(dtype, images):
    rng = np.random.default_rng(images)
    layers = [_random_block(rng, 64, 64, 0.15, False).astype(dtype) for _ in range(6)]
    for w in layers:
        w.data = np.abs(w.data)
    x = ((rng.random((images, 64)) < 0.3) * 4).astype(dtype)
    x[::4] = 0
    want = reference.infer(layers, sp.csr_matrix(x), -0.4, 32.0, dtype).toarray()
    yt, ids = kernels.run_layers_numpy(np.ascontiguousarray(x.T), [(w.indptr, w.indices, w.data) for w in layers],
                                       -0.4, 32.0, np.arange(images))
    alive = np.flatnonzero(want.any(axis=1))
    np.testing.assert_array_equal(ids, alive)
    np.testing.assert_array_equal(yt, want[alive].T)


def test_tiles_keep_inputs_in_cache_between_their_bounds():
    assert kernels.tile_for(1024) == 256 and kernels.tile_for(1024, 8) == 128
    assert kernels.tile_for(64) == 4096
    # wide layers: rows of 1 KB whatever the width, buffers within TILE_MAX_BYTES
    assert kernels.tile_for(65536) == 256 and kernels.tile_for(65536, 8) == 128
    assert kernels.tile_for(1 << 20) == 16
    for n in (1, 100, 1000, 3000, 70000, 300000):
        for itemsize in (4, 8):
            tile = kernels.tile_for(n, itemsize)
            assert 16 <= tile <= 4096 and tile % 16 == 0
            assert tile == 16 or tile * n * itemsize <= max(cpu.TILE_BYTES, cpu.ROW_BYTES * n)
            assert tile == 16 or tile * n * itemsize <= cpu.TILE_MAX_BYTES
            assert tile * itemsize >= cpu.ROW_BYTES or (tile + 16) * n * itemsize > cpu.TILE_MAX_BYTES


def _twin_block(rng, inputs: int, sizes: list[int], entries: list[int]) -> sp.csc_matrix:
    # columns in groups of twins (group g: sizes[g] columns on the same entries[g] inputs, each its own values),
    # the groups' columns shuffled among each other, as RadiX-Net layers have them
    cols = []
    for size, n in zip(sizes, entries):
        rows = np.sort(rng.choice(inputs, n, replace=False))
        cols += [(rows, rng.choice([-1.0, 0.25, 1 / 16, 0.5, 2.0], n)) for _ in range(size)]
    cols = [cols[i] for i in rng.permutation(len(cols))]
    indptr = np.cumsum([0] + [len(r) for r, _ in cols])
    indices = np.concatenate([r for r, _ in cols]).astype(np.int32)
    data = np.concatenate([v for _, v in cols])
    return sp.csc_matrix((data, indices, indptr), shape=(inputs, len(cols)))


def test_twin_groups_gather_exactly_the_columns_with_the_same_inputs():
    rng = np.random.default_rng(3)
    w = _twin_block(rng, 50, [1, 2, 3, 4, 5, 9, 1, 6], [3, 3, 0, 4, 8, 1, 5, 32])
    everything = np.arange(w.shape[1])
    order, starts = cpu._twin_groups(w.indptr.astype(np.int64), w.indices, cpu.TWIN_MIN_IMAGES, everything)
    assert sorted(order.tolist()) == list(range(w.shape[1]))  # a permutation of the columns
    pattern = [tuple(w.indices[w.indptr[j]:w.indptr[j + 1]]) for j in range(w.shape[1])]
    groups = [order[starts[g]:starts[g + 1]] for g in range(starts.size - 1)]
    assert all(len(g) > 0 and list(g) == sorted(g) for g in groups)
    assert all(len({pattern[j] for j in g}) == 1 for g in groups)  # twins only
    assert len(groups) == len(set(pattern))  # all of them: one group per distinct pattern
    # a narrow batch is not worth the search: every column a group of its own, in order
    order, starts = cpu._twin_groups(w.indptr.astype(np.int64), w.indices, cpu.TWIN_MIN_IMAGES - 1, everything)
    assert order.tolist() == list(range(w.shape[1])) and starts.tolist() == list(range(w.shape[1] + 1))
    # a subset of the columns: exactly those, grouped as the whole block groups them
    some = everything[rng.random(w.shape[1]) < 0.5]
    order, starts = cpu._twin_groups(w.indptr.astype(np.int64), w.indices, cpu.TWIN_MIN_IMAGES, some)
    assert sorted(order.tolist()) == some.tolist()
    groups = [order[starts[g]:starts[g + 1]] for g in range(starts.size - 1)]
    assert all(len({pattern[j] for j in g}) == 1 for g in groups)
    assert len(groups) == len({pattern[j] for j in some})


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("images", [1, 130, 700])  # one tile without twins, one with; 3,000 inputs: several tiles
@pytest.mark.parametrize("inputs", [96, 3000])
@pytest.mark.parametrize("received", [0, 9])
@pytest.mark.parametrize("share", [0.0, 0.3, 1.0])
def test_layer_step_in_two_column_sets_writes_what_one_step_writes(dtype, images, inputs, received, share):
    # model mode computes the outputs other parts wait for first and the rest after, into one block: the two
    # calls together must give the whole step's numbers to the bit, and neither may touch the other's rows
    rng = np.random.default_rng(images + received)
    w = _twin_block(rng, inputs + received, [1, 3, 4, 5, 8, 11, 2], [6, 6, 7, 32, 1, 4, 9]).astype(dtype)
    x = ((rng.random((images, inputs + received)) < 0.6) * rng.random((images, inputs + received)) * 8).astype(dtype)
    yt, extra = np.ascontiguousarray(x.T[:inputs]), (np.ascontiguousarray(x.T[inputs:]) if received else None)
    whole = kernels.layer_step(yt, w.indptr, w.indices, w.data, -0.3, 4.0, extra=extra)
    np.testing.assert_array_equal(whole, reference.layer_step(sp.csr_matrix(x), w, -0.3, 4.0).toarray().T)
    first = np.flatnonzero(rng.random(w.shape[1]) < share)
    rest = np.setdiff1d(np.arange(w.shape[1]), first)
    out = np.full((w.shape[1], images), np.nan, dtype=dtype)
    kernels.layer_step(yt, w.indptr, w.indices, w.data, -0.3, 4.0, extra=extra, columns=first, out=out)
    assert np.isnan(out[rest]).all()  # the rest untouched
    np.testing.assert_array_equal(out[first], whole[first])
    got = kernels.layer_step(yt, w.indptr, w.indices, w.data, -0.3, 4.0, extra=extra, columns=rest, out=out)
    assert got is out
    np.testing.assert_array_equal(out, whole)
    # the same two sets from inputs packed once (model mode's overlapped steps)
    tiles = kernels.tile_inputs(yt, extra)
    assert tiles.shape[1] == inputs + received and tiles.shape[0] * tiles.shape[2] >= images
    out = np.full((w.shape[1], images), np.nan, dtype=dtype)
    kernels.layer_step_tiles(tiles, images, w.indptr, w.indices, w.data, -0.3, 4.0, first, out)
    assert np.isnan(out[rest]).all()
    np.testing.assert_array_equal(out[first], whole[first])
    assert kernels.layer_step_tiles(tiles, images, w.indptr, w.indices, w.data, -0.3, 4.0, rest, out) is out
    np.testing.assert_array_equal(out, whole)


def test_layer_step_refuses_an_output_of_the_wrong_shape():
    w = sp.random(8, 5, density=0.5, format="csc", random_state=0)
    with pytest.raises(ValueError, match="shape"):
        kernels.layer_step(np.ones((8, 3)), w.indptr, w.indices, w.data, -0.3, 4.0, out=np.empty((5, 4)))
    with pytest.raises(ValueError, match="shape"):
        kernels.layer_step_tiles(kernels.tile_inputs(np.ones((8, 3))), 3, w.indptr, w.indices, w.data, -0.3, 4.0,
                                 np.arange(5), np.empty((5, 4)))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("images", [1, 17, 128, 300])  # twins looked for from 128 images
@pytest.mark.parametrize("entries", [1, 4, 7, 32])  # within, at and past a pass of four inputs
def test_layer_step_on_twins_is_bit_equal_to_the_reference(dtype, images, entries):
    # twins are summed four at a time (each input row read once for four outputs): every group size, remainders
    # included, must give the reference's numbers to the bit, in each output's own entry order
    rng = np.random.default_rng(images + entries)
    w = _twin_block(rng, 96, [1, 3, 4, 5, 8, 11], [entries, entries, entries + 1, entries, max(0, entries - 1),
                                                   entries]).astype(dtype)
    x = ((rng.random((images, 96)) < 0.6) * rng.random((images, 96)) * 8).astype(dtype)
    want = reference.layer_step(sp.csr_matrix(x), w, -0.3, 4.0).toarray().T
    got = kernels.layer_step(np.ascontiguousarray(x.T), w.indptr, w.indices, w.data, -0.3, 4.0)
    np.testing.assert_array_equal(got, want)
    layers = [(w.indptr, w.indices, w.data)]
    yt, ids = kernels.run_layers_numpy(np.ascontiguousarray(x.T), layers, -0.3, 4.0, np.arange(images))
    alive = np.flatnonzero(want.any(axis=0))
    np.testing.assert_array_equal(ids, alive)
    np.testing.assert_array_equal(yt, want[:, alive])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("tile_bytes", [64 * 16 * 8, 1 << 20])  # tiles of 16 images (many), or one for all
@pytest.mark.parametrize("group_layers", [1, 3, 16])
def test_layer_loop_across_tiles_and_groups_is_bit_equal_to_one_layer_at_a_time(monkeypatch, dtype, tile_bytes,
                                                                               group_layers):
    # tiles run through groups of layers and squeeze dead images out as they go: every tile size and group
    # length must give exactly the activations and survivors of stepping layer by layer and then cutting
    monkeypatch.setattr(cpu, "TILE_BYTES", tile_bytes)
    monkeypatch.setattr(cpu, "ROW_BYTES", 0)  # no floor on the tile's width: tiles as small as TILE_BYTES says
    monkeypatch.setattr(cpu, "GROUP_LAYERS", group_layers)
    rng = np.random.default_rng(group_layers)
    layers = [_random_block(rng, 64, 64, 0.12, k % 4 == 1).astype(dtype) for k in range(11)]
    for w in layers:
        w.data = np.abs(w.data) + 0.05  # most images live on; the bias still kills some
    x = ((rng.random((64, 203)) < 0.3) * rng.random((64, 203)) * 8).astype(dtype)
    x[:, ::7] = 0  # dead from the start
    yt, ids = x, np.arange(203)
    for w in layers:
        yt = kernels.layer_step(yt, w.indptr, w.indices, w.data, -0.3, 32.0)
        keep = yt.any(axis=0)
        yt, ids = yt[:, keep], ids[keep]
    pulled = []

    def stream():  # an iterator, as streamed layers come: the loop holds one group at a time
        for k, w in enumerate(layers):
            pulled.append(k)
            yield w.indptr, w.indices, w.data

    given = x.copy()
    got, got_ids = kernels.run_layers_numpy(x, stream(), -0.3, 32.0, np.arange(203))
    assert 0 < ids.size < 203
    np.testing.assert_array_equal(got_ids, ids)
    np.testing.assert_array_equal(got, yt)
    assert pulled == list(range(len(layers)))
    np.testing.assert_array_equal(x, given)  # the loop reuses its own outputs' memory, never the caller's array


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_held_layers_are_packed_and_read_in_place_with_the_same_result(monkeypatch, dtype):
    # data mode holds a network packed (kernels.held_layers): every group of its layers is read where it lies,
    # never gathered, and the loop's results are those of layers held one array each
    monkeypatch.setattr(cpu, "GROUP_LAYERS", 3)
    rng = np.random.default_rng(11)
    layers = [_random_block(rng, 64, 64, 0.12, k == 2) for k in range(8)]
    for w in layers:
        w.data = np.abs(w.data) + 0.05
    as_read = [(w.indptr, w.indices, w.data) for w in layers]
    held = kernels.held_layers(iter(as_read), sum(w.nnz for w in layers), dtype, "cpu")
    assert [h[1].dtype for h in held] == [np.int32] * 8 and [h[2].dtype for h in held] == [dtype] * 8
    assert all(h[1].base is held[0][1].base and h[2].base is held[0][2].base for h in held)
    span = cpu._in_place([h[1] for h in held[2:5]], np.dtype(np.int32))
    assert span is not None and np.shares_memory(span, held[2][1])
    np.testing.assert_array_equal(span, np.concatenate([w.indices for w in layers[2:5]]))
    assert cpu._in_place([w.indices for w in layers[2:5]], np.dtype(np.int32)) is None  # arrays of their own
    assert cpu._in_place([held[2][1], held[4][1]], np.dtype(np.int32)) is None  # not one after the other
    gathered = []
    concatenate = np.concatenate

    def counted(arrays, *args, **kwargs):
        gathered.append(sum(a.size for a in arrays))
        return concatenate(arrays, *args, **kwargs)

    x = ((rng.random((64, 150)) < 0.3) * 4.0).astype(dtype)
    x[:, ::9] = 0  # dead from the start
    want = kernels.run_layers_numpy(x, [(p, i, d.astype(dtype)) for p, i, d in as_read], -0.3, 32.0, np.arange(150))
    monkeypatch.setattr(cpu.np, "concatenate", counted)
    got = kernels.run_layers_numpy(x, held, -0.3, 32.0, np.arange(150))
    assert 0 < got[1].size < 150
    np.testing.assert_array_equal(got[1], want[1])
    np.testing.assert_array_equal(got[0], want[0])
    assert max(gathered) < layers[0].nnz  # pointers and twins, never a group's entries
    with pytest.raises(ValueError, match="entries"):
        kernels.held_layers(iter(as_read), 5, dtype, "cpu")


def _positive_blocks(rng, count: int) -> list:
    # 64 x 64 layers of positive weights: images stay alive through them
    layers = [_random_block(rng, 64, 64, 0.12, False) for _ in range(count)]
    for w in layers:
        w.data = np.abs(w.data) + 0.05
    return layers


def test_layer_loop_reuses_its_outputs_memory_from_group_to_group(monkeypatch):
    # one layer a group (as at 65,536 neurons): a fresh output array per layer would be a fresh mapping whose pages
    # are zeroed on first touch; the loop keeps to two outputs' memory however many groups it runs
    monkeypatch.setattr(cpu, "GROUP_LAYERS", 1)
    rng = np.random.default_rng(5)
    layers = _positive_blocks(rng, 9)
    x = ((rng.random((64, 300)) < 0.3) * 4.0).astype(np.float64)
    cpu.run_layers_numpy(x, [(w.indptr, w.indices, w.data) for w in layers[:1]], -0.3, 32.0, np.arange(300))
    sizes = []
    empty = np.empty

    def counted(shape, *args, **kwargs):
        sizes.append(int(np.prod(shape)))
        return empty(shape, *args, **kwargs)

    monkeypatch.setattr(cpu.np, "empty", counted)
    cpu.run_layers_numpy(x, [(w.indptr, w.indices, w.data) for w in layers], -0.3, 32.0, np.arange(300))
    assert 1 <= sum(1 for n in sizes if n >= 64 * 250) <= 2  # outputs (64 rows x the live images): two at most


def test_layer_loop_stops_reading_layers_once_every_image_is_dead():
    w = sp.csc_matrix(np.zeros((8, 8)))
    w.indptr, w.indices, w.data = np.zeros(9, dtype=np.int64), np.zeros(0, dtype=np.int32), np.zeros(0)
    pulled = []

    def stream():
        for k in range(40):
            pulled.append(k)
            yield w.indptr, w.indices, w.data

    yt, ids = kernels.run_layers_numpy(np.ones((8, 5)), stream(), -0.3, 32.0, np.arange(5))
    assert yt.shape == (8, 0) and ids.size == 0
    assert len(pulled) <= cpu.GROUP_LAYERS


@pytest.mark.parametrize("density", [0.0, 0.02, 0.5, 1.0])
@pytest.mark.parametrize("constant", [False, True])
@pytest.mark.parametrize("columns", ["all", "some"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_messages_round_trip_in_their_smallest_form(density, constant, columns, dtype):
    rng = np.random.default_rng(7)
    block = ((rng.random((60, 257)) < density) * (32.0 if constant else rng.random((60, 257)) + 0.1)).astype(dtype)
    rows = rng.choice(60, 23, replace=False)
    cols = None if columns == "all" else np.sort(rng.choice(257, 100, replace=False))
    expected = block[rows] if cols is None else block[np.ix_(rows, cols)]
    dense = kernels.pack_rows(block, rows, cols, compact=False)
    compact = kernels.pack_rows(block, rows, cols)
    for msg in (dense, compact):
        out = np.full(expected.shape, -1, dtype=dtype)
        kernels.unpack_rows(msg, out)
        np.testing.assert_array_equal(out, expected)
    assert kernels.message_bytes(compact) <= kernels.message_bytes(dense)
    nnz = np.count_nonzero(expected)
    bitmap = (expected.size + 7) // 8
    if nnz and constant:
        assert kernels.message_bytes(compact) == bitmap + 24 + block.itemsize  # bitmap, header, one value
    elif density == 1.0:
        assert int(compact[0][2]) == kernels.DENSE  # a bitmap would only add to it
    else:
        assert kernels.message_bytes(compact) == bitmap + 24 + nnz * block.itemsize


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("images", [5, 16, 40])  # within one tile of 16, at it, and across three
@pytest.mark.parametrize("received", [0, 9])
def test_layer_step_across_tiles_with_received_rows(monkeypatch, dtype, images, received):
    # every path of the single step: the batch as its own tile, a packed tile, packed tiles copied into place
    monkeypatch.setattr(cpu, "TILE_BYTES", 1)  # tiles of 16 images
    monkeypatch.setattr(cpu, "ROW_BYTES", 0)
    rng = np.random.default_rng(images + received)
    own, outputs = 30, 21
    w = _random_block(rng, own + received, outputs, 0.3, True).astype(dtype)
    x = ((rng.random((own + received, images)) < 0.6) * rng.random((own + received, images)) * 9).astype(dtype)
    got = kernels.layer_step(np.ascontiguousarray(x[:own]), w.indptr, w.indices, w.data, -0.3, 4.0,
                             extra=np.ascontiguousarray(x[own:]) if received else None)
    want = reference.infer([w], sp.csr_matrix(x.T), -0.3, 4.0, dtype).toarray().T
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("kind", ["csr", "coo", "dense"])
@pytest.mark.parametrize("neurons", [None, [], [7, 0, 3, 19], list(range(0, 20, 2))])
def test_activations_of_rows_takes_a_parts_neurons_before_densifying(dtype, kind, neurons):
    rng = np.random.default_rng(len(neurons or ()))
    images = sp.random(6, 20, density=0.3, format="csr", random_state=rng, dtype=np.float64)
    block = {"csr": images, "coo": images.tocoo(), "dense": images.toarray()}[kind]
    whole = images.toarray().T.astype(dtype)
    picked = None if neurons is None else np.array(neurons, dtype=np.int64)
    got = kernels.activations_of_rows(block, dtype, picked)
    assert got.dtype == dtype and got.flags.c_contiguous
    np.testing.assert_array_equal(got, whole if picked is None else whole[picked])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("rows", [0, 1, 7, 300])
@pytest.mark.parametrize("alive", [0.0, 0.3, 0.9, 1.0])
def test_keep_columns_writes_the_live_images_over_the_block_itself(dtype, rows, alive):
    rng = np.random.default_rng(rows)
    images = 53
    a = rng.random((rows, images)).astype(dtype)
    keep = rng.random(images) < alive
    expected = a[:, keep].copy()
    got = kernels.keep_columns(a, keep)
    np.testing.assert_array_equal(got, expected)
    assert got.flags.c_contiguous and (got.size == 0 or np.shares_memory(got, a))


def test_keep_columns_refuses_a_block_it_cannot_compact_in_place():
    a = np.zeros((6, 8), dtype=np.float32)
    with pytest.raises(ValueError, match="C-contiguous"):
        kernels.keep_columns(a[:, ::2], np.ones(4, dtype=bool))


def test_the_layer_loop_takes_up_the_buffer_its_last_call_left_free_and_never_writes_a_callers_array(monkeypatch):
    # a chunk run 32 layers a call (kernels.ends) reuses one buffer from call to call on its thread instead of
    # mapping fresh pages for each; what a call returned and what it was given are never written over
    monkeypatch.setattr(cpu, "GROUP_LAYERS", 2)
    rng = np.random.default_rng(5)
    block = [(w.indptr, w.indices, w.data) for w in _positive_blocks(rng, 6)]
    x = ((rng.random((64, 150)) < 0.3) * 4.0).astype(np.float32)
    x[:, ::9] = 0  # dead from the start: the survivors are gathered out of the last buffer
    given = x.copy()
    cpu.release_scratch()
    first = kernels.run_layers_numpy(x, block, -0.3, 32.0, np.arange(150))
    free = scratch.left_free(np.dtype(np.float32))
    assert free is not None and not np.shares_memory(free, first[0]) and not np.shares_memory(free, x)
    free[:] = np.nan
    scratch.leave_free(free)
    returned = first[0].copy()
    second = kernels.run_layers_numpy(first[0], block, -0.3, 32.0, first[1])
    assert not np.isnan(free).all()  # the second call wrote into it
    np.testing.assert_array_equal(first[0], returned)  # the caller's arrays as they were
    np.testing.assert_array_equal(x, given)
    again = kernels.run_layers_numpy(returned, block, -0.3, 32.0, first[1])  # fresh buffers: the same numbers
    np.testing.assert_array_equal(second[0], again[0])
    cpu.release_scratch()
