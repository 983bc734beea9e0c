"""What one inference run keeps on each worker, in one object (:class:`InferenceRun`) made from a frozen spec
(:class:`InferenceRunSpec`) and owned by the worker's run registry (:mod:`dasknn.runtime.worker_runs`).

A model-mode part's plan and blocks, its activations between its layer tasks, the space its steps reuse, the
streams its layers are read from and the tallies of the messages it built are typed fields here, not globals of a
module; the run's end closes it once (:func:`dasknn.runtime.worker_runs.close_run`), and with it every stream.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import numpy as np

from .. import kernels
from ..errors import DasknnError
from ..kernels.ends import KnownEnds
from ..plan import PartLayer
from ..runtime.exchange import Endpoint
from ..runtime.worker_runs import worker_run
from ..store import LayerStream, PartStream, ReadAhead

Block = tuple[np.ndarray, np.ndarray, np.ndarray]  # indptr, indices, data (CSC)


@dataclass(frozen=True)
class LayerStreamSpec:
    """Data mode out of core: stream whole layers of the store at ``path`` as ``dtype``, ``keep`` at once; in
    pipeline mode up to a stage's ``last`` layer only (0: the store's last); keeping up to ``hold_bytes`` of what
    it fetched in memory as stored, so that the worker's (the stage's) next chunks do not fetch its layers again."""

    path: str
    dtype: str
    keep: int
    last: int = 0
    hold_bytes: int = 0


@dataclass(frozen=True)
class PartStreamSpec:
    """Model mode out of core: stream part ``part``'s blocks from the part plan at ``plan``, ``keep`` at once,
    keeping up to ``hold_bytes`` of what it fetched in memory as stored, so that the worker's next chunks do not
    fetch them again."""

    plan: str
    part: int
    dtype: str
    keep: int
    hold_bytes: int = 0


#: A stream's spec (what the worker opens, once per run and spec).
StreamSpec = LayerStreamSpec | PartStreamSpec


@dataclass(frozen=True)
class InferenceRunSpec:
    """One inference run as its workers know it: its id (the suffix of its tasks' keys)."""

    run: str

    def open(self) -> InferenceRun:
        return InferenceRun(self)


@dataclass(frozen=True)
class SplitStep:
    """An overlapped step's first half, kept for its second (:func:`~dasknn.engine.tasks.step_rest`): the packed
    inputs, the columns still to compute, and the layer's block (a stream has moved on by then)."""

    tiles: np.ndarray
    rest: np.ndarray
    layer: Block


@dataclass
class PartState:
    """A model-mode part's activations after its layer ``layer`` of one chunk, held on its worker until its next
    step: the block (outputs x live images), the alive masks of its sync layers so far, (an overlapped step's
    first half) what its second half needs, and what each of its steps computed, one entry a layer so far
    (:class:`~dasknn.engine.tasks.StepCount`)."""

    layer: int
    block: object
    masks: list[np.ndarray]
    split: SplitStep | None = None
    counts: list = field(default_factory=list)


@dataclass
class MessageBytes:
    """Bytes of the boundary messages one layer's parts built on a worker: as dense rows, and as sent."""

    dense: int = 0
    sent: int = 0


@dataclass
class InferenceRun:
    """One inference run's state on one worker. Made by :meth:`InferenceRunSpec.open`, closed once."""

    spec: InferenceRunSpec
    #: model mode, resident: each part's plan made here (:func:`~dasknn.engine.exchange_plan.plan_part`), by
    #: (group, part), until the run ends; its weights' task takes it from here, not as a Dask dependency (a worker
    #: lost later then leaves that task waiting for it, never depending on data already dropped)
    plans: dict[tuple[int, int], list[PartLayer]] = field(default_factory=dict)
    #: the part's blocks of every layer made with its plan (the store's dtype), until its weights' task takes them
    blocks: dict[tuple[int, int], list[Block]] = field(default_factory=dict)
    #: each model-mode part's activations between its layer tasks, by (chunk, part): only the boundary messages
    #: travel; a block never leaves its worker, so it needs no key (a key per block cost a scheduler round trip)
    parts: dict[tuple[int, int], PartState] = field(default_factory=dict)
    #: where the backend reuses space (the CPU's), the flat arrays each part's blocks, received rows and packed
    #: inputs are written into, by (chunk, part, use), reused layer after layer (a fresh array of 100 MB each
    #: layer costs page faults the step waits on: every array over 32 MiB is a fresh mmap)
    spaces: dict[tuple[int, int, str], list[np.ndarray]] = field(default_factory=dict)
    #: the open streams, by spec (consecutive tasks share a stream's read-ahead)
    streams: dict[StreamSpec, ReadAhead] = field(default_factory=dict)
    #: the boundary messages built here, by the layer they are for
    messages: dict[int, MessageBytes] = field(default_factory=dict)
    #: data and pipeline modes with folding: the ends of the vectors this worker's chunks converged to, for its
    #: later chunks to take instead of running them through the same layers again
    ends: KnownEnds = field(default_factory=KnownEnds)
    #: the run's end of the exchange here (what it sent to parts on other workers, by message tag; what reached it)
    endpoint: Endpoint = field(init=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __post_init__(self) -> None:
        self.endpoint = Endpoint(self.spec)

    def stream(self, spec: StreamSpec) -> ReadAhead:
        """The run's stream of ``spec``, opened on first use."""
        with self._lock:
            if spec not in self.streams:
                self.streams[spec] = (LayerStream(spec.path, spec.dtype, spec.keep, spec.last, spec.hold_bytes)
                                      if isinstance(spec, LayerStreamSpec)
                                      else PartStream(spec.plan, spec.part, spec.dtype, spec.keep, spec.hold_bytes))
            return self.streams[spec]

    def part_layer(self, part: list[tuple[PartLayer, Block]] | PartStreamSpec, k: int) -> tuple[PartLayer, Block]:
        """A model-mode part's layer ``k``: held in memory (a list), or read from its part plan as it is needed."""
        return part[k - 1] if isinstance(part, list) else self.stream(part).layer(k)

    def space(self, chunk: int, part: int, use: str, like, shape: tuple[int, int], generations: int):
        """An uninitialised ``shape`` array of ``like``'s dtype for the part's ``use``: in the space of its array of
        that use ``generations`` calls back (a block of layer k goes where the block of layer k - 2 was: the block
        of layer k - 1 is the step's input). A fresh array where ``like``'s backend does not reuse space (a
        device's)."""
        backend = kernels.backend_of(like)
        if not backend.reuse_space:
            return backend.empty(shape, like.dtype)
        size = shape[0] * shape[1]
        spaces = self.spaces.setdefault((chunk, part, use), [])
        space = spaces.pop(0) if len(spaces) == generations else None
        if space is None or space.size < size or space.dtype != like.dtype:
            space = backend.empty(size + size // 16, like.dtype)  # room for a layer with a few more rows
        spaces.append(space)
        return space[:size].reshape(shape)

    def reused(self, chunk: int, part: int, use: str) -> list[np.ndarray]:
        """The part's spaces of ``use`` (a list the caller takes from and puts back into)."""
        return self.spaces.setdefault((chunk, part, use), [])

    def hold(self, chunk: int, part: int, state: PartState) -> None:
        """Keep a part's activations until its next step."""
        self.parts[(chunk, part)] = state

    def take(self, chunk: int, part: int, layer: int, split: bool = False) -> PartState:
        """The part's activations after its layer ``layer`` (no longer held unless ``split``: an overlapped step's
        second half reads what its first half kept)."""
        state = self.parts.get((chunk, part)) if split else self.parts.pop((chunk, part), None)
        if state is None or state.layer != layer or (state.split is not None) != split:
            raise DasknnError(f"model mode: part {part} expected its layer {layer} on this worker, found "
                              f"{'none' if state is None else state.layer} (a task ran twice or out of order)")
        return state

    def tally(self, k: int, dense: int, sent: int) -> None:
        """Count a boundary message for layer ``k``: its bytes as dense rows, and as built."""
        counted = self.messages.setdefault(k, MessageBytes())
        counted.dense += dense
        counted.sent += sent

    def figures(self) -> dict:
        """What the run measured here: bytes its streams read, its messages' bytes by layer (as dense rows, as
        built), and what its messages took to other workers by layer (as the exchange counted them)."""
        crossed: dict[int, int] = {}
        pairs: dict[tuple[int, int], int] = {}
        for (tag, sender, receiver), nbytes in self.endpoint.sent.items():
            crossed[tag.layer] = crossed.get(tag.layer, 0) + nbytes
            pairs[(sender, receiver)] = pairs.get((sender, receiver), 0) + nbytes
        return {"bytes_read": int(sum(s.bytes_read for s in self.streams.values())),
                "messages": {k: (m.dense, m.sent) for k, m in self.messages.items()}, "crossed": crossed,
                "pairs": pairs}

    def close(self) -> None:
        """Let go of everything: the layers streams hold, the parts' blocks and plans, the reused space."""
        for stream in self.streams.values():
            stream.close()
        self.streams.clear()
        self.parts.clear()
        self.spaces.clear()
        self.plans.clear()
        self.blocks.clear()
        self.ends.clear()
        self.endpoint.close()
        kernels.release_backends()  # and the kernels' caches: device copies of streamed layers, steps' scratch


def inference_run(run: str) -> InferenceRun:
    """Run ``run``'s object in this process (made on first use)."""
    return worker_run(InferenceRunSpec(run))
