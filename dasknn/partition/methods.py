"""The entry point: :func:`partition_network` dispatches to a method."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import scipy.sparse as sp

from ..errors import DasknnError
from .fast import fast
from .hypergraph import PRESETS, ProgressFn, _layered, _mtk, _shared
from .metrics import _as_layers, _check_epsilon, _check_parts, layer_imbalance, layer_volumes, validate_partition
from .segments import fast_segments
from .simple import _block, _random

#: Methods :func:`partition_network` accepts.
METHODS: tuple[str, ...] = ("hypergraph", "hypergraph-shared", "hypergraph-layered", "fast", "fast-segments", "block",
                            "random")


# --------------------------------------------------------------------------------------------- entry point
def partition_network(
    layers: Sequence[sp.csc_matrix],
    parts: int,
    method: str = "hypergraph",
    *,
    epsilon: float = 0.03,
    seed: int = 0,
    threads: int | None = None,
    sweeps: int | None = None,
    preset: str = "default",
    progress: ProgressFn | None = None,
) -> np.ndarray:
    """Assign every neuron of every layer (inputs included) to one of ``parts`` parts.

    Parameters
    ----------
    layers
        ``W_1 ... W_L`` as ``N x N`` CSC matrices in the challenge orientation, or a
        :class:`~dasknn.network.Network`.
    parts
        Number of parts ``K``, ``1 <= K <= N``.
    method
        One of :data:`METHODS` (see the module docstring).
    epsilon
        Allowed per-layer work imbalance, ``max / mean - 1``. ``block`` and ``random`` balance by
        construction; ``hypergraph-shared`` balances the work summed over layers.
    seed
        Seed for ``random`` and for Mt-KaHyPar.
    threads
        Mt-KaHyPar threads (default: the CPUs this process may use). Mt-KaHyPar sets up its thread pool
        once per process, so only the first hypergraph call's value takes effect.
    sweeps
        Refinement sweeps after the forward pass of the layered methods (alternately backward and
        forward; each re-partitions every row). Default: 0 for ``hypergraph``, 2 for ``hypergraph-layered``, 1
        for ``fast`` (a label-propagation sweep).
    preset
        Mt-KaHyPar preset, one of :data:`PRESETS`: ``"default"``, or ``"deterministic"`` (the same owners on
        every run, whatever the threads: for reproducible figures; slower).
    progress
        Called as ``progress(done, total)`` as the layered methods finish rows of owners (a progress bar).

    Returns
    -------
    numpy.ndarray
        ``int32`` owners of shape ``(L + 1, N)``, every entry in ``[0, parts)``.

    Raises
    ------
    DasknnError
        For an unknown method, a bad ``parts`` or ``epsilon``, or layers that are not square and alike.
    """
    ws = _as_layers(layers)
    n = ws[0].shape[0]
    k = _check_parts(parts, n)
    eps = _check_epsilon(epsilon)
    if method not in METHODS:
        raise DasknnError(f"unknown partition method {method!r}; choose one of {', '.join(METHODS)}")
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, (int, np.integer)) or threads < 1):
        raise DasknnError(f"threads must be a positive integer, got {threads!r}")
    if sweeps is not None and (isinstance(sweeps, bool) or not isinstance(sweeps, (int, np.integer)) or sweeps < 0):
        raise DasknnError(f"sweeps must be a non-negative integer, got {sweeps!r}")
    if preset not in PRESETS:
        raise DasknnError(f"unknown Mt-KaHyPar preset {preset!r}; choose one of {', '.join(PRESETS)}")
    seed = int(seed)
    if k == 1:
        return np.zeros((len(ws) + 1, n), dtype=np.int32)
    if method == "block":
        owners = _block(ws, k)
    elif method == "random":
        owners = _random(ws, k, seed)
    else:
        _mtk(threads)
        if method == "hypergraph-shared":
            owners = _shared(ws, k, eps, seed, preset)
        elif method == "fast":
            owners = fast(ws, k, eps, seed, 1 if sweeps is None else int(sweeps), preset, progress)
        elif method == "fast-segments":
            owners = fast_segments(ws, k, eps, seed, preset=preset)
        else:
            # Measured on the challenge network: the forward pass alone beats the shared owner by about a
            # third in volume in less time; each sweep costs about as much as the forward pass for ~0.5 %.
            default_sweeps = 2 if method == "hypergraph-layered" else 0
            # hypergraph: the lean rows (hubs, twins, no community detection); measured: the same volume on the
            # challenge network, about a sixth of the CPU time on a generated 65536-wide network
            owners = _layered(ws, k, eps, seed, default_sweeps if sweeps is None else int(sweeps), preset,
                              lean=method == "hypergraph", progress=progress)
            if method == "hypergraph" and isinstance(ws, list):
                # (not for layers read on demand: the shared owner's hypergraph holds every layer's nets at once)
                # some networks keep one locality through all layers (a shared owner per index then sends
                # far less: 0.003 of random against the layered pass's 0.22 on the training benchmark's
                # network); keep it where it is smaller and still balances every layer
                shared = _shared(ws, k, eps, seed, preset)
                if (layer_imbalance(ws, shared, parts=k).max() <= eps + 1e-12
                        and layer_volumes(ws, shared, parts=k).sum() < layer_volumes(ws, owners, parts=k).sum()):
                    owners = shared
    return validate_partition(owners, len(ws), n, k)
