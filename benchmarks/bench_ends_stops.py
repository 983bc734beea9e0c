"""What the stops of a chunk's loop for shared ends (``dasknn.kernels.ends``) cost where nothing collapses: one
chunk through a store's layers in this process, under a Dask nanny's malloc settings, alternated four ways.

Usage (from the repository root)::

    python benchmarks/bench_ends_stops.py STORE [--images 7500] [--rounds 7] [--random-weights 0.04:0.3]

The four ways: compression off; folding without stops (``ENDS_EVERY`` 10**9: the chunk's layers in one call);
stops every 32 layers whatever they find (``ENDS_MOST_SPAN`` = ``ENDS_EVERY``: the rule before the stops grew
apart); and the stops as they are (farther apart while they find nothing to share). Each row gives the least and
the median CPU seconds (user + system) of ``--rounds`` rounds, the page faults, and the least CPU against compression
off's: CPU time in one process is far steadier than a cluster's wall time on a shared machine. The run re-executes
itself once with ``MALLOC_TRIM_THRESHOLD_`` set as a Dask nanny sets it (fresh buffers are then fresh mappings).
``--random-weights`` runs a copy of the store with normal weights (as ``bench_compress.py`` does): nothing folds.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
from datetime import datetime, timezone

import numpy as np

#: (ENDS_EVERY, ENDS_MOST_SPAN) of each way; None: compression off.
WAYS = {"compress off": None, "folds, no stops": (10 ** 9, 10 ** 9), "stops every 32": (32, 32),
        "stops growing apart": (32, 256)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("store")
    ap.add_argument("--images", type=int, default=7500)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--random-weights", metavar="MEAN:STD")
    args = ap.parse_args()
    if os.environ.get("MALLOC_TRIM_THRESHOLD_") is None:  # as under a Dask nanny (its pre-spawn-environ)
        os.environ.update(MALLOC_TRIM_THRESHOLD_="65536", OMP_NUM_THREADS="1")
        os.execv(sys.executable, [sys.executable, *sys.argv])
    from dasknn import kernels, store
    from dasknn.kernels import ends
    from dasknn.kernels.folds import Folds

    tmp = tempfile.TemporaryDirectory(prefix="bench-ends-")
    path = args.store
    if args.random_weights:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from bench_compress import random_weights

        mean, std = (float(v) for v in args.random_weights.split(":"))
        path = random_weights(path, mean, std, os.path.join(tmp.name, "random.zarr"))
    s = store.open_store(path)
    layers = kernels.held_layers(((w.indptr, w.indices, w.data) for w in s.iter_layers()),
                                 int(s.layer_entries().sum()), args.dtype, "cpu")
    rows = s.inputs.rows(0, args.images)
    cpu = kernels.backend_named("cpu")

    def run(way) -> None:
        yt = cpu.activations_of_rows(rows, np.dtype(args.dtype))
        ids = np.arange(yt.shape[1])
        if way is None:
            kernels.run_layers(yt, layers, s.bias, s.ymax, ids, folds=Folds(enabled=False))
            return
        ends.ENDS_EVERY, ends.ENDS_MOST_SPAN = way
        ends.run_layers_remembering(ends.KnownEnds(), yt, layers, 1, s.depth, s.bias, s.ymax, ids, Folds())

    for way in WAYS.values():  # compiled and warm
        run(way)
    used: dict[str, list[tuple[float, int]]] = {name: [] for name in WAYS}
    for _ in range(args.rounds):
        for name, way in WAYS.items():
            before = resource.getrusage(resource.RUSAGE_SELF)
            run(way)
            after = resource.getrusage(resource.RUSAGE_SELF)
            used[name].append((after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime,
                               after.ru_minflt - before.ru_minflt))
    print(f"# {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, {os.path.basename(path.rstrip('/'))}, "
          f"{rows.shape[0]} images, {s.depth} layers, {args.dtype}, {args.rounds} rounds, load "
          f"{os.getloadavg()[0]:.2f}")
    print("way | CPU s least | CPU s median | page faults (median) | least against compression off")
    off = min(c for c, _ in used["compress off"])
    for name, values in used.items():
        cpu_s = [c for c, _ in values]
        print(f"{name} | {min(cpu_s):.3f} | {np.median(cpu_s):.3f} | {np.median([f for _, f in values]):.0f} | "
              f"{min(cpu_s) / off:.3f}", flush=True)
    tmp.cleanup()


if __name__ == "__main__":
    main()
