"""The distributed engine on the real n1024-l120 network: every mode beside the SciPy reference, in one run.

Usage (from the repository root, with the shared data beside the checkout)::

    python benchmarks/bench_engine.py [--images 60000] [--workers 2] [--modes data,model:hypergraph,model:random]

For each mode: inference seconds and edges/s as the challenge counts them, the ratio to the reference loop
measured in the same run, correctness against the published truth, bytes that crossed between workers (Dask's
own counters) against the plan's prediction, tasks per layer and per second, and where the wall time went
(task stream: time inside tasks, in transfers, and the rest, which is Dask's own overhead).
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

#: Images each mode runs untimed before its timed run (twice a tile of float32 images, in two chunks).
WARM_IMAGES = 1024
CPU_PEAK_MACS = 1e11  # the figure for 2 cores: about 1e11 multiply-adds per second


def task_time_split(stream: list[dict], wall: float, threads: int) -> dict[str, float]:
    """Fractions of (wall x threads) spent computing tasks, transferring, and neither (Dask's overhead)."""
    compute = transfer = 0.0
    for t in stream:
        if t["key"].split("-")[0] in ("weights", "images"):
            continue  # loading is untimed, as the challenge counts
        for ss in t.get("startstops", ()):
            if ss["action"] == "compute":
                compute += ss["stop"] - ss["start"]
            elif ss["action"] == "transfer":
                transfer += ss["stop"] - ss["start"]
    total = wall * threads
    return {"compute": compute / total, "transfer": transfer / total, "other": max(0.0, 1 - (compute + transfer) / total)}


def main() -> None:
    from distributed import get_task_stream

    from dasknn import engine, io, reference
    from dasknn.cli import import_network
    from dasknn.cluster import local_client
    from dasknn.store import write_inputs_store

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=str(Path(__file__).resolve().parents[2] / "shared/data/graphchallenge"))
    ap.add_argument("--images", type=int, default=60000)
    ap.add_argument("--reference-images", type=int, default=None, help="images for the reference (default: same)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--modes", default="data,model:hypergraph,model:hypergraph:dense,model:random",
                    help="comma-separated mode[:partition[:compact|dense]]")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--chunks", type=int, default=None, help="image chunks (default: the engine's, 2 per thread)")
    ap.add_argument("--exchange", default="auto", help="model mode's transport: auto, tasks or p2p")
    ap.add_argument("--no-reference", action="store_true", help="skip the SciPy loop (ratios to it are then blank)")
    args = ap.parse_args()
    data = Path(args.data)
    n = args.images

    net = io.read_network(data / "neuron1024.tar.gz")
    images = io.read_images(data / "sparse-images-1024.tsv.gz")[:n]
    truth = io.read_categories(data / "neuron1024-l120-categories.tsv")
    truth = truth[truth < n]

    nref = args.reference_images or n
    rows = []
    ref_rate = macs = float("nan")
    if not args.no_reference:
        alive: list[int] = []
        t0 = time.perf_counter()
        ref_cats = reference.infer_categories(net.layers, images[:nref], net.bias, net.ymax, np.dtype(args.dtype))
        ref_seconds = time.perf_counter() - t0
        ref_rate = nref * net.edges / ref_seconds
        reference.infer(net.layers, images, net.bias, net.ymax, np.float64, alive=alive)
        # the multiply-adds a kernel that drops dead images must do: each layer's entries x the images entering it
        entering = [n] + alive[:-1]
        macs = sum(a * w.nnz for a, w in zip(entering, net.layers))
        rows.append(("reference (SciPy loop)", f"{nref} images", f"{ref_seconds:.1f}", f"{ref_rate:.3e}", "1.00",
                     f"{np.setxor1d(ref_cats, truth[truth < nref]).size}", "", "", ""))
    with tempfile.TemporaryDirectory() as tmp:
        store = import_network(data / "neuron1024.tar.gz", Path(tmp) / "real.zarr")
        inputs = write_inputs_store(Path(tmp) / "in.zarr", images)
        # a few images through each mode first, untimed: the workers compile the kernels (Numba's cache may be
        # cold: a changed kernel compiles for several seconds) and load the layers, which the challenge's timing
        # leaves out
        warm = write_inputs_store(Path(tmp) / "warm.zarr", images[:WARM_IMAGES])
        with local_client(workers=args.workers) as client:
            threads = sum(client.nthreads().values())
            for spec in args.modes.split(","):
                mode, _, rest = spec.partition(":")
                part, _, messages = rest.partition(":")
                engine.infer(store, warm, client, mode=mode, partition=part or "hypergraph", dtype=args.dtype,
                             messages=messages or "compact", exchange=args.exchange)
                with get_task_stream(client) as ts:
                    r = engine.infer(store, inputs, client, mode=mode, partition=part or "hypergraph",
                                     dtype=args.dtype, messages=messages or "compact", chunks=args.chunks,
                                     exchange=args.exchange)
                split = task_time_split(ts.data, r.seconds, threads)
                wrong = np.setxor1d(r.categories, truth).size
                sent = (f"{r.bytes_sent / 1e6:.1f} MB (messages {sum(r.message_bytes) / 1e6:.1f}, as dense rows "
                        f"{r.plan_bytes / 1e6:.1f})" if r.plan_bytes else "-")
                rows.append((f"{mode} {part} {messages}".strip(), f"{r.chunks} chunks", f"{r.seconds:.2f}",
                             f"{r.edges_per_second:.3e}", f"{r.edges_per_second / ref_rate:.2f}", str(wrong), sent,
                             f"{r.tasks / r.layers:.2f} / {r.tasks / r.seconds:.0f}",
                             f"{split['compute']:.0%} / {split['transfer']:.0%} / {split['other']:.0%}"))
                if mode == "data":
                    rows.append(("  (kernel multiply-adds / s)", "", "", f"{macs / r.seconds:.3e}",
                                 f"{macs / r.seconds / CPU_PEAK_MACS:.0%} of 1e11", "", "", "", ""))

    print(f"dasknn engine benchmark, {date.today()}, {platform.node()}, {os.cpu_count()} cores, "
          f"{args.workers} workers, {n} images of the real n1024-l120 network, {args.dtype}")
    head = ("mode", "batch", "seconds", "edges/s", "x reference", "mismatched", "bytes between workers",
            "tasks per layer / per s", "in tasks / transfers / other")
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for r in rows:
        print("| " + " | ".join(r) + " |")


if __name__ == "__main__":
    main()
