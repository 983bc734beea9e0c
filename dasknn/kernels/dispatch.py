"""Kernels chosen by the activations' array type, in the style of dask-image's dispatchers.

NumPy arrays are registered here; CuPy registers itself lazily the first time a CuPy array arrives, so importing
dasknn (or :mod:`dasknn.kernels`) never imports CuPy.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np

from .cpu import keep_columns_numpy, layer_step_numpy, run_layers_numpy


class Dispatch:
    """Look up an implementation by the type of the first argument; lazy registration by top-level module."""

    def __init__(self, name: str):
        self.name = name
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
        raise TypeError(f"no {self.name} kernel for arrays of type {kind.__module__}.{kind.__name__}")

    def __call__(self, arg, *args, **kwargs):
        return self.dispatch(type(arg))(arg, *args, **kwargs)


layer_step = Dispatch("layer_step")
layer_step.register(np.ndarray)(layer_step_numpy)
run_layers_device = Dispatch("run_layers")
run_layers_device.register(np.ndarray)(run_layers_numpy)
#: ``a[:, keep]`` for a boolean mask ``keep``, over ``a`` itself where the device allows (``a`` is then spent)
keep_columns = Dispatch("keep_columns")
keep_columns.register(np.ndarray)(keep_columns_numpy)


def run_layers(
    yt: np.ndarray,
    layers: Iterable[tuple[np.ndarray, np.ndarray, np.ndarray]],
    bias: float,
    ymax: float,
    ids: np.ndarray,
    compact_every: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Run consecutive layers on one block of images, dropping images that die.

    A dead image (an all-zero column) stays dead, so it is cut out of ``yt`` every ``compact_every`` layers (by
    default every layer on the CPU, every ``GPU_COMPACT_EVERY`` on a GPU). The loop is chosen by ``yt``'s array
    type: :func:`dasknn.kernels.cpu.run_layers_numpy`, or on a device its own loop (fused alive flags, fewer
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

    Returns
    -------
    (yt, ids)
        The final activations of the surviving images and their original indices (a NumPy array).
    """
    return run_layers_device(yt, layers, bias, ymax, ids, compact_every)


@layer_step.register_lazy("cupy")
@run_layers_device.register_lazy("cupy")
@keep_columns.register_lazy("cupy")
def _register_cupy() -> None:  # pragma: no cover - needs CuPy
    import cupy

    from .gpu import layer_step_gpu, run_layers_gpu

    layer_step.register(cupy.ndarray)(layer_step_gpu)
    run_layers_device.register(cupy.ndarray)(run_layers_gpu)
    keep_columns.register(cupy.ndarray)(lambda a, keep: a[:, cupy.asarray(keep)])
