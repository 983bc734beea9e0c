"""What one training run (model and hybrid modes) keeps on each worker, in one object (:class:`TrainRun`) made from a
frozen spec and owned by the worker's run registry (:mod:`dasknn.runtime.worker_runs`): its parts' states, each
step's activations and gradients between the step's tasks, its losses, and its end of the exchange."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..errors import DasknnError
from ..runtime.exchange import Endpoint
from ..runtime.worker_runs import worker_run
from .parts import TrainPart


@dataclass(frozen=True)
class TrainRunSpec:
    """One training run as its workers know it: its id."""

    run: str

    def open(self) -> TrainRun:
        return TrainRun(self)


@dataclass
class StepWork:
    """What one part's step keeps between its tasks: per layer the inputs it read and its outputs (forward), the
    error it passes down (backward), and the gradients so far."""

    inputs: dict[int, np.ndarray] = field(default_factory=dict)  # layer k -> the inputs it read (rows: plan inputs)
    outputs: dict[int, np.ndarray] = field(default_factory=dict)  # layer k -> its outputs (0: its input pixels)
    passed_down: dict[int, np.ndarray] = field(default_factory=dict)  # layer k -> error for its inputs
    grads: dict[int, np.ndarray] = field(default_factory=dict)  # layer k -> its values' gradient (0-based later)
    head: tuple | None = None  # (head rows' gradient, head bias' gradient or empty)
    partial_logits: np.ndarray | None = None  # part 0: its own share of the logits
    dlog: np.ndarray | None = None  # part 0: the logits' error


@dataclass
class TrainRun:
    """One training run's state on one worker. Made by :meth:`TrainRunSpec.open`, closed once."""

    spec: TrainRunSpec
    #: each part's state between steps, by (group, part)
    parts: dict[tuple[int, int], TrainPart] = field(default_factory=dict)
    #: each part's work within a step, by (step, group, part)
    work: dict[tuple[int, int, int], StepWork] = field(default_factory=dict)
    #: each group's loss of each step (part 0's worker), by (step, group)
    losses: dict[tuple[int, int], float] = field(default_factory=dict)
    endpoint: Endpoint = field(init=False)

    def __post_init__(self) -> None:
        self.endpoint = Endpoint(self.spec)

    def part(self, group: int, q: int) -> TrainPart:
        """Part ``q`` of group ``group``, made here by its set-up task."""
        if (group, q) not in self.parts:
            raise DasknnError(f"training: part {q} of group {group} has no state on this worker (its set-up task "
                              "ran elsewhere)")
        return self.parts[(group, q)]

    def step_work(self, step: int, group: int, q: int) -> StepWork:
        """What the part's step ``step`` keeps between its tasks (made on first use)."""
        return self.work.setdefault((step, group, q), StepWork())

    def end_step(self, step: int, group: int, q: int) -> StepWork:
        """The part's step's work, no longer kept (the step is done)."""
        return self.work.pop((step, group, q))

    def figures(self) -> dict:
        """What the run measured here: the bytes its messages took to other parts, as the exchange counted them."""
        return {"crossed": int(sum(self.endpoint.sent.values()))}

    def close(self) -> None:
        self.parts.clear()
        self.work.clear()
        self.losses.clear()
        self.endpoint.close()


def train_run(run: str) -> TrainRun:
    """Training run ``run``'s object in this process (made on first use)."""
    return worker_run(TrainRunSpec(run))
