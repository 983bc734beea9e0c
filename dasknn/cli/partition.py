"""``dasknn partition``: the layers' neurons over K parts, reported, saved and optionally drawn."""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import numpy as np

from ..errors import DasknnError
from ..locations import as_location, exists
from ..partials import new_partial
from .common import PLOT_EXTRA, Progress, emit, local_argument, positive_int, require_matplotlib


def cmd_partition(args: argparse.Namespace) -> int:
    """``dasknn partition``: partition, report, and keep the owners with a store (or in ``--out``)."""
    from .. import io
    from .. import partition as partitioning
    from ..store import is_store, open_store, partition_name, save_partition

    if args.plot:  # before the work, not after it
        require_matplotlib("--plot")
    on_cluster = args.workers is not None or args.scheduler is not None
    if on_cluster:
        if not is_store(args.network):
            if not exists(args.network):
                raise DasknnError("no such file or directory", args.network)
            raise DasknnError("--workers/--scheduler partition a store (the workers read its layers): "
                              "import the network first (dasknn import)")
        from ..cluster import local_client, tls_options
        from ..partition.cluster import partition_on_cluster

        layers = None
        shape = open_store(args.network, check="metadata")
        partitioning.check_partition_arguments(args.parts, shape.neurons, args.epsilon)  # the workers would refuse
        rows = shape.depth + 1
        bar = Progress(rows, f"partition ({args.method}, K = {args.parts}, on the cluster)", not args.json)
        try:
            with local_client(args.workers, args.threads_per_worker, args.scheduler,
                              memory_limit=args.memory_limit or "auto", **tls_options(args)) as client:
                # the workers report rows as events only for a bar on the terminal (not under --json, in a pipe)
                follow = (lambda done, _: bar.to(done)) if bar.shown else None
                owners, report = partition_on_cluster(client, str(args.network), args.parts, args.method,
                                                      args.epsilon, args.seed, progress=follow)
        finally:
            bar.close()
        seconds = report["seconds"]
    else:
        if is_store(args.network):
            layers = open_store(args.network).partition_layers()
        else:
            layers = io.read_network(args.network, bias=0.0).layers  # the bias plays no part in partitioning
        rows = len(layers) + 1
        bar = Progress(rows, f"partition ({args.method}, K = {args.parts})", not args.json)
        t0 = time.perf_counter()
        try:
            # the bar counts rows of owners (layers); a method that refines rows reports its passes in proportion
            owners = partitioning.partition_network(layers, args.parts, args.method, epsilon=args.epsilon,
                                                    seed=args.seed,
                                                    progress=lambda done, total: bar.to(done * rows // total))
        finally:
            bar.close()
        seconds = time.perf_counter() - t0
        report = partitioning.partition_report(layers, owners, args.method, seconds)
    if args.out:
        out = Path(args.out)
        tmp = new_partial(out, suffix=".npy")
        np.save(tmp, owners.astype(np.int32, copy=False), allow_pickle=False)  # as documented, however computed
        os.replace(tmp, out)
    if is_store(args.network):
        # kept with the network, so inference and training reuse it
        save_partition(args.network, partition_name(args.method, args.parts, args.seed, args.epsilon), owners, report)
    if args.plot:
        if layers is None:
            layers = open_store(args.network).partition_layers()
        partitioning.plot_partition(layers, owners, args.method, args.plot, seed=args.seed)
    emit(args, report, f"{args.method}, {args.parts} parts: volume {report['volume_total']:,} entries per image "
                       f"(busiest part sends {report['max_part_send']:,}), worst layer imbalance "
                       f"{report['imbalance_max']:.2%}, {seconds:.1f} s")
    return 0


def add_partition_parser(sub) -> None:
    """Add ``partition`` to an argparse subparsers object."""
    pt = sub.add_parser("partition", help="partition the layers' neurons over workers (hypergraph model)",
                        description="Assign every neuron of every layer to one of K parts, minimising the entries "
                                    "parts exchange while balancing every layer's work.")
    pt.add_argument("network", type=as_location,
                    help="a store, a directory of n{N}-l{k}.tsv files, or neuron{N}.tar.gz")
    pt.add_argument("--parts", type=int, required=True, help="number of parts (workers), K")
    pt.add_argument("--method", default="hypergraph",
                    choices=("hypergraph", "hypergraph-shared", "hypergraph-layered", "fast", "fast-segments", "block", "random"),
                    help="partitioning method (default hypergraph)")
    pt.add_argument("--epsilon", type=float, default=0.03, help="allowed per-layer imbalance (default 0.03)")
    pt.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    pt.add_argument("--out", type=local_argument("--out of partition"),
                    help="write the owners array (int32, layers+1 x neurons) to this .npy")
    pt.add_argument("--plot", metavar="PNG", type=local_argument("--plot"),
                    help="draw per-layer volume against block and random, and per-part load, "
                         f"to a PNG (needs matplotlib: {PLOT_EXTRA})")
    pt.add_argument("--workers", type=positive_int,
                    help="partition on a local Dask cluster of this many workers (a store only: a worker reads the "
                         "layers and runs the partition with its threads; the client holds the owners)")
    pt.add_argument("--threads-per-worker", type=positive_int, default=1, help="threads per local worker (default 1)")
    pt.add_argument("--memory-limit", help="local workers' memory limit, e.g. 2GB (default: machine memory / workers)")
    pt.add_argument("--scheduler", help="address of a running Dask scheduler: partition on its workers")
    from ..cluster import add_tls_arguments

    add_tls_arguments(pt)
    pt.add_argument("--json", action="store_true", help="print one JSON object")
    pt.set_defaults(func=cmd_partition)
