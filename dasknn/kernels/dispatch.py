"""The backends by name and by array type, registered lazily, in the style of zarr's buffer prototypes and
dask-image's dispatchers.

A backend (:class:`~dasknn.kernels.backend.Backend`) is registered by name with the module that holds it (its
``BACKEND``) and the top-level module of its array types; nothing is imported then. The module is imported the
first time the backend is asked for by name, or an array of that top-level module arrives; its array library
(CuPy) only when such an array arrives (:meth:`~dasknn.kernels.backend.Backend.array_types`), so importing dasknn
never imports CuPy. Adding a backend is a module implementing the contract and one :func:`register_backend` line
below.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np

from .backend import Backend
from .folds import Folds, run_layers_folding


@dataclass(frozen=True)
class Registration:
    """A backend as registered: its name, the module whose ``BACKEND`` it is, the top-level module of its arrays."""

    name: str
    module: str
    arrays: str


#: Registered backends by name, in registration order.
_REGISTERED: dict[str, Registration] = {}
#: The backends loaded so far, by name, and by array type (found by the types' top-level module).
_LOADED: dict[str, Backend] = {}
_BY_TYPE: dict[type, Backend] = {}


def register_backend(name: str, module: str, arrays: str) -> None:
    """Register backend ``name``: the ``BACKEND`` of ``module`` (imported on first use), for arrays whose type's
    top-level module is ``arrays`` (``"numpy"``, ``"cupy"``)."""
    _REGISTERED[name] = Registration(name, module, arrays)


def unregister_backend(name: str) -> None:
    """Forget backend ``name`` and the array types found for it (a test's own backend, after the test)."""
    _REGISTERED.pop(name, None)
    gone = _LOADED.pop(name, None)
    for kind in [k for k, b in _BY_TYPE.items() if b is gone]:
        del _BY_TYPE[kind]


def backend_names() -> tuple[str, ...]:
    """The registered backends' names (``("cpu", "gpu")``, and any a caller registered)."""
    return tuple(_REGISTERED)


def backend_named(name: str) -> Backend:
    """The backend registered as ``name`` (its module imported on first use; its array library is not)."""
    backend = _LOADED.get(name)
    if backend is None:
        if name not in _REGISTERED:
            raise ValueError(f"no backend named {name!r}: the backends are {', '.join(_REGISTERED)}")
        backend = _LOADED[name] = importlib.import_module(_REGISTERED[name].module).BACKEND
    return backend


def find_backend(kind: type) -> Backend | None:
    """The backend of arrays of type ``kind``, or None where no registered backend runs on them.

    A type of a registered top-level module (and not yet seen) has its backend's array types registered first,
    so a subclass that backend runs on (an ``np.ndarray`` subclass of another library) is found ahead of its
    base classes.
    """
    backend = _BY_TYPE.get(kind)
    if backend is not None:
        return backend
    top = kind.__module__.split(".")[0]
    for reg in _REGISTERED.values():
        if reg.arrays == top:
            found = backend_named(reg.name)
            for t in found.array_types():
                _BY_TYPE[t] = found
    for cls in kind.__mro__:
        if cls in _BY_TYPE:
            return _BY_TYPE[cls]
    return None


def backend_for(kind: type) -> Backend:
    """The backend of arrays of type ``kind``; a TypeError where none runs on them."""
    backend = find_backend(kind)
    if backend is None:
        raise TypeError(f"no backend runs on arrays of type {kind.__module__}.{kind.__name__}")
    return backend


def backend_of(a) -> Backend:
    """The backend of array ``a`` (NumPy arrays: ``"cpu"``; CuPy arrays: ``"gpu"``)."""
    return backend_for(type(a))


def release_backends() -> None:
    """Let go of every backend's caches (kept layers, scratch) after a run: those of the backends whose module is
    imported (a backend never imported holds nothing)."""
    for reg in list(_REGISTERED.values()):
        if reg.module in sys.modules:
            backend_named(reg.name).release()


class Dispatch:
    """One kernel looked up by the type of its first argument: the method ``method`` of that array's backend,
    unless a type was registered with this dispatcher alone (:meth:`register`, :meth:`register_lazy`).

    The per-kernel dispatchers of before the backends (``layer_step``, ``run_layers_device``, ``keep_columns``,
    ``grad.weight_grad_device``, ``grad.back_input_device``) are these.
    """

    def __init__(self, name: str, method: str | None = None):
        self.name = name
        self.method = name if method is None else method
        self._impls: dict[type, Callable] = {}
        self._lazy: dict[str, Callable[[], None]] = {}

    def register(self, kind: type) -> Callable[[Callable], Callable]:
        def wrap(fn: Callable) -> Callable:
            self._impls[kind] = fn
            return fn

        return wrap

    def register_lazy(self, module: str) -> Callable[[Callable[[], None]], Callable[[], None]]:
        def wrap(fn: Callable[[], None]) -> Callable[[], None]:
            self._lazy[module] = fn
            return fn

        return wrap

    def dispatch(self, kind: type) -> Callable:
        for cls in kind.__mro__:
            if cls in self._impls:
                return self._impls[cls]
        top = kind.__module__.split(".")[0]
        if top in self._lazy:
            self._lazy.pop(top)()
            return self.dispatch(kind)
        backend = find_backend(kind)
        if backend is None:
            raise TypeError(f"no {self.name} kernel for arrays of type {kind.__module__}.{kind.__name__}")
        return getattr(backend, self.method)

    def __call__(self, arg, *args, **kwargs):
        return self.dispatch(type(arg))(arg, *args, **kwargs)


layer_step = Dispatch("layer_step")
run_layers_device = Dispatch("run_layers")
#: ``a[:, keep]`` for a boolean mask ``keep``, over ``a`` itself where the device allows (``a`` is then spent)
keep_columns = Dispatch("keep_columns")


def run_layers(
    yt: np.ndarray,
    layers: Iterable[tuple[np.ndarray, np.ndarray, np.ndarray]],
    bias: float,
    ymax: float,
    ids: np.ndarray,
    compact_every: int | None = None,
    folds: Folds | None = None,
) -> tuple:
    """Run consecutive layers on one block of images, dropping images that die (and, with ``folds``, folding
    images whose activations are equal into one).

    A dead image (an all-zero column) stays dead, so it is cut out of ``yt`` every ``compact_every`` layers (by
    default every layer on the CPU, every ``GPU_COMPACT_EVERY`` on a GPU). The loop is the backend's of ``yt``:
    :func:`dasknn.kernels.cpu.run_layers_numpy`, or on a device its own loop (fused alive flags, fewer
    synchronisations), :func:`dasknn.kernels.gpu.run_layers_gpu`.

    Parameters
    ----------
    yt
        ``N x B`` activations.
    layers
        Each layer as ``(indptr, indices, data)`` in CSC form (a list, or an iterator that reads them as they are
        needed).
    bias, ymax
        The rule's constants.
    ids
        The images' original indices (length ``B``); they follow the surviving columns.
    compact_every
        Layers between compactions; None for the backend's default.
    folds
        The chunk's :class:`~dasknn.kernels.folds.Folds`: equal images are computed once (a backend whose loop
        folds itself, ``folds_in_loop``, does it there; any other's loop runs between looks,
        :func:`~dasknn.kernels.folds.run_layers_folding`), and the layers are counted in it.

    Returns
    -------
    (yt, ids) or, with ``folds``, (yt, ids, folds)
        The final activations of the surviving images (their representatives, with ``folds``) and their original
        indices (a NumPy array); the record after these layers.
    """
    if folds is None:
        return run_layers_device(yt, layers, bias, ymax, ids, compact_every)
    backend = backend_of(yt)
    if getattr(backend, "folds_in_loop", False):
        return backend.run_layers(yt, layers, bias, ymax, ids, compact_every, folds)
    return run_layers_folding(backend, yt, layers, bias, ymax, ids, compact_every, folds)


# the backends: a new one is a module implementing kernels.backend.Backend and a line here
register_backend("cpu", "dasknn.kernels.cpu", arrays="numpy")
register_backend("gpu", "dasknn.kernels.gpu", arrays="cupy")
