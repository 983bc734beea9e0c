"""Training a sparse network with a fixed sparsity pattern: single process, or on Dask in data, model, hybrid or
pipeline mode.

Modules: :mod:`.model` (the model, its passes and optimiser), :mod:`.data` (images, split, batch schedule),
:mod:`.checkpoint`, :mod:`.data_mode`, :mod:`.model_mode` and :mod:`.pipeline_mode` (the Dask task graphs of each
mode),
:mod:`.weights` (importing dense weights), :mod:`.driver` (:func:`train`). The command line is in
:mod:`dasknn.cli.train`.

The model
---------
The sparse layers are the inference layers, ``Y_next = h(Y @ W + b)`` (challenge orientation, activations held
transposed and dense: ``yt`` is ``neurons x batch``), where ``h`` adds the scalar bias ``b`` to *nonzero* sums
only, then applies ReLU and the optional clamp ``ymax`` (off, ``inf``, by default when training). The bias is a
**fixed scalar** (not trained; 0 by default for training, since the challenge's -0.3 belongs to its 1/16
weights). After layer ``L`` comes a small dense classifier head (``N x classes`` weights plus a bias vector,
both trained) and softmax cross-entropy, averaged over the batch.

Only the stored values of each layer learn: the pattern never changes. Weights, gradients, momentum and Adam
moments are flat arrays aligned with the CSC ``data`` of the layer; the pattern (``indptr, indices``) is held
once and shared by all of them. No dense copy of a sparse layer exists anywhere.

Stored weights are re-initialised for training (the generated networks' values are all 1/16): He-style normal
values with standard deviation ``sqrt(2 / fan_in)`` (fan_in: the column's nonzeros), seeded; ``init="keep"``
keeps the stored values (e.g. a network imported with :func:`import_weights`).

Gradients
---------
With ``delta_k = dL/dY_k * h'(Z_k)`` (``h'`` is 1 where the output is strictly between 0 and ``ymax``), the
weight gradient of a stored entry ``(i, j)`` is ``sum_b Y_{k-1}[i, b] * delta_k[j, b]`` (computed only at the
pattern, by :mod:`dasknn.kernels.grad`), and the error passed down is ``W_k @ delta_k``.

Modes on Dask
-------------
* ``data``: every replica holds the whole model and a shard of each batch; the gradient values (sparse values
  and head, one flat array) are summed by a binary tree of tasks pinned to the replicas' workers, the sum
  travels back worker to worker, and each replica applies the same optimiser step.
* ``model``: the layers' columns are partitioned (:mod:`dasknn.partition`) and each part holds its columns'
  values, their optimiser states and the head rows of the outputs it owns. Forward, parts exchange boundary
  activations as in inference (``plan.send/recv``); the head's partial logits go to part 0, which computes the
  loss and sends the (classes x batch) error back. Backward, each part computes the error contributions for all
  the inputs it needed and sends those owned by others back to their owners, who sum them: the forward volume in
  reverse. Weight gradients need no traffic.
* ``hybrid``: groups of ``group_size`` workers split each batch; each group runs model mode on its share over
  the same partition. Part ``q`` of every group holds the same columns, so the groups all-reduce each part's
  gradient values (values only, a tree of tasks pinned to the parts' workers, as in data mode) and every copy
  applies the same step.
* ``pipeline``: the layers are cut into ``group_size`` consecutive stages balanced by entries (all the workers by
  default) among the cuts that fit each worker's memory, one per worker, each holding its layers' values and
  optimiser state (the last stage also the head). Each batch is split into micro-batches that flow forward stage
  to stage (the activations travel worker to worker) and back (the errors of a stage's inputs travel to the
  previous stage), one forward and one backward in turn (1F1B); each stage sums its micro-batches' gradients and
  applies the step once all have come back (a flush every step, so a step is one synchronous step on the whole
  batch). With fewer stages than workers, replicas of the pipeline split the
  batch and all-reduce each stage's gradient values as hybrid mode does.

If a worker is lost mid-run, the run is rebuilt on the workers there are from the last checkpoint this run
wrote (or from its start) and continues: the batches depend only on the seed and the step, so nothing is lost
but the recomputed steps.

Replicas and parts are mapped round-robin onto the cluster's workers, so ``workers=4`` runs on a 2-worker
cluster too (two parts per worker).
"""

from __future__ import annotations

from ..kernels import back_input, weight_grad
from .checkpoint import load_checkpoint, save_checkpoint
from .data import load_data, load_digits_1024, schedule, split
from .device import BACKENDS, array_module
from .driver import AWAIT_WORKERS_SECONDS, MAX_RESTARTS, MODES, TrainResult, train
from .model import (
    ADAM,
    MOMENTUM,
    OPT_SLOTS,
    OPTIMIZERS,
    Model,
    accuracy,
    active,
    apply_update,
    forward,
    forward_layer,
    gradients,
    init_model,
    logits,
    sgd_step,
    softmax_xent,
)
from .parts import join_model, split_model
from .pipeline_mode import PIPELINE_SCHEDULES
from .weights import import_weights

__all__ = [
    "ADAM", "AWAIT_WORKERS_SECONDS", "BACKENDS", "array_module", "MAX_RESTARTS", "MODES", "MOMENTUM", "OPTIMIZERS", "OPT_SLOTS", "Model",
    "PIPELINE_SCHEDULES",
    "TrainResult", "accuracy", "active", "apply_update", "back_input", "forward", "forward_layer", "gradients",
    "import_weights", "init_model", "join_model", "load_checkpoint", "load_data", "load_digits_1024", "logits",
    "save_checkpoint", "schedule", "sgd_step", "softmax_xent", "split", "split_model", "train", "weight_grad",
]
