"""Images that converge computed once, in every mode, against the truth (and against ``compress=False``).

Usage (from the repository root)::

    python benchmarks/verify_compress.py STORE [--dtype float64] [--runs data,data-stream,pipeline:2,model:16]
        [--off]

STORE is a dasknn store holding its images and their truth (``dasknn import ... --truth``, ``dasknn generate
--truth``). A run is ``data``, ``data-stream``, ``pipeline:K`` (one pipeline of K stages on K workers) or
``model:K`` (K parts on K workers, hypergraph partition, p2p exchange). Each row: the categories against the stored
truth with compression on, and with ``--off`` the same run with compression off beside it: its categories, the
bytes that crossed between workers and the seconds, both ways.
"""

from __future__ import annotations

import argparse
import os
import platform
from datetime import datetime, timezone

import numpy as np


def main() -> None:
    from dasknn import engine, store
    from dasknn.cluster import local_client

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("store")
    ap.add_argument("--dtype", default="float64")
    ap.add_argument("--runs", default="data,data-stream,pipeline:2,pipeline:3,pipeline:4,model:2,model:4,model:8,"
                                      "model:16")
    ap.add_argument("--off", action="store_true", help="run each with compression off too")
    args = ap.parse_args()
    s = store.open_store(args.store)
    truth = s.inputs.truth(args.dtype)
    print(f"# {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, {platform.node()}, {os.cpu_count()} cores, "
          f"{args.store}: {s.neurons} x {s.depth}, {s.inputs.images} images, {args.dtype}")
    print("run | workers | on: categories | on: bytes sent | on: seconds | off: categories | off: bytes sent | "
          "off: seconds")
    for run in args.runs.split(","):
        name, _, k = run.partition(":")
        workers = int(k) if k else 2
        options = {"data": {"mode": "data", "resident": True}, "data-stream": {"mode": "data", "resident": False},
                   "pipeline": {"mode": "pipeline"},
                   "model": {"mode": "model", "partition": "hypergraph", "exchange": "p2p"}}[name]
        with local_client(workers=workers, threads_per_worker=1) as client:
            row = [run, str(workers)]
            for compress in (True, False) if args.off else (True,):
                r = engine.infer(args.store, client=client, dtype=args.dtype, compress=compress, **options)
                same = np.array_equal(r.categories, truth)
                row += [f"{r.categories.size} {'= truth' if same else 'DIFFER from truth'}", f"{r.bytes_sent:,}",
                        f"{r.seconds:.2f}"]
            print(" | ".join(row), flush=True)


if __name__ == "__main__":
    main()
