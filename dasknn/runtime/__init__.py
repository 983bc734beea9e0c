"""Dask mechanics that know nothing of layers, shared by inference (:mod:`dasknn.engine`) and training
(:mod:`dasknn.train`).

* :mod:`.graph`: task graphs pinned to workers, references between their tasks, the one Dask span, and a
  values-only tree reduction.
* :mod:`.recovery`: watching futures for a lost worker, waiting for workers after a loss, and "ensure a client".
  Each caller keeps its own recovery policy (inference re-runs unfinished chunks, training restarts from its
  last checkpoint).
* :mod:`.metrics`: byte counters on the workers.
* :mod:`.exchange`: the seam the parts of a run send each other messages through, one module per transport.
* :mod:`.worker_runs`: the registry of run objects (a run's state on each worker), closed once.
* :mod:`.heap`: glibc's heap for tasks that make and drop large arrays over and over (the nanny's
  ``MALLOC_TRIM_THRESHOLD_`` turns each one into a fresh ``mmap``).
"""
