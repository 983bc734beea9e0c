"""Where training's arrays live: the array module of an array, and the checks of a run's backend.

On a device the model's values, patterns and optimiser state, the images and the activations are that backend's
arrays (CuPy's on ``"gpu"``); the kernels are their backend's (:mod:`dasknn.kernels`), and the few NumPy calls of
training ask :func:`array_module` which module to use. CuPy is imported only when a device array or
``backend="gpu"`` asks.
"""

from __future__ import annotations

import numpy as np

from ..errors import DasknnError
from ..kernels import array_module, backend_named, backend_names

#: The built-in backends: NumPy arrays and the Numba kernels, or CuPy arrays and the CUDA kernels (any other
#: registered with :func:`dasknn.kernels.register_backend` trains too).
BACKENDS = ("cpu", "gpu")
#: The modes whose steps run on any backend's arrays (model mode's parts and messages are host arrays).
ANY_BACKEND_MODES = ("single", "data")

__all__ = ["ANY_BACKEND_MODES", "BACKENDS", "array_module", "check_backend", "take_batch"]


def check_backend(backend: str, mode: str) -> None:
    """Refuse, in one line, a backend that cannot run this mode or here (``"gpu"`` without CuPy)."""
    if backend not in backend_names():
        raise DasknnError(f"backend must be one of {', '.join(backend_names())}, not {backend!r}")
    if backend != "cpu" and mode not in ANY_BACKEND_MODES:
        raise DasknnError(f"--{backend} trains in single or data mode; --mode {mode} trains on the CPU")
    missing = backend_named(backend).missing()
    if missing is not None:
        raise DasknnError(f"--{backend} needs {missing}")


def take_batch(xt, labels, idx: np.ndarray):
    """The images (columns of ``xt``, contiguous) and labels of batch ``idx``, on ``xt``'s device."""
    xp = array_module(xt)
    idx = xp.asarray(idx)
    return xp.ascontiguousarray(xt[:, idx]), labels[idx]
