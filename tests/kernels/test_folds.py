"""Images that converge are computed once (dasknn.kernels.folds): the record, its schedule of looks, and the CPU
loop's folds on the real network's slice, bit for bit against the loop that computes every image; and the ends a
worker's chunks share (dasknn.kernels.ends)."""

from __future__ import annotations

import numpy as np
import pytest

from dasknn import io
from dasknn.kernels import cpu, ends, folds
from dasknn.kernels.folds import Folds


def test_roots_follow_chains_of_folds_and_expand_gives_every_image_its_column():
    # 5 into 3, then 3 into 1 (3 was a representative when 5 was folded); 7 into 2, and 2 dies later
    record = Folds().folded(np.array([5, 7]), np.array([3, 2])).folded(np.array([3]), np.array([1]))
    np.testing.assert_array_equal(record.roots(), [1, 2, 1])
    images, columns = record.expand(np.array([4, 1]))  # the survivors' columns: image 4, then image 1
    assert dict(zip(images.tolist(), columns.tolist())) == {4: 0, 1: 1, 5: 1, 3: 1}  # 7 died with 2
    np.testing.assert_array_equal(record.weights(np.array([4, 1, 2])), [1, 3, 2])


def test_looks_come_every_layer_while_they_fold_many_and_grow_apart_while_they_fold_none():
    record = Folds()
    assert record.looks(4).tolist() == [True] * 4  # a chunk starts looking after every layer
    assert record.ran(4, 0.10).every == 1  # 10 % folded: still every layer
    assert record.ran(4, 0.01).every == 1  # 1 %: unchanged
    every, looks = [], []
    for _ in range(6):
        looks.append(record.looks(16).sum())
        record = record.ran(16, 0.0)  # nothing folded: twice as far apart, 16 layers at most
        every.append(record.every)
    assert every == [2, 4, 8, 16, 16, 16] and folds.MOST_EVERY == 16
    assert looks == [16, 8, 4, 2, 1, 1]
    # a look after the first of 3 layers, the next 16 layers after it: 14 on; 3 more without a look: 11 on
    assert record.to_look == 1
    later = record.ran(3, 0.0)
    assert later.to_look == 14 and later.every == 16
    assert later.ran(3, 0.0).to_look == 11 and later.ran(3, 0.0).layers_to_run(16) == 11
    assert not Folds(enabled=False).looks(16).any() and Folds(enabled=False).layers_to_run(16) == 16


@pytest.fixture(scope="module")
def real_slice(slice_paths):
    net = io.read_network(slice_paths["network"])
    x = io.read_images(slice_paths["images"], neurons=1024)
    return net, x


def _run(net, x, dtype, record):
    layers = [(w.indptr, w.indices, w.data.astype(dtype)) for w in net.layers]
    yt = np.ascontiguousarray(x.toarray().T.astype(dtype))
    return cpu.run_layers_numpy(yt, layers, net.bias, net.ymax, np.arange(x.shape[0]), folds=record)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_real_slice_folded_is_bit_equal_to_every_image_computed(real_slice, dtype):
    net, x = real_slice
    off, off_ids, counted = _run(net, x, dtype, Folds(enabled=False))
    on, on_ids, record = _run(net, x, dtype, Folds())
    assert counted.merged.size == 0 and np.array_equal(counted.columns[1:], counted.alive[:-1])
    images, columns = record.expand(on_ids)
    order, want = np.argsort(images), np.argsort(off_ids)
    np.testing.assert_array_equal(images[order], off_ids[want])
    np.testing.assert_array_equal(on[:, columns[order]], off[:, want])  # bit for bit
    np.testing.assert_array_equal(record.alive, counted.alive)  # the same images alive after every layer
    # the real network's images collapse by layer 12: far fewer columns than images there
    assert record.columns[-1] * 2 < record.alive[-2] and record.columns.sum() < counted.columns.sum()


