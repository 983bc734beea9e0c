"""Importing dense weights (``.npz``, or a PyTorch ``state_dict``) pruned by magnitude into a dasknn store."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import scipy.sparse as sp

from ..errors import DasknnError
from ..network import Network


def _torch_weights(path) -> list[np.ndarray]:
    """The 2-D tensors of a PyTorch ``state_dict`` file, in order, transposed to the challenge orientation."""
    try:
        import torch
    except ImportError:
        raise DasknnError("reading a .pt file needs PyTorch (pip install torch); or save the weights as an .npz "
                          "(numpy.savez)", path) from None
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        raise DasknnError(f"cannot read the weights as a PyTorch state_dict ({type(e).__name__})", path) from None
    if not isinstance(state, dict):
        raise DasknnError(f"a .pt file must hold a state_dict (a dict of tensors), not a {type(state).__name__}", path)
    # nn.Linear keeps out x in (y = x @ W.T); a dasknn layer is in x out (Y @ W). 1-D tensors (biases) are
    # skipped: a dasknn network has one scalar bias (--bias).
    return [t.detach().to(torch.float64).numpy().T.copy() for t in state.values()
            if isinstance(t, torch.Tensor) and t.ndim == 2]


def import_weights(model_npz, out, sparsity: float | None = None, *, bias: float = 0.0, overwrite: bool = False) -> Path:
    """Dense layer weights pruned by magnitude to ``sparsity`` (the share of zeros; per layer, ties broken by
    position), or with their zeros kept when ``sparsity`` is None, written as a dasknn store.

    ``model_npz`` is an ``.npz`` of square arrays in the order stored (challenge orientation, ``Y @ W``), or,
    where PyTorch is installed, a ``.pt``/``.pth`` ``state_dict`` whose 2-D tensors (``nn.Linear`` weights,
    ``out x in``, transposed on reading) are the layers in order."""
    if Path(model_npz).suffix in (".pt", ".pth"):
        arrays = _torch_weights(model_npz)
    else:
        try:
            with np.load(model_npz, allow_pickle=False) as f:
                arrays = [np.asarray(f[name], dtype=np.float64) for name in f.files]
        except (OSError, ValueError) as e:
            raise DasknnError(f"cannot read the weights ({e})", model_npz) from None
    if not arrays:
        raise DasknnError("the file holds no 2-D weight arrays", model_npz)
    if sparsity is not None and not 0 <= sparsity < 1:
        raise DasknnError(f"--sparsity must be in [0, 1), not {sparsity}")
    layers = []
    for k, a in enumerate(arrays, start=1):
        if a.ndim != 2 or a.shape[0] != a.shape[1] or a.shape != arrays[0].shape:
            raise DasknnError(f"array {k} is {a.shape}; the layers must be square and of one size", model_npz)
        if sparsity is not None:
            keep = a.size - int(round(sparsity * a.size))
            order = np.argsort(-np.abs(a), axis=None, kind="stable")[:keep]
            mask = np.zeros(a.size, dtype=bool)
            mask[order] = True
            a = np.where(mask.reshape(a.shape), a, 0.0)
        layers.append(sp.csc_matrix(a))
    from ..store import write_network  # (here: the store imports Zarr, which the CLI's start need not load)

    return write_network(out, Network(layers, bias, source=f"import-weights {Path(model_npz).name}"),
                         overwrite=overwrite)

