"""The training driver: :func:`train` checks its arguments, loads the data and the model, runs the steps in one
process or on Dask (data, model, hybrid or pipeline mode) in chunks with checkpoints, and restarts from the last checkpoint
when a worker is lost."""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np
import scipy.sparse as sp

from .. import modes, timings
from ..errors import DasknnError
from ..kernels import to_device
from ..kernels.warm import WarmSpec, warm_kernels
from ..locations import location
from ..network import Network
from ..runtime import metrics
from ..runtime.recovery import Recovery, ensure_client, smallest_memory_limit, workers_info
from .checkpoint import has_checkpoint, load_checkpoint, save_checkpoint
from .data import load_data, schedule, split
from .data_mode import DataRunner
from .device import check_backend, take_batch
from .model import Model, accuracy, init_model, sgd_step
from .model_mode import ModelRunner
from .pipeline_mode import AUTO_SCHEDULE, PIPELINE_SCHEDULES, PipelineRunner

MODES = modes.TRAINING
#: Times a run rebuilds itself after losing a worker before it gives up.
MAX_RESTARTS = 3
#: Seconds a training run waits after losing workers for as many to be back before it restarts.
AWAIT_WORKERS_SECONDS = 30.0


@dataclass
class TrainResult:
    """What a training run did and measured."""

    model: Model
    mode: str
    workers: int
    steps: int
    seconds: float
    losses: list[float]
    train_loss: float
    test_accuracy: float
    train_accuracy: float
    bytes_sent: int = 0
    partition: str = ""
    restarts: int = 0
    group_size: int = 0
    #: each loss of workers the run survived (:meth:`dasknn.runtime.recovery.Loss.as_dict`): who, in which phase,
    #: the step it restarted from, the wait and the workers it went on with (fewer where one was not replaced)
    recoveries: list = field(default_factory=list)
    #: compiling the kernels (or loading them from Numba's cache) before the steps' clock: the longest warm-up
    #: among the workers (this process in single mode); ``seconds`` is the steps alone
    compile_seconds: float = 0.0
    #: pipeline mode: stages per pipeline, micro-batches per replica's share of a batch, and the seconds each
    #: stage's tasks were busy (by ``"r{replica}-s{stage}"``; the bubble is the rest of ``seconds``)
    stages: int = 0
    micro_batches: int = 0
    stage_busy_seconds: dict = field(default_factory=dict)
    #: pipeline mode: each stage's layers, ``[first, last]`` (1-based), as cut by the workers' memory
    stage_layers: list = field(default_factory=list)
    #: pipeline mode: the order of the micro-batches it ran (``gpipe`` or ``1f1b``)
    pipeline_schedule: str = ""
    #: pipeline mode: the most micro-batches whose activations each stage held at once (by ``"r{replica}-s{stage}"``;
    #: the last stage holds none: its backward pass follows its forward pass at once)
    stage_held_micro_batches: dict = field(default_factory=dict)

    @property
    def bytes_sent_per_step(self) -> float:
        return self.bytes_sent / self.steps if self.steps else 0.0

    def summary(self) -> dict:
        """The figures ``dasknn train --json`` prints."""
        return {"mode": self.mode, "workers": self.workers, "partition": self.partition, "steps": self.steps,
                "seconds": round(self.seconds, 4), "compile_seconds": round(self.compile_seconds, 3),
                "steps_per_second": round(self.steps / self.seconds, 3) if self.seconds > 0 else None,
                "train_loss": self.train_loss, "train_accuracy": self.train_accuracy,
                "test_accuracy": self.test_accuracy, "state_bytes": self.model.state_bytes(),
                "dense_masked_state_bytes": self.model.dense_masked_state_bytes(),
                "bytes_sent_per_step": self.bytes_sent_per_step, "optimizer": self.model.optimizer,
                "group_size": self.group_size, "restarts": self.restarts, "recoveries": self.recoveries,
                "stages": self.stages,
                "micro_batches": self.micro_batches, "stage_layers": self.stage_layers,
                "stage_held_micro_batches": self.stage_held_micro_batches,
                "pipeline_schedule": self.pipeline_schedule}


def layers_of(network) -> tuple[list[sp.csc_matrix], str | None]:
    """The sparse layers of a store path, a :class:`~dasknn.network.Network` or a list, and the store's path."""
    if isinstance(network, Network):
        return list(network.layers), None
    if isinstance(network, (list, tuple)):
        return list(network), None
    from ..store import open_store

    path = str(location(network))
    return open_store(path).network().layers, path


