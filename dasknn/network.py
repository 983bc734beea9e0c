"""What a sparse network is, independent of where it is stored.

Layers are kept in the challenge's convention, ``Y_next = h(Y @ W + b)`` with one row per image: entry
``W[i, j]`` connects input neuron ``i`` to output neuron ``j``. In memory a layer is a SciPy matrix in CSC form,
because a column of ``W`` (everything one output neuron needs) is the unit that partitions, stores and
computes; its arrays are exactly what the Zarr store holds.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from .errors import DasknnError

#: The GraphChallenge bias for each published width.
CHALLENGE_BIAS: dict[int, float] = {1024: -0.3, 4096: -0.35, 16384: -0.4, 65536: -0.45}
#: The GraphChallenge clamp.
CHALLENGE_YMAX: float = 32.0


def challenge_bias(neurons: int) -> float:
    """Return the GraphChallenge bias for a network of ``neurons`` per layer.

    Raises
    ------
    DasknnError
        If the width is not one of the published ones.
    """
    try:
        return CHALLENGE_BIAS[neurons]
    except KeyError:
        known = ", ".join(str(n) for n in CHALLENGE_BIAS)
        raise DasknnError(f"no GraphChallenge bias is defined for {neurons} neurons (known: {known}); pass --bias") from None


@dataclass
class Network:
    """An in-memory sparse network: one ``N x N`` CSC matrix per layer, plus the layer rule's constants.

    Attributes
    ----------
    layers
        ``W_1 ... W_L`` in the challenge's orientation (rows are inputs, columns are outputs), CSC format.
    bias
        Added to every nonzero of ``Y @ W``.
    ymax
        Upper clamp of the activations.
    source
        Where the network came from (a path, or a generator's description).
    """

    layers: list[sp.csc_matrix]
    bias: float
    ymax: float = CHALLENGE_YMAX
    source: str = ""

    def __post_init__(self) -> None:
        if not self.layers:
            raise DasknnError("a network needs at least one layer")
        shape = self.layers[0].shape
        if shape[0] != shape[1]:
            raise DasknnError(f"layer 1 is {shape[0]} x {shape[1]}; layers must be square")
        for k, w in enumerate(self.layers, start=1):
            if w.shape != shape:
                raise DasknnError(f"layer {k} is {w.shape[0]} x {w.shape[1]}, layer 1 is {shape[0]} x {shape[1]}")

    @property
    def neurons(self) -> int:
        """Neurons per layer."""
        return int(self.layers[0].shape[0])

    @property
    def depth(self) -> int:
        """Number of layers."""
        return len(self.layers)

    @property
    def edges(self) -> int:
        """Nonzeros over all layers (the challenge's edge count)."""
        return int(sum(w.nnz for w in self.layers))

    def __iter__(self) -> Iterator[sp.csc_matrix]:
        return iter(self.layers)


def as_csc_layer(w: sp.spmatrix | sp.sparray, dtype: np.dtype | type | None = None) -> sp.csc_matrix:
    """Return ``w`` as a canonical CSC matrix (sorted indices, no duplicates, int32 indices)."""
    m = sp.csc_matrix(w, dtype=dtype)
    m.sum_duplicates()
    m.sort_indices()
    if m.indices.dtype != np.int32 and m.shape[0] < 2**31:
        m.indices = m.indices.astype(np.int32)
    m.indptr = m.indptr.astype(np.int64)
    return m


