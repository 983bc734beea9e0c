"""A streaming worker that runs several chunks fetching each layer once (its stream keeping what it fetched,
``sizing.stream_hold_bytes``) against fetching the layers again for every chunk (as before issue 45), alternated
on the workers of one warm cluster.

Usage (from the repository root)::

    python benchmarks/bench_read_once.py STORE [--chunks 4] [--rounds 3] [--workers 2] [--memory-limit 600MB]
        [--modes data,model]

Each round runs each mode (data mode streamed, model mode streamed from a part plan over ``block`` parts, float64)
twice: with its streams keeping what they fetch (``kept``, today's) and without (``fetched again``: the hold
computed on the client patched to 0 bytes). The first round (compiling, the part plan made) is dropped. Prints for
each the bytes the workers read (the JSON's ``bytes_read``: decoded bytes of the layers fetched from the store),
that over one pass of the network, best and median inference seconds, and the categories' agreement.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import statistics
import tempfile
from collections.abc import Iterator

import numpy as np

#: Whether the streams keep what they fetch, by setting's name.
SETTINGS = {"kept": True, "fetched again": False}


@contextlib.contextmanager
def fetched_again(on: bool = True) -> Iterator[None]:
    """Within the block (``on``), runs made on this client stream as before issue 45: their streams keep nothing
    (the hold the client computes, ``sizing.stream_hold_bytes``, patched to 0 bytes)."""
    if not on:  # nothing patched (so the code before issue 45, which has no hold, runs too)
        yield
        return
    infer_module = importlib.import_module("dasknn.engine.infer")  # (the module: the package's name is its function)
    hold = infer_module.stream_hold_bytes
    infer_module.stream_hold_bytes = lambda *args: 0
    try:
        yield
    finally:
        infer_module.stream_hold_bytes = hold


def _run(client, store: str, mode: str, chunks: int, plan: str, kept: bool):
    from dasknn import engine

    with fetched_again(not kept):
        return engine.infer(store, client=client, mode=mode, resident=False, chunks=chunks, dtype="float64",
                            **({"partition": "block", "plan_store": plan} if mode == "model" else {}))


def main() -> None:
    from dasknn import store as stores
    from dasknn.cluster import local_client

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("store")
    ap.add_argument("--chunks", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--memory-limit", default="600MB")
    ap.add_argument("--modes", default="data,model")
    args = ap.parse_args()
    modes = args.modes.split(",")
    network = stores.open_store(args.store)
    one_pass = sum(w.indptr.nbytes + w.indices.nbytes + w.data.astype(np.float64).nbytes
                   for w in network.iter_layers())
    seconds = {(m, s): [] for m in modes for s in SETTINGS}
    read: dict[tuple[str, str], int] = {}
    categories = []
    with tempfile.TemporaryDirectory() as plans, \
            local_client(workers=args.workers, threads_per_worker=1, memory_limit=args.memory_limit) as client:
        for round_ in range(args.rounds):
            for mode in modes:
                for name, kept in SETTINGS.items():
                    r = _run(client, args.store, mode, args.chunks, os.path.join(plans, "plan"), kept)
                    categories.append(r.categories)
                    read[mode, name] = r.bytes_read
                    if round_:
                        seconds[mode, name].append(r.seconds)
    agree = all(np.array_equal(c, categories[0]) for c in categories)
    print(f"# {os.path.basename(args.store.rstrip('/'))}, {args.workers} workers of {args.memory_limit}, "
          f"{args.chunks} chunks, one pass of the network {one_pass:,} bytes, load {os.getloadavg()[0]:.2f}, "
          f"categories {'equal' if agree else 'DIFFER'}")
    for (mode, name), values in seconds.items():
        print(f"{mode}, {name}: bytes read {read[mode, name]:,} ({read[mode, name] / one_pass:.2f} passes), "
              f"best {min(values):.3f} s, median {statistics.median(values):.3f} s")


if __name__ == "__main__":
    main()
