"""A worker's chunks sharing the ends of their converged vectors (``dasknn.kernels.ends``) against not sharing them
and against ``compress=False``, alternated on the workers of one warm cluster.

Usage (from the repository root)::

    python benchmarks/bench_shared_ends.py STORE [--images N] [--rounds 5] [--workers 2]

Each round runs data mode (float32) three ways: ends shared (the default, a lookup after every 32nd layer), not
shared (``ENDS_EVERY`` set to 10**9 on the workers: a chunk's layers in one call, as before the ends were shared) and
compression off; the first round (loading, compiling) is dropped. Prints the best and median inference seconds of
each, and the categories' agreement.
"""

from __future__ import annotations

import argparse
import os
import statistics

import numpy as np

#: ENDS_EVERY for each setting (None: compression off).
SETTINGS = {"ends shared": 32, "not shared": 10 ** 9, "compress off": None}


def _set_every(every: int) -> None:
    from dasknn.kernels import ends

    ends.ENDS_EVERY = every


def main() -> None:
    from dasknn import engine
    from dasknn.cluster import local_client

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("store")
    ap.add_argument("--images", type=int, default=None, help="the first N images (default: all)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    seconds: dict[str, list[float]] = {name: [] for name in SETTINGS}
    categories: dict[str, np.ndarray] = {}
    with local_client(workers=args.workers, threads_per_worker=1) as client:
        for round_ in range(args.rounds):
            for name, every in SETTINGS.items():
                client.run(_set_every, every or 32)
                r = engine.infer(args.store, client=client, mode="data", dtype="float32", images=args.images,
                                 compress=every is not None)
                categories[name] = r.categories
                if round_:
                    seconds[name].append(r.seconds)
    agree = all(np.array_equal(c, categories["compress off"]) for c in categories.values())
    print(f"# {os.path.basename(args.store.rstrip('/'))}, {args.workers} workers, load {os.getloadavg()[0]:.2f}, "
          f"categories {'equal' if agree else 'DIFFER'}")
    for name, values in seconds.items():
        print(f"{name}: best {min(values):.3f} s, median {statistics.median(values):.3f} s")


if __name__ == "__main__":
    main()
