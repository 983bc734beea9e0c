"""Running inference on a Dask cluster: per-layer task graphs over partitioned blocks.

The workers are split into *groups*; each group runs its share of the batch's image chunks, and the network is
partitioned over the workers of a group:

* ``data`` mode: groups of one worker. Every worker holds every layer and runs a chunk through a whole segment of
  consecutive layers in one task (no exchange is needed, so tasks stay coarse).
* ``model`` mode: one group of all workers. Part ``q`` owns the columns (output neurons) the partition gives it,
  reads only those from the store, and per layer and chunk runs one task, ``spmm-l{k}-p{q}-c{c}``: it computes
  the layer from its previous block (held on its worker between tasks) and the rows the others sent, and packs
  out of its new block exactly the rows the plan says each other part needs in the next layer. That packed
  output is the task's result, so Dask moves it worker to worker to the tasks that depend on it (the layer's
  first messages come from ``send-l1-p{p}-to{q}-c{c}``; with more than two parts, ``send-l{k}-p{p}-to{q}-c{c}``
  tasks pick each recipient's share). Tasks are pinned to workers, so those messages are the only activation
  traffic. With ``overlap`` (CPU, off by default) each layer but the last is two tasks: ``spmm-l{k}-p{q}-c{c}``
  computes and sends only the rows others read, ``spmm-rest-l{k}-p{q}-c{c}`` the rest while they travel.
* ``hybrid``: groups of ``group_size`` workers, each a model-mode group on its own chunks.
* ``pipeline``: groups of ``group_size`` workers (all by default), each a pipeline whose ``s``-th worker holds stage
  ``s``, consecutive layers (:func:`dasknn.stages.stage_cuts`); chunk ``c``'s task ``stage{s}-l{a}-{b}-c{c}`` runs
  the stage's layers and hands the live activations to the next stage's worker as its result.

Dead images (all-zero activations can never come back) are dropped: in data mode inside the segment task, in
model mode every ``sync_every`` layers, when each part sends its alive mask with its messages and all compact the
same way (the messages sent with the masks still carry the images that layer killed). Categories come back with
their original indices.

Timing follows the challenge: the clock starts once weights and inputs sit in the workers' memory and stops when
the categories are back on the client. The client never holds weights or activations: workers read the store.

The package, stage by stage: :mod:`.infer` (the entry point, its checks and its recovery policy), :mod:`.sizing`
(memory, chunks, the cost model's calibration), :mod:`.owners` (the partition), :mod:`.execute` (passes),
:mod:`.data_mode`, :mod:`.model_mode` and :mod:`.pipeline_mode` (graph builders), :mod:`.tasks` (what runs on the workers). The Dask
mechanics underneath (pinned graphs, worker loss, byte counters) are :mod:`dasknn.runtime`'s.
"""

from __future__ import annotations

from .infer import AWAIT_WORKERS_SECONDS, MAX_RECOVERIES, InferenceResult, checked_arguments, infer
from .groups import MODES
from .options import InferenceOptions, options_with
from .owners import resolve_partition
from .sizing import MEMORY_SHARE, WEIGHTS_SHARE, WORKER_BASE, chunk_bounds, default_chunks, sync_layers
from .tasks import write_part_plan_layer

#: The old private name, kept for callers of ``engine._write_part_plan_layer``.
_write_part_plan_layer = write_part_plan_layer

__all__ = [
    "AWAIT_WORKERS_SECONDS",
    "MAX_RECOVERIES",
    "MEMORY_SHARE",
    "MODES",
    "WEIGHTS_SHARE",
    "WORKER_BASE",
    "InferenceOptions",
    "InferenceResult",
    "checked_arguments",
    "chunk_bounds",
    "default_chunks",
    "infer",
    "options_with",
    "resolve_partition",
    "sync_layers",
    "write_part_plan_layer",
]