def check_arguments(mode: str, epochs: int, batch: int, lr: float, workers: int, group_size: int | None,
                    checkpoint_every: int, checkpoint, resume: bool, micro_batches: int = 4,
                    pipeline_schedule: str = AUTO_SCHEDULE) -> int:
    """Refuse what cannot run (one line each); return the parts per group (1 outside model and hybrid mode; the
    stages per pipeline in pipeline mode)."""
    if mode not in MODES:
        raise DasknnError(f"--mode must be one of {', '.join(MODES)}, not {mode!r}")
    if epochs < 1 or batch < 1 or workers < 1 or not lr > 0:
        raise DasknnError("--epochs, --batch and --workers must be at least 1 and --lr positive")
    if micro_batches < 1:
        raise DasknnError(f"--micro-batches must be at least 1, not {micro_batches}")
    if pipeline_schedule not in PIPELINE_SCHEDULES:
        raise DasknnError(f"--pipeline-schedule must be one of {', '.join(PIPELINE_SCHEDULES)}, "
                          f"not {pipeline_schedule!r}")
    parts = modes.group_size_of(mode, workers, group_size)
    if (checkpoint_every or resume) and checkpoint is None:
        raise DasknnError("--checkpoint-every and --resume need --checkpoint STORE")
    return parts


def chunk_bounds(start: int, todo: int, chunk: int, checkpoint_every: int) -> Iterator[tuple[int, int]]:
    """``(a, b)`` ranges of the ``todo`` steps left (the run is at step ``start``): at most ``chunk`` steps each,
    ending on every multiple of ``checkpoint_every`` so a checkpoint falls between two chunks."""
    size = checkpoint_every if checkpoint_every else chunk
    at = 0
    while at < todo:
        step0 = start + at
        stop = min(todo, at + min(chunk, size - step0 % size if checkpoint_every else chunk))
        yield at, stop
        at = stop


@dataclass(frozen=True)
class _Job:
    """The steps to run and what to do between chunks (the same in every mode)."""

    xt: np.ndarray
    labels: np.ndarray
    todo: list[np.ndarray]
    chunks: list[tuple[int, int]]
    lr: float
    checkpoint: str | os.PathLike[str] | None
    checkpoint_every: int
    seed: int
    progress: Callable[[int], None] | None
    #: the training kernels on this device, compiled before the clock
    warm: WarmSpec
    #: pipeline mode: micro-batches per replica's share of a batch, and their order (gpipe, 1f1b or auto)
    micro_batches: int = 4
    pipeline_schedule: str = AUTO_SCHEDULE


@dataclass
class _Outcome:
    model: Model
    losses: list[float]
    seconds: float
    bytes_sent: int = 0
    restarts: int = 0
    compile_seconds: float = 0.0
    figures: dict = field(default_factory=dict)  # what the runner measured (pipeline mode: stages' busy time)
    recoveries: list = field(default_factory=list)  # each loss of workers survived (Loss.as_dict)


def _start_model(layers, classes: int, neurons: int, checkpoint, resume: bool, **init) -> Model:
    # a resumed run continues from the checkpoint, which must be of this network and optimiser
    if resume and checkpoint is not None and has_checkpoint(checkpoint):
        model, _ = load_checkpoint(checkpoint)
        if model.optimizer != init["optimizer"] or model.depth != len(layers) or model.neurons != neurons:
            raise DasknnError("the checkpoint was made with another network or optimiser", checkpoint)
        return model
    return init_model(layers, classes, **init)


def _run_single(model: Model, job: _Job) -> _Outcome:
    losses: list[float] = []
    timings.enter("compile")
    compile_seconds = warm_kernels(job.warm)
    timings.enter("steps")
    t0 = time.perf_counter()
    for a, b in job.chunks:
        for idx in job.todo[a:b]:
            losses.append(sgd_step(model, *take_batch(job.xt, job.labels, idx), job.lr))
        if job.checkpoint_every and model.step % job.checkpoint_every == 0:
            save_checkpoint(job.checkpoint, model, {"seed": job.seed})
        if job.progress is not None:
            job.progress(model.step)
    return _Outcome(model, losses, time.perf_counter() - t0, compile_seconds=compile_seconds)


