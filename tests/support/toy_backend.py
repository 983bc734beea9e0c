"""A backend that exists only in the tests: the proof that a backend is one module and one registration line.

Its arrays are NumPy arrays behind a wrapper (:class:`ToyArray`) that is not an ``np.ndarray`` and is never made
one implicitly (as a CuPy array is not): a caller that tests for ``np.ndarray``, hands one to a Numba kernel or
calls NumPy on it directly fails. Its array module (:data:`toy_numpy`) is NumPy's functions on those arrays, as
``cupy`` is to CuPy's; its kernels are plain NumPy and SciPy reference implementations (no Numba). It counts the
calls to its kernels (:attr:`ToyBackend.calls`), so a test can see that they ran.

Registered with one call: ``dasknn.kernels.register_backend("toy", "toy_backend", arrays="toy_backend")``.
"""

from __future__ import annotations

import types
from collections import Counter
from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field

import numpy as np
import scipy.sparse as sp
from numpy.lib.mixins import NDArrayOperatorsMixin

from dasknn.kernels import activations_of_rows, to_host
from dasknn.kernels.messages import CONSTANT, DENSE, SPARSE


def _unwrap(x):
    # the NumPy arrays inside ToyArrays, in arguments of any nesting
    if isinstance(x, ToyArray):
        return x.a
    if isinstance(x, (tuple, list)):
        return type(x)(_unwrap(v) for v in x)
    if isinstance(x, dict):
        return {k: _unwrap(v) for k, v in x.items()}
    return x


def _wrap(x):
    # NumPy arrays in results wrapped (scalars, shapes and dtypes as they are)
    if isinstance(x, np.ndarray):
        return ToyArray(x)
    if isinstance(x, tuple):
        return tuple(_wrap(v) for v in x)
    return x


class ToyArray(NDArrayOperatorsMixin):
    """A NumPy array on the toy "device": operators, methods and indexing work and give ToyArrays back."""

    __slots__ = ("a",)

    def __init__(self, a: np.ndarray):
        self.a = a

    def __array__(self, *args, **kwargs):
        raise TypeError("a toy array is not implicitly a NumPy array: ask its backend's to_host")

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        if "out" in kwargs:
            kwargs["out"] = _unwrap(kwargs["out"])
        return _wrap(getattr(ufunc, method)(*_unwrap(inputs), **kwargs))

    def __getattr__(self, name: str):
        if name.startswith("__"):  # NumPy's protocols (__array_interface__, ...) would make it a NumPy array
            raise AttributeError(name)
        attr = getattr(self.a, name)
        if not callable(attr):
            return _wrap(attr)
        return lambda *args, **kwargs: _wrap(attr(*_unwrap(args), **_unwrap(kwargs)))

    def __getitem__(self, key):
        return _wrap(self.a[_unwrap(key)])

    def __setitem__(self, key, value) -> None:
        self.a[_unwrap(key)] = _unwrap(value)

    def __len__(self) -> int:
        return len(self.a)

    def __float__(self) -> float:
        return float(self.a)

    def __repr__(self) -> str:
        return f"ToyArray({self.a!r})"


class _ToyNumpy(types.ModuleType):
    """NumPy's functions on ToyArrays: arguments unwrapped, array results wrapped (``asarray`` of a NumPy array
    gives a ToyArray, as ``cupy.asarray`` gives a CuPy array); NumPy's types as they are."""

    def __getattr__(self, name: str):
        attr = getattr(np, name)
        if isinstance(attr, type) or not callable(attr):
            return attr
        return lambda *args, **kwargs: _wrap(attr(*_unwrap(args), **_unwrap(kwargs)))


#: The toy backend's array module.
toy_numpy = _ToyNumpy("toy_numpy")


def _host(a) -> np.ndarray:
    return a.a if isinstance(a, ToyArray) else np.asarray(a)


def _rule(z: np.ndarray, bias: float, ymax: float) -> np.ndarray:
    # the challenge's rule: the bias to nonzero sums only, then ReLU and the clamp
    t = z.dtype.type
    return np.where(z != 0, np.clip(z + t(bias), t(0), t(ymax)), t(0))


