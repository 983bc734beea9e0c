"""Foundation figures: parse times, store import and size, generator speed, the reference's edges/s, and the
Dask engine beside the reference in the same run.

Usage (from the repository root, with the shared data beside the checkout)::

    python benchmarks/bench_foundation.py [--data ../shared/data/graphchallenge] [--images 20000]

Prints one table; every figure is measured here, in this run.
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile
import time
from datetime import date
from pathlib import Path

import numpy as np


def timed(fn, *args, **kwargs):
    t0 = time.perf_counter()
    out = fn(*args, **kwargs)
    return out, time.perf_counter() - t0


def main() -> None:
    from dasknn import engine, generate, io, reference
    from dasknn.cli import import_network
    from dasknn.cluster import local_client
    from dasknn.store import open_store, write_inputs_store

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=str(Path(__file__).resolve().parents[2] / "shared/data/graphchallenge"))
    ap.add_argument("--images", type=int, default=20000, help="images for the reference and engine rows")
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    data = Path(args.data)
    rows: list[tuple[str, str]] = []

    io.read_layer(b"1\t1\t1\n", 1, source="warm-up")  # compile the parser once (cached on disk after)
    net, t_net = timed(io.read_network, data / "neuron1024.tar.gz")
    rows.append(("parse neuron1024.tar.gz (120 layers, 3.9 M entries)", f"{t_net:.2f} s"))
    images, t_img = timed(io.read_images, data / "sparse-images-1024.tsv.gz")
    rows.append((f"parse sparse-images-1024.tsv.gz ({images.nnz / 1e6:.1f} M lines)", f"{t_img:.2f} s"))
    truth = io.read_categories(data / "neuron1024-l120-categories.tsv")

    with tempfile.TemporaryDirectory() as tmp:
        store, t_imp = timed(import_network, data / "neuron1024.tar.gz", Path(tmp) / "real.zarr",
                             data / "sparse-images-1024.tsv.gz", data / "neuron1024-l120-categories.tsv")
        s = open_store(store)
        rows.append(("import network + images + truth to Zarr", f"{t_imp:.2f} s, {s.nbytes_on_disk() / 1e6:.1f} MB"))
        _, t_open = timed(open_store, store, "full")
        rows.append(("open + full check of that store", f"{t_open:.2f} s"))

        _, t_gen = timed(generate.write, Path(tmp) / "g16k.zarr", 16384, 120)
        rows.append(("generate 16384 x 120 into a store", f"{t_gen:.1f} s"))

        n = args.images
        batch = images[:n]
        ref_rates = {}
        for dtype in (np.float32, np.float64):
            cats, t_ref = timed(reference.infer_categories, net.layers, batch, net.bias, net.ymax, dtype)
            ref_rates[np.dtype(dtype).name] = n * net.edges / t_ref
            ok = np.setxor1d(cats, truth[truth < n]).size
            rows.append((f"reference {np.dtype(dtype).name}, {n} images", f"{t_ref:.1f} s, "
                         f"{n * net.edges / t_ref:.3e} edges/s, {ok} mismatched"))

        inputs = write_inputs_store(Path(tmp) / "in.zarr", batch)
        with local_client(workers=args.workers) as client:
            for dtype in ("float32", "float64"):
                r = engine.infer(store, inputs, client, dtype=dtype)
                ok = np.setxor1d(r.categories, truth[truth < n]).size
                rows.append((f"dasknn infer {dtype}, {n} images, {r.workers} workers", f"{r.seconds:.1f} s, "
                             f"{r.edges_per_second:.3e} edges/s = {r.edges_per_second / ref_rates[dtype]:.2f}x "
                             f"the reference, {ok} mismatched"))

    print(f"dasknn foundation benchmark, {date.today()}, {platform.node()}, {os.cpu_count()} cores, "
          f"Python {platform.python_version()}")
    width = max(len(a) for a, _ in rows)
    for a, b in rows:
        print(f"| {a:<{width}} | {b} |")


if __name__ == "__main__":
    main()