def _owners(layers, partition, parts: int, path: str | None, seed: int, client) -> tuple[np.ndarray, str]:
    # model and hybrid mode: the owner of every neuron, and the partition's name in the figures
    from ..partition import partition_network

    if isinstance(partition, np.ndarray):
        return partition, "given"
    if parts == 1:
        return np.zeros((len(layers) + 1, int(layers[0].shape[0])), dtype=np.int32), "single"
    if path is not None:
        from ..engine import resolve_partition
        from ..engine.sizing import partition_fits_worker

        # as inference does: a stored network is partitioned on the cluster where a worker has the memory
        info = workers_info(client)
        fits = bool(info) and partition_fits_worker(int(layers[0].shape[0]), smallest_memory_limit(info))
        return resolve_partition(path, partition, parts, seed, client if fits else None), str(partition)
    return partition_network(layers, parts, str(partition), seed=seed), str(partition)


def _runner_factory(client, mode: str, workers: int, parts: int, owners: np.ndarray | None, job: _Job,
                    backend: str, exchange: str = "auto"):
    # builds the runner on the workers there are now (again after a loss): replicas and parts round-robin; a
    # model read back from a checkpoint goes to the device again
    def start(m: Model):
        m = m.on(backend)
        names = sorted(client.nthreads())
        if not names:
            raise DasknnError("the Dask cluster has no workers")
        ws = [names[i % len(names)] for i in range(workers)]
        if mode == "data":
            return DataRunner(client, ws, m, job.xt, job.labels), len(names)
        if mode == modes.PIPELINE:  # replicas of `parts` stages each
            return PipelineRunner(client, [ws[i:i + parts] for i in range(0, workers, parts)], m, job.xt,
                                  job.labels, job.micro_batches, max((len(t) for t in job.todo), default=0),
                                  job.pipeline_schedule), len(names)
        return ModelRunner(client, [ws[i:i + parts] for i in range(0, workers, parts)], m, owners, job.xt,
                           job.labels, exchange), len(names)

    return start


@dataclass
class _Progress:
    """Where a run on Dask stands (kept across the attempts of its recovery policy)."""

    losses: list[float]
    runner: object = None
    saved: int | None = None  # the step of the last checkpoint this run wrote (to restart from), if any
    sent0: dict | None = None
    t0: float = 0.0
    compile_seconds: float = 0.0  # every attempt's warm-up (a restarted worker is a fresh process)


def _run_on_cluster(client, recovery: Recovery, start_on_cluster, model: Model, job: _Job) -> _Outcome:
    """Run the chunks on Dask; after a lost worker (in the set-up or a step), rebuild from this run's last checkpoint
    (or its start) on the workers there are."""
    done, chunks = model.step, job.chunks
    at_chunk = {a: i for i, (a, _) in enumerate(chunks)}
    run = _Progress(losses=[])

    def attempt(workers: list[str]) -> _Outcome:
        back = load_checkpoint(job.checkpoint)[0] if run.saved is not None else model
        del run.losses[back.step - done:]
        recovery.enter("set-up")  # the model's parts and the data scattered to the workers
        run.runner, _ = start_on_cluster(back)
        with timings.phase("compile"):
            run.compile_seconds += _warm(client, run.runner, job)
        if run.sent0 is None:
            run.sent0, run.t0 = client.run(metrics.bytes_sent), time.perf_counter()
        recovery.enter("steps")
        for i in range(at_chunk.get(back.step - done, len(chunks)), len(chunks)):
            a, b = chunks[i]
            run.losses += run.runner.run(job.todo[a:b], job.lr, done + a)
            if job.checkpoint_every and (done + b) % job.checkpoint_every == 0:
                save_checkpoint(job.checkpoint, run.runner.model(), {"seed": job.seed})
                run.saved = done + b
            if job.progress is not None:
                job.progress(done + b)
        # the figures before the model comes back to the client (the gather is counted as sent)
        seconds = time.perf_counter() - run.t0
        sent1 = client.run(metrics.bytes_sent)
        pushed = run.runner.pushed_bytes() if hasattr(run.runner, "pushed_bytes") else 0  # (p2p: past Dask's)
        figures = run.runner.figures() if hasattr(run.runner, "figures") else {}
        final = run.runner.model()
        run.runner.close()
        # a lost worker's counter is lost with it; a restarted one counts from zero
        sent = sum(sent1[w] - run.sent0.get(w, 0) for w in sent1) + pushed
        return _Outcome(final, run.losses, seconds, sent, len(recovery.losses), run.compile_seconds, figures,
                        [loss.as_dict() for loss in recovery.losses])

    def on_loss(lost) -> dict:
        if run.runner is not None:
            run.runner.cancel()
        return {"restart_from_step": int(done if run.saved is None else run.saved)}

    return recovery.run(attempt, on_loss)


