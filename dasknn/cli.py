"""The ``dasknn`` command: argument parsing, progress, JSON output and exit codes.

Every user-fixable problem ends as one line on stderr (``dasknn: error: ...``) and exit status 2; nothing here
knows how the work is done, only which function does it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np

from . import __version__
from .errors import DasknnError

EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line like every other error."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise DasknnError(f"{self.prog}: {message} (see --help)")


class _Progress:
    """A progress bar on a terminal, silence elsewhere (pipes, --json)."""

    def __init__(self, total: int, desc: str, enabled: bool):
        self.bar = None
        if enabled and sys.stderr.isatty():
            from tqdm import tqdm

            self.bar = tqdm(total=total, desc=desc, unit="", leave=False, file=sys.stderr)

    def to(self, done: int, total: int | None = None) -> None:
        if self.bar is not None:
            self.bar.n = done
            self.bar.refresh()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _say(args: argparse.Namespace, text: str) -> None:
    if not getattr(args, "json", False):
        print(text, file=sys.stderr if getattr(args, "_quiet_stdout", False) else sys.stdout, flush=True)


# --- generate ------------------------------------------------------------------------------------------------


def cmd_generate(args: argparse.Namespace) -> int:
    from . import generate

    bar = _Progress(args.layers, "generate", not args.json)
    t0 = time.perf_counter()
    try:
        out = generate.write(args.out, args.neurons, args.layers, args.images, args.seed, truth=args.truth,
                             overwrite=args.overwrite, progress=bar.to, bias=args.bias)
    finally:
        bar.close()
    seconds = time.perf_counter() - t0
    report = {"out": str(out), "neurons": args.neurons, "layers": args.layers, "edges": 32 * args.neurons * args.layers,
              "images": args.images, "seed": args.seed, "seconds": round(seconds, 3)}
    _emit(args, report, f"wrote {out}: {args.neurons} neurons x {args.layers} layers, {args.images} images "
                        f"in {seconds:.1f} s")
    return 0


# --- import / export -----------------------------------------------------------------------------------------


def import_network(
    network: str | os.PathLike[str],
    out: str | os.PathLike[str],
    inputs: str | os.PathLike[str] | None = None,
    truth: str | os.PathLike[str] | None = None,
    layers: int | None = None,
    bias: float | None = None,
    ymax: float = 32.0,
    overwrite: bool = False,
    progress=None,
) -> Path:
    """Import a GraphChallenge network (directory or tar.gz), and optionally its inputs and truth, into a store."""
    from . import io, store
    from .network import challenge_bias

    neurons, depth, layer_iter = io.iter_network_layers(network, layers)
    images = io.read_images(inputs, neurons=neurons) if inputs else None
    cats = io.read_categories(truth, images.shape[0] if images is not None else None) if truth else None
    if cats is not None and images is None:
        raise DasknnError("--truth needs --inputs")
    b = challenge_bias(neurons) if bias is None else bias
    with store.StoreWriter(out, neurons, depth, b, ymax, source=os.fspath(network), overwrite=overwrite) as w:
        for k, layer in enumerate(layer_iter, start=1):
            w.write_layer(k, layer)
            if progress is not None:
                progress(k)
        if images is not None:
            w.write_inputs(images, cats)
    return Path(out)


def cmd_import(args: argparse.Namespace) -> int:
    from .store import open_store

    t0 = time.perf_counter()
    bar = _Progress(0, "import", not args.json)
    try:
        out = import_network(args.network, args.out, args.inputs, args.truth, args.layers, args.bias, args.ymax,
                             args.overwrite, progress=bar.to)
    finally:
        bar.close()
    s = open_store(out)
    report = {"out": str(out), "neurons": s.neurons, "layers": s.depth, "edges": s.edges,
              "images": s.inputs.images if s.inputs else 0, "bytes_on_disk": s.nbytes_on_disk(),
              "seconds": round(time.perf_counter() - t0, 3)}
    _emit(args, report, f"wrote {out}: {s.neurons} neurons x {s.depth} layers, {s.edges} edges, "
                        f"{report['images']} images, {report['bytes_on_disk'] / 1e6:.1f} MB")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from . import io
    from .store import open_store

    s = open_store(args.store)
    folder = io.write_network(s.iter_layers(), args.out, s.neurons)
    written = [str(folder)]
    if s.inputs is not None:
        io.write_images(Path(args.out) / f"sparse-images-{s.neurons}.tsv", s.inputs.rows())
        written.append(f"sparse-images-{s.neurons}.tsv")
        t = s.inputs.truth()
        if t is not None:
            io.write_categories(Path(args.out) / f"neuron{s.neurons}-l{s.depth}-categories.tsv", t)
            written.append(f"neuron{s.neurons}-l{s.depth}-categories.tsv")
    _emit(args, {"out": str(args.out), "written": written}, f"wrote {', '.join(written)}")
    return 0


def cmd_info(args: argparse.Namespace) -> int:
    from .store import open_store

    s = open_store(args.store, check="full" if args.check else "auto")
    report = {"store": str(s.path), "neurons": s.neurons, "layers": s.depth, "edges": s.edges, "bias": s.bias,
              "ymax": s.ymax, "dtype": s.attrs.get("dtype"), "source": s.source,
              "images": s.inputs.images if s.inputs else 0,
              "truth": None if s.inputs is None or s.inputs.truth() is None else int(s.inputs.truth().size),
              "bytes_on_disk": s.nbytes_on_disk()}
    _emit(args, report, "\n".join(f"{k:>14}: {v}" for k, v in report.items()))
    return 0


# --- partition -----------------------------------------------------------------------------------------------


def cmd_partition(args: argparse.Namespace) -> int:
    from . import io, partition
    from .store import is_store, open_store, partition_name, save_partition

    if is_store(args.network):
        layers = open_store(args.network).partition_layers()
    else:
        layers = io.read_network(args.network, bias=0.0).layers  # the bias plays no part in partitioning
    t0 = time.perf_counter()
    owners = partition.partition_network(layers, args.parts, args.method, epsilon=args.epsilon, seed=args.seed)
    seconds = time.perf_counter() - t0
    report = partition.partition_report(layers, owners, args.method, seconds)
    if args.out:
        out = Path(args.out)
        tmp = out.with_name(f".{out.name}.partial.npy")
        np.save(tmp, owners, allow_pickle=False)
        os.replace(tmp, out)
    if is_store(args.network):
        # kept with the network, so inference and training reuse it
        save_partition(args.network, partition_name(args.method, args.parts, args.seed, args.epsilon), owners, report)
    if args.plot:
        partition.plot_partition(layers, owners, args.method, args.plot, seed=args.seed)
    _emit(args, report, f"{args.method}, {args.parts} parts: volume {report['volume_total']:,} entries per image "
                        f"(busiest part sends {report['max_part_send']:,}), worst layer imbalance "
                        f"{report['imbalance_max']:.2%}, {seconds:.1f} s")
    return 0


# --- infer ---------------------------------------------------------------------------------------------------


@contextlib.contextmanager
def _as_stores(args: argparse.Namespace) -> Iterator[tuple[Path, Path, np.ndarray | None, dict]]:
    """Resolve --network/--inputs/--truth to stores (importing TSV into a temporary folder) and the truth."""
    from . import generate, io
    from .store import is_store, location, open_inputs, open_store, write_inputs_store

    notes: dict = {}
    with tempfile.TemporaryDirectory(prefix="dasknn-") as tmp:
        if args.network is None:
            if args.inputs is not None:
                raise DasknnError("--inputs needs --network")
            bar = _Progress(generate.DEFAULT["layers"], "generating the default network (once)", not args.json)
            try:
                network = generate.default_store(progress=bar.to)
            finally:
                bar.close()
            notes["network"] = f"default: {network}"
        elif is_store(args.network):
            network = location(args.network)
        else:
            t0 = time.perf_counter()
            network = import_network(args.network, Path(tmp) / "network.zarr")
            notes["import_seconds"] = round(time.perf_counter() - t0, 3)
        neurons = open_store(network, check="metadata").neurons
        if args.inputs is None:
            inputs = network
        elif is_store(args.inputs):
            inputs = location(args.inputs)
        else:
            inputs = write_inputs_store(Path(tmp) / "inputs.zarr", io.read_images(args.inputs, neurons=neurons),
                                        source=os.fspath(args.inputs))
        truth = io.read_categories(args.truth) if args.truth else open_inputs(inputs).truth(args.dtype)
        yield network, inputs, truth, notes


@contextlib.contextmanager
def performance_report(path: str | os.PathLike[str] | None, client) -> Iterator[None]:
    """Write Dask's performance report (task stream, profiles, bandwidth) of the block to ``path`` (HTML).

    ``None`` records nothing. The report is made by the scheduler of ``client``, so it sees every task run there.
    """
    if path is None:
        yield
        return
    check_report(path)
    from distributed import performance_report as _report

    with client.as_current(), _report(filename=os.fspath(path)):
        yield


def check_report(path: str | os.PathLike[str] | None) -> None:
    """Fail early (before any cluster starts) where ``--report PATH`` cannot be written."""
    if path is None:
        return
    try:
        import bokeh  # noqa: F401  the scheduler draws the report with bokeh
    except ImportError:
        raise DasknnError("--report needs bokeh: pip install bokeh (or 'dasknn[notebook]')") from None
    if not os.fspath(path).endswith((".html", ".htm")):
        raise DasknnError(f"--report writes HTML: give a PATH.html, not {os.fspath(path)}")
    if not Path(path).resolve().parent.is_dir():
        raise DasknnError(f"--report: the folder of {os.fspath(path)} does not exist")


def cmd_infer(args: argparse.Namespace) -> int:
    from .cluster import local_client, tls_options

    if args.resume and not args.results:
        raise DasknnError("--resume needs --results (the store the earlier run wrote)")
    check_report(args.report)
    with local_client(args.workers, args.threads_per_worker, args.scheduler, gpu=args.gpu,
                      memory_limit=args.memory_limit or "auto", **tls_options(args)) as client:
        return run_infer(args, client)


def run_infer(args: argparse.Namespace, client) -> int:
    """Run ``dasknn infer`` with parsed ``args`` on an existing ``client``; print the figures, return the exit code.

    The cluster examples (``examples/slurm.py``, ``mpi.py``, ``gpu.py``) build their own cluster and call this with
    a parser made by :func:`add_infer_arguments`, so they take exactly the options of ``dasknn infer``.
    """
    from . import engine, io

    if args.resume and not args.results:
        raise DasknnError("--resume needs --results (the store the earlier run wrote)")
    with _as_stores(args) as (network, inputs, truth, notes):
        bar = _Progress(0, "infer", not args.json)

        def progress(done: int, total: int) -> None:
            if bar.bar is not None:
                bar.bar.total = total
            bar.to(done)

        try:
            with performance_report(getattr(args, "report", None), client):
                result = engine.infer(network, inputs, client, mode=args.mode, partition=args.partition,
                                      group_size=args.group_size, images=args.batch, chunks=args.chunks,
                                      segment=args.segment, sync_every=args.sync_every, dtype=args.dtype,
                                      backend="gpu" if args.gpu else "cpu", resident=args.resident,
                                      keep_layers=args.keep_layers, results=args.results, resume=args.resume,
                                      progress=progress, messages=args.messages, explain=args.explain,
                                      activations=args.activations, plan_store=args.plan_store)
        finally:
            bar.close()
    cats = result.categories
    mismatched = None
    if truth is not None:
        truth = truth[truth < result.images]
        mismatched = int(np.setxor1d(cats, truth).size)
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
        "mode": result.mode, "group_size": result.group_size, "tasks": result.tasks,
        "bytes_sent": result.bytes_sent, "plan_bytes": result.plan_bytes, "bytes_read": result.bytes_read,
        "streamed": not result.resident, "computed_chunks": len(result.computed_chunks),
        "load_seconds": round(result.load_seconds, 3), "plan_seconds": round(result.plan_seconds, 3),
        "message_bytes": sum(result.message_bytes),
        **notes,
    }
    if result.exchange_bytes:
        # per layer: the boundary messages as dense rows, and as Dask recorded the compact ones that crossed
        report["dense_message_bytes_per_layer"] = result.dense_message_bytes
        report["exchange_bytes_per_layer"] = result.exchange_bytes
    if result.predictions:
        report["predictions"] = result.predictions
        report["calibration"] = result.calibration
    if args.explain and not args.json:
        print(_explain(result.predictions, result.mode, result.group_size, result.seconds), flush=True)
    verdict = "no truth to compare" if mismatched is None else (
        "matches the truth" if mismatched == 0 else f"differs from the truth on {mismatched} images")
    _emit(args, report,
          f"{result.images} images x {result.layers} layers of {result.neurons} neurons ({result.edges} edges): "
          f"{cats.size} categories, {verdict}\n"
          f"inference {result.seconds:.3f} s on {result.workers} workers ({result.mode} mode): "
          f"{result.edges_per_second:.3e} edges/s")
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    """``dasknn train``, inside Dask's performance report when ``--report`` is given."""
    from .train import run_train

    if not args.report:
        return run_train(args)
    if args.mode == "single":
        raise DasknnError("--report records Dask tasks: use it with --mode data or model, not single")
    check_report(args.report)
    from .cluster import local_client, tls_options

    # the report is drawn by the scheduler, so training runs on a cluster opened here, whose scheduler we hold
    with local_client(workers=None if args.scheduler else min(args.workers, os.cpu_count() or 1),
                      scheduler=args.scheduler, **tls_options(args)) as client, performance_report(args.report, client):
        args.scheduler = client.scheduler.address
        if client.security is not None and client.security.require_encryption:  # --tls: connect with its files
            sec = client.security
            args.tls_ca, args.tls_cert, args.tls_key = sec.tls_ca_file, sec.tls_client_cert, sec.tls_client_key
        return run_train(args)


