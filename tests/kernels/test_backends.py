"""The backend contract's shared checks, the same for every backend (zarr-python's style: one suite, a subclass
per backend): the CPU's, the toy backend of ``toy_backend.py`` (NumPy behind a wrapper type, SciPy kernels, only
in the tests), and the GPU's on a machine with a device.

Each check hands the backend its own arrays and reads the results back through it: the layer step (received rows,
some columns, into ``out``), the layer loop dropping dead images, keeping columns, alive masks, messages, the
training kernels against a dense reference, the engine's segment task and run space, and a few training steps in
one process, which give the CPU backend's losses. A backend that passes them unchanged is one room.
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from dasknn import kernels, reference
from dasknn import train as tr
from dasknn.engine import tasks
from dasknn.engine.worker_run import InferenceRun, InferenceRunSpec
from dasknn.kernels.backend import Backend, BackendUnsupported
from dasknn.kernels.folds import Folds
from examples import random_activations, random_layer

BIAS, YMAX = -0.3, 4.0


@pytest.fixture(scope="module", autouse=True)
def toy_registered():
    # the toy backend, for this module's tests only (its module is tests/support/toy_backend.py)
    kernels.register_backend("toy", "toy_backend", arrays="toy_backend")
    yield
    kernels.unregister_backend("toy")


def reference_step(x: np.ndarray, layer, bias: float = BIAS, ymax: float = YMAX) -> np.ndarray:
    """The SciPy ground truth of one layer on ``x`` (inputs x images), as ``outputs x images``."""
    indptr, indices, data = layer
    w = sp.csc_matrix((data, indices, indptr), shape=(x.shape[0], indptr.size - 1))
    return reference.layer_step(sp.csr_matrix(x.T), w, bias, ymax).toarray().T


def train_small(backend: str, optimizer: str) -> tr.TrainResult:
    """Four steps in one process on a 48-neuron, 3-layer network."""
    rng = np.random.default_rng(1)
    layers = [sp.random(48, 48, density=0.25, format="csc", random_state=rng) for _ in range(3)]
    x = rng.random((40, 48)) * (rng.random((40, 48)) < 0.5)
    y = rng.integers(0, 5, 40)
    return tr.train(layers, (x, y), epochs=2, batch=16, lr=0.05, optimizer=optimizer, mode="single", seed=5,
                    max_steps=4, bias=-0.05, ymax=1.5, backend=backend)


@pytest.fixture(scope="module")
def cpu_runs() -> dict[str, tr.TrainResult]:
    return {opt: train_small("cpu", opt) for opt in ("sgd", "adam")}


class BackendChecks:
    """The checks every backend passes. A subclass names its backend and what it cannot do."""

    name: str
    #: whether its layer step computes some columns only (else it says it cannot, in one error)
    columns: bool = True
    #: whether it packs messages in their smallest form (else as dense rows)
    compacts: bool = True
    #: how close its training losses and weights come to the CPU backend's
    training_rtol: float = 1e-12

    @pytest.fixture
    def be(self) -> Backend:
        return kernels.backend_named(self.name)

    def test_is_found_by_name_and_by_its_arrays(self, be):
        assert isinstance(be, Backend) and be.name == self.name and be.missing() is None
        a = be.to_device(np.arange(6.0).reshape(2, 3))
        assert kernels.backend_of(a) is be and type(a) in be.array_types()
        assert kernels.array_module(a) is be.array_module()
        np.testing.assert_array_equal(be.to_host(a), np.arange(6.0).reshape(2, 3))
        be.to_device(a)[0, 0] = 42.0  # already there: not copied
        assert be.to_host(a)[0, 0] == 42.0
        np.testing.assert_array_equal(kernels.to_host(kernels.to_device(np.ones(3), self.name)), np.ones(3))
        e = kernels.empty_like_kind(a, (4, 5))
        assert kernels.backend_of(e) is be and e.shape == (4, 5) and e.dtype == np.float64

    @pytest.mark.parametrize("dtype", [np.float32, np.float64])
    def test_layer_step_reads_received_rows_into_out_and_by_columns(self, be, dtype):
        own, received, n_out, images = 60, 20, 70, 150
        layer = random_layer(own + received, n_out, seed=3, dtype=dtype)
        x = random_activations(own + received, images, seed=3, dtype=dtype)
        want = reference_step(x, layer)
        dev_layer = tuple(be.to_device(a) for a in layer)
        yt, extra = be.to_device(np.ascontiguousarray(x[:own])), be.to_device(np.ascontiguousarray(x[own:]))
        got = kernels.layer_step(yt, *dev_layer, BIAS, YMAX, extra=extra)
        assert kernels.backend_of(got) is be
        np.testing.assert_array_equal(be.to_host(got), want)
        out = be.empty((n_out, images), dtype)
        assert be.layer_step(yt, *dev_layer, BIAS, YMAX, extra, None, out) is out
        np.testing.assert_array_equal(be.to_host(out), want)
        first = np.arange(0, n_out, 3)
        if not self.columns:
            with pytest.raises(BackendUnsupported, match=f"the {self.name} backend cannot"):
                be.layer_step(yt, *dev_layer, BIAS, YMAX, extra, first, out)
            return
        out = be.to_device(np.full((n_out, images), -1.0, dtype=dtype))
        be.layer_step(yt, *dev_layer, BIAS, YMAX, extra, first, out)
        np.testing.assert_array_equal(be.to_host(out)[first], want[first])
        assert (be.to_host(out)[np.setdiff1d(np.arange(n_out), first)] == -1).all()  # the other rows untouched
        be.layer_step(yt, *dev_layer, BIAS, YMAX, extra, np.setdiff1d(np.arange(n_out), first), out)
        np.testing.assert_array_equal(be.to_host(out), want)

    @pytest.mark.parametrize("compact_every", [None, 1, 3])
    def test_layer_loop_drops_dead_images(self, be, compact_every):
        n, images = 64, 200
        layers = [random_layer(n, n, seed=10 + k, dtype=np.float64) for k in range(6)]
        x = random_activations(n, images, seed=4, dtype=np.float64)
        want, ids = x, np.arange(images)
        for layer in layers:
            want = reference_step(want, layer)
            keep = want.any(axis=0)
            want, ids = want[:, keep], ids[keep]
        assert 0 < ids.size < images  # some images die, some live
        got, got_ids = kernels.run_layers(be.to_device(x), [tuple(be.to_device(a) for a in w) for w in layers],
                                          BIAS, YMAX, np.arange(images), compact_every)
        assert isinstance(got_ids, np.ndarray)
        np.testing.assert_array_equal(got_ids, ids)
        np.testing.assert_array_equal(be.to_host(got), want)

    @pytest.mark.parametrize("dtype", [np.float32, np.float64])
    def test_layer_loop_folds_equal_images_and_expands_them_exactly(self, be, dtype):
        # half the images repeat others (equal from the first layer on); the loop computes each distinct vector once
        # and the record gives every image back with its representative's activations, bit for bit
        n, images = 64, 300
        layers = [random_layer(n, n, seed=20 + k, dtype=dtype) for k in range(7)]
        x = random_activations(n, images, seed=8, dtype=dtype)
        x[:, 150:] = x[:, np.random.default_rng(8).integers(0, 150, images - 150)]
        want, ids = x, np.arange(images)
        alive = []
        for layer in layers:
            want = reference_step(want, layer)
            keep = want.any(axis=0)
            want, ids = want[:, keep], ids[keep]
            alive.append(ids.size)
        got, got_ids, folds = kernels.run_layers(be.to_device(x), [tuple(be.to_device(a) for a in w) for w in layers],
                                                 BIAS, YMAX, np.arange(images), folds=Folds())
        assert folds.merged.size > 0 and got.shape[1] < ids.size  # folded: fewer columns than alive images
        images_back, columns = folds.expand(got_ids)
        order = np.argsort(images_back)
        np.testing.assert_array_equal(images_back[order], ids)
        np.testing.assert_array_equal(be.to_host(got)[:, columns[order]], want)
        # one count a layer (a loop that does not fold itself counts per run of layers between its looks)
        assert folds.alive.size == folds.columns.size == len(layers) and folds.alive[-1] == alive[-1]
        assert folds.columns[0] == images and folds.columns[-1] < alive[-1]
        off, off_ids, counted = kernels.run_layers(be.to_device(x), [tuple(be.to_device(a) for a in w) for w in layers],
                                                   BIAS, YMAX, np.arange(images), folds=Folds(enabled=False))
        assert counted.merged.size == 0 and counted.alive[-1] == alive[-1] and counted.columns[-1] >= alive[-1]
        np.testing.assert_array_equal(np.sort(off_ids), ids)

    def test_keep_columns_and_alive(self, be):
        a = random_activations(30, 50, seed=5, dtype=np.float32)
        keep = np.random.default_rng(5).random(50) < 0.5
        want = a[:, keep]
        got = kernels.keep_columns(be.to_device(a.copy()), keep)  # the array given is spent
        np.testing.assert_array_equal(be.to_host(got), want)
        mask = kernels.alive(be.to_device(a))
        assert isinstance(mask, np.ndarray) and mask.dtype == bool
        np.testing.assert_array_equal(mask, a.any(axis=0))

    @pytest.mark.parametrize("density,constant", [(0.0, False), (0.05, False), (0.05, True), (0.9, False)])
    @pytest.mark.parametrize("compact", [True, False])
    def test_messages_round_trip(self, be, density, constant, compact):
        rng = np.random.default_rng(6)
        block = (rng.random((40, 33)) * (rng.random((40, 33)) < density)).astype(np.float32)
        if constant:
            block[block != 0] = 4.0
        rows, cols = np.array([0, 3, 4, 17, 39]), np.arange(0, 33, 2)
        for c in (None, cols):
            want = block[rows] if c is None else block[np.ix_(rows, c)]
            message = kernels.pack_rows(be.to_device(block), rows, c, compact)
            out = be.empty(want.shape, np.float32)
            kernels.unpack_rows(message, out)
            np.testing.assert_array_equal(be.to_host(out), want)
            dense = kernels.message_bytes(kernels.pack_rows(be.to_device(block), rows, c, False))
            assert kernels.message_bytes(message) <= dense
            if self.compacts and compact and density < 0.1:
                assert int(message[0][2]) != kernels.DENSE and kernels.message_bytes(message) < dense

    def test_training_kernels_match_a_dense_reference(self, be):
        rng = np.random.default_rng(7)
        w = sp.random(30, 24, density=0.3, format="csc", random_state=7)
        w.data = rng.standard_normal(w.nnz)
        xin = rng.standard_normal((30, 9)) * (rng.random((30, 9)) < 0.7)
        delta = rng.standard_normal((24, 9))
        pattern = (be.to_device(w.indptr.astype(np.int64)), be.to_device(w.indices.astype(np.int32)))
        grad = kernels.weight_grad(*pattern, be.to_device(xin), be.to_device(delta))
        cols = np.repeat(np.arange(24), np.diff(w.indptr))
        np.testing.assert_allclose(be.to_host(grad), (xin @ delta.T)[w.indices, cols], rtol=1e-12, atol=1e-12)
        down = kernels.back_input(*pattern, be.to_device(w.data), be.to_device(delta), 30)
        np.testing.assert_allclose(be.to_host(down), w @ delta, rtol=1e-12, atol=1e-12)

    def test_activations_of_rows_and_kept_layers(self, be):
        rows = sp.random(12, 40, density=0.2, format="csr", random_state=8, dtype=np.float64)
        neurons = np.array([5, 1, 30])
        got = be.activations_of_rows(rows, np.float32, neurons)
        np.testing.assert_array_equal(be.to_host(got), rows.toarray()[:, neurons].T.astype(np.float32))
        layers = [random_layer(20, 20, seed=k, dtype=np.float32) for k in range(3)]
        for _ in range(2):  # a second chunk reads the layers kept by the first
            kept = list(be.keep_on_device(("net", "float32"), 1, iter(layers)))
            for got_layer, layer in zip(kept, layers, strict=True):
                for a, b in zip(got_layer, layer, strict=True):
                    np.testing.assert_array_equal(kernels.to_host(a), b)
        be.release()

    def test_the_engines_segment_task_and_run_space(self, be):
        n, images = 64, 120
        layers = [random_layer(n, n, seed=20 + k, dtype=np.float32) for k in range(4)]
        x = random_activations(n, images, seed=9, dtype=np.float32)
        want = reference.infer([sp.csc_matrix((d, i, p), shape=(n, n)) for p, i, d in layers],
                               sp.csr_matrix(x.T), BIAS, YMAX, np.float32).toarray()
        weights = [tuple(be.to_device(a) for a in layer) for layer in layers]
        result = tasks.run_segment("backend-check", weights, be.to_device(x), 100, 1, 4, BIAS, YMAX, True,
                                   rows=(100, images))
        np.testing.assert_array_equal(result.ids, 100 + np.flatnonzero(want.any(axis=1)))
        np.testing.assert_array_equal(result.activations, want)
        run = InferenceRun(InferenceRunSpec("backend-check"))
        like = be.to_device(x)
        spaces = [run.space(0, 0, "block", like, (10, images), 2) for _ in range(3)]
        assert all(kernels.backend_of(s) is be and s.shape == (10, images) for s in spaces)
        run.close()

    @pytest.mark.parametrize("optimizer", ["sgd", "adam"])
    def test_training_steps_give_the_cpu_backends_losses(self, be, optimizer, cpu_runs, monkeypatch):
        calls = []

        def counted(name):
            kernel = getattr(be, name)  # this backend's (bound, or a static function)
            return staticmethod(lambda *args, **kwargs: calls.append(name) or kernel(*args, **kwargs))

        for name in ("layer_step", "weight_grad", "back_input"):
            monkeypatch.setattr(type(be), name, counted(name))
        run = train_small(self.name, optimizer)
        assert {"layer_step", "weight_grad", "back_input"} <= set(calls)  # the steps ran on this backend
        cpu = cpu_runs[optimizer]
        assert run.steps == cpu.steps == 4
        np.testing.assert_allclose(run.losses, cpu.losses, rtol=self.training_rtol, atol=0)
        for a, b in zip(run.model.params, cpu.model.params, strict=True):
            assert isinstance(a, np.ndarray)
            np.testing.assert_allclose(a, b, rtol=self.training_rtol, atol=self.training_rtol)


class TestCpuBackend(BackendChecks):
    name = "cpu"


class TestToyBackend(BackendChecks):
    name = "toy"

    def test_its_kernels_are_its_own(self, be):
        # the toy's arrays are not NumPy's: the CPU's Numba kernels refuse them, so the checks above ran the toy's
        a = be.to_device(np.ones((4, 3)))
        with pytest.raises(TypeError):
            np.asarray(a)
        with pytest.raises(TypeError):
            kernels.layer_step_numpy(a, np.array([0, 1]), np.array([0], np.int32), np.ones(1), 0.0, 1.0)


@pytest.mark.gpu
class TestGpuBackend(BackendChecks):
    name = "gpu"
    columns = False  # the CUDA kernels compute every output of a block
    compacts = False  # device blocks are sent as dense rows
    training_rtol = 1e-5  # CuPy's exp and log round their last bits their own way (as tests/train/test_train.py allows)


def test_a_backend_is_one_registration(monkeypatch):
    # registered by name, found by its arrays' module, forgotten again; no CuPy for a NumPy array
    import sys

    assert kernels.backend_names()[:2] == ("cpu", "gpu") and "toy" in kernels.backend_names()
    assert kernels.backend_of(np.zeros(1)).name == "cpu" and "cupy" not in sys.modules
    with pytest.raises(ValueError, match="no backend named 'tpu'"):
        kernels.backend_named("tpu")
    with pytest.raises(TypeError, match="no backend runs on arrays of type builtins.dict"):
        kernels.backend_of({})
    kernels.register_backend("toy2", "toy_backend", arrays="toy_backend_nowhere")
    assert kernels.backend_named("toy2") is kernels.backend_named("toy")
    kernels.unregister_backend("toy2")
    assert "toy2" not in kernels.backend_names()
