"""How an inference runs: every option of :func:`dasknn.engine.infer` in one frozen object, checked once."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import DasknnError


@dataclass(frozen=True, eq=False)
class InferenceOptions:
    """How an inference runs (what it runs on, and where, are :func:`~dasknn.engine.infer`'s own arguments).

    Parameters
    ----------
    mode
        ``"data"``, ``"model"``, ``"hybrid"`` or ``"pipeline"`` (see :mod:`dasknn.engine`), or ``"auto"``: the
        mode the cost model (:mod:`dasknn.cost`) predicts fastest among those whose share of the weights fits
        (pipeline mode only where data mode cannot hold the weights).
    partition
        For model and hybrid modes: a method of :mod:`dasknn.partition`, a ``.npy`` owners file, or an array.
        A method's partition is computed once and kept in the store (when it is writable) for the next run. It is
        computed on a worker of the cluster, not the client, where a worker has the memory for it
        (:func:`~dasknn.engine.sizing.partition_fits_worker`).
    group_size
        Workers per group in hybrid mode (2 by default where the workers divide evenly); stages per pipeline in
        pipeline mode (all the workers by default: one pipeline).
    images
        Use only the first ``images`` inputs.
    chunks
        Number of image chunks (fixed by a dask.array's row chunks when the inputs are one). By default (:func:`default_chunks`) 2 per worker thread in data mode, so chunks
        pipeline through the layers, 1 per thread of a group in model and hybrid mode, at least 2 per stage of each
        pipeline in pipeline mode; more where a chunk's
        activations would not fit in a worker's memory.
    segment
        Layers per task: in data mode (all by default: no exchange is needed between them), and in model and
        hybrid modes with a transport that delivers the messages itself (``exchange="p2p"``; all by default: a
        part runs a chunk's layers in one task, exchanging as it goes).
    sync_every
        Model mode: layers between alive-mask exchanges that drop dead images.
    dtype
        ``"float64"`` (the default, as on the command line: the published truth is exact in it) or
        ``"float32"`` (faster; may differ from the truth on a few images that sit on the threshold).
    backend
        ``"cpu"`` (NumPy blocks, the Numba kernel) or ``"gpu"`` (CuPy blocks on each worker's GPU, the cuSPARSE
        kernel; run one worker per GPU, e.g. ``dask_cuda.LocalCUDACluster``), or another backend registered in
        :mod:`dasknn.kernels.dispatch` (so in the workers too). The kernels are the backend's of the blocks.
    resident
        Hold every layer (data mode) or every layer's share of a part (model and hybrid modes) in each worker's
        memory (fast when it fits), or stream them from the store as they are needed, at most ``keep_layers``
        at once with the next read ahead (out of core: the weights never all load). Default: resident when a
        worker's weights take at most a quarter of its memory. Model mode out of core streams each part's
        columns from a *part plan* (see ``plan_store``), so each worker reads only its share.
    keep_layers
        Layers a streaming worker holds at once (the one computing and the one being read ahead). Model and
        hybrid modes keep one more for each further chunk of a worker where that fits
        (:func:`~dasknn.engine.sizing.part_stream_keep`), so no chunk reads its part's layers again.
    results
        A Zarr results store: each chunk's categories are written there by its worker as it finishes.
    resume
        Continue the run that wrote ``results``: chunks already written are read back, not recomputed.
    progress
        Called as ``progress(done, total)`` as chunks finish.
    messages
        Model mode: ``"compact"`` boundary messages (a nonzero bitmap and the nonzero values, or one value when
        they are all equal, whichever is smallest) or ``"dense"`` rows.
    activations
        Also write each chunk's final activations (the surviving images' last rows) into ``results``, chunk by
        chunk (read them with :func:`dasknn.store.read_activations`).
    plan_store
        Model and hybrid modes out of core: where the part plan is kept (each part's blocks of every layer,
        indexed into the rows it reads, and its exchange lists), written by the workers once per network and
        partition and reused after. Default: inside the network store, under ``plans/``. On a cluster of
        several machines it must be a folder every worker can reach.
    explain
        Predict every mode's time with the cost model (:mod:`dasknn.cost`), even where ``mode`` is given; the
        predictions and the calibration are in the result.
    keep_activations
        Keep each chunk's final activations on its worker: the result's ``activations`` is then a dask.array of
        them (images x neurons, chunked like the chunks).
    overlap
        Model and hybrid modes: each part computes the outputs other parts read next first and sends them, then
        the rest while they travel, so no part waits for another's whole layer (two tasks per part and layer;
        CPU only; sync layers then at least 2 apart, their masks arriving two layers on). Off by default: on a
        streamed 65,536-wide network it ran slower, its layer reads no longer hidden in the parts' waits
        (BENCHMARKS.md).
    compress
        Images whose activations become equal are computed once, one column for each distinct vector, the others
        folded into it and expanded at the chunk's end (:mod:`dasknn.kernels.folds`; exact: two images equal after
        a layer stay equal). Data and pipeline modes look inside the layer loop; model and hybrid modes at the
        sync layers, where the parts fold the images equal on every part (their messages then carry one column of
        each). On by default; False computes every alive image, for comparison.
    exchange
        Model and hybrid modes: how the parts' boundary messages travel (a transport of
        :mod:`dasknn.runtime.exchange`): ``"tasks"``, each message a task result that Dask moves (a task per part
        and layer, a pick per further recipient), or ``"p2p"``, pushed worker to worker over Dask's comms (a task
        per part and segment of layers; the scheduler out of the exchange), or ``"auto"`` (the default): the one
        the cost model predicts cheaper once the plan says who sends to whom (:func:`dasknn.cost.choose_exchange`:
        the task exchange's tasks through the scheduler against p2p's messages from the workers; the task exchange
        for a GPU backend).
    """

    mode: str = "auto"
    partition: str | np.ndarray = "hypergraph"
    group_size: int | None = None
    images: int | None = None
    chunks: int | None = None
    segment: int | None = None
    sync_every: int = 2
    dtype: str = "float64"
    backend: str = "cpu"
    resident: bool | None = None
    keep_layers: int = 2
    results: str | os.PathLike[str] | None = None
    resume: bool = False
    progress: Callable[[int, int], None] | None = None
    messages: str = "compact"
    explain: bool = False
    activations: bool = False
    plan_store: str | os.PathLike[str] | None = None
    keep_activations: bool = False
    overlap: bool = False
    exchange: str = "auto"
    compress: bool = True

    def check(self) -> None:
        """Refuse, in one line each, what no network and no cluster could run."""
        from ..kernels import backend_names
        from .groups import MODES

        if self.mode not in MODES:
            raise DasknnError(f"--mode must be one of {', '.join(MODES)}, not {self.mode!r}")
        if self.dtype not in ("float32", "float64"):
            raise DasknnError(f"--dtype must be float32 or float64, not {self.dtype}")
        if self.resume and self.keep_activations:
            raise DasknnError("keep_activations needs every chunk computed: it cannot resume a run")
        for option, value in (("--sync-every", self.sync_every), ("--keep-layers", self.keep_layers),
                              ("--chunks", self.chunks), ("--segment", self.segment),
                              ("--group-size", self.group_size)):
            if value is not None and value < 1:
                raise DasknnError(f"{option} must be at least 1, not {value}")
        if self.activations and self.results is None:
            raise DasknnError("--activations needs --results (the store they are written to)")
        if self.resume and self.results is None:
            raise DasknnError("--resume needs --results (the store the earlier run wrote)")
        if not isinstance(self.compress, bool):
            raise DasknnError(f"compress must be True or False (--compress on|off), not {self.compress!r}")
        if self.messages not in ("compact", "dense"):
            raise DasknnError(f"--messages must be compact or dense, not {self.messages!r}")
        if self.backend not in backend_names():
            raise DasknnError(f"backend must be {' or '.join(backend_names())}, not {self.backend!r}")
        from ..runtime.exchange import EXCHANGES

        if self.exchange != "auto" and self.exchange not in EXCHANGES:
            raise DasknnError(f"--exchange must be one of auto, {', '.join(sorted(EXCHANGES))}, "
                              f"not {self.exchange!r}")
        if self.overlap and self.backend != "cpu":
            raise DasknnError("overlap splits each layer's kernel by columns, which only the CPU kernel does: "
                              "leave it off with backend='gpu'")


def tuning(options: InferenceOptions) -> dict[str, Any]:
    """``options`` as keywords of :func:`dasknn.infer`, but the batch's size (``images``), which it sets itself."""
    return {f.name: getattr(options, f.name) for f in dataclasses.fields(options) if f.name != "images"}


#: The options' names (a keyword that is not one of them is refused as Python refuses an unknown parameter).
OPTION_NAMES = frozenset(f.name for f in dataclasses.fields(InferenceOptions))


def options_with(options: InferenceOptions | None, changes: dict[str, Any], caller: str = "infer") -> InferenceOptions:
    """``options`` (the defaults when None) with ``changes`` (option names to values) over them."""
    unknown = sorted(set(changes) - OPTION_NAMES)
    if unknown:  # as Python says it for a named parameter
        raise TypeError(f"{caller}() got an unexpected keyword argument {unknown[0]!r}")
    return dataclasses.replace(options or InferenceOptions(), **changes)
