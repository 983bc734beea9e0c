"""``dasknn train`` and ``dasknn import-weights``: their parsers and runs live in :mod:`dasknn.train`."""

from __future__ import annotations

import argparse
import os

from ..errors import DasknnError
from .common import check_report, performance_report, positive_int


def cmd_train(args: argparse.Namespace) -> int:
    """``dasknn train``, inside Dask's performance report when ``--report`` is given."""
    from ..train import run_train

    if not args.report:
        return run_train(args)
    if args.mode == "single":
        raise DasknnError("--report records Dask tasks: use it with --mode data or model, not single")
    check_report(args.report)
    from ..cluster import local_client, tls_options

    # the report is drawn by the scheduler, so training runs on a cluster opened here, whose scheduler we hold
    with local_client(workers=None if args.scheduler else min(args.workers, os.cpu_count() or 1),
                      scheduler=args.scheduler, **tls_options(args)) as client, performance_report(args.report, client):
        args.scheduler = client.scheduler.address
        if client.security is not None and client.security.require_encryption:  # --tls: connect with its files
            sec = client.security
            args.tls_ca, args.tls_cert, args.tls_key = sec.tls_ca_file, sec.tls_client_cert, sec.tls_client_key
        return run_train(args)


def add_train_parsers(sub) -> None:
    """Add ``train`` and ``import-weights`` (as :mod:`dasknn.train` defines them) to a subparsers object."""
    from .. import train

    train.add_train_parser(sub)
    sub.choices["train"].set_defaults(func=cmd_train)
    for action in sub.choices["train"]._actions:  # --workers 0 refused by the parser, as for every command
        if "--workers" in action.option_strings:
            action.type = positive_int
    train.add_import_weights_parser(sub)
