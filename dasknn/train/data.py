"""Training data: the digits (scikit-learn), an ``.npz`` or arrays; the seeded hold-out split and batch schedule."""

from __future__ import annotations

import numpy as np

from ..errors import DasknnError
from ..kernels import rows_on_host


def load_digits_1024() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's 8x8 digits (1,797 images), each pixel repeated 4 x 4 to 32 x 32 = 1024 inputs, in [0, 1]."""
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        raise DasknnError("--data digits needs scikit-learn: pip install scikit-learn") from None
    d = load_digits()
    imgs = np.kron(d.images, np.ones((1, 4, 4))) / 16.0
    return imgs.reshape(len(imgs), 1024), d.target.astype(np.int64)


def _on_host(a):
    # a NumPy array of whatever holds the data: a dask collection is computed (the batch schedule draws rows at
    # random, so training holds its images), a scipy.sparse matrix made dense, a CuPy array copied to the host
    if hasattr(a, "__dask_graph__"):
        a = a.compute()
    a = rows_on_host(a)
    if hasattr(a, "toarray"):
        a = a.toarray()
    return np.asarray(a)


def load_data(data, neurons: int) -> tuple[np.ndarray, np.ndarray]:
    """``(x, y)``: images (count x neurons, float64) and integer labels, from ``"digits"``, an ``.npz`` with arrays
    ``x`` and ``y``, or a pair of arrays: NumPy, ``scipy.sparse``, CuPy or ``dask.array`` (computed once: the
    batch schedule draws images at random, so the training images are held where the schedule runs)."""
    if isinstance(data, tuple):
        x, y = (_on_host(a) for a in data)
    elif str(data) == "digits":
        x, y = load_digits_1024()
    else:
        try:
            with np.load(data, allow_pickle=False) as f:
                x, y = f["x"], f["y"]
        except (OSError, KeyError, ValueError) as e:
            raise DasknnError(f"cannot read training data: an .npz with arrays x and y is needed ({e})", data) from None
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y).astype(np.int64)
    if x.ndim != 2 or x.shape[1] != neurons:
        raise DasknnError(f"the training images have {x.shape[-1]} pixels, the network {neurons} neurons")
    if y.shape != (x.shape[0],) or y.min() < 0:
        raise DasknnError("the labels must be one non-negative integer per image")
    return x, y


def split(x: np.ndarray, y: np.ndarray, test_share: float, seed: int):
    """A seeded hold-out split: ``(x_train, y_train, x_test, y_test)``."""
    perm = np.random.default_rng([seed, 7]).permutation(len(y))
    n_test = int(round(test_share * len(y)))
    te, trn = perm[:n_test], perm[n_test:]
    return x[trn], y[trn], x[te], y[te]


def schedule(n_train: int, batch: int, epochs: int, seed: int) -> list[np.ndarray]:
    """Every step's batch (indices into the training set): a seeded permutation per epoch, so a resumed run
    sees exactly the batches an uninterrupted one would."""
    steps = []
    for e in range(epochs):
        perm = np.random.default_rng([seed, 11, e]).permutation(n_train)
        steps += [np.sort(perm[i:i + batch]) for i in range(0, n_train, batch)]
    return steps

