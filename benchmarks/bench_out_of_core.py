"""Out of core: a generated network larger than the workers' memory, streamed from its Zarr store.

Usage (from the repository root)::

    python benchmarks/bench_out_of_core.py [--neurons 65536] [--layers 480] [--images 1000] \\
        [--workers 2] [--memory-limit 2GB] [--store bench-out/n65536-l480.zarr] [--ramdisk]

Generates the network (once; the store is reused), runs data-mode inference with the layers streamed from the
store (at most 2 decoded per worker, the next read ahead) on workers with a memory limit, and checks the
categories against the reference computed layer by layer from the store. Reports generation time, the store's
size on disk, the workers' peak resident memory, bytes read from the store and edges/s. With ``--ramdisk``, also
times the same run without read-ahead and from a copy of the store in /dev/shm, to show what prefetching hides.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import time
from datetime import date
from pathlib import Path

import numpy as np


class _Rows(list):
    """Table rows, printed as they are measured (a long run shows what it has so far)."""

    def append(self, row: tuple[str, str]) -> None:
        super().append(row)
        print(f"| {row[0]} | {row[1]} |", flush=True)


def peak_rss(dask_worker) -> int:
    # the process's own high-water mark; not getrusage's ru_maxrss, which a spawned worker inherits from the
    # process that started it (it survives exec: a client that had 1.6 GB made every worker report 1.6 GB)
    with open("/proc/self/status") as f:
        line = next(x for x in f if x.startswith("VmHWM:"))
    return int(line.split()[1]) * 1024  # kB


def add_network_arguments(ap: argparse.ArgumentParser) -> None:
    """The options every out-of-core benchmark shares: the generated network, the batch, the workers."""
    ap.add_argument("--neurons", type=int, default=65536)
    ap.add_argument("--layers", type=int, default=480)
    ap.add_argument("--images", type=int, default=1000)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--memory-limit", default="2GB")
    ap.add_argument("--store", default=None, help="default: bench-out/n{neurons}-l{layers}.zarr")


def network_store(args: argparse.Namespace, title: str):
    """Start the benchmark's table (its title, date, machine) and open its store: generated once (timed), then
    reused. Returns the store's path, the open store and the table's rows."""
    from dasknn import generate
    from dasknn.store import open_store

    print(f"dasknn {title}, {date.today()}, {platform.node()}, {os.cpu_count()} cores")
    print("| what | measured |\n|---|---|", flush=True)
    rows = _Rows()
    path = Path(args.store or f"bench-out/n{args.neurons}-l{args.layers}.zarr")
    if not (path / "zarr.json").exists():
        t0 = time.perf_counter()
        generate.write(path, args.neurons, args.layers, args.images, seed=0, overwrite=True)
        rows.append(("generate into the store", f"{time.perf_counter() - t0:.1f} s"))
    s = open_store(path, check="metadata")
    csr_bytes = s.edges * (4 + 4) + s.depth * (s.neurons + 1) * 8
    rows.append(("network", f"{s.neurons} x {s.depth}, {s.edges:.3e} nonzeros, {csr_bytes / 1e9:.1f} GB as CSR"))
    return path, s, rows


def main() -> None:
    from dask.utils import parse_bytes

    from dasknn import engine, reference
    from dasknn.cluster import local_client

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_network_arguments(ap)
    ap.add_argument("--ramdisk", action="store_true")
    ap.add_argument("--no-reference", action="store_true")
    ap.add_argument("--reference-images", type=int, default=50,
                    help="images the (single-threaded SciPy) reference checks (default 50: it is slow at this size)")
    args = ap.parse_args()
    path, s, rows = network_store(args, "out-of-core benchmark")
    rows.append(("store on disk (zstd + crc32c)", f"{s.nbytes_on_disk() / 1e9:.2f} GB"))

    with local_client(workers=args.workers, memory_limit=args.memory_limit) as client:
        t0 = time.perf_counter()
        r = engine.infer(path, client=client, images=args.images, mode="data", resident=False)
        wall = time.perf_counter() - t0
        peaks = client.run(peak_rss)
    limit = parse_bytes(args.memory_limit)
    rows.append((f"streamed inference, {args.images} images, {args.workers} workers limited to {args.memory_limit}",
                 f"{r.seconds:.1f} s ({wall:.1f} s with loading), {r.edges_per_second:.3e} edges/s"))
    rows.append(("peak resident memory per worker", ", ".join(f"{p / 1e9:.2f} GB" for p in peaks.values()) +
                 f" (limit {limit / 1e9:.1f} GB: {'under' if max(peaks.values()) < limit else 'OVER'})"))
    rows.append(("bytes read from the store (decoded)", f"{r.bytes_read / 1e9:.2f} GB in {r.chunks} chunks"))

    if not args.no_reference:
        t0 = time.perf_counter()
        n = min(args.reference_images, args.images)
        ref = reference.infer_categories(s.iter_layers(), s.inputs.rows(0, n), s.bias, s.ymax, np.float32)
        t_ref = time.perf_counter() - t0
        ours = r.categories[r.categories < n]
        rows.append((f"reference on the first {n} images, layer by layer from the store",
                     f"{t_ref:.1f} s, {n * s.edges / t_ref:.3e} edges/s; categories {ref.size}, dasknn {ours.size}, "
                     f"mismatched {np.setxor1d(ref, ours).size}"))

    if args.ramdisk:
        with local_client(workers=args.workers, memory_limit=args.memory_limit) as client:
            t1 = engine.infer(path, client=client, images=args.images, mode="data", resident=False, keep_layers=1)
            shm = Path("/dev/shm") / path.name
            shutil.rmtree(shm, ignore_errors=True)
            shutil.copytree(path, shm)
            try:
                t2 = engine.infer(shm, client=client, images=args.images, mode="data", resident=False)
            finally:
                shutil.rmtree(shm, ignore_errors=True)
            t3 = engine.infer(path, client=client, images=args.images, mode="data", resident=False)
        rows.append(("read-ahead (2 layers) / none (1 layer) / store on RAM disk",
                     f"{t3.seconds:.1f} s / {t1.seconds:.1f} s / {t2.seconds:.1f} s: read-ahead is "
                     f"{t3.seconds / t2.seconds - 1:+.0%} against the RAM disk"))



if __name__ == "__main__":
    main()
