"""The fused kernel on the blocks each mode runs: the whole layer (data mode) against one part's block (model mode),
on one process alone and on several at once.

Usage (from the repository root)::

    python benchmarks/bench_kernel_shapes.py [--store bench-out/n65536-l480.zarr] [--layer 240] [--parts 2] \\
        [--processes 2] [--partition hypergraph-k2-s0-e0.03]

Each figure is :func:`dasknn.cost.kernel_rate` (multiply-adds per second over one of the kernel's tiles of
random activations), the measurement the cost model makes per mode. With ``--processes`` processes running it at
once, as that many workers would on one machine, the rate also shows what they take from each other's caches
and memory bandwidth. The partition is one saved in the store (a model-mode run or ``dasknn partition`` saves it).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp


def _rate(args: tuple) -> float:
    from dasknn import cost

    return cost.kernel_rate(*args)


def main() -> None:
    import numpy as np

    from dasknn.store import load_partition, open_store

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--store", default="bench-out/n65536-l480.zarr")
    ap.add_argument("--layer", type=int, default=None, help="default: the middle layer")
    ap.add_argument("--parts", type=int, default=2)
    ap.add_argument("--processes", type=int, default=2)
    ap.add_argument("--partition", default=None, help="saved partition name (default: hypergraph-k{parts}-s0-e0.03)")
    ap.add_argument("--dtype", default="float32")
    args = ap.parse_args()
    s = open_store(args.store, check="lazy")
    k = args.layer or max(1, s.depth // 2)
    name = args.partition or f"hypergraph-k{args.parts}-s0-e0.03"
    found = load_partition(args.store, name)
    if found is None:
        raise SystemExit(f"{args.store}: no saved partition {name!r}")
    owners = np.ascontiguousarray(found[0][k - 1:k + 1])
    print(f"kernel rates, {s.neurons} x {s.depth} layer {k}, {args.dtype}, multiply-adds per second per process")
    print("| block | 1 process | " + f"{args.processes} processes at once (each) |")
    print("|---|---|---|")
    ctx = mp.get_context("spawn")
    for label, spec in (("whole layer (data mode)", None), (f"part 0 of {args.parts} (model mode)", owners)):
        one = _rate((args.store, k, args.dtype, spec, 0))
        with ctx.Pool(args.processes) as pool:
            many = pool.map(_rate, [(args.store, k, args.dtype, spec, i % args.parts if spec is not None else 0)
                                    for i in range(args.processes)])
        print(f"| {label} | {one:.3g} | " + ", ".join(f"{r:.3g}" for r in many) + " |")


if __name__ == "__main__":
    main()
