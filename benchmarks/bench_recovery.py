"""What losing a worker costs: the same inference uninterrupted and with a worker killed halfway, one run.

Usage (from the repository root)::

    python benchmarks/bench_recovery.py [--neurons 1024] [--layers 60] [--images 4000] [--mode model]

A generated network with its truth; 2 local workers; the second run kills one worker process (SIGKILL) once any
part has finished half the layers. Prints both wall times, what the engine recovered (chunks kept and re-run,
seconds waited for the nanny's new worker) and whether the categories equal the truth.
"""

from __future__ import annotations

import argparse
import os
import signal
import tempfile
import threading
import time
from datetime import date
from pathlib import Path

import numpy as np


def _deepest_layer_done(dask_scheduler) -> int:
    done = [int(key.split("-")[1][1:].split("-")[0]) for key, ts in dask_scheduler.tasks.items()
            if isinstance(key, str) and key.startswith("spmm-l") and ts.state == "memory"]
    return max(done, default=0)


def main() -> None:
    from dasknn import engine, generate, store
    from dasknn.cluster import local_client

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--neurons", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=60)
    ap.add_argument("--images", type=int, default=4000)
    ap.add_argument("--mode", default="model")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = generate.write(Path(tmp) / "net.zarr", args.neurons, args.layers, args.images, seed=5, truth=True)
        truth = store.open_inputs(path).truth("float32")
        kw = dict(mode=args.mode, chunks=4, segment=1 if args.mode == "data" else None)
        with local_client(workers=2) as client:
            engine.infer(path, client=client, **kw)  # warm: kernels compiled, partition kept in the store
            t0 = time.perf_counter()
            plain = engine.infer(path, client=client, **kw)
            plain_wall = time.perf_counter() - t0
            victim = sorted(client.scheduler_info()["workers"])[1]
            pid = client.run(os.getpid, workers=[victim])[victim]
            box: dict = {}
            t0 = time.perf_counter()
            t = threading.Thread(target=lambda: box.setdefault("r", engine.infer(path, client=client, **kw)))
            t.start()
            while client.run_on_scheduler(_deepest_layer_done) < args.layers // 2 and t.is_alive():
                time.sleep(0.01)
            os.kill(pid, signal.SIGKILL)
            t.join()
            killed_wall = time.perf_counter() - t0
    r = box["r"]
    print(f"dasknn recovery benchmark, {date.today()}, {os.uname().nodename}, {os.cpu_count()} cores, "
          f"{args.neurons} x {args.layers}, {args.images} images, {args.mode} mode, 2 workers, 4 chunks")
    print("| run | wall s | inference s | categories equal the truth | recoveries |")
    print("|---|---|---|---|---|")
    print(f"| uninterrupted | {plain_wall:.2f} | {plain.seconds:.2f} | "
          f"{np.array_equal(plain.categories, truth)} | - |")
    print(f"| worker killed at layer {args.layers // 2} | {killed_wall:.2f} | {r.seconds:.2f} | "
          f"{np.array_equal(r.categories, truth)} | {r.recoveries} |")
    print(f"cost of the loss: {killed_wall - plain_wall:+.2f} s wall ({killed_wall / plain_wall:.2f}x)")


if __name__ == "__main__":
    main()