def _emit(args: argparse.Namespace, report: dict, text: str) -> None:
    if args.json:
        print(json.dumps(report))
    else:
        print(text)


# --- parser --------------------------------------------------------------------------------------------------


def _explain(predictions: list[dict], mode: str, group_size: int, measured: float) -> str:
    """The cost model's table: each mode's predicted seconds and their parts, and what ran."""
    lines = ["mode     group  fits  predicted s  (compute + exchange + tasks + read)"]
    for p in predictions:
        ran = p["mode"] == mode and p["group_size"] == group_size
        lines.append(f"{p['mode']:<8} {p['group_size']:>5}  {'yes' if p['fits'] else 'no ':<4} {p['seconds']:>11.3f}  "
                     f"({p['compute']:.3f} + {p['exchange']:.3f} + {p['tasks']:.3f} + {p['read']:.3f})"
                     + (f"  <- ran: measured {measured:.3f} s" if ran else ""))
    return "\n".join(lines)


def add_infer_arguments(f: argparse.ArgumentParser) -> None:
    """Add the options of ``dasknn infer`` to ``f`` (also used by the cluster examples in ``examples/``)."""
    f.add_argument("--network", help="a store, a directory of n{N}-l{k}.tsv files, or neuron{N}.tar.gz")
    f.add_argument("--inputs", help="sparse-images-{N}.tsv[.gz] or a store (default: the network store's inputs)")
    f.add_argument("--truth", help="neuron{N}-l{L}-categories.tsv (default: the truth stored with the inputs)")
    f.add_argument("--batch", type=int, help="use only the first BATCH images")
    f.add_argument("--mode", choices=("auto", "data", "model", "hybrid"), default="auto",
                   help="data: every worker runs every layer on its images; model: the layers are partitioned "
                        "over the workers; hybrid: groups of workers split the batch, each group partitions the "
                        "layers; auto: the one the cost model predicts fastest among those that fit in memory "
                        "(default auto; see --explain)")
    f.add_argument("--explain", action="store_true",
                   help="print the cost model's predicted time of every mode (with --json: in the output)")
    f.add_argument("--messages", choices=("compact", "dense"), default="compact",
                   help="model mode: boundary messages as a nonzero bitmap and values, or one value when all are "
                        "equal, whichever is smallest (compact, default), or as dense rows")
    f.add_argument("--partition", default="hypergraph",
                   help="model/hybrid: a method (hypergraph, hypergraph-shared, hypergraph-layered, block, random) "
                        "or an owners .npy file (default hypergraph)")
    f.add_argument("--group-size", type=int, help="hybrid: workers per group (default 2)")
    f.add_argument("--chunks", type=int, help="number of image chunks (default: 2 per worker thread in data mode, "
                   "1 per thread of a group in model and hybrid mode, more if a chunk would not fit in memory)")
    f.add_argument("--segment", type=int, help="data mode: layers per task (default: all)")
    f.add_argument("--sync-every", type=int, default=2,
                   help="model mode: layers between exchanges of alive masks that drop dead images (default 2)")
    f.add_argument("--dtype", choices=("float32", "float64"), default="float32", help="arithmetic (default float32)")
    f.add_argument("--workers", type=int, help="local worker processes (default: one per core)")
    f.add_argument("--threads-per-worker", type=int, default=1, help="threads per local worker (default 1)")
    f.add_argument("--scheduler", help="address of a running Dask scheduler (instead of a local cluster)")
    from .cluster import add_tls_arguments

    add_tls_arguments(f)
    f.add_argument("--stream", dest="resident", action="store_false", default=None,
                   help="read the layers (data mode) or each part's share of them (model mode) as they are needed "
                        "instead of holding them all (out of core; the default when a worker's weights take over "
                        "a quarter of its memory)")
    f.add_argument("--resident", dest="resident", action="store_true",
                   help="hold every layer, or each part's share, in the workers (the default when they fit)")
    f.add_argument("--plan-store", metavar="DIR",
                   help="model mode with --stream: where the part plan (each part's blocks and exchange lists, "
                        "made once per partition) is kept (default: inside the network store, under plans/)")
    f.add_argument("--keep-layers", type=int, default=2,
                   help="streaming: layers a worker holds at once, the one computing and the one read ahead (2)")
    f.add_argument("--memory-limit", help="local workers' memory limit, e.g. 2GB (default: machine memory / workers)")
    f.add_argument("--results", help="a Zarr results store: each chunk's categories are written as it finishes")
    f.add_argument("--activations", action="store_true",
                   help="with --results: also write the final activations of every image, chunk by chunk "
                        "(dasknn.store.read_activations reads them back)")
    f.add_argument("--resume", action="store_true",
                   help="continue the run that wrote --results: only the chunks not yet written are computed")
    f.add_argument("--gpu", action="store_true",
                   help="run on GPUs: a dask-cuda cluster (one worker per GPU) and CuPy kernels")
    f.add_argument("--out", help="write the categories (1-based image indices) to this file")
    f.add_argument("--json", action="store_true", help="print one JSON object")
    f.add_argument("--report", metavar="PATH.html", help="write Dask's performance report (task stream, worker "
                   "profiles, transfers) of the inference to this HTML file (needs bokeh)")


