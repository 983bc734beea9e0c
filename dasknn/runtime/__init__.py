"""Dask mechanics that know nothing of layers, shared by inference (:mod:`dasknn.engine`) and training
(:mod:`dasknn.train`).

* :mod:`.graph`: task graphs pinned to workers, references between their tasks, the one Dask span, and a
  values-only tree reduction.
* :mod:`.recovery`: watching futures for a lost worker, waiting for workers after a loss, and "ensure a client".
  Each caller keeps its own recovery policy (inference re-runs unfinished chunks, training restarts from its
  last checkpoint).
* :mod:`.metrics`: byte counters on the workers and the exchange-log scheduler plugin.
"""