def test_the_loop_tiles_afresh_more_often_while_its_looks_fold_many(real_slice, monkeypatch):
    # a chunk whose looks fold many images (its record looks after every layer) runs groups of
    # FOLDING_GROUP_LAYERS, its emptied tiles gathered afresh between them; without folds, groups of GROUP_LAYERS
    net, x = real_slice
    asked = []
    next_group = cpu._next_group
    monkeypatch.setattr(cpu, "_next_group", lambda layers, most: asked.append(most) or next_group(layers, most))
    _run(net, x, "float32", Folds())
    assert asked[0] == cpu.FOLDING_GROUP_LAYERS < cpu.GROUP_LAYERS
    asked.clear()
    _run(net, x, "float32", Folds(enabled=False))
    assert asked and set(asked) == {cpu.GROUP_LAYERS}


def test_a_hash_never_folds_alone_equal_hashes_are_compared(real_slice, monkeypatch):
    # every column hashes alike: each is compared with the first of its hash, and only equal ones fold
    net, x = real_slice
    x = x[:300]
    off, off_ids, _ = _run(net, x, "float64", Folds(enabled=False))
    monkeypatch.setattr(cpu, "hash_coefficients", lambda rows: np.zeros(rows))
    on, on_ids, record = _run(net, x, "float64", Folds())
    images, columns = record.expand(on_ids)
    order, want = np.argsort(images), np.argsort(off_ids)
    np.testing.assert_array_equal(images[order], off_ids[want])
    np.testing.assert_array_equal(on[:, columns[order]], off[:, want])


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_later_chunks_take_the_ends_earlier_chunks_found_bit_for_bit(real_slice, monkeypatch, dtype):
    # a worker's chunks converge onto the same vectors: a later chunk's column equal to one an earlier chunk had
    # after a looked-up layer takes that column's end, and every image ends exactly as computed one by one
    monkeypatch.setattr(ends, "ENDS_EVERY", 4)
    monkeypatch.setattr(ends, "ENDS_MOST_COLUMNS", 10 ** 6)  # the slice's 12 layers converge less than 120 do
    net, x = real_slice
    layers = [(w.indptr, w.indices, w.data.astype(dtype)) for w in net.layers]
    half = x.shape[0] // 2
    known = ends.KnownEnds()

    def chunk(rows: slice, start: int, record: Folds, remembering: bool = True):
        yt = np.ascontiguousarray(x[rows].toarray().T.astype(dtype))
        ids = np.arange(start, start + yt.shape[1])
        if not remembering:
            return cpu.run_layers_numpy(yt, layers, net.bias, net.ymax, ids, folds=record)
        return ends.run_layers_remembering(known, yt, layers, 1, len(layers), net.bias, net.ymax, ids, record)

    computed = []
    for rows, start in ((slice(0, half), 0), (slice(half, None), half), (slice(0, half), x.shape[0])):
        off, off_ids, counted = chunk(rows, start, Folds(enabled=False), remembering=False)
        on, on_ids, record = chunk(rows, start, Folds())
        images, columns = record.expand(on_ids)
        order, want = np.argsort(images), np.argsort(off_ids)
        np.testing.assert_array_equal(images[order], off_ids[want])
        np.testing.assert_array_equal(on[:, columns[order]], off[:, want])  # bit for bit
        np.testing.assert_array_equal(record.alive, counted.alive)  # the skipped layers' images counted alive
        computed.append(record.columns)
        assert len(known) > 0
    # the first half again (other ids): its converged columns all took their ends after layer 4 or 8
    assert computed[2][8:].sum() < computed[0][8:].sum() and computed[2][:4].sum() == computed[0][:4].sum()
    assert computed[1][8:].sum() < computed[0][8:].sum()


def test_known_ends_are_compared_never_trusted_to_the_hash_and_bounded_in_bytes():
    known = ends.KnownEnds(most_bytes=64)  # one end: its 3 + 2 float64s
    at = np.array([[1.0, 2.0], [0.0, 3.0], [4.0, 0.0]])
    end = np.array([[5.0, 6.0], [7.0, 8.0], [0.0, 0.0]])[:2]
    record = Folds().folded(np.array([9]), np.array([11]))  # image 9 was folded into 11 later
    known.learn(3, [(2, at, np.array([9, 10]))], end, np.array([11, 12]), record)
    assert len(known) == 1  # image 10 did not reach the end; 9 did, as 11
    found = known.find(2, 3, at)
    np.testing.assert_array_equal(found[0], end[:, 0])
    assert found[1] is None and known.find(2, 4, at) == [None, None] and known.find(1, 3, at) == [None, None]
    near = at.copy()
    near[0, 0] = np.nextafter(1.0, 2.0)
    assert known.find(2, 3, near)[0] is None
    known.learn(3, [(2, at[:, 1:], np.array([12]))], end, np.array([11, 12]), record)
    assert len(known) == 1  # over its bytes: not kept


