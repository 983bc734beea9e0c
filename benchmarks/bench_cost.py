"""The cost model against the clock: ``--mode auto``'s predictions beside measured runs of every mode, one run.

Usage (from the repository root, with the shared data beside the checkout)::

    python benchmarks/bench_cost.py [--images 20000] [--workers 2] [--wide bench-out/n65536-l60.zarr]

Case 1, the real n1024-l120 network: ``auto`` with ``explain`` (what it predicts and picks), then data mode and
model mode (hypergraph partition, compact messages; and dense messages) measured; per mode: predicted and
measured seconds, the error, and the bytes that crossed between workers (Dask's counters) with the per-layer
message sizes. Case 2 (``--wide``, a generated 65536-neuron store, workers limited to ``--memory-limit``): the
same for data mode streaming, model mode where it fits.
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile
from datetime import date
from pathlib import Path


def _row(name: str, pred: dict | None, r, truth) -> tuple:
    import numpy as np

    measured = r.seconds
    predicted = pred.seconds if pred else float("nan")
    err = (predicted - measured) / measured if pred else float("nan")
    # a lower bound (the exchange not estimated: the setup and data mode's multiply-adds alone cost more than data
    # mode) is not a prediction to miss by
    error = "bound" if pred and pred.volumes_from == "bound" else f"{err:+.0%}"
    wrong = "-" if truth is None else str(np.setxor1d(r.categories, truth).size)
    sent = f"{r.bytes_sent / 1e6:.1f} MB" if r.group_size > 1 else "-"
    parts = (f"{pred.compute:.2f} / {pred.exchange:.2f} / {pred.tasks:.2f} / {pred.read:.2f}"
             + (f" ({pred.transport}; ran {r.exchange})" if pred.transport else "")) if pred else "-"
    return (name, f"{predicted:.2f}", parts, f"{measured:.2f}", error, f"{r.edges_per_second:.3e}", wrong, sent)


def _case(client, store, inputs, images, truth, modes, title, memory_note=""):
    from dasknn import engine

    auto = engine.infer(store, inputs, client, mode="auto", explain=True, images=images)
    preds = {(p.mode, p.group_size): p for p in auto.predictions}
    rows = []
    measured = {}
    for name, kwargs in modes:
        r = engine.infer(store, inputs, client, images=images, **kwargs)
        measured[(r.mode, r.group_size)] = r.seconds
        rows.append(_row(name, preds.get((r.mode, r.group_size)), r, truth))
        if r.group_size > 1:
            per_layer = ", ".join(f"{d / 1e6:.1f}->{m / 1e6:.2f}" for d, m in
                                  zip(r.dense_message_bytes[:: max(1, r.layers // 8)], r.message_bytes[:: max(1, r.layers // 8)]))
            rows.append(("  messages per layer, MB dense->compact (every " f"{max(1, r.layers // 8)}th layer)",
                         "", "", "", "", "", "", per_layer))
    fastest = min(measured, key=measured.get)
    print(f"\n{title}{memory_note}: auto picked {auto.mode} (group {auto.group_size}) in {auto.seconds:.2f} s; "
          f"fastest measured: {fastest[0]} (group {fastest[1]}); calibration: "
          + ", ".join(f"{k} {v:.3g}" for k, v in auto.calibration.as_dict().items() if isinstance(v, float))
          + ", kernel_rates by group size " + ", ".join(f"{g}: {v:.3g}" for g, v in auto.calibration.kernel_rates.items()))
    head = ("mode", "predicted s", "compute / exchange / tasks / read", "measured s", "error", "edges/s",
            "mismatched", "bytes between workers")
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for row in rows:
        print("| " + " | ".join(row) + " |", flush=True)


def main() -> None:
    from dasknn import io
    from dasknn.cli import import_network
    from dasknn.cluster import local_client
    from dasknn.store import write_inputs_store

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=str(Path(__file__).resolve().parents[2] / "shared/data/graphchallenge"))
    ap.add_argument("--images", type=int, default=20000)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--wide", default=None, help="a generated wide store for case 2 (skipped when not given)")
    ap.add_argument("--wide-images", type=int, default=1000)
    ap.add_argument("--memory-limit", default="2GB")
    args = ap.parse_args()
    data = Path(args.data)
    print(f"dasknn cost-model benchmark, {date.today()}, {platform.node()}, {os.cpu_count()} cores, "
          f"{args.workers} workers")
    truth = io.read_categories(data / "neuron1024-l120-categories.tsv")
    truth = truth[truth < args.images]
    with tempfile.TemporaryDirectory() as tmp:
        store = import_network(data / "neuron1024.tar.gz", Path(tmp) / "real.zarr")
        inputs = write_inputs_store(Path(tmp) / "in.zarr", io.read_images(data / "sparse-images-1024.tsv.gz")[:args.images])
        with local_client(workers=args.workers) as client:
            _case(client, store, inputs, args.images, truth,
                  [("data", dict(mode="data")),
                   ("model hypergraph compact", dict(mode="model")),
                   ("model hypergraph dense", dict(mode="model", messages="dense"))],
                  f"real n1024-l120, {args.images} images")
    if args.wide:
        with local_client(workers=args.workers, memory_limit=args.memory_limit) as client:
            _case(client, args.wide, None, args.wide_images, None,
                  [("data streamed", dict(mode="data", resident=False))],
                  f"{args.wide}, {args.wide_images} images", f", workers limited to {args.memory_limit}")


if __name__ == "__main__":
    main()
