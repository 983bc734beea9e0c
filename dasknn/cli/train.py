"""``dasknn train`` and ``dasknn import-weights``: their options and runs (the work is :mod:`dasknn.train`'s)."""

from __future__ import annotations

import argparse
import os

from .. import timings
from ..cluster import add_tls_arguments, local_client, tls_options
from ..errors import DasknnError
from ..locations import as_location
from ..train import MODES, OPTIMIZERS, PIPELINE_SCHEDULES, import_weights, train
from .common import (check_report, emit, local_argument, loss_lines, performance_report, plural, positive_int,
                     say_losses)


def add_train_parsers(sub) -> None:
    """Add ``train`` and ``import-weights`` to a subparsers object."""
    add_train_parser(sub)
    add_import_weights_parser(sub)


def add_train_parser(subparsers) -> None:
    """Add ``dasknn train`` to an argparse subparsers object."""
    p = subparsers.add_parser("train", help="train a sparse network (fixed pattern) with a dense classifier head")
    p.add_argument("--network", required=True, metavar="STORE", type=as_location,
                   help="a dasknn store: the fixed sparsity pattern")
    p.add_argument("--data", default="digits", type=local_argument("--data"),
                   help="digits (scikit-learn) or an .npz with arrays x and y")
    p.add_argument("--epochs", type=int, default=5, help="passes over the training set (default 5)")
    p.add_argument("--batch", type=int, default=64, help="images per step (default 64)")
    p.add_argument("--lr", type=float, default=1e-3, help="learning rate (default 1e-3)")
    p.add_argument("--optimizer", choices=OPTIMIZERS, default="adam",
                   help="optimiser; its state is stored for the nonzeros only (default adam)")
    p.add_argument("--mode", choices=MODES, default="model",
                   help="single process, data (replicas all-reduce gradient values), model (partitioned layers; "
                        "default), hybrid (groups split the batch, model mode in each) or pipeline (consecutive "
                        "stages of layers, one per worker; micro-batches flow through them)")
    p.add_argument("--partition", default="hypergraph", metavar="METHOD",
                   help="model mode: partition method or owners .npy (default hypergraph)")
    p.add_argument("--workers", type=positive_int, default=2,
                   help="replicas, parts, groups x parts, or pipelines x stages (default 2)")
    p.add_argument("--group-size", type=int, default=None, metavar="G",
                   help="hybrid mode: parts per group; the groups split each batch (default 2 where it divides); "
                        "pipeline mode: stages per pipeline (default all the workers: one pipeline)")
    p.add_argument("--micro-batches", type=positive_int, default=4, metavar="M",
                   help="pipeline mode: micro-batches per pipeline's share of each batch (default 4)")
    p.add_argument("--pipeline-schedule", choices=PIPELINE_SCHEDULES, default="auto",
                   help="pipeline mode: the micro-batches' order: gpipe (every forward pass, then every backward "
                        "one; the faster where tasks are short), 1f1b (one forward, one backward in turn: stage s of "
                        "K holds at most K - s micro-batches' activations), or auto (default): gpipe where its "
                        "activations fit the workers' memory, else 1f1b")
    p.add_argument("--exchange", choices=("auto", "tasks", "p2p"), default="auto",
                   help="model/hybrid: how the parts' messages travel: as task results Dask moves (tasks: tasks per "
                        "part and layer of every step), pushed worker to worker over Dask's comms (p2p: one task per "
                        "part for a chunk of steps), or auto (default): the one the cost model predicts cheaper")
    p.add_argument("--scheduler", default=None, help="address of an existing Dask scheduler")
    add_tls_arguments(p)
    p.add_argument("--checkpoint-every", type=int, default=0, metavar="N", help="write a checkpoint every N steps")
    p.add_argument("--checkpoint", default=None, metavar="STORE", type=as_location,
                   help="the checkpoint (a Zarr group, written atomically)")
    p.add_argument("--resume", action="store_true", help="continue exactly from --checkpoint")
    p.add_argument("--gpu", action="store_true",
                   help="train on GPUs (single or data mode): the same step on CuPy arrays with the CUDA kernels")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--report", metavar="PATH.html", type=local_argument("--report"),
                   help="write Dask's performance report of the training to this HTML file")
    p.add_argument("--seed", type=int, default=0, help="seed of the initialisation, split and shuffling (default 0)")
    p.add_argument("--bias", type=float, default=0.0, help="the fixed scalar bias of the sparse layers")
    p.add_argument("--init", choices=("he", "keep"), default="he",
                   help="he: re-initialise the stored values (He, seeded); keep: train from the stored values")
    p.set_defaults(func=cmd_train)