def build_parser() -> argparse.ArgumentParser:
    """The ``dasknn`` argument parser (exposed for the docs and tests)."""
    p = _Parser(prog="dasknn", description="Sparse deep neural networks on Dask: GraphChallenge inference, "
                                           "partitioning and training, out of core.")
    p.add_argument("--version", action="version", version=f"dasknn {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True

    g = sub.add_parser("generate", help="make a challenge-like network (and images)",
                       description="Generate a RadiX-Net-style network: 32 nonzeros per row and column, values 1/16.")
    g.add_argument("--neurons", type=int, required=True, help="neurons per layer (a power of two, e.g. 1024)")
    g.add_argument("--layers", type=int, required=True, help="number of layers")
    g.add_argument("--out", required=True, help="a .zarr store, or a directory for the published TSV layout")
    g.add_argument("--images", type=int, default=0, help="also make this many synthetic images (default 0)")
    g.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    g.add_argument("--truth", action="store_true", help="also compute the images' categories with the reference")
    g.add_argument("--bias", type=float, help="layer bias (default: the challenge's for N)")
    g.add_argument("--overwrite", action="store_true", help="replace --out if it exists")
    g.add_argument("--json", action="store_true", help="print one JSON object")
    g.set_defaults(func=cmd_generate)

    i = sub.add_parser("import", help="import a GraphChallenge network (and inputs) into a Zarr store",
                       description="Read n{N}-l{k}.tsv files (a directory or neuron{N}.tar.gz) into a dasknn store.")
    i.add_argument("network", help="directory of n{N}-l{k}.tsv files, or neuron{N}.tar.gz")
    i.add_argument("--out", required=True, help="the store to write (STORE.zarr)")
    i.add_argument("--inputs", help="sparse-images-{N}.tsv[.gz] to store with the network")
    i.add_argument("--truth", help="neuron{N}-l{L}-categories.tsv to store with the inputs")
    i.add_argument("--layers", type=int, help="import only the first LAYERS layers")
    i.add_argument("--bias", type=float, help="layer bias (default: the challenge's for N)")
    i.add_argument("--ymax", type=float, default=32.0, help="activation clamp (default 32)")
    i.add_argument("--overwrite", action="store_true", help="replace --out if it exists")
    i.add_argument("--json", action="store_true", help="print one JSON object")
    i.set_defaults(func=cmd_import)

    e = sub.add_parser("export", help="write a store back as GraphChallenge TSV files")
    e.add_argument("store", help="a dasknn store")
    e.add_argument("--out", required=True, help="directory to write neuron{N}/n{N}-l{k}.tsv (and inputs) into")
    e.add_argument("--json", action="store_true", help="print one JSON object")
    e.set_defaults(func=cmd_export)

    s = sub.add_parser("info", help="describe and check a store")
    s.add_argument("store", help="a dasknn store")
    s.add_argument("--check", action="store_true", help="read and check every value, however large the store")
    s.add_argument("--json", action="store_true", help="print one JSON object")
    s.set_defaults(func=cmd_info)

    pt = sub.add_parser("partition", help="partition the layers' neurons over workers (hypergraph model)",
                        description="Assign every neuron of every layer to one of K parts, minimising the entries "
                                    "parts exchange while balancing every layer's work.")
    pt.add_argument("network", help="a store, a directory of n{N}-l{k}.tsv files, or neuron{N}.tar.gz")
    pt.add_argument("--parts", type=int, required=True, help="number of parts (workers), K")
    pt.add_argument("--method", default="hypergraph",
                    choices=("hypergraph", "hypergraph-shared", "hypergraph-layered", "block", "random"),
                    help="partitioning method (default hypergraph)")
    pt.add_argument("--epsilon", type=float, default=0.03, help="allowed per-layer imbalance (default 0.03)")
    pt.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    pt.add_argument("--out", help="write the owners array (int32, layers+1 x neurons) to this .npy")
    pt.add_argument("--plot", help="draw per-layer volume against block and random, and per-part load, to a PNG")
    pt.add_argument("--json", action="store_true", help="print one JSON object")
    pt.set_defaults(func=cmd_partition)

    from . import train

    train.add_train_parser(sub)
    sub.choices["train"].set_defaults(func=cmd_train)
    train.add_import_weights_parser(sub)

    from . import challenge

    challenge.add_bench_parser(sub)

    f = sub.add_parser("infer", help="batch inference on a Dask cluster",
                       description="Run GraphChallenge batch inference. With no --network, a generated 1024 x 120 "
                                   "network and 20,000 images (made once, cached) are used and checked.")
    add_infer_arguments(f)
    f.set_defaults(func=cmd_infer)
    return p


def run_guarded(func, *args) -> int:
    """Call ``func(*args)`` as the command line does: a :class:`DasknnError` is one line on stderr and exit 2.

    For scripts built on :func:`add_infer_arguments` and :func:`run_infer` (see ``examples/``).
    """
    try:
        return int(func(*args) or 0)
    except DasknnError as e:
        print(f"dasknn: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("dasknn: interrupted; nothing partial was kept", file=sys.stderr)
        return EXIT_INTERRUPTED


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit status."""

    def run() -> int:
        args = build_parser().parse_args(argv)
        return args.func(args)

    return run_guarded(run)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
