"""dask.array inputs whose chunks are CuPy arrays (issue 17): on the workers each chunk is copied to the host
(``.get()``) where the image-loading task makes the kernels' block, and on to the device with ``backend="gpu"``.

Here without a GPU, a stand-in array type stands for CuPy's: its module is named like CuPy's (the loading task
recognises CuPy by its module, ``cupy`` or ``cupyx``) and, like CuPy's, it is on the host only through ``get()``.
Its module is uploaded to the workers (``Client.upload_file``), as CuPy is installed on a GPU machine's.
The same checks with real CuPy chunks run behind the ``gpu`` marker.
"""

from __future__ import annotations

import numpy as np
import pytest

import dasknn

STANDIN_MODULE = "cupy_standin"


STANDIN = """
class DeviceRows:
    # rows on a device: sliced there, on the host only through get() (as cupy.ndarray and cupyx sparse)
    def __init__(self, host):
        self._host = host
        self.shape = host.shape
        self.ndim = host.ndim
        self.dtype = host.dtype

    def __getitem__(self, key):
        return DeviceRows(self._host[key])

    def __array__(self, *args, **kwargs):
        raise TypeError("a device array is not implicitly a NumPy array: use get()")

    def get(self):
        return self._host
"""


@pytest.fixture
def device_rows(tmp_path, monkeypatch, client):
    # a module named like CuPy's, importable here and (uploaded) on the workers, as CuPy is on a GPU machine's
    path = tmp_path / f"{STANDIN_MODULE}.py"
    path.write_text(STANDIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    client.upload_file(str(path))
    module = __import__(STANDIN_MODULE)
    return module.DeviceRows


@pytest.mark.cluster
@pytest.mark.parametrize("sparse", [False, True])
def test_dask_array_of_device_chunks_matches_the_truth(sparse, device_rows, slice_store, slice_images, slice_truth,
                                                       client):
    import dask.array as da
    from distributed import futures_of

    host = slice_images if sparse else slice_images.toarray()
    images = da.from_array(host, chunks=(250, 1024), asarray=False).map_blocks(
        device_rows, dtype=host.dtype, meta=np.empty((0, 0), dtype=host.dtype))
    made = client.persist(images)
    held = client.gather([client.submit(lambda chunk: type(chunk).__module__, f, pure=False) for f in futures_of(made)])
    assert set(held) == {STANDIN_MODULE}  # the workers hold device rows, which NumPy cannot read without get()
    result = dasknn.infer(slice_store, made, client, truth=slice_truth, mode="data")
    np.testing.assert_array_equal(result.categories, slice_truth)
    assert result.matches_truth and result.images == 1000


# --- on a GPU ------------------------------------------------------------------------------------------------


@pytest.mark.cluster
@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["cpu", "gpu"])
@pytest.mark.parametrize("sparse", [False, True])
def test_dask_array_of_cupy_chunks_matches_the_truth(backend, sparse, slice_store, slice_images, slice_truth, client):
    import cupy
    import cupyx.scipy.sparse as csp
    import dask.array as da

    host = slice_images if sparse else slice_images.toarray()
    to_device = (lambda b: csp.csr_matrix(b)) if sparse else cupy.asarray
    images = da.from_array(host, chunks=(250, 1024), asarray=False).map_blocks(
        to_device, dtype=host.dtype, meta=csp.csr_matrix((0, 0), dtype=host.dtype) if sparse
        else cupy.empty((0, 0), dtype=host.dtype))
    result = dasknn.infer(slice_store, images, client, truth=slice_truth, mode="data", backend=backend)
    np.testing.assert_array_equal(result.categories, slice_truth)
    assert result.matches_truth
    kept = dasknn.infer(slice_store, images, client, mode="data", backend=backend, keep_activations=True)
    np.testing.assert_array_equal(np.flatnonzero(kept.activations.sum(axis=1).compute()), slice_truth)
