"""The execution modes, defined once for inference, training, the cost model and the command line.

How the workers share the work: ``data`` (every worker holds the whole network and runs its own images),
``model`` (the network is partitioned over all the workers, who exchange boundary rows), ``hybrid`` (groups of
workers, each a model-mode group on its own images). Inference adds ``auto`` (the cost model picks); both add
``pipeline`` (each worker of a group holds a stage of consecutive layers: chunks, or micro-batches forward and back,
flow stage to stage; replicas of the pipeline share the batch); training adds ``single`` (this process, no Dask).
"""

from __future__ import annotations

DATA, MODEL, HYBRID = "data", "model", "hybrid"
AUTO, SINGLE, PIPELINE = "auto", "single", "pipeline"
#: The ways the workers share the work, by group size: one worker, all of them, groups in between.
DISTRIBUTED = (DATA, MODEL, HYBRID)
#: ``dasknn infer --mode``: the cost model's choice first, then the distributed modes, then stages of layers.
INFERENCE = (AUTO, *DISTRIBUTED, PIPELINE)
#: ``dasknn train --mode``: this process alone first, then the distributed modes, then stages of layers.
TRAINING = (SINGLE, *DISTRIBUTED, PIPELINE)


def mode_of(group_size: int, workers: int) -> str:
    """The distributed mode of groups of ``group_size`` among ``workers`` workers."""
    return DATA if group_size == 1 else MODEL if group_size == workers else HYBRID


def group_size_of(mode: str, workers: int, group_size: int | None) -> int:
    """Workers per group of a distributed ``mode`` (or ``single``) on ``workers`` workers: 1 in data (and single)
    mode, all of them in model mode, ``group_size`` in hybrid mode (by default 2 where four or more workers divide
    evenly, else all), and in pipeline mode the stages of one pipeline (``group_size``, by default all the workers:
    one pipeline). A group size that does not divide the workers is refused in one line."""
    from .errors import DasknnError

    if mode in (DATA, SINGLE):
        return 1
    if mode == MODEL or (mode == PIPELINE and not group_size):
        return workers
    if mode == PIPELINE:
        g = group_size or workers
    else:
        g = group_size or (2 if workers % 2 == 0 and workers >= 4 else workers)
    if g < 1 or workers % g:
        raise DasknnError(f"--group-size {g} must divide the {workers} workers")
    return g
