"""Where training's arrays live: the array module of an array, and the checks of ``backend="gpu"``.

On the GPU the model's values, patterns and optimiser state, the images and the activations are CuPy arrays; the
kernels are chosen by array type (:mod:`dasknn.kernels`), and the few NumPy calls of training ask
:func:`array_module` which module to use. CuPy is imported only when a device array or ``backend="gpu"`` asks.
"""

from __future__ import annotations

import importlib
from types import ModuleType

import numpy as np

from ..errors import DasknnError

#: Where training runs: NumPy arrays and the Numba kernels, or CuPy arrays and the CUDA kernels.
BACKENDS = ("cpu", "gpu")


def array_module(a) -> ModuleType:
    """NumPy for a NumPy array, CuPy for any other (as ``cupy.get_array_module``, without importing CuPy for
    NumPy arrays)."""
    if isinstance(a, np.ndarray):
        return np
    import cupy

    return cupy


def check_backend(backend: str, mode: str) -> None:
    """Refuse, in one line, a backend that cannot run this mode or here (``"gpu"`` without CuPy)."""
    if backend not in BACKENDS:
        raise DasknnError(f"backend must be one of {', '.join(BACKENDS)}, not {backend!r}")
    if backend == "gpu":
        if mode not in ("single", "data"):
            raise DasknnError(f"--gpu trains in single or data mode; --mode {mode} trains on the CPU")
        try:
            importlib.import_module("cupy")
        except ImportError:
            raise DasknnError("--gpu needs CuPy: pip install 'dasknn[gpu]'") from None


def take_batch(xt, labels, idx: np.ndarray):
    """The images (columns of ``xt``, contiguous) and labels of batch ``idx``, on ``xt``'s device."""
    xp = array_module(xt)
    idx = xp.asarray(idx)
    return xp.ascontiguousarray(xt[:, idx]), labels[idx]
