"""The ``dasknn`` command: the parser of every command, exit codes, and one-line errors.

Every user-fixable problem ends as one line on stderr (``dasknn: error: ...``) and exit status 2; nothing here
knows how the work is done, only which function does it.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
import threading
import traceback
import warnings
from collections.abc import Callable, Iterator, Sequence

from .. import __version__
from ..errors import DasknnError
from ..locations import remote_error_line
from ..timings import Timings, recording, since_process_start
from .bench import add_bench_parser
from .data import add_data_parsers
from .infer import add_infer_parser
from .partition import add_partition_parser
from .train import add_train_parsers
from .warm import add_warm_parser

EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line like every other error."""

    def error(self, message: str) -> None:  # type: ignore[override]
        # the line already starts "dasknn: error: "; the command is named once, where its help is
        raise DasknnError(f"{message} (see {self.prog} --help)")


def build_parser() -> argparse.ArgumentParser:
    """The ``dasknn`` argument parser (exposed for the docs and tests)."""
    p = _Parser(prog="dasknn", description="Sparse deep neural networks on Dask: GraphChallenge inference, "
                                           "partitioning and training, out of core.")
    p.add_argument("--version", action="version", version=f"dasknn {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    add_data_parsers(sub)
    add_partition_parser(sub)
    add_train_parsers(sub)
    add_bench_parser(sub)
    add_infer_parser(sub)
    add_warm_parser(sub)
    return p


def run_guarded(func: Callable[..., int | None], *args) -> int:
    """Call ``func(*args)`` as the command line does: a :class:`DasknnError` is one line on stderr and exit 2.

    For scripts built on :func:`add_infer_arguments` and :func:`run_infer` (see ``examples/``).
    """
    try:
        return int(func(*args) or 0)
    except DasknnError as e:
        print(f"dasknn: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except Exception as e:
        # what an object store's client raised where no store named it (a worker's read, say): still one line
        line = remote_error_line(e, os_errors=False)
        if line is None:
            raise
        print(f"dasknn: error: {line}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt as e:
        # the interrupt may land between a coroutine's making and its awaiting (Zarr's calls from this thread): freed
        # with the interrupt's frames, it warned "coroutine ... was never awaited" below the one line (seen once in
        # a test run under load). Freed here, where that warning is not shown
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "coroutine .* was never awaited", RuntimeWarning)
            traceback.clear_frames(e.__traceback__)
        print("dasknn: interrupted; nothing partial was kept", file=sys.stderr)
        return EXIT_INTERRUPTED


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Within the block, SIGTERM (``timeout``, a batch scheduler's kill) ends the command as Ctrl-C does.

    The handler raises :class:`KeyboardInterrupt` in the main thread, so every writer removes its partial output on
    the way out, as it does for Ctrl-C; the handler before is restored after. Elsewhere than the main thread (where
    no handler can be installed) it does nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit status.

    Without ``argv`` this process is the command (the console script, ``python -m dasknn``): its timings count
    the interpreter's start-up too.
    """
    timings = Timings(startup=since_process_start() if argv is None else 0.0)

    def run() -> int:
        timings.enter("arguments")
        args = build_parser().parse_args(argv)
        return args.func(args)

    with sigterm_as_interrupt(), recording(timings):
        return run_guarded(run)