@dataclass(frozen=True)
class ToyBackend:
    """The ``"toy"`` backend: ToyArrays, NumPy and SciPy kernels."""

    name: str = "toy"
    reuse_space: bool = False
    #: calls to each kernel, by name
    calls: Counter = field(default_factory=Counter, compare=False)

    def missing(self) -> str | None:
        return None

    def array_types(self) -> tuple[type, ...]:
        return (ToyArray,)

    def array_module(self) -> types.ModuleType:
        return toy_numpy

    def to_device(self, a) -> ToyArray:
        return a if isinstance(a, ToyArray) else ToyArray(np.array(to_host(a)))  # a copy, as to a device

    def to_host(self, a: ToyArray) -> np.ndarray:
        return a.a.copy()

    def empty(self, shape: tuple[int, ...], dtype) -> ToyArray:
        return ToyArray(np.empty(shape, dtype=dtype))

    def activations_of_rows(self, block, dtype, neurons=None) -> ToyArray:
        return ToyArray(activations_of_rows(block, dtype, neurons))

    def layer_step(self, yt, indptr, indices, data, bias, ymax, extra=None, columns=None, out=None) -> ToyArray:
        self.calls["layer_step"] += 1
        x = _host(yt) if extra is None else np.vstack([_host(yt), _host(extra)])
        n_out = len(indptr) - 1
        w = sp.csc_matrix((_host(data).astype(x.dtype), _host(indices), _host(indptr)), shape=(x.shape[0], n_out))
        h = _rule(np.asarray(w.T @ x), bias, ymax)  # each output summed in its entries' order
        out = self.empty((n_out, x.shape[1]), x.dtype) if out is None else out
        rows = slice(None) if columns is None else np.asarray(columns)
        out.a[rows] = h[rows]
        return out

    def run_layers(self, yt, layers, bias, ymax, ids, compact_every=None) -> tuple[ToyArray, np.ndarray]:
        self.calls["run_layers"] += 1
        every = 2 if compact_every is None else compact_every  # not every layer: the ids must follow
        ids = np.asarray(ids)
        if yt.shape[1] == 0:
            return yt, ids
        k = 0
        for k, (indptr, indices, data) in enumerate(layers, start=1):
            yt = self.layer_step(yt, indptr, indices, data, bias, ymax)
            if k % every == 0:
                yt, ids = self._compact(yt, ids)
            if yt.shape[1] == 0:
                break
        return self._compact(yt, ids) if k % every else (yt, ids)

    def _compact(self, yt: ToyArray, ids: np.ndarray) -> tuple[ToyArray, np.ndarray]:
        keep = self.alive(yt)
        return ToyArray(yt.a[:, keep]), ids[keep]

    def keep_columns(self, a: ToyArray, keep: np.ndarray) -> ToyArray:
        return ToyArray(a.a[:, keep])

    def alive(self, yt: ToyArray) -> np.ndarray:
        return yt.a.any(axis=0)

    def pack_rows(self, block, rows, cols=None, compact=True) -> tuple:
        # the same message format as the CPU's, in plain NumPy: dense, or a bitmap and the nonzeros (one, if equal)
        dense = block.a[rows] if cols is None else block.a[np.ix_(rows, cols)]
        header = np.array([rows.size, dense.shape[1], DENSE], dtype=np.int64)
        nonzero = dense != 0
        values = dense[nonzero]
        bits = np.packbits(nonzero.ravel())
        if compact and (values.size == 0 or (values == values[0]).all()):
            header[2] = CONSTANT if values.size else SPARSE
            return header, bits, ToyArray(values[:1])
        if compact and bits.nbytes + values.nbytes < dense.nbytes:
            header[2] = SPARSE
            return header, bits, ToyArray(values)
        return header, np.empty(0, np.uint8), ToyArray(np.ascontiguousarray(dense).ravel())

    def unpack_rows(self, message: tuple, out: ToyArray) -> None:
        header, bits, values = message
        kind, values = int(header[2]), values.a
        if kind == DENSE:
            out.a[...] = values.reshape(out.shape)
            return
        nonzero = np.unpackbits(bits, count=out.a.size).astype(bool).reshape(out.shape)
        out.a[...] = 0
        out.a[nonzero] = values[0] if kind == CONSTANT else values

    def weight_grad(self, xin, delta, indptr, indices) -> ToyArray:
        self.calls["weight_grad"] += 1
        indptr, indices = _host(indptr), _host(indices)
        outputs = np.repeat(np.arange(indptr.size - 1), np.diff(indptr))
        x, d = _host(xin).astype(np.float64), _host(delta).astype(np.float64)
        return ToyArray(np.einsum("pb,pb->p", x[indices], d[outputs]))

    def back_input(self, delta, indptr, indices, data, n_in) -> ToyArray:
        self.calls["back_input"] += 1
        d = _host(delta).astype(np.float64)
        w = sp.csc_matrix((_host(data).astype(np.float64), _host(indices), _host(indptr)), shape=(n_in, d.shape[0]))
        return ToyArray(np.asarray(w @ d))

    def keep_on_device(self, key: Hashable, first: int, layers: Iterable[tuple]) -> Iterable[tuple]:
        for layer in layers:
            yield tuple(self.to_device(a) for a in layer)

    def release(self) -> None:
        pass  # nothing is kept between calls


#: The backend ``register_backend("toy", "toy_backend", ...)`` finds here.
BACKEND = ToyBackend()
