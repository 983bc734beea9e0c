"""Every mode, with 1, 2 and 4 workers, on the real n1024-l120 network and all 60,000 inputs, against the truth.

Usage (from the repository root, with the shared data beside the checkout)::

    python benchmarks/verify_modes.py [--dtype float64] [--workers 1,2,4] [--modes data,model,hybrid]

float64 must match the published truth exactly; float32 may differ on a handful of threshold images.
"""

from __future__ import annotations

import argparse
import tempfile
from datetime import date
from pathlib import Path

import numpy as np


def main() -> None:
    from dasknn import engine, io
    from dasknn.cli import import_network
    from dasknn.cluster import local_client

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=str(Path(__file__).resolve().parents[2] / "shared/data/graphchallenge"))
    ap.add_argument("--dtype", default="float64")
    ap.add_argument("--workers", default="1,2,4")
    ap.add_argument("--modes", default="data,model,hybrid")
    ap.add_argument("--partition", default="hypergraph")
    args = ap.parse_args()
    data = Path(args.data)
    truth = io.read_categories(data / "neuron1024-l120-categories.tsv")
    print(f"dasknn mode verification, {date.today()}, real n1024-l120, 60,000 images, {args.dtype}, "
          f"partition {args.partition}")
    print("| workers | mode | group size | categories | mismatched | seconds | edges/s |")
    print("|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        store = import_network(data / "neuron1024.tar.gz", Path(tmp) / "real.zarr", data / "sparse-images-1024.tsv.gz")
        for n in map(int, args.workers.split(",")):
            with local_client(workers=n) as client:
                for mode in args.modes.split(","):
                    group = 2 if mode == "hybrid" and n >= 4 else None
                    if mode == "hybrid" and n < 4:
                        group = n  # one group: the same graph as model mode
                    r = engine.infer(store, client=client, mode=mode, partition=args.partition, group_size=group,
                                     dtype=args.dtype)
                    wrong = np.setxor1d(r.categories, truth).size
                    print(f"| {n} | {mode} | {r.group_size} | {r.categories.size} | {wrong} | {r.seconds:.1f} | "
                          f"{r.edges_per_second:.3e} |", flush=True)


if __name__ == "__main__":
    main()