def run_train(args) -> int:
    """``dasknn train``: run, print the figures (JSON with ``--json``), return the exit code."""
    common = dict(epochs=args.epochs, batch=args.batch, lr=args.lr, optimizer=args.optimizer, mode=args.mode,
                  partition=args.partition, workers=args.workers, group_size=args.group_size,
                  checkpoint_every=args.checkpoint_every,
                  checkpoint=args.checkpoint, resume=args.resume, seed=args.seed, bias=args.bias, init=args.init,
                  backend="gpu" if args.gpu else "cpu", exchange=args.exchange, micro_batches=args.micro_batches,
                  pipeline_schedule=args.pipeline_schedule)
    tls = getattr(args, "tls", False) or getattr(args, "tls_ca", None)
    if args.mode != "single" and (getattr(args, "scheduler", None) or tls):
        with local_client(workers=None if args.scheduler else min(args.workers, os.cpu_count() or 1),
                          scheduler=args.scheduler, gpu=args.gpu, **tls_options(args)) as c:
            result = train(args.network, args.data, client=c, **common)
    else:
        result = train(args.network, args.data, **common)
    timings.enter("output")
    say_losses(args, result.recoveries)  # (with --json; the text says them after its figures)
    s = result.summary()
    recorded = timings.current()
    if recorded is not None:
        s["timings"] = recorded.as_dict()  # where the command's wall time went, phase by phase
    emit(args, s, f"{s['steps']} steps in {s['seconds']:.2f} s ({where_trained(s['mode'], s['workers'])}): "
                  f"train loss {s['train_loss']:.4f}, test accuracy {100 * s['test_accuracy']:.2f} %, "
                  f"state {s['state_bytes']:,} B (dense with mask {s['dense_masked_state_bytes']:,} B), "
                  f"{s['bytes_sent_per_step']:,.0f} B sent per step"
                  + (f"\n{loss_lines(result.recoveries)}" if result.recoveries else "")
                  + (f"\n{recorded.line()}" if recorded is not None else ""))
    return 0


def where_trained(mode: str, workers: int) -> str:
    """Where a run trained, in words: "single process", or the mode and its workers ("model mode, 2 workers")."""
    return "single process" if mode == "single" else f"{mode} mode, {plural(workers, 'worker')}"


def add_import_weights_parser(subparsers) -> None:
    """Add ``dasknn import-weights`` to an argparse subparsers object."""
    p = subparsers.add_parser("import-weights", help="dense weights (.npz, or .pt with PyTorch) pruned by magnitude "
                                                      "into a store")
    p.add_argument("model", metavar="MODEL.npz|MODEL.pt", type=local_argument("the model"))
    p.add_argument("--sparsity", type=float, default=None, help="share of zeros; default: keep the zeros given")
    p.add_argument("--out", required=True, metavar="STORE", type=as_location)
    p.add_argument("--bias", type=float, default=0.0)
    p.add_argument("--overwrite", action="store_true")
    p.set_defaults(func=run_import_weights)


def run_import_weights(args) -> int:
    """``dasknn import-weights``: write the store, print its path, return the exit code."""
    path = import_weights(args.model, args.out, args.sparsity, bias=args.bias, overwrite=args.overwrite)
    print(path)
    return 0


def check_before_a_cluster(args: argparse.Namespace) -> None:
    """Refuse what :func:`~dasknn.train.train` would refuse, with its own checks, before any cluster starts: the
    arguments, the backend, and a network path that is not a store."""
    from ..store import open_store
    from ..train.device import check_backend
    from ..train.driver import check_arguments

    check_arguments(args.mode, args.epochs, args.batch, args.lr, args.workers, args.group_size,
                    args.checkpoint_every, args.checkpoint, args.resume, args.micro_batches, args.pipeline_schedule)
    check_backend("gpu" if args.gpu else "cpu", args.mode)
    open_store(args.network, check="metadata")


def cmd_train(args: argparse.Namespace) -> int:
    """``dasknn train``, inside Dask's performance report when ``--report`` is given."""
    if args.report and args.mode == "single":  # the arguments' combination first, the files after
        raise DasknnError("--report records Dask tasks: use it with --mode data or model, not single")
    check_before_a_cluster(args)
    if not args.report:
        return run_train(args)
    check_report(args.report)
    # the report is drawn by the scheduler, so training runs on a cluster opened here, whose scheduler we hold
    with local_client(workers=None if args.scheduler else min(args.workers, os.cpu_count() or 1),
                      scheduler=args.scheduler, gpu=args.gpu, **tls_options(args)) as client, \
            performance_report(args.report, client):
        args.scheduler = client.scheduler.address
        if client.security is not None and client.security.require_encryption:  # --tls: connect with its files
            sec = client.security
            args.tls_ca, args.tls_cert, args.tls_key = sec.tls_ca_file, sec.tls_client_cert, sec.tls_client_key
        return run_train(args)