def _train_on(client, mode: str, layers, partition, parts: int, path: str | None, seed: int, workers: int, job: _Job,
              backend: str, model: Model, exchange: str) -> tuple[_Outcome, str]:
    # the run on a cluster: every phase (the partition, the set-up, the steps) under one policy for lost workers
    recovery = Recovery(client, "training", sorted(workers_info(client)), max_losses=MAX_RESTARTS,
                        wait_seconds=AWAIT_WORKERS_SECONDS, advice="see the workers' logs")
    owners, part_name = None, ""
    if mode in (modes.MODEL, modes.HYBRID):
        # computed once: a restart after a lost worker reuses it (each part's worker makes its plan from it)
        recovery.enter("partition")
        owners, part_name = recovery.run(lambda ws: _owners(layers, partition, parts, path, seed, client))
    return _run_on_cluster(client, recovery, _runner_factory(client, mode, workers, parts, owners, job, backend,
                                                             exchange), model, job), part_name


def _warm(client, runner, job: _Job) -> float:
    # the training kernels compiled on the runner's workers before its steps are timed; the longest warm-up.
    # (imported here: the engine package imports zarr, and zarr CuPy where it is installed, which importing
    # dasknn.train must not)
    from ..engine.warm import longest, warm_workers

    return longest(warm_workers(client, sorted(set(runner.workers)), (job.warm,)).values())


