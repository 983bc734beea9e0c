"""Made-up inputs the tests share: kernel layers and activations, and small training networks with their data."""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

#: Neurons and classes of the small training networks.
N, C = 48, 5


def random_layer(n_in: int, n_out: int, seed: int, dtype) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A CSC layer with 0 to 9 entries per output (some empty), weights of both signs, some large (clamped)."""
    rng = np.random.default_rng(seed)
    counts = rng.integers(0, 10, size=n_out)
    counts[:2] = (0, 32 if n_in >= 32 else n_in)  # an empty output and a full-width one
    indptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    indices = np.concatenate([np.sort(rng.choice(n_in, size=c, replace=False)) for c in counts]).astype(np.int32)
    data = rng.normal(0.2, 1.0, size=indices.size).astype(dtype)
    data[rng.random(data.size) < 0.1] *= 40  # sums beyond ymax
    return indptr, indices, data


def random_activations(n_in: int, nb: int, seed: int, dtype) -> np.ndarray:
    rng = np.random.default_rng(seed + 1)
    yt = (rng.random((n_in, nb)) * 3).astype(dtype)
    yt[rng.random((n_in, nb)) < 0.4] = 0
    yt[:, ::7] = 0  # dead images stay dead
    return yt


def random_layers(depth=3, n=N, density=0.25, seed=1):
    rng = np.random.default_rng(seed)
    out = []
    for k in range(depth):
        m = sp.random(n, n, density=density, format="csc", random_state=rng, dtype=np.float64)
        m = m.tocsc()
        m.data[:] = 1.0
        out.append(m)
    return out


def toy_data(count=40, n=N, seed=2):
    rng = np.random.default_rng(seed)
    x = rng.random((count, n)) * (rng.random((count, n)) < 0.5)
    y = rng.integers(0, C, count)
    return x, y


def rel(a, b):
    """The largest difference between ``a`` and ``b`` relative to the largest magnitude in ``b``."""
    return np.abs(a - b).max() / max(np.abs(b).max(), 1e-300)
