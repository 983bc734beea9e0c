"""Uniform columns through regular iso-valued layers: a chunk whose every column holds one value in every row
(the vector the challenge's images converge to: every neuron at ``ymax``) runs on without the kernel while its
layers each give every output the same number of inputs, all with one weight.

Such a layer (*regular iso-valued*: the challenge's networks and ``dasknn generate``'s, RadiX-Net wiring with one
constant weight) sums, for every output, the same terms in the same order when every input holds ``v``: ``n``
products ``v * w``, each rounded, added left to right from zero, as the kernels add them (the CPU's separately
rounded multiply and add, the GPU's ``__fmul_rn`` and ``__fadd_rn``), then the rule. So every output holds the same
value, computed once here with the activations' own scalar arithmetic: exact, bit for bit, and the column stays
uniform through the next such layer. A column reaching zero is dead (it stays zero). Where a layer is not regular
iso-valued, the chunk goes back to the kernel's loop at that layer.

A layer's form is found once per array (a pass over its weights and pointers; :func:`held_with_forms` does it for a
held network while it is loaded, so a run never pays for it) and kept while the layer's arrays live.
"""

from __future__ import annotations

import itertools
import weakref
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import numpy as np

from .dispatch import backend_of


@dataclass(frozen=True)
class RegularLayer:
    """A layer whose each of ``outputs`` outputs reads ``inputs`` inputs, every entry of weight ``weight`` (as
    stored)."""

    outputs: int
    inputs: int
    weight: float


def regular_form(indptr, data) -> RegularLayer | None:
    """``(indptr, data)``'s layer as a :class:`RegularLayer`, or None where its outputs read different numbers of
    inputs, or any none, or its weights differ (arrays of any backend)."""
    outputs = int(indptr.shape[0]) - 1
    if outputs < 1 or data.shape[0] == 0:
        return None
    backend = backend_of(data)
    xp = backend.array_module()
    counts = xp.diff(indptr)
    first = data[:1]
    if not bool(backend.to_host(xp.all(counts == counts[0]) & xp.all(data == first))):
        return None
    inputs = int(backend.to_host(counts[:1])[0])
    weight = float(backend.to_host(first)[0])
    return RegularLayer(outputs, inputs, weight) if inputs > 0 and np.isfinite(weight) else None


#: The form of each layer met, by the id of its weights array, while that array lives (a weak reference's callback
#: drops the entry): (a reference to the weights, to the pointers, the form or None).
_FORMS: dict[int, tuple[weakref.ref, weakref.ref, RegularLayer | None]] = {}


def layer_form(layer: tuple) -> RegularLayer | None:
    """:func:`regular_form` of ``layer`` (``(indptr, indices, data)``), found once while its arrays live."""
    indptr, _, data = layer
    seen = _FORMS.get(id(data))
    if seen is not None and seen[0]() is data and seen[1]() is indptr:
        return seen[2]
    return _remember(layer, regular_form(indptr, data))


def _remember(layer: tuple, form: RegularLayer | None) -> RegularLayer | None:
    indptr, _, data = layer
    key = id(data)
    try:
        refs = (weakref.ref(data, lambda _, key=key: _FORMS.pop(key, None)), weakref.ref(indptr))
    except TypeError:  # (an array no weak reference follows: found again next time)
        return form
    _FORMS[key] = (*refs, form)
    return form


def held_with_forms(hold: Callable[[Iterable[tuple]], list[tuple]], layers: Iterable[tuple]) -> list[tuple]:
    """``hold(layers)`` (a backend holding a network's layers, host arrays as read), each layer's form found as it
    passes and kept for its held copy: a run then finds them without a pass over the layers."""
    forms: list[RegularLayer | None] = []

    def noting() -> Iterator[tuple]:
        for layer in layers:
            forms.append(regular_form(layer[0], layer[2]))
            yield layer

    held = hold(noting())
    for copy, form in zip(held, forms):
        _remember(copy, form)
    return held


#: Values already taken through a layer's form: (value, form, bias, ymax, dtype) -> value after.
_THROUGH: dict[tuple, np.generic] = {}
#: Entries of _THROUGH at most (it is emptied past this: a run meets a handful).
_THROUGH_MOST = 1 << 12


def through(value: np.generic, form: RegularLayer, bias: float, ymax: float) -> np.generic:
    """Every output of a layer of ``form`` when every input holds ``value`` (a NumPy scalar of the activations'
    dtype), with the kernels' arithmetic: ``form.inputs`` products rounded one by one, added left to right from
    zero, then the bias on a nonzero sum, ReLU and the clamp at ``ymax``."""
    key = (value, value.dtype.str, form, bias, ymax)
    out = _THROUGH.get(key)
    if out is None:
        kind = value.dtype.type
        zero, term = kind(0), kind(value * kind(form.weight))
        total = zero
        for _ in range(form.inputs):
            total = kind(total + term)
        out = kind(total + kind(bias))
        out = out if out > zero else zero
        out = out if out < kind(ymax) else kind(ymax)
        out = out if total != zero else zero
        if len(_THROUGH) >= _THROUGH_MOST:
            _THROUGH.clear()
        _THROUGH[key] = out
    return out


@dataclass(frozen=True)
class UniformRun:
    """Uniform columns taken through consecutive regular iso-valued layers.

    ``values``: each column's value after the ``ran`` layers (zero: it died); ``lived``: after how many of them each
    column was still alive; ``outputs``: the last layer's outputs (the columns' length); ``rest``: the layers not
    taken (the first one met that is not regular iso-valued first)."""

    values: np.ndarray
    lived: np.ndarray
    ran: int
    outputs: int
    rest: Iterator

    def alive_after(self, weights: np.ndarray) -> np.ndarray:
        """The images alive after each of the layers, the columns standing for ``weights`` images each."""
        layer = np.arange(self.ran)[:, None]
        return ((self.lived[None, :] > layer) * weights[None, :]).sum(axis=1)


def uniform_values(host: np.ndarray) -> np.ndarray | None:
    """Each column's value where every column of ``host`` (activations on the host) holds one value in all its
    rows; None otherwise."""
    if not host.size or not (host == host[:1]).all():
        return None
    return host[0].copy()


def run_uniform(values: np.ndarray, layers: Iterator, most: int, bias: float, ymax: float) -> UniformRun:
    """Columns holding ``values`` (one each, the activations' dtype) through the next of ``layers`` while they
    are regular iso-valued, ``most`` of them at most, or until every column is dead."""
    lived = np.zeros(values.size, dtype=np.int64)
    ran, outputs = 0, 0
    steady = None  # the form of the layers just run while the values are its fixed point (they stay as they are)
    while ran < most:
        layer = next(layers, None)
        if layer is None:
            break
        form = layer_form(layer)
        if form is None:
            layers = itertools.chain([layer], layers)  # (the loop runs it)
            break
        if form != steady:
            lived[values != 0] = ran
            before, values = values, np.array([through(v, form, bias, ymax) for v in values], dtype=values.dtype)
            steady = form if np.array_equal(values, before) else None
            outputs = form.outputs
        ran += 1
        if steady is None and not values.any():
            break
    lived[values != 0] = ran
    return UniformRun(values, lived, ran, outputs, layers)