def test_stops_grow_apart_while_they_find_nothing_to_share_and_come_back_once_a_chunk_collapses():
    E, most = ends.ENDS_EVERY, ends.ENDS_MOST_SPAN
    assert ends.next_span(E, 1000, 990) == 2 * E and ends.next_span(4 * E, 1000, 990) == 8 * E
    assert ends.next_span(most, 1000, 990) == most  # never farther apart than ENDS_MOST_SPAN
    assert ends.next_span(4 * E, 1000, 500) == E  # half the columns gone: it collapses, or dies
    assert ends.next_span(4 * E, 20, ends.ENDS_MOST_COLUMNS) == E  # down to the columns a stop looks up
    # on layers divisible by ENDS_EVERY (where the chunks that share stop), the first the next one
    assert [ends.next_stop(0, E), ends.next_stop(E, 2 * E), ends.next_stop(E - 5, E)] == [E, 3 * E, E]


def _permutations(neurons: int, depth: int) -> list[tuple]:
    # layers that move each neuron's value to another: images stay alive and distinct through any depth
    rng = np.random.default_rng(1)
    return [(np.arange(neurons + 1), rng.permutation(neurons).astype(np.int32), np.ones(neurons))
            for _ in range(depth)]


@pytest.mark.parametrize("distinct", [40, 4], ids=["nothing-collapses", "collapsed"])
def test_a_chunks_loop_stops_less_often_where_nothing_collapses(monkeypatch, distinct):
    layers = _permutations(64, 300)
    x = np.random.default_rng(2).random((64, distinct))
    yt = np.ascontiguousarray(x[:, np.arange(40) % distinct])  # 40 images, `distinct` of them different
    stops = []

    def counted(yt, layers, *args, **kw):  # the layer each of the loop's runs ends after
        run = list(layers)
        stops.append((stops[-1] if stops else 0) + len(run))
        return cpu.run_layers_numpy(yt, run, *args, **kw)

    monkeypatch.setattr(ends, "run_layers", counted)
    on, ids, record = ends.run_layers_remembering(ends.KnownEnds(), yt.copy(), iter(layers), 1, 300, 0.0, 1e9,
                                                  np.arange(40), Folds())
    E = ends.ENDS_EVERY
    want = [E, 3 * E, 7 * E, 300] if distinct > ends.ENDS_MOST_COLUMNS else list(range(E, 300, E)) + [300]
    assert stops == want
    off, off_ids = cpu.run_layers_numpy(yt.copy(), layers, 0.0, 1e9, np.arange(40))
    images, columns = record.expand(ids)
    order = np.argsort(images)
    np.testing.assert_array_equal(images[order], off_ids)
    np.testing.assert_array_equal(on[:, columns[order]], off)  # bit for bit


def test_a_handed_over_input_takes_the_loops_later_outputs_and_a_callers_input_is_never_written():
    from dasknn.kernels import scratch

    layers = _permutations(64, 40)  # groups of 16 layers: the loop's later groups write where the input was
    x = np.random.default_rng(3).random((64, 30))
    first, ids = cpu.run_layers_numpy(x, layers[:3], 0.0, 1e9, np.arange(30))  # in a flat buffer of the loop's
    kept = first.copy()
    plain, _ = cpu.run_layers_numpy(first, layers[3:], 0.0, 1e9, ids)
    np.testing.assert_array_equal(first, kept)  # not handed over: left as it was
    scratch.hand_over(first)
    handed, _ = cpu.run_layers_numpy(first, layers[3:], 0.0, 1e9, ids)
    np.testing.assert_array_equal(handed, plain)  # bit for bit
    assert not np.array_equal(first, kept) and handed.base is not first.base  # a later group's output went there
    assert scratch.take_back(first) is None  # the loop took the hand-over: it reaches no later loop
