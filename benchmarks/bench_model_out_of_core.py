"""Model, data and pipeline mode out of core: a generated network larger than the workers' memory, streamed.

Usage (from the repository root)::

    python benchmarks/bench_model_out_of_core.py [--neurons 65536] [--layers 480] [--images 1000] \\
        [--workers 2] [--memory-limit 2GB] [--partition hypergraph] [--reference-images 20] \\
        [--modes model,data,pipeline]

Data mode streams every layer to every worker (each reads the whole network for its half of the images); model
mode streams each part's own columns of every layer from a part plan (each reads half the network, for all the
images) and exchanges boundary activations; pipeline mode gives each worker a stage of consecutive layers (each
reads its own layers, for all the images) and sends a chunk's live activations once per stage boundary. Each runs
here, one after the other, each on a fresh cluster of
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
    ap.add_argument("--modes", default="model,data",
                    help="the modes to run, in order (model first: its part plan is timed apart before any run)")
    ap.add_argument("--chunks", type=int, default=None, help="image chunks, every mode (default: each mode's own)")
    ap.add_argument("--reference-images", type=int, default=20,
                    help="images the (single-threaded SciPy) reference checks; 0 skips it")
    args = ap.parse_args()
    modes = args.modes.split(",")
    path, s, rows = network_store(args, " / ".join(modes) + " out of core")

    owners = None
    if "model" in modes:
        t0 = time.perf_counter()
        owners = engine.resolve_partition(str(path), args.partition, args.workers)  # kept in the store after
        volumes = np.array([partition.layer_volumes([s.layer(k)], owners[k - 1:k + 1], parts=args.workers)[0]
                            for k in range(1, s.depth + 1)])
        rows.append((f"partition ({args.partition}, {args.workers} parts, computed once or read back, out of core)",
                     f"{time.perf_counter() - t0:.1f} s; volume per layer: mean {volumes.mean():,.0f} of "
                     f"{s.neurons} neurons ({volumes.mean() / s.neurons:.0%}), min {volumes.min():,}, "
                     f"max {volumes.max():,}"))
    limit = parse_bytes(args.memory_limit)
    runs = {}
    predictions = None
    for mode in modes:
        # data and model mode streamed; pipeline mode as its default decides (each stage resident where it fits
        # its worker, else streamed within the stage)
        options = dict(partition=owners, resident=False) if mode != "pipeline" else {}
        if args.chunks:
            options["chunks"] = args.chunks
        with local_client(workers=args.workers, memory_limit=args.memory_limit) as client:
            t0 = time.perf_counter()
            r = engine.infer(path, client=client, images=args.images, mode=mode, explain=predictions is None,
                             **options)
            wall = time.perf_counter() - t0
            peaks = client.run(peak_rss)
        predictions = predictions or r.predictions
        runs[mode] = r
        stages = f", stages {' '.join(f'{a}-{b}' for a, b in r.stages)}" if r.stages else ""
        rows.append((f"{mode} mode {'resident' if r.resident else 'streamed'}, {args.images} images, "
                     f"{r.chunks} chunk(s), {r.tasks} tasks{stages}",
                     f"{r.seconds:.1f} s ({wall:.1f} s in all), {r.edges_per_second:.3e} edges/s"))
        if r.plan_seconds:
            rows.append(("part plan written by the workers (once per partition)", f"{r.plan_seconds:.1f} s"))
        rows.append((f"{mode}: bytes read from the store (decoded; per worker) / sent between workers",
                     f"{r.bytes_read / 1e9:.2f} GB ({r.bytes_read / args.workers / 1e9:.2f} GB) / "
                     f"{r.bytes_sent / 1e9:.2f} GB" +
                     (f" (boundary messages as Dask recorded them {sum(r.exchange_bytes) / 1e9:.2f} GB; as dense "
                      f"rows {sum(r.dense_message_bytes) / 1e9:.2f} GB)" if mode == "model" else "")))
        rows.append((f"{mode}: peak resident memory per worker",
                     ", ".join(f"{p / 1e9:.2f} GB" for p in peaks.values()) +
                     f" (limit {limit / 1e9:.1f} GB: {'under' if max(peaks.values()) < limit else 'OVER'})"))
    first = runs[modes[0]]
    for mode in modes[1:]:
        r = runs[mode]
        rows.append((f"{mode} / {modes[0]}: time, bytes read",
                     f"{r.seconds / first.seconds:.2f}, {r.bytes_read / max(1, first.bytes_read):.2f}"))
    for p in predictions:
        measured = runs[p.mode].seconds if p.mode in runs else float("nan")
        rows.append((f"predicted {p.mode} (compute / exchange / tasks / read)",
                     f"{p.seconds:.1f} s ({p.compute:.1f} / {p.exchange:.1f} / {p.tasks:.1f} / "
                     f"{p.read:.1f}); measured {measured:.1f} s: {p.seconds / measured - 1:+.0%}"))
    best = cost.cheapest(predictions)
    fastest = min(runs, key=lambda m: runs[m].seconds)
    rows.append(("--mode auto would pick", f"{best.mode} (the fastest measured: {fastest})"))
    for mode in modes[1:]:
        same = np.array_equal(first.categories, runs[mode].categories)
        rows.append((f"categories, {mode} against {modes[0]}", f"{first.categories.size} and "
                     f"{runs[mode].categories.size}: {'identical' if same else 'DIFFERENT'}"))
    if args.reference_images:
        n = min(args.reference_images, args.images)
        ref = reference.infer_categories(s.iter_layers(), s.inputs.rows(0, n), s.bias, s.ymax, np.float32)
        ours = first.categories[first.categories < n]
        rows.append((f"reference on the first {n} images, layer by layer from the store",
                     f"categories {ref.size}, dasknn ({modes[0]}) {ours.size}, mismatched "
                     f"{np.setxor1d(ref, ours).size}"))


if __name__ == "__main__":
    main()
