"""Uniform columns through regular iso-valued layers (dasknn.kernels.uniform): a layer's form, a uniform column's
value through it against the kernel's own sums, and a converged chunk of a generated network run on without the
loop, bit for bit against the loop that computes every image."""

from __future__ import annotations

import numpy as np
import pytest

from dasknn import generate, kernels
from dasknn.kernels import cpu, ends, uniform
from dasknn.kernels.folds import Folds
from dasknn.kernels.uniform import RegularLayer

#: (value, weight, inputs, bias): sums whose rounding differs from inputs x (value x weight) in float32, one that
#: clamps at ymax, one that dies under the bias
CASES = [(0.1, 0.1, 7, -0.3), (1 / 3, 0.0625, 32, -0.45), (0.7, 0.3, 13, -0.3), (0.3, 0.7, 31, -0.3),
         (32.0, 0.0625, 32, -0.3), (0.01, 0.0625, 3, -0.3)]


def _regular_layer(rows: int, outputs: int, inputs: int, weight: float, dtype, seed: int = 0):
    rng = np.random.default_rng(seed)
    indices = np.concatenate([np.sort(rng.choice(rows, inputs, replace=False)) for _ in range(outputs)])
    return np.arange(outputs + 1, dtype=np.int64) * inputs, indices.astype(np.int32), np.full(indices.size, weight, dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("images", [1, 3])
def test_a_uniform_column_through_a_regular_layer_holds_the_kernels_sum(dtype, images):
    for value, weight, inputs, bias in CASES:
        layer = _regular_layer(40, 6, inputs, weight, dtype)
        out = cpu.layer_step_numpy(np.full((40, images), value, dtype), *layer, bias, 32.0)
        form = uniform.layer_form(layer)
        assert form == RegularLayer(6, inputs, float(dtype(weight)))
        after = uniform.through(dtype(value), form, bias, 32.0)
        assert after.dtype == dtype and np.array_equal(out, np.full_like(out, after)), (value, weight, inputs)


def test_a_layer_is_regular_only_with_one_weight_and_one_count_of_inputs():
    indptr, indices, data = _regular_layer(40, 6, 5, 0.0625, np.float32)
    assert uniform.regular_form(indptr, data) == RegularLayer(6, 5, 0.0625)
    other = data.copy()
    other[3] = 0.125
    assert uniform.regular_form(indptr, other) is None
    uneven = indptr.copy()
    uneven[1:-1] += 1  # the first output reads 6 inputs, the last 4
    assert uniform.regular_form(uneven, data) is None
    assert uniform.regular_form(np.zeros(3, dtype=np.int64), data[:0]) is None  # outputs that read nothing


def test_a_held_network_has_its_forms_found_as_it_is_read(monkeypatch):
    net = generate.network(1024, 4, seed=1)
    layers = [(w.indptr, w.indices, w.data) for w in net.layers]
    held = kernels.held_layers(iter(layers), sum(w.nnz for w in net.layers), "float32", "cpu")

    def not_again(indptr, data):
        raise AssertionError("the form of a held layer was found again")

    monkeypatch.setattr(uniform, "regular_form", not_again)
    assert [uniform.layer_form(layer) for layer in held] == [RegularLayer(1024, 32, 0.0625)] * 4


@pytest.fixture(scope="module")
def deep():
    # a generated 1024 x 72 network: its 300 images converge onto one vector, every neuron at ymax, by layer 32
    return generate.network(1024, 72, seed=3), generate.images(300, 1024, seed=3)


def _chunk(net, x, dtype, layers=None, remembering=True):
    layers = layers or [(w.indptr, w.indices, w.data.astype(dtype)) for w in net.layers]
    yt = np.ascontiguousarray(x.toarray().T.astype(dtype))
    ids = np.arange(x.shape[0])
    if not remembering:
        return cpu.run_layers_numpy(yt, layers, net.bias, net.ymax, ids, folds=Folds(enabled=False))
    return ends.run_layers_remembering(ends.KnownEnds(), yt, layers, 1, len(layers), net.bias, net.ymax, ids,
                                       Folds())


def _assert_same(net, x, dtype, layers=None):
    # the chunk with uniform columns against every image computed: the same images end alive, bit for bit, the
    # same counted alive after every layer; returns the record's columns computed per layer
    off, off_ids, counted = _chunk(net, x, dtype, layers, remembering=False)
    on, on_ids, record = _chunk(net, x, dtype, layers)
    images, columns = record.expand(on_ids)
    order, want = np.argsort(images), np.argsort(off_ids)
    np.testing.assert_array_equal(images[order], off_ids[want])
    np.testing.assert_array_equal(on[:, columns[order]], off[:, want])  # bit for bit
    depth = len(net.layers)
    alive = np.zeros((2, depth), dtype=np.int64)
    alive[0, :counted.alive.size], alive[1, :record.alive.size] = counted.alive[:depth], record.alive[:depth]
    np.testing.assert_array_equal(alive[1], alive[0])
    return np.pad(record.columns, (0, depth - record.columns.size))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_a_converged_chunk_runs_the_regular_layers_without_the_loop_bit_for_bit(deep, dtype):
    net, x = deep
    columns = _assert_same(net, x, dtype)
    assert columns[31] > 0 and columns[32:].sum() == 0  # the loop ran none of the layers after 32


def test_a_layer_not_regular_sends_the_chunk_back_to_the_loop(deep):
    net, x = deep
    layers = [(w.indptr, w.indices, w.data.copy()) for w in net.layers]
    layers[49][2][0] *= 1.5  # layer 50: one weight differs
    columns = _assert_same(net, x, "float32", layers)
    assert columns[32:49].sum() == 0 and columns[49] > 0  # the loop ran layer 50 (and on to the next lookup)
    assert columns[64:].sum() == 0  # uniform again at layer 64: the rest without the loop


def test_uniform_columns_that_die_in_a_regular_layer_leave_the_chunk(deep):
    net, x = deep
    layers = [(w.indptr, w.indices, w.data.copy()) for w in net.layers]
    layers[39][2][:] = -0.0625  # layer 40: regular, and every sum negative
    columns = _assert_same(net, x, "float32", layers)
    on_ids = _chunk(net, x, "float32", layers)[1]
    assert on_ids.size == 0 and columns[32:].sum() == 0
