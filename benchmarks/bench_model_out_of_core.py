"""Model mode against data mode out of core: a generated network larger than the workers' memory, both streamed.

Usage (from the repository root)::

    python benchmarks/bench_model_out_of_core.py [--neurons 65536] [--layers 480] [--images 1000] \\
        [--workers 2] [--memory-limit 2GB] [--partition hypergraph] [--reference-images 20]

Data mode streams every layer to every worker (each reads the whole network for its half of the images); model
mode streams each part's own columns of every layer from a part plan (each reads half the network, for all the
images) and exchanges boundary activations. Both run here, one after the other, each on a fresh cluster of
``--workers`` workers limited to ``--memory-limit`` (so each peak is its own), with the cost model's predictions
for both taken before the first. Reports, side by side: seconds, edges/s, bytes read from the store, bytes sent
between workers, peak memory, the predictions against the times measured, and which mode ``--mode auto`` would
pick (the same ``cost.cheapest`` over the same predictions). The partition (computed once, out of core, then kept
in the store) and the part plan (written once by the workers, then kept) are timed apart: they are made once per
network and partition, not per run.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from bench_out_of_core import add_network_arguments, network_store, peak_rss


def main() -> None:
    from dask.utils import parse_bytes

    from dasknn import cost, engine, partition, reference
    from dasknn.cluster import local_client

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_network_arguments(ap)
    ap.add_argument("--partition", default="hypergraph")
    ap.add_argument("--reference-images", type=int, default=20,
                    help="images the (single-threaded SciPy) reference checks; 0 skips it")
    args = ap.parse_args()
    path, s, rows = network_store(args, "model vs data out of core")

    t0 = time.perf_counter()
    owners = engine.resolve_partition(str(path), args.partition, args.workers)  # kept in the store after
    volumes = np.array([partition.layer_volumes([s.layer(k)], owners[k - 1:k + 1], parts=args.workers)[0]
                        for k in range(1, s.depth + 1)])
    rows.append((f"partition ({args.partition}, {args.workers} parts, computed once or read back, out of core)",
                 f"{time.perf_counter() - t0:.1f} s; volume per layer: mean {volumes.mean():,.0f} of {s.neurons} "
                 f"neurons ({volumes.mean() / s.neurons:.0%}), min {volumes.min():,}, max {volumes.max():,}"))
    limit = parse_bytes(args.memory_limit)
    runs = {}
    predictions = None
    for mode in ("model", "data"):  # model first: its part plan is made (and timed) before either timed run
        with local_client(workers=args.workers, memory_limit=args.memory_limit) as client:
            t0 = time.perf_counter()
            r = engine.infer(path, client=client, images=args.images, mode=mode, partition=owners, resident=False,
                             explain=predictions is None)
            wall = time.perf_counter() - t0
            peaks = client.run(peak_rss)
        predictions = predictions or r.predictions
        runs[mode] = r
        rows.append((f"{mode} mode streamed, {args.images} images, {r.chunks} chunk(s)",
                     f"{r.seconds:.1f} s ({wall:.1f} s in all), {r.edges_per_second:.3e} edges/s"))
        if r.plan_seconds:
            rows.append(("part plan written by the workers (once per partition)", f"{r.plan_seconds:.1f} s"))
        rows.append((f"{mode}: bytes read from the store (decoded) / sent between workers",
                     f"{r.bytes_read / 1e9:.2f} GB / {r.bytes_sent / 1e9:.2f} GB" +
                     (f" (boundary messages as Dask recorded them {sum(r.exchange_bytes) / 1e9:.2f} GB; as dense "
                      f"rows {sum(r.dense_message_bytes) / 1e9:.2f} GB)" if mode == "model" else "")))
        rows.append((f"{mode}: peak resident memory per worker",
                     ", ".join(f"{p / 1e9:.2f} GB" for p in peaks.values()) +
                     f" (limit {limit / 1e9:.1f} GB: {'under' if max(peaks.values()) < limit else 'OVER'})"))
    m, d = runs["model"], runs["data"]
    rows.append(("model / data time", f"{m.seconds / d.seconds:.2f} (model {'faster' if m.seconds < d.seconds else 'slower'})"))
    for p in predictions:
        measured = runs[p.mode].seconds if p.mode in runs else float("nan")
        rows.append((f"predicted {p.mode} (compute / exchange / tasks / read)",
                     f"{p.seconds:.1f} s ({p.compute:.1f} / {p.exchange:.1f} / {p.tasks:.1f} / "
                     f"{p.read:.1f}); measured {measured:.1f} s: {p.seconds / measured - 1:+.0%}"))
    best = cost.cheapest(predictions)
    faster = "model" if m.seconds < d.seconds else "data"
    rows.append(("--mode auto would pick", f"{best.mode} (the faster measured: {faster})"))
    same = np.array_equal(m.categories, d.categories)
    rows.append(("categories, model against data", f"{m.categories.size} and {d.categories.size}: "
                                                   f"{'identical' if same else 'DIFFERENT'}"))
    if args.reference_images:
        n = min(args.reference_images, args.images)
        ref = reference.infer_categories(s.iter_layers(), s.inputs.rows(0, n), s.bias, s.ymax, np.float32)
        ours = m.categories[m.categories < n]
        rows.append((f"reference on the first {n} images, layer by layer from the store",
                     f"categories {ref.size}, dasknn {ours.size}, mismatched {np.setxor1d(ref, ours).size}"))


if __name__ == "__main__":
    main()
