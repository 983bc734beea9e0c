"""dasknn: sparse deep neural networks on Dask, out of core, on CPUs and GPUs.

The stages, one module each: :mod:`~dasknn.io` (GraphChallenge files), :mod:`~dasknn.store` (the Zarr layer
store), :mod:`~dasknn.generate` (challenge-like networks), :mod:`~dasknn.reference` (the SciPy ground truth),
:mod:`~dasknn.engine` (Dask execution) and :mod:`~dasknn.cli` (the ``dasknn`` command).

Importing dasknn imports neither Dask's cluster machinery nor CuPy; they load when first used.
"""

from __future__ import annotations

__version__ = "0.1.0"

from .api import infer
from .errors import DasknnError
from .network import Network


def open_store(*args, **kwargs):
    """Open a dasknn Zarr store; see :func:`dasknn.store.open_store`."""
    from .store import open_store as _open

    return _open(*args, **kwargs)


__all__ = ["DasknnError", "Network", "__version__", "infer", "open_store"]
