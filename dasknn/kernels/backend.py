"""The backend contract: everything inference and training do with arrays of one array library, in one type.

A backend is one array library and the kernels that run on its arrays: ``"cpu"`` (NumPy arrays, the Numba kernels
of :mod:`.cpu`) and ``"gpu"`` (CuPy arrays, the CUDA kernels of :mod:`.gpu`). Callers never test an array's type:
they ask the backend of their arrays (:func:`~dasknn.kernels.dispatch.backend_of`) or of their run
(:func:`~dasknn.kernels.dispatch.backend_named`) and call it. Every backend takes the same arguments in every
method; one that cannot do something raises :class:`BackendUnsupported`, saying what.

Layouts are the kernels' own: activations transposed and dense (``neurons x images``), a layer block in CSC form
(``indptr`` over output neurons, ``indices`` their input neurons, ``data`` the weights). Alive masks, image
indices and the rows a message carries stay NumPy arrays on the host whatever the backend.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from types import ModuleType
from typing import Any, Protocol, runtime_checkable

import numpy as np

#: An array of some backend (a NumPy array, a CuPy array, ...): held by callers without knowing its type.
Array = Any
#: A layer block in CSC form, ``(indptr, indices, data)``, on some backend.
Block = tuple[Array, Array, Array]


class BackendUnsupported(NotImplementedError):
    """What a backend cannot do, said in one line (``the gpu backend cannot compute some columns of a layer``)."""

    def __init__(self, backend: str, what: str):
        super().__init__(f"the {backend} backend cannot {what}")
        self.backend = backend
        self.what = what


@runtime_checkable
class Backend(Protocol):
    """One array library and its kernels. Implementations: :class:`dasknn.kernels.cpu.CpuBackend`,
    :class:`dasknn.kernels.gpu.GpuBackend`; registered by :func:`dasknn.kernels.dispatch.register_backend`."""

    #: The name runs ask for (``backend="cpu"``).
    name: str
    #: Whether a caller that writes a step's output layer after layer should reuse its space (True on the host,
    #: where a fresh array of a hundred megabytes costs the page faults the step waits on; False on a device,
    #: whose memory pool reuses freed blocks itself and whose memory is too small to keep spaces per chunk).
    reuse_space: bool

    def missing(self) -> str | None:
        """What this backend needs and this process lacks, in a few words (``"CuPy: pip install ..."``); None
        where it can run here."""

    def array_types(self) -> tuple[type, ...]:
        """The array types this backend runs on (importing its library: asked only when such an array arrives)."""

    def array_module(self) -> ModuleType:
        """The NumPy-like module of its arrays (``numpy``, ``cupy``): device-agnostic code calls it."""

    def to_device(self, a) -> Array:
        """``a`` (a NumPy array, or an array of any backend) on this backend; an array already here is not
        copied."""

    def to_host(self, a) -> np.ndarray:
        """A NumPy copy of one of this backend's arrays (a NumPy array is returned as it is)."""

    def empty(self, shape: tuple[int, ...], dtype) -> Array:
        """An uninitialised array of ``shape`` and ``dtype`` on this backend."""

    def activations_of_rows(self, block, dtype, neurons: np.ndarray | None = None) -> Array:
        """Images in memory (rows: dense or ``scipy.sparse``, on the host or a device) as the kernels' dense
        ``neurons x images`` activations on this backend: only the ``neurons`` given, in their order, if any."""

    def layer_step(self, yt, indptr, indices, data, bias: float, ymax: float, extra=None,
                   columns: np.ndarray | None = None, out=None) -> Array:
        """One fused layer, ``h(W_block^T @ [yt; extra])``, for the block's output neurons.

        ``extra``: more input rows (received rows, read in place); ``columns``: compute only these outputs
        (ascending), leaving ``out``'s other rows as they are; ``out``: where to write (``outputs x images``,
        ``yt``'s dtype), a new array when None. See :func:`dasknn.kernels.cpu.layer_step_numpy`.
        """

    def run_layers(self, yt, layers: Iterable[Block], bias: float, ymax: float, ids: np.ndarray,
                   compact_every: int | None = None) -> tuple[Array, np.ndarray]:
        """Consecutive layers on one block of images, dead images dropped every ``compact_every`` layers (None:
        the backend's default); returns the survivors' activations and their ``ids`` (NumPy).

        A backend whose loop also folds equal images (:mod:`dasknn.kernels.folds`) says so with a true
        ``folds_in_loop`` attribute and takes the chunk's record as a last argument, ``folds``, returning
        ``(yt, ids, folds)`` then; any other's loop is run between looks by
        :func:`~dasknn.kernels.folds.run_layers_folding`, the fold done with its array module."""

    def keep_columns(self, a, keep: np.ndarray) -> Array:
        """``a[:, keep]`` for a boolean NumPy mask, over ``a`` itself where the backend can (``a`` is spent)."""

    def alive(self, yt) -> np.ndarray:
        """Which images (columns) still have a nonzero activation, as a NumPy mask."""

    def pack_rows(self, block, rows: np.ndarray, cols: np.ndarray | None = None, compact: bool = True) -> tuple:
        """The boundary message holding ``block[rows][:, cols]`` (see :mod:`dasknn.kernels.messages`), in its
        smallest form where ``compact`` and the backend can, else as dense rows."""

    def unpack_rows(self, message: tuple, out) -> None:
        """Write a message's rows into ``out`` (``rows x images``, one of this backend's arrays)."""

    def weight_grad(self, xin, delta, indptr, indices) -> Array:
        """Training: ``sum_b xin[i, b] * delta[j, b]`` for every stored ``(i, j)``, float64, aligned with
        ``indices`` (see :func:`dasknn.kernels.grad.weight_grad`)."""

    def back_input(self, delta, indptr, indices, data, n_in: int) -> Array:
        """Training: the error passed down, ``W_block @ delta`` (``n_in x batch``, float64)."""

    # optional: ``hold_layers(layers, entries, dtype) -> list[Block]``, a network's layers (host arrays, as read;
    # ``entries`` in all) held the way this backend's loop reads them cheapest (the CPU's packed one after
    # another: kernels.cpu.packed_layers); without it each array goes to the device (kernels.arrays.held_layers)

    def keep_on_device(self, key: Hashable, first: int, layers: Iterable[Block]) -> Iterable[Block]:
        """Streamed layers ``first, first + 1, ...`` (host arrays, as read) as this backend's, keeping the copies
        that fit for the next chunks under ``(key, layer)`` (a host backend passes them through)."""

    def release(self) -> None:
        """Let go of what the kernels keep between calls (kept layers, scratch) after a run."""
