"""What the pass after a lost worker loads again in model mode: only the lost worker's part (kept placement, issue 42
item 12) against every part (as before), side by side in one run.

Usage (from the repository root)::

    python benchmarks/bench_lost_parts.py [--neurons 4096] [--layers 120] [--images 1200] [--parts 3] [--repeats 2]

A generated network with its truth; ``--parts`` local worker processes under nannies, model mode with one part a
worker (task exchange, 6 chunks). Each run SIGKILLs the last worker as part 1 starts layer ``layers / 2`` of the first
chunk; its nanny starts a new worker and the pass after the loss runs on the workers there are. "kept" is the engine
as it is (the survivors keep their parts; the lost part is planned and loaded on the new worker); "all reloaded"
is the same engine with every held part refused (``HeldParts.layers_on`` answering None), which plans and loads every
part again, as the engine did before. Prints, for the pass after the loss: the parts planned and loaded, the bytes
of the parts' layers loaded (the scheduler's sizes of the weights tasks), the plan and load phases' seconds, the
pass's inference seconds, and whether the categories equal the truth.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import tempfile
import threading
import time
from datetime import date
from pathlib import Path

import numpy as np


def _plugin(trigger: str):
    from distributed.diagnostics.plugin import SchedulerPlugin

    class Watch(SchedulerPlugin):
        """``ready`` set as a ``trigger`` task is sent to its worker; the weights tasks finished, with their sizes."""

        def __init__(self) -> None:
            self.ready, self.loaded, self.scheduler = threading.Event(), [], None

        def transition(self, key, start, finish, *args, **kwargs) -> None:
            if not isinstance(key, str):
                return
            if finish == "processing" and key.startswith(trigger):
                self.ready.set()
            elif finish == "memory" and key.startswith("weights-g"):
                self.loaded.append(self.scheduler.tasks[key].nbytes)

    return Watch()


def _one(client, path, args, refuse_held: bool) -> dict:
    # one inference losing its last worker halfway through the first chunk; the figures of the pass after the loss
    from dasknn import engine
    from dasknn.engine.places import HeldParts

    infer_module = sys.modules["dasknn.engine.infer"]  # (the package's name ``infer`` is the function)
    passes = []
    execute = infer_module.execute

    def recorded(client, job, workers, g, todo, out, *rest):
        passes.append(out)
        return execute(client, job, workers, g, todo, out, *rest)

    layers_on = HeldParts.layers_on
    infer_module.execute = recorded
    if refuse_held:
        HeldParts.layers_on = lambda self, slot, worker, parts: None
    watch = _plugin(f"spmm-l{args.layers // 2}-p1-c0-")
    watch.scheduler = client.cluster.scheduler  # (in this process: a local cluster's)
    watch.scheduler.add_plugin(watch, name="bench-lost-parts")
    victim = sorted(client.scheduler_info()["workers"])[-1]
    pid = client.run(os.getpid, workers=[victim])[victim]
    box: dict = {}

    def kill() -> None:
        if watch.ready.wait(300):
            box["before"] = len(watch.loaded)
            os.kill(pid, signal.SIGKILL)

    t = threading.Thread(target=kill)
    t.start()
    try:
        result = engine.infer(path, client=client, mode="model", chunks=6, exchange="tasks")
    finally:
        t.join(10)
        infer_module.execute, HeldParts.layers_on = execute, layers_on
        client.cluster.scheduler.remove_plugin(name="bench-lost-parts")
    client.wait_for_workers(args.parts, timeout=60)
    [loss] = result.recoveries
    after = passes[-1]
    return {"loaded": after.parts_loaded, "kept": after.parts_kept,
            "bytes": sum(watch.loaded[box["before"]:]), "plan": after.plan_seconds, "load": after.load_seconds,
            "inference": after.seconds, "phase": loss["phase"],
            "exact": bool(np.array_equal(result.categories, args.truth))}


def main() -> None:
    from dasknn import engine, generate, store
    from dasknn.cluster import local_client

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--neurons", type=int, default=4096)
    ap.add_argument("--layers", type=int, default=120)
    ap.add_argument("--images", type=int, default=1200)
    ap.add_argument("--parts", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    rows: dict[str, list[dict]] = {"kept": [], "all reloaded": []}
    with tempfile.TemporaryDirectory() as tmp:
        path = generate.write(Path(tmp) / "net.zarr", args.neurons, args.layers, args.images, seed=5, truth=True)
        args.truth = store.open_inputs(path).truth(np.float64)  # (the default arithmetic)
        with local_client(workers=args.parts) as client:
            # warm: the kernels compiled, the partition kept in the store
            engine.infer(path, client=client, mode="model", chunks=6, exchange="tasks")
            for _ in range(args.repeats):
                for name in rows:  # side by side, alternating
                    rows[name].append(_one(client, path, args, refuse_held=name != "kept"))
    print(f"dasknn lost-part benchmark, {date.today()}, {os.uname().nodename}, {os.cpu_count()} cores, "
          f"{args.neurons} x {args.layers}, {args.images} images, model mode, {args.parts} parts on {args.parts} "
          f"workers, 6 chunks, task exchange, {args.repeats} runs each (median; each run's figures in brackets)")
    print("| after the loss | parts planned and loaded | parts kept | bytes loaded (MB) | plan s | load s | "
          "plan + load s | inference s | exact | phase |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, runs in rows.items():
        def cell(key: str, scale: float = 1.0, fmt: str = ".2f") -> str:
            values = [r[key] * scale for r in runs]
            return f"{statistics.median(values):{fmt}} ({', '.join(f'{v:{fmt}}' for v in values)})"

        for r in runs:
            r["setup"] = r["plan"] + r["load"]
        print(f"| {name} | {cell('loaded', fmt='.0f')} | {cell('kept', fmt='.0f')} | {cell('bytes', 1e-6, '.1f')} | "
              f"{cell('plan')} | {cell('load')} | {cell('setup')} | {cell('inference')} | "
              f"{all(r['exact'] for r in runs)} | {', '.join(sorted({r['phase'] for r in runs}))} |")


if __name__ == "__main__":
    main()
