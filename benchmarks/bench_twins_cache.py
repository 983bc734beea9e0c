"""The layer loop with each resident layer's twins found once (``kernels.cpu._layer_twins``) against finding them
on every call, as before, side by side in one process.

Usage (from the repository root)::

    python benchmarks/bench_twins_cache.py [--rounds 8] [--shapes 65536x256,16384x256,1024x256]

Each shape is generated layers (``NEURONSxIMAGES``: 4 layers at 65,536 neurons, 8 below) and a batch of random
inputs at the clamp (25 % nonzero, so images live on), run through :func:`dasknn.kernels.cpu.run_layers_numpy` with
the cache and with a stand-in that searches every time, alternating which goes first, the first round untimed
(compiling, the cache's first search); it prints the medians and their ratio, and checks the results are equal.
"""

from __future__ import annotations

import argparse
import time

import numpy as np


def main() -> None:
    from dasknn import generate
    from dasknn.kernels import cpu

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--shapes", default="65536x256,16384x256,1024x256")
    args = ap.parse_args()
    cached = cpu._layer_twins

    def uncached(layer, indptr, indices, images):
        return cpu._twin_groups(indptr, indices, images, np.arange(indptr.size - 1))

    print("| neurons | images | layers | found once, ms | found every call, ms | every call / once | equal |")
    print("|--:|--:|--:|--:|--:|--:|---|")
    for shape in args.shapes.split(","):
        neurons, images = (int(v) for v in shape.split("x"))
        depth = 4 if neurons >= 65536 else 8
        layers = [(w.indptr, w.indices, w.data) for w in generate.iter_layers(neurons, depth, seed=1, dtype=np.float64)]
        rng = np.random.default_rng(0)
        yt = (rng.random((neurons, images)) < 0.25) * 32.0
        ids = np.arange(images)
        times: dict = {"once": [], "every": []}
        out: dict = {}
        try:
            for r in range(args.rounds + 1):
                order = (("once", cached), ("every", uncached))
                for key, find in order if r % 2 else order[::-1]:
                    cpu._layer_twins = find
                    t0 = time.perf_counter()
                    out[key] = cpu.run_layers_numpy(yt, layers, -0.3, 32.0, ids)
                    if r:
                        times[key].append(time.perf_counter() - t0)
        finally:
            cpu._layer_twins = cached
        once, every = (float(np.median(times[k])) for k in ("once", "every"))
        equal = all(np.array_equal(a, b) for a, b in zip(out["once"], out["every"]))
        print(f"| {neurons} | {images} | {depth} | {once * 1e3:.1f} | {every * 1e3:.1f} | {every / once:.3f} "
              f"| {'yes' if equal else 'NO'} |", flush=True)


if __name__ == "__main__":
    main()
