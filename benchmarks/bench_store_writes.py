"""Writing a part plan, and a network's layers, to an object store that answers each request late, two code versions
alternated (issue 45).

Model mode out of core reads its parts from a part plan, written once next to the layers: a task per layer, each
writing every part's lists and block. ``dasknn generate`` and ``dasknn import`` write a network layer by layer. Behind
an object store, what a writer asks one request at a time costs a wait each (S3: tens of milliseconds before an
answer), whatever its size. This serves moto's S3 API on 127.0.0.1 (``tests/support/s3.py``), answering each request
``--wait-ms`` late, and in a child process per ``--tree`` version (its tree first on ``PYTHONPATH``):

- writes the part plan of ``STORE`` (local) under a block partition of ``--parts`` parts to ``s3://nets/...``, as the
  engine's ``plan-l{k}`` tasks do (:func:`dasknn.engine.tasks.write_part_plan_layer`, one layer after another, as
  one worker thread runs them), and to a local folder; every layer written is read back
  (``PlanStore.part_layer``) and compared with the local plan;
- writes ``STORE``'s first ``--layers`` layers as a network of their own (``store.write_network``), to S3 and to a
  local folder, and reads every layer back from S3 to compare;
- writes as many chunks of a run's results with their activations (``--results`` with ``--activations``: 1,000
  images a chunk, a twentieth of their activations nonzero), to S3 and to a local folder, and reads them back.

The rounds alternate the versions so the machine's load falls on both alike.

    python benchmarks/bench_store_writes.py STORE --tree before=/tmp/before --tree after=. [--wait-ms 0,30]
        [--layers 10] [--parts 2] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests" / "support"))

from versions import add_tree_argument, median, named_trees, ratios_to, tree_env  # noqa: E402

ROW_MARK = "ROW "


def block_owners(layers: int, neurons: int, parts: int):
    """Every layer's neurons cut into ``parts`` equal runs (the partition does not change what is written, only how
    much)."""
    import numpy as np

    return np.tile((np.arange(neurons) * parts // neurons).astype(np.int32), (layers + 1, 1))


def child(store: str, url: str, layers: int, parts: int) -> None:
    """Write ``layers`` layers of the plan at ``url`` and locally, then as many of the network's layers; print the
    seconds and whether what was written reads back equal."""
    import numpy as np
    import scipy.sparse as sp

    import dasknn
    from dasknn.engine.tasks import write_part_plan_layer
    from dasknn.network import Network
    from dasknn.store import (PlanStore, create_plan_store, finish_plan_store, open_results, open_store,
                              read_activations, write_chunk_result, write_network)

    print(f"dasknn from {dasknn.__file__}", flush=True)
    network = open_store(store, check="metadata")
    owners = block_owners(network.depth, network.neurons, parts)
    depth = min(layers, network.depth)
    with tempfile.TemporaryDirectory() as tmp:
        local = str(Path(tmp) / "plan.zarr")
        create_plan_store(local, store, owners)
        counts = np.zeros((network.depth, parts, parts), dtype=np.int64)
        t0 = time.perf_counter()
        for k in range(1, depth + 1):
            counts[k - 1] = write_part_plan_layer(store, local, k, parts)
        local_ms = (time.perf_counter() - t0) / depth * 1e3
        t0 = time.perf_counter()
        create_plan_store(url, store, owners)
        start_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        for k in range(1, depth + 1):
            write_part_plan_layer(store, url, k, parts)
        layer_ms = (time.perf_counter() - t0) / depth * 1e3
        finish_plan_store(local, counts)
        finish_plan_store(url, counts)
        written, made = PlanStore(url), PlanStore(local)
        same = all(_equal(written.part_layer(q, k, "float32"), made.part_layer(q, k, "float32"))
                   for k in range(1, depth + 1) for q in range(parts))
        # the network's first layers as a network of their own, written whole to S3 and to a local folder
        first = Network([network.layer(k) for k in range(1, depth + 1)], network.bias)
        times = {}
        for where in (f"{url.removesuffix('.zarr')}-network.zarr", str(Path(tmp) / "network.zarr")):
            t0 = time.perf_counter()
            write_network(where, first)
            times[where] = (time.perf_counter() - t0) / depth * 1e3
            back = open_store(where, check="metadata")
            same = same and all((back.layer(k) != first.layers[k - 1]).nnz == 0 for k in range(1, depth + 1))
        network_ms, network_local_ms = times.values()
        # --results with --activations: a chunk's categories and its images' final activations, chunk by chunk
        chunk, neurons = 1000, network.neurons
        bounds = [(c * chunk, (c + 1) * chunk) for c in range(depth)]
        run = {"network": store, "inputs": store, "images": depth * chunk, "dtype": "float32", "chunks": bounds}
        rng = np.random.default_rng(0)
        kept = [sp.random(chunk, neurons, density=0.05, format="csr", dtype=np.float32, random_state=rng)
                for _ in bounds]
        for where in (f"{url.removesuffix('.zarr')}-results.zarr", str(Path(tmp) / "results.zarr")):
            open_results(where, run, resume=False, activations=True)
            t0 = time.perf_counter()
            for c, (a, b) in enumerate(bounds):
                write_chunk_result(where, c, np.arange(a, b), kept[c])
            times[where] = (time.perf_counter() - t0) / depth * 1e3
            same = same and (read_activations(where) != sp.vstack(kept)).nnz == 0
        results_ms, results_local_ms = list(times.values())[2:]
    print(ROW_MARK + json.dumps({"start_s": start_s, "layer_ms": layer_ms, "local_ms": local_ms,
                                 "network_ms": network_ms, "network_local_ms": network_local_ms,
                                 "results_ms": results_ms, "results_local_ms": results_local_ms, "same": same}),
          flush=True)


def _equal(a, b) -> bool:
    import numpy as np

    (pa, ba), (pb, bb) = a, b
    lists = lambda pl: [pl.outputs, pl.inputs, *pl.local, *pl.recv.values(), *pl.send.values()]  # noqa: E731
    return (sorted(pa.recv) == sorted(pb.recv) and sorted(pa.send) == sorted(pb.send)
            and all(np.array_equal(x, y) for x, y in zip(lists(pa), lists(pb)))
            and all(np.array_equal(x, y) for x, y in zip(ba, bb)))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("store")
    add_tree_argument(p)
    p.add_argument("--wait-ms", default="0,30", help="each request answered this late, one run per value")
    p.add_argument("--layers", type=int, default=10)
    p.add_argument("--parts", type=int, default=2)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    store = str(Path(args.store).resolve())
    if args.child:
        child(store, args.child, args.layers, args.parts)
        return
    from s3 import BUCKET, environment, moto_server

    trees = named_trees(args, "bench_store_writes")
    started = datetime.now(timezone.utc)
    waits = [float(w) for w in args.wait_ms.split(",")]
    rows: dict[tuple[str, float], list[dict]] = {}
    for wait in waits:
        with moto_server(wait) as endpoint, environment(endpoint.environment()):
            for rnd in range(args.rounds):
                for name, tree in trees:
                    url = f"s3://{BUCKET}/plan-{name}-{wait:g}-{rnd}.zarr"
                    cmd = [sys.executable, __file__, store, "--child", url, "--layers", str(args.layers),
                           "--parts", str(args.parts)]
                    out = subprocess.run(cmd, env=tree_env(tree), stdout=subprocess.PIPE, text=True,
                                         check=True).stdout
                    for line in out.splitlines():
                        if line.startswith(ROW_MARK):
                            rows.setdefault((name, wait), []).append(json.loads(line[len(ROW_MARK):]))
                            print(f"  wait {wait:g} ms, round {rnd + 1}, {name}: {rows[(name, wait)][-1]}",
                                  flush=True)
                        else:
                            print(f"  {name}: {line}", flush=True)
    print(f"\n{started:%Y-%m-%d %H:%M}-{datetime.now(timezone.utc):%H:%M} UTC, {platform.node()}, store {store}, "
          f"K = {args.parts}, {args.layers} layers a round, {args.rounds} rounds (medians)")
    print("| wait a request, ms | version | start the plan, s | a plan layer, ms | the same to a local folder, ms | "
          "a network layer, ms | the same to a local folder, ms | a results chunk, ms | the same to a local folder, "
          "ms | read back equal | each / the first version's |")
    print("|--:|---|--:|--:|--:|--:|--:|--:|--:|---|---|")
    keys = ("start_s", "layer_ms", "local_ms", "network_ms", "network_local_ms", "results_ms", "results_local_ms")
    for wait in waits:
        first = None
        for name, _ in trees:
            got = rows[(name, wait)]
            figures = [median([r[key] for r in got]) for key in keys]
            first = first or figures
            print(f"| {wait:g} | {name} | {figures[0]:.2f} | " + " | ".join(f"{x:.1f}" for x in figures[1:])
                  + f" | {all(r['same'] for r in got)} | {ratios_to(figures, first)} |")


if __name__ == "__main__":
    main()
