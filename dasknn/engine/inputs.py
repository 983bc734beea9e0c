"""Where a batch's images come from: a store, an array scattered to the workers, or a dask.array's chunks.

Each kind has a frozen *spec* that travels in the image-loading tasks; :func:`load_images` (on a worker) turns
a chunk of any kind into the kernels' dense transposed block. The client-side :class:`InputSource` says which
spec, which data (a future per chunk, one future for the whole batch, or none) and, for dask arrays, the chunk
bounds the array's row chunks fix.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import kernels
from ..store import open_inputs


@dataclass(frozen=True)
class StoredRows:
    """Rows read from the inputs of the store at ``path`` (each worker reads its chunk's rows)."""

    path: str

    def rows(self, data, start: int, stop: int):
        """Images ``start:stop`` (``data`` is unused: the worker reads the store)."""
        return open_inputs(self.path).rows(start, stop)


@dataclass(frozen=True)
class ScatteredRows:
    """Rows sliced from the whole batch (a NumPy array or CSR matrix) scattered to the workers once."""

    def rows(self, data, start: int, stop: int):
        """Images ``start:stop`` of the scattered batch ``data``."""
        return data[start:stop]


@dataclass(frozen=True)
class ChunkRows:
    """One row chunk of a persisted dask.array: the chunk holds exactly the images ``start:stop``."""

    def rows(self, data, start: int, stop: int):
        """The chunk ``data`` itself, checked against the bounds it was given."""
        if data.shape[0] != stop - start:
            raise ValueError(f"a dask.array chunk holds {data.shape[0]} rows, its bounds say {stop - start}")
        return data


#: What an image-loading task is told about its rows.
RowsSpec = StoredRows | ScatteredRows | ChunkRows


@dataclass
class InputSource:
    """A batch of images as the engine loads it: a spec, its data, its size and (dask arrays) its chunk bounds.

    Attributes
    ----------
    spec
        How a worker gets a chunk's rows.
    images, neurons
        The batch's shape (rows are images).
    data
        None (a store), a future of the whole batch (scattered), or one future per row chunk (a dask.array).
    bounds
        The chunk bounds the data fixes (a dask.array's row chunks), or None where the engine chooses them.
    label
        What the inputs are, for messages and a results store's run description.
    """

    spec: RowsSpec
    images: int
    neurons: int
    data: object = None
    bounds: list[tuple[int, int]] | None = None
    label: str = ""

    @property
    def path(self) -> str | None:
        """The inputs store, where the images are stored (the cost model's probe reads a sample from it)."""
        return self.spec.path if isinstance(self.spec, StoredRows) else None

    def data_for(self, chunk: int):
        """What the loading task of chunk ``chunk`` takes as its data."""
        return self.data[chunk] if isinstance(self.data, list) else self.data


def stored_source(path: str) -> InputSource:
    """The inputs of the store at ``path``."""
    batch = open_inputs(path)
    return InputSource(StoredRows(path), batch.images, batch.neurons, label=path)


def load_images(spec: RowsSpec, data, start: int, stop: int, rows: np.ndarray | None, dtype: str, backend: str):
    """On a worker: images ``start:stop`` as the kernels' dense ``neurons x images`` block (only the neurons
    ``rows`` in model mode), on the backend's device."""
    return kernels.backend_named(backend).activations_of_rows(spec.rows(data, start, stop), np.dtype(dtype), rows)
