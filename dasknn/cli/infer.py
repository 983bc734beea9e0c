"""``dasknn infer``: its options (shared with the cluster examples), the run on a client, the printed figures."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from .. import timings
from ..errors import DasknnError
from ..modes import INFERENCE
from ..ingest import import_network
from ..locations import as_location
from .common import (Progress, Stages, add_name_arguments, check_report, emit, explain_table, local_argument,
                     loss_lines, mismatch_line, performance_report, plural, positive_int, say_losses)

if TYPE_CHECKING:
    from ..store import NetworkStore


@dataclass(frozen=True)
class Prepared:
    """What ``dasknn infer`` runs on, resolved and checked before any cluster starts."""

    network: NetworkStore  # opened, its metadata checked (the engine does not read it again)
    inputs: Path | str
    truth: np.ndarray | None
    notes: dict


@contextlib.contextmanager
def prepared_infer(args: argparse.Namespace) -> Iterator[Prepared]:
    """Resolve --network/--inputs/--truth to stores (importing TSV into a temporary folder) and check every argument
    the engine would refuse: a wrong path or ``--batch -1`` ends here, before a cluster costs seconds to start.

    The stores imported for the run live until the block exits.
    """
    from .. import engine, generate, io
    from ..store import is_store, location, open_inputs, open_store, write_inputs_store

    if args.resume and not args.results:
        raise DasknnError("--resume needs --results (the store the earlier run wrote)")
    notes: dict = {}
    timings.enter("reading")
    with tempfile.TemporaryDirectory(prefix="dasknn-") as tmp:
        if args.network is None:
            if args.inputs is not None:
                raise DasknnError("--inputs needs --network")
            timings.enter("default network")  # made once, with its truth, then kept
            stages = Stages(bars=not args.json)
            try:
                network = generate.default_store(stage=lambda name, total: stages.begin(
                    f"{name} of the default network (once)", total))
            finally:
                stages.close()
            notes["network"] = f"default: {network}"
            timings.enter("reading")
        elif is_store(args.network):
            network = location(args.network)
        else:
            timings.enter("import")
            t0 = time.perf_counter()
            network = import_network(args.network, Path(tmp) / "network.zarr")
            notes["import_seconds"] = round(time.perf_counter() - t0, 3)
            timings.enter("reading")
        shape = open_store(network, check="lazy")  # its shape (checked_arguments reads its layers' metadata)
        if args.inputs is None:
            inputs = network
        elif is_store(args.inputs):
            inputs = location(args.inputs)
        else:
            rows = io.read_images(args.inputs, neurons=shape.neurons, any_name=args.any_name)
            narrow = io.narrow_images(args.inputs, rows)
            if narrow:
                print(f"dasknn: warning: {narrow}", file=sys.stderr, flush=True)
            inputs = write_inputs_store(Path(tmp) / "inputs.zarr", rows, source=os.fspath(args.inputs))
        _, store, _, _ = engine.checked_arguments(network, inputs, options_of(args))
        stored = open_inputs(inputs)
        truth = (io.checked_truth(args.truth, stored.images, shape.neurons, shape.depth, args.any_name) if args.truth
                 else stored.truth(args.dtype))
        yield Prepared(store, inputs, truth, notes)


def options_of(args: argparse.Namespace, progress=None):
    """The engine's options ``dasknn infer``'s arguments ask for (:class:`~dasknn.engine.options.InferenceOptions`)."""
    from ..engine.options import InferenceOptions

    return InferenceOptions(mode=args.mode, partition=args.partition, group_size=args.group_size, images=args.batch,
                            chunks=args.chunks, segment=args.segment, sync_every=args.sync_every, dtype=args.dtype,
                            backend="gpu" if args.gpu else "cpu", resident=args.resident,
                            keep_layers=args.keep_layers, results=args.results, resume=args.resume,
                            progress=progress, messages=args.messages, explain=args.explain,
                            activations=args.activations, plan_store=args.plan_store, overlap=args.overlap,
                            exchange=args.exchange, compress=args.compress == "on")


def cmd_infer(args: argparse.Namespace) -> int:
    from ..cluster import local_client, tls_options

    check_report(args.report)
    with prepared_infer(args) as prepared:
        with local_client(args.workers, args.threads_per_worker, args.scheduler, gpu=args.gpu,
                          memory_limit=args.memory_limit or "auto", **tls_options(args)) as client:
            result = _inferred(args, client, prepared)
    # printed once the cluster has closed, so that the timings count its closing too
    return _shown(args, prepared, result)


def run_infer(args: argparse.Namespace, client, prepared: Prepared | None = None) -> int:
    """Run ``dasknn infer`` with parsed ``args`` on an existing ``client``; print the figures, return the exit code.

    The cluster examples (``examples/slurm.py``, ``mpi.py``, ``gpu.py``) build their own cluster and call this with
    a parser made by :func:`add_infer_arguments`, so they take exactly the options of ``dasknn infer``. ``prepared``
    (from :func:`prepared_infer`, entered before the cluster was built) saves checking the arguments again.
    """
    if prepared is None:
        with prepared_infer(args) as prepared:
            return run_infer(args, client, prepared)
    return _shown(args, prepared, _inferred(args, client, prepared))


def _inferred(args: argparse.Namespace, client, prepared: Prepared):
    # the run on the client, with its progress bar and --report; the engine's InferenceResult
    from ..api import infer
    from ..engine.options import tuning

    bar = Progress(0, "infer", not args.json)

    def progress(done: int, total: int) -> None:
        if bar.bar is not None:
            bar.bar.total = total
        bar.to(done)

    timings.enter("reading")  # the arguments checked again by the library, the workers counted
    try:
        with performance_report(getattr(args, "report", None), client):
            # dasknn.infer: the one way in, for Python, this command and bench-graphchallenge (it compares with
            # the truth too)
            result = infer(prepared.network, prepared.inputs, client, truth=prepared.truth, batch=args.batch,
                           **tuning(options_of(args, progress)))
    finally:
        bar.close()
    return result


def _shown(args: argparse.Namespace, prepared: Prepared, result) -> int:
    # the categories written (--out), the figures printed (text or JSON), the exit code
    from .. import io

    timings.enter("output")
    notes = prepared.notes
    cats, mismatched = result.categories, result.mismatched
    if result.probe_skipped:
        # auto without its cost model (the probe did not fit the workers): which mode ran instead, in one line
        print(f"dasknn: {result.probe_skipped}", file=sys.stderr, flush=True)
    say_losses(args, result.recoveries)  # (with --json; the text says them after its figures)
    if args.out:
        io.write_categories(args.out, cats)
    report = {
        "images": result.images, "neurons": result.neurons, "layers": result.layers, "edges": result.edges,
        "categories": int(cats.size),
        "matches_truth": None if mismatched is None else mismatched == 0,
        "mismatched": mismatched,
        "seconds": round(result.seconds, 4),
        "edges_per_second": None if np.isnan(result.edges_per_second) else result.edges_per_second,
        "workers": result.workers, "chunks": result.chunks, "dtype": args.dtype,
        "mode": result.mode, "group_size": result.group_size, "exchange": result.exchange or None, "tasks": result.tasks,
        "bytes_sent": result.bytes_sent, "plan_bytes": result.plan_bytes, "bytes_read": result.bytes_read,
        "streamed": not result.resident, "computed_chunks": len(result.computed_chunks),
        "load_seconds": round(result.load_seconds, 3), "compile_seconds": round(result.compile_seconds, 3),
        "plan_seconds": round(result.plan_seconds, 3),
        "partition_seconds": round(result.partition_seconds, 3),
        "message_bytes": sum(result.message_bytes),
        # images whose activations became equal computed once: the edges the kernels multiplied, per second
        "compress": args.compress == "on",
        "multiplied_per_second": None if np.isnan(result.multiplied_per_second) else result.multiplied_per_second,
        # each loss of workers the run survived: who, in which phase, what was kept and redone, the wait
        "recoveries": result.recoveries,
        **({"probe_skipped": result.probe_skipped} if result.probe_skipped else {}),
        **notes,
    }
    recorded = timings.current()
    if recorded is not None:
        # where the command's wall time went, phase by phase (they add up to it)
        report["timings"] = recorded.as_dict()
    if result.stages:
        report["stages"] = result.stages  # pipeline mode: each stage's first and last layer
    if result.predictions:
        report["predictions"] = [p.as_dict() for p in result.predictions]
        # the probe's lists of an entry a layer (most of the object, on a deep network) only with --explain
        report["calibration"] = result.calibration.as_dict(per_layer=args.explain)
    if result.exchange_bytes:
        # last, the long arrays, one entry a layer: the boundary messages as dense rows, and as Dask recorded the
        # compact ones that crossed
        report["exchange_pairs"] = result.exchange_pairs  # bytes by sender (row) and receiver part
        report["per_layer"] = {"dense_message_bytes": result.dense_message_bytes,
                               "exchange_bytes": result.exchange_bytes}
    if result.layer_alive:
        # the images alive after each layer, and the columns it computed (the distinct vectors, where folded)
        report.setdefault("per_layer", {}).update(alive=result.layer_alive, distinct=result.layer_columns)
    if args.explain and not args.json:
        print(explain_table(result.predictions, result.mode, result.group_size, result.seconds), flush=True)
        if result.calibration is not None and result.calibration.distinct:
            from ..cost import alive_per_layer, computed_per_layer

            # over every layer, as the predictions take them: the probe stops once its images are one vector
            cal = result.calibration
            share = computed_per_layer(cal, result.layers).sum() / max(alive_per_layer(cal, result.layers).sum(),
                                                                        1e-12)
            print(f"probe: its {cal.probe_images} images held {share:.1%} as many distinct vectors as alive images "
                  f"over the network's {result.layers} layers ({cal.probe_layers} run, the later ones taken as the "
                  f"last; folded, the rest computed once; the predictions count the distinct ones)", flush=True)
    verdict = "no truth to compare" if mismatched is None else (
        "matches the truth" if mismatched == 0 else f"differs from the truth on {mismatched} images")
    emit(args, report,
          f"{result.images} images x {result.layers} layers of {result.neurons} neurons ({result.edges} edges): "
          f"{cats.size} categories, {verdict}\n"
          f"inference {result.seconds:.3f} s on {plural(result.workers, 'worker')} ({result.mode} mode): "
          f"{result.edges_per_second:.3e} edges/s"
          + (f" ({result.multiplied_per_second:.3e} multiplied/s, each distinct vector once)"
             if args.compress == "on" and not np.isnan(result.multiplied_per_second) else "")
          + (f"\n{loss_lines(result.recoveries)}" if result.recoveries else "")
          + (f"\n{recorded.line()}" if recorded is not None else ""))
    if mismatched:
        # a check that fails fails the command, as bench-graphchallenge does
        print(f"dasknn: {mismatch_line(mismatched, result.images, args.dtype)}", file=sys.stderr, flush=True)
        return 1
    return 0


def add_infer_arguments(f: argparse.ArgumentParser) -> None:
    """Add the options of ``dasknn infer`` to ``f`` (also used by the cluster examples in ``examples/``)."""
    f.add_argument("--network", type=as_location,
                   help="a store, a directory of n{N}-l{k}.tsv files, or neuron{N}.tar.gz")
    f.add_argument("--inputs", type=as_location,
                   help="sparse-images-{N}.tsv[.gz] or a store (default: the network store's inputs)")
    add_name_arguments(f)
    f.add_argument("--batch", type=int, help="use only the first BATCH images")
    f.add_argument("--mode", choices=INFERENCE, default="auto",
                   help="data: every worker runs every layer on its images; model: the layers are partitioned "
                        "over the workers; hybrid: groups of workers split the batch, each group partitions the "
                        "layers; pipeline: each worker holds a stage of consecutive layers and chunks flow stage "
                        "to stage; auto: the one the cost model predicts fastest among those that fit in memory "
                        "(default auto; see --explain)")
    f.add_argument("--explain", action="store_true",
                   help="print the cost model's predicted time of every mode (with --json: in the output)")
    f.add_argument("--messages", choices=("compact", "dense"), default="compact",
                   help="model mode: boundary messages as a nonzero bitmap and values, or one value when all are "
                        "equal, whichever is smallest (compact, default), or as dense rows")
    f.add_argument("--exchange", choices=("auto", "tasks", "p2p"), default="auto",
                   help="model/hybrid: how boundary messages travel: as task results Dask moves (tasks: a task per "
                        "part and layer), pushed worker to worker over Dask's comms (p2p: a task per part and "
                        "segment of layers, the scheduler out of the exchange), or auto (default): the one the cost "
                        "model predicts cheaper for the plan")
    f.add_argument("--partition", default="hypergraph",
                   help="model/hybrid: a method (hypergraph, hypergraph-shared, hypergraph-layered, block, random) "
                        "or an owners .npy file (default hypergraph)")
    f.add_argument("--group-size", type=int, help="hybrid: workers per group (default 2); pipeline: stages per "
                   "pipeline, the workers running workers / G pipelines side by side (default: one over all)")
    f.add_argument("--chunks", type=int, help="number of image chunks (default: 2 per worker thread in data mode, "
                   "1 per thread of a group in model and hybrid mode, more if a chunk would not fit in memory)")
    f.add_argument("--segment", type=int, help="layers per task: data mode, and model mode with --exchange p2p "
                   "(default: all)")
    f.add_argument("--sync-every", type=int, default=2,
                   help="model mode: layers between exchanges of alive masks that drop dead images (default 2)")
    f.add_argument("--overlap", action="store_true",
                   help="model mode, CPU: each part computes and sends the outputs others read first, the rest while "
                        "they travel (two tasks per part and layer; default: one, in lockstep)")
    f.add_argument("--compress", choices=("on", "off"), default="on",
                   help="images whose activations become equal are computed once (on, default; exact; model and "
                        "hybrid modes fold them at the sync layers), or every alive image is computed (off, for "
                        "comparison)")
    f.add_argument("--dtype", choices=("float32", "float64"), default="float64",
                   help="arithmetic (default float64, in which the published truth is exact; float32 is faster and "
                        "may flip an image that sits on the threshold)")
    f.add_argument("--workers", type=positive_int, help="local worker processes (default: one per core)")
    f.add_argument("--threads-per-worker", type=positive_int, default=1,
                   help="threads per local worker (default 1)")
    f.add_argument("--scheduler", help="address of a running Dask scheduler (instead of a local cluster)")
    from ..cluster import add_tls_arguments

    add_tls_arguments(f)
    f.add_argument("--stream", dest="resident", action="store_false", default=None,
                   help="read the layers (data mode) or each part's share of them (model mode) as they are needed "
                        "instead of holding them all (out of core; the default when a worker's weights take over "
                        "a quarter of its memory)")
    f.add_argument("--resident", dest="resident", action="store_true",
                   help="hold every layer, or each part's share, in the workers (the default when they fit)")
    f.add_argument("--plan-store", metavar="DIR", type=as_location,
                   help="model mode with --stream: where the part plan (each part's blocks and exchange lists, "
                        "made once per partition) is kept (default: inside the network store, under plans/)")
    f.add_argument("--keep-layers", type=int, default=2,
                   help="streaming: layers a worker holds at once, the one computing and the one read ahead (2); "
                        "model mode adds one for each further chunk of a worker where it fits")
    f.add_argument("--memory-limit", help="local workers' memory limit, e.g. 2GB (default: machine memory / workers)")
    f.add_argument("--results", type=as_location,
                   help="a Zarr results store: each chunk's categories are written as it finishes")
    f.add_argument("--activations", action="store_true",
                   help="with --results: also write the final activations of every image, chunk by chunk "
                        "(dasknn.store.read_activations reads them back)")
    f.add_argument("--resume", action="store_true",
                   help="continue the run that wrote --results: only the chunks not yet written are computed")
    f.add_argument("--gpu", action="store_true",
                   help="run on GPUs: a dask-cuda cluster (one worker per GPU) and CuPy kernels")
    f.add_argument("--out", type=local_argument("--out of infer"),
                   help="write the categories (1-based image indices) to this file")
    f.add_argument("--json", action="store_true", help="print one JSON object")
    f.add_argument("--report", metavar="PATH.html", type=local_argument("--report"),
                   help="write Dask's performance report (task stream, worker profiles, transfers) of the "
                        "inference to this HTML file (needs bokeh)")


def add_infer_parser(sub) -> None:
    """Add ``infer`` to an argparse subparsers object."""
    f = sub.add_parser("infer", help="batch inference on a Dask cluster",
                       description="Run GraphChallenge batch inference. With no --network, a generated 1024 x 120 "
                                   "network and 20,000 images (made once, cached) are used and checked.")
    add_infer_arguments(f)
    f.set_defaults(func=cmd_infer)
