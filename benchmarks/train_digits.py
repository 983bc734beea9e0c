"""Real learning: scikit-learn's 8x8 digits, scaled to 32x32, through 4 sparse layers of 1024 neurons (32 per
row and column, the challenge-like generated topology) and a 10-way head, held-out 20 % (seeded split).

Usage (from the repository root; needs scikit-learn, the ``train`` extra)::

    python benchmarks/train_digits.py [--modes single,data,model] [--workers 2] [--epochs 5]

Prints test accuracy, loss and steps per second for each mode; the modes must agree.
"""

from __future__ import annotations

import argparse
import os
import platform
from datetime import date


def main() -> None:
    from dasknn import generate
    from dasknn import train as tr
    from dasknn.cluster import local_client

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--modes", default="single,data,model")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=5)
    args = ap.parse_args()
    net = generate.network(1024, 4, seed=0)
    common = dict(epochs=args.epochs, batch=64, lr=1e-3, optimizer="adam", seed=0)
    print(f"dasknn digits training, {date.today()}, {platform.node()}, {os.cpu_count()} cores, "
          f"4 sparse layers of 1024 (32 per row), Adam lr 1e-3, batch 64, {args.epochs} epochs")
    print("| mode | workers | steps | test accuracy | train loss | steps/s |\n|---|---|---|---|---|---|")
    for mode in args.modes.split(","):
        if mode == "single":
            r = tr.train(net, "digits", mode="single", **common)
            n = 1
        else:
            with local_client(workers=args.workers) as client:
                r = tr.train(net, "digits", mode=mode, workers=args.workers, client=client, **common)
            n = args.workers
        s = r.summary()
        print(f"| {mode} | {n} | {s['steps']} | {100 * s['test_accuracy']:.1f} % | {s['train_loss']:.4f} | "
              f"{s['steps'] / s['seconds']:.1f} |", flush=True)


if __name__ == "__main__":
    main()