def train(
    network,
    data="digits",
    *,
    epochs: int = 1,
    batch: int = 64,
    lr: float = 0.01,
    optimizer: str = "sgd",
    mode: str = "model",
    partition: str | np.ndarray = "hypergraph",
    workers: int = 2,
    group_size: int | None = None,
    client=None,
    checkpoint_every: int = 0,
    checkpoint: str | os.PathLike[str] | None = None,
    resume: bool = False,
    seed: int = 0,
    bias: float = 0.0,
    ymax: float = math.inf,
    init: str = "he",
    max_steps: int | None = None,
    test_share: float = 0.2,
    chunk: int = 50,
    progress: Callable[[int], None] | None = None,
    backend: str = "cpu",
    exchange: str = "auto",
    micro_batches: int = 4,
    pipeline_schedule: str = AUTO_SCHEDULE,
) -> TrainResult:
    """Train a sparse network (fixed pattern) with a dense classifier head; see the module's description.

    Parameters
    ----------
    network
        A store path, a :class:`~dasknn.network.Network` or a list of sparse layers (only the pattern matters
        with ``init="he"``).
    data
        ``"digits"`` (needs 1024 neurons and scikit-learn), an ``.npz`` with ``x`` (images x neurons) and ``y``,
        or a pair ``(x, y)`` of arrays (NumPy, ``scipy.sparse``, CuPy or ``dask.array``; rows are images, ``y``
        the labels). A seeded ``test_share`` is held out.
    mode
        ``"single"`` (this process, no Dask), ``"data"``, ``"model"``, ``"hybrid"`` or ``"pipeline"`` (the
        layers cut into consecutive stages balanced by entries within each worker's memory, one per worker;
        micro-batches flow through them, one forward and one backward in turn (1F1B) with a flush every step:
        see :mod:`dasknn.train.pipeline_mode`).
    partition
        Model and hybrid mode: an owners array or a partition method; for a stored network also a ``.npy``
        file, and a method's partition is computed once, on a worker of the cluster where one has the memory,
        and kept in the store.
    workers
        Replicas (data), parts (model) or groups x parts (hybrid), mapped round-robin onto the cluster's
        workers.
    group_size
        Hybrid mode: parts per group (2 by default where the workers divide evenly); the groups split each
        batch. Pipeline mode: stages per pipeline (all the workers by default); the pipelines split each batch.
    checkpoint, checkpoint_every, resume
        Save the model (atomically) every ``checkpoint_every`` steps and at the end; with ``resume``, continue
        from the checkpoint: the batches depend only on the seed and the step, so the result is that of an
        uninterrupted run.
    max_steps
        Stop after this many steps in all (of the ``epochs`` scheduled).
    chunk
        Steps per submitted task graph.
    progress
        Called with the number of steps done (in all) after every chunk.
    exchange
        Model and hybrid mode: how the parts' messages travel (a transport of :mod:`dasknn.runtime.exchange`), or
        ``"auto"``: the one :func:`~dasknn.runtime.exchange.choice.choose_exchange` predicts cheaper for the parts.
    backend
        ``"cpu"`` (NumPy, Numba kernels) or ``"gpu"`` (the same step on CuPy arrays and the CUDA kernels; single
        and data mode; the checkpoints and the result are on the host).
    micro_batches
        Pipeline mode: micro-batches per pipeline's share of each batch (the bubble is (K - 1) / (M + K - 1) of
        a step for K stages and M micro-batches).
    pipeline_schedule
        Pipeline mode: the order of a step's micro-batches, ``"gpipe"`` (every forward pass, then every backward
        one: the faster where a stage's tasks are short), ``"1f1b"`` (one forward, one backward in turn: stage
        ``s`` of K holds at most K - s micro-batches' activations) or ``"auto"``: GPipe where its activations fit
        the workers' memory, else 1F1B. The losses are the same.

    Notes
    -----
    If a worker leaves the cluster during a Dask run (killed, or lost with its node), the run rebuilds itself
    on the workers there are (waiting up to 30 s for a nanny to restart the lost one) from the last checkpoint
    written by this run, or from the start without one, at most :data:`MAX_RESTARTS` times: the result is that
    of an uninterrupted run.
    """
    parts = check_arguments(mode, epochs, batch, lr, workers, group_size, checkpoint_every, checkpoint, resume,
                            micro_batches, pipeline_schedule)
    timings.enter("reading")  # the network, the data, the model (or its checkpoint)
    check_backend(backend, mode)
    layers, path = layers_of(network)
    if mode == modes.PIPELINE and parts > len(layers):
        raise DasknnError(f"pipeline mode: {parts} stages need at least as many layers, the network has "
                          f"{len(layers)} (--group-size sets the stages per pipeline)")
    neurons = int(layers[0].shape[0])
    x, y = load_data(data, neurons)
    x_tr, y_tr, x_te, y_te = split(x, y, test_share, seed)
    model = _start_model(layers, int(y.max()) + 1, neurons, checkpoint, resume, seed=seed, init=init, bias=bias,
                         ymax=ymax, optimizer=optimizer)
    todo = schedule(len(y_tr), batch, epochs, seed)[:max_steps][model.step:]
    bounds = list(chunk_bounds(model.step, len(todo), chunk, checkpoint_every))
    # the images and labels go to the device once; the batches are taken there
    job = _Job(to_device(np.ascontiguousarray(x_tr.T), backend), to_device(y_tr, backend), todo, bounds, lr,
               checkpoint, checkpoint_every, seed, progress, WarmSpec(backend=backend, training=True), micro_batches,
               pipeline_schedule)
    part_name = ""
    if mode == "single":
        run = _run_single(model.on(backend), job)
    else:
        # without a client, a local cluster for the run (on GPUs a dask-cuda one: a worker per visible GPU)
        cluster = ({"gpu": True, "workers": None} if backend == "gpu"
                   else {"workers": min(workers, os.cpu_count() or 1)})
        with ensure_client(client, **cluster) as c:
            run, part_name = _train_on(c, mode, layers, partition, parts, path, seed, workers, job, backend, model,
                                       exchange)
    timings.enter("results")  # the model back on the host, its checkpoint, the accuracies
    run.model = run.model.on("cpu")
    if checkpoint is not None and todo:
        save_checkpoint(checkpoint, run.model, {"seed": seed})
    return TrainResult(model=run.model, mode=mode, workers=1 if mode == "single" else workers, steps=len(todo),
                       seconds=run.seconds, losses=[float(v) for v in run.losses],
                       train_loss=float(np.mean(run.losses[-10:])) if run.losses else float("nan"),
                       test_accuracy=accuracy(run.model, np.ascontiguousarray(x_te.T), y_te),
                       train_accuracy=accuracy(run.model, np.ascontiguousarray(x_tr.T), y_tr),
                       bytes_sent=run.bytes_sent,
                       partition=part_name, restarts=run.restarts, recoveries=run.recoveries,
                       group_size=parts if mode in (modes.HYBRID, modes.PIPELINE) else 0,
                       compile_seconds=run.compile_seconds, **_pipeline_figures(mode, parts, micro_batches, run))


def _pipeline_figures(mode: str, parts: int, micro_batches: int, run: _Outcome) -> dict:
    # TrainResult's pipeline fields (empty outside pipeline mode)
    if mode != modes.PIPELINE:
        return {}
    return {"stages": parts, "micro_batches": micro_batches,
            "stage_busy_seconds": run.figures.get("stage_busy_seconds", {}),
            "stage_layers": run.figures.get("stage_layers", []),
            "stage_held_micro_batches": run.figures.get("stage_held_micro_batches", {}),
            "pipeline_schedule": run.figures.get("pipeline_schedule", "")}
