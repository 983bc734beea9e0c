"""Images that converge computed once: ``compress`` on against off, side by side in one run, on one cluster.

Usage (from the repository root)::

    python benchmarks/bench_compress.py STORE [STORE ...] [--images N] [--workers 2] [--dtype float32]
        [--modes data,pipeline] [--rounds 3]

A STORE is a dasknn store holding its images (``dasknn import`` of the published files, ``dasknn generate
--images``). For each store and mode the two settings alternate ``--rounds`` times on the same warm cluster (the
first run of each, which loads and compiles, is dropped from nothing: the engine times inference alone, its warm-up
in the untimed load phase); each row gives the best inference seconds, the challenge's nominal edges/s (images x
all edges / seconds), the edges the kernels multiplied per second, the columns computed against the alive images
summed over the layers, the categories' agreement between the two settings and with the stored truth, and the
speed-up (off / on). Beside the wall seconds, each run's CPU seconds of the worker processes (user + system, read
in each worker before and after the run: the load and the inference together), steadier than wall on a machine
others share; a last line per store and mode gives the on/off ratios of the medians of both and of the least
CPU seconds (the round least disturbed by other processes), and the workers' page faults.

``--random-weights MEAN:STD`` runs, instead of each STORE, a copy of it (in a temporary folder) whose weights are
drawn from a normal distribution, the wiring, bias and images kept: with ``0.04:0.3`` on the real n1024-l120 the
images stay alive and distinct to the last layer, so nothing folds and the row shows what looking costs.
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile
from datetime import datetime, timezone

import numpy as np


def main() -> None:
    from dasknn import engine, store
    from dasknn.cluster import local_client

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("stores", nargs="+")
    ap.add_argument("--images", type=int, default=None, help="the first N images (default: all)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--modes", default="data")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--stream", action="store_true", help="stream the layers (data mode out of core)")
    ap.add_argument("--random-weights", metavar="MEAN:STD", help="run a copy of each store with normal weights")
    args = ap.parse_args()
    tmp = tempfile.TemporaryDirectory(prefix="bench-compress-")
    if args.random_weights:
        mean, std = (float(v) for v in args.random_weights.split(":"))
        args.stores = [random_weights(path, mean, std, os.path.join(tmp.name, f"random-{i}.zarr"))
                       for i, path in enumerate(args.stores)]

    print(f"# {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, {platform.node()}, {os.cpu_count()} cores, "
          f"load {os.getloadavg()[0]:.2f}, {args.workers} workers, {args.dtype}")
    print("store | mode | compress | seconds (best) | worker CPU s (median) | nominal edges/s | multiplied edges/s | "
          "columns / alive | categories | speed-up")
    with local_client(workers=args.workers, threads_per_worker=1) as client:
        for path in args.stores:
            s = store.open_store(path)
            truth = s.inputs.truth(args.dtype) if s.inputs is not None else None
            for mode in args.modes.split(","):
                runs: dict[bool, list] = {True: [], False: []}
                cpu: dict[bool, list[float]] = {True: [], False: []}
                for _ in range(args.rounds):
                    for compress in (False, True):
                        before = workers_usage(client)
                        r = engine.infer(path, client=client, mode=mode, dtype=args.dtype, images=args.images,
                                         compress=compress, resident=False if args.stream else None)
                        cpu[compress].append(workers_usage(client) - before)
                        runs[compress].append(r)
                best = {c: min(rs, key=lambda r: r.seconds) for c, rs in runs.items()}
                agree = np.array_equal(best[True].categories, best[False].categories)
                for compress in (False, True):
                    r = best[compress]
                    cats = r.categories
                    if truth is not None and args.images is None:
                        vs_truth = "= truth" if np.array_equal(cats, truth) else \
                            f"{np.setxor1d(cats, truth).size} differ from truth"
                    else:
                        vs_truth = "no truth"
                    ratio = best[False].seconds / r.seconds
                    print(f"{os.path.basename(path.rstrip('/'))} | {mode} | {'on' if compress else 'off'} | "
                          f"{r.seconds:.3f} | {np.median(cpu[compress], axis=0)[0]:.2f} | {r.edges_per_second:.3e} | "
                          f"{r.multiplied_per_second:.3e} | "
                          f"{sum(r.layer_columns)} / {sum(r.layer_alive)} | "
                          f"{cats.size} ({'on = off' if agree else 'ON != OFF'}; {vs_truth}) | "
                          f"{ratio:.2f}x", flush=True)
                walls = {c: np.median([r.seconds for r in rs]) for c, rs in runs.items()}
                used = {c: np.array(v) for c, v in cpu.items()}  # rounds x (CPU s, page faults)
                median, least = ({c: f(u[:, 0]) for c, u in used.items()} for f in (np.median, np.min))
                print(f"# on/off, {args.rounds} rounds: wall medians {walls[True] / walls[False]:.3f}, worker CPU "
                      f"medians {median[True] / median[False]:.3f}, least {least[True] / least[False]:.3f} (CPU s "
                      f"off {fmt(used[False][:, 0])}; on {fmt(used[True][:, 0])}); page faults (medians) off "
                      f"{np.median(used[False][:, 1]):.0f}, on {np.median(used[True][:, 1]):.0f}; load "
                      f"{os.getloadavg()[0]:.2f}", flush=True)
    tmp.cleanup()


def workers_usage(client) -> np.ndarray:
    """The CPU seconds (user + system) and the page faults of the cluster's worker processes so far, summed."""
    return np.sum(list(client.run(_own_usage).values()), axis=0)


def _own_usage() -> tuple[float, int]:
    import resource

    used = resource.getrusage(resource.RUSAGE_SELF)
    return used.ru_utime + used.ru_stime, used.ru_minflt


def fmt(values: list[float]) -> str:
    return " ".join(f"{v:.2f}" for v in values)


def random_weights(path: str, mean: float, std: float, out: str) -> str:
    """A copy of the store at ``path`` with its weights drawn from normal(mean, std) (seeded), at ``out``."""
    import numpy as np

    from dasknn import store

    s = store.open_store(path)
    rng = np.random.default_rng(7)
    with store.StoreWriter(out, s.neurons, s.depth, s.bias, s.ymax, f"{path} with normal({mean}, {std}) weights") as w:
        for k, layer in enumerate(s.iter_layers(), start=1):
            layer = layer.copy()
            layer.data = rng.normal(mean, std, layer.data.size)
            w.write_layer(k, layer)
        w.write_inputs(s.inputs.rows())
    return out


if __name__ == "__main__":
    main()
