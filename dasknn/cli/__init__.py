"""The ``dasknn`` command, one module per command group.

:mod:`~dasknn.cli.main` builds the parser and runs it; :mod:`~dasknn.cli.common` holds what the commands share
(progress, JSON-or-text output, the performance report); :mod:`~dasknn.cli.data` (generate, import, export,
info), :mod:`~dasknn.cli.partition`, :mod:`~dasknn.cli.infer`, :mod:`~dasknn.cli.train` and
:mod:`~dasknn.cli.bench` (bench-graphchallenge) each hold one group's options and runs.

The names below are the package's public surface (the console script is ``dasknn.cli:main``; the cluster examples
use :func:`add_infer_arguments`, :func:`run_infer` and :func:`run_guarded`).
"""

from __future__ import annotations

from ..ingest import import_network
from .common import check_report, performance_report
from .infer import add_infer_arguments, cmd_infer, run_infer
from .main import EXIT_INTERRUPTED, EXIT_USAGE, build_parser, main, run_guarded

__all__ = ["EXIT_INTERRUPTED", "EXIT_USAGE", "add_infer_arguments", "build_parser", "check_report", "cmd_infer",
           "import_network", "main", "performance_report", "run_guarded", "run_infer"]
