"""What every ``dasknn`` command shares: the progress bar, JSON-or-text output, the performance report, --explain."""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

from ..errors import DasknnError
from ..locations import local_path


class Progress:
    """A progress bar on a terminal, silence elsewhere (pipes, --json)."""

    def __init__(self, total: int, desc: str, enabled: bool):
        self.bar = None
        if enabled and sys.stderr.isatty():
            from tqdm import tqdm

            self.bar = tqdm(total=total, desc=desc, unit="", leave=False, file=sys.stderr)

    @property
    def shown(self) -> bool:
        """Whether a bar is on the terminal (a caller can skip the work of reporting to none)."""
        return self.bar is not None

    def to(self, done: int, total: int | None = None) -> None:
        """Show ``done`` steps done."""
        if self.bar is not None:
            self.bar.n = done
            self.bar.refresh()

    def close(self) -> None:
        """Remove the bar."""
        if self.bar is not None:
            self.bar.close()


class Stages:
    """A long command's stages: a progress bar for each on a terminal, else one line each on stderr.

    A run in a pipe or a batch job is then never silent for minutes (``generate --truth``); stdout, where the
    result or its JSON goes, is left alone.
    """

    def __init__(self, bars: bool):
        self.bars = bars
        self.bar: Progress | None = None

    def begin(self, name: str, total: int) -> Callable[[int], None]:
        """Start stage ``name`` of ``total`` steps; return what to call with the steps done."""
        self.close()
        self.bar = Progress(total, name, self.bars)
        if not self.bar.shown:
            print(f"dasknn: {name} ...", file=sys.stderr, flush=True)
        return self.bar.to

    def close(self) -> None:
        """Remove the bar of the stage under way, if any."""
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def emit(args: argparse.Namespace, report: dict, text: str) -> None:
    """Print ``report`` as one JSON object with ``--json``, else ``text``.

    The object is indented on a terminal, for a person to read, and one line elsewhere, for a script to parse.
    """
    if args.json:
        print(json.dumps(report, indent=2 if sys.stdout.isatty() else None))
    else:
        print(text)


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

    # inline: the page carries bokeh's scripts, so it opens on an offline compute node (no CDN)
    with client.as_current(), _report(filename=os.fspath(path), mode="inline"):
        yield
    # on stderr: stdout is the command's figures (its JSON)
    print(f"dasknn: wrote the performance report to {os.fspath(path)}", file=sys.stderr, flush=True)


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


def explain_table(predictions: list, mode: str, group_size: int, measured: float) -> str:
    """The cost model's table of its :class:`~dasknn.cost.Prediction`: each mode's predicted inference seconds and
    their parts (what the run measures as its inference), then the load of resident weights and the one-time setup
    (a partition and a plan still to make) apart, the whole it chooses by, and what ran."""
    lines = ["mode            group  fits  predicted s  (compute + exchange + tasks + read)  + load  + setup"
             "  = in all"]
    for p in predictions:
        ran = p.mode == mode and p.group_size == group_size
        # a lower bound: the exchange was not estimated, the setup alone costing more than data mode
        note = {"sample": " (exchange from a sample)", "bound": " (at least: exchange not estimated)"}.get(
            p.volumes_from, "")
        via = f" ({p.transport})" if p.transport else ""  # model and hybrid: the exchange it assumes
        lines.append(f"{p.mode + via:<15} {p.group_size:>5}  {'yes' if p.fits else 'no ':<4} "
                     f"{p.inference_seconds:>11.3f}  ({p.compute:.3f} + {p.exchange:.3f} + {p.tasks:.3f} + "
                     f"{p.read:.3f})  + {p.load_seconds:.3f}  + {p.setup_seconds:.3f}  = {p.seconds:.3f}{note}"
                     + (f"  <- ran: measured {measured:.3f} s" if ran else ""))
    return "\n".join(lines)


def local_argument(what: str) -> Callable[[str], Path]:
    """An argument type for ``what`` that only a local file or folder can be (TSV files, a ``.npy``, a CSV): a URL
    is refused in one line (stores' arguments take :func:`~dasknn.locations.as_location`, where a URL stays one)."""
    return functools.partial(local_path, what=what)


def add_name_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``--truth`` (a local categories file) and ``--any-name`` (read files named for another network) to a
    command that reads the published inputs (``import``, ``infer``)."""
    parser.add_argument("--truth", type=local_argument("--truth"),
                        help="neuron{N}-l{L}-categories.tsv, the truth of the inputs (infer: by default the one stored with them)")
    parser.add_argument("--any-name", action="store_true",
                        help="read --inputs and --truth files whose names (sparse-images-{N}, "
                             "neuron{N}-l{L}-categories) say another network's width or depth (refused by default)")


def positive_int(text: str) -> int:
    """An argparse type: a whole number of at least 1 (``--workers 0`` is refused, not read as "the default")."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


PLOT_EXTRA = 'pip install "dasknn[plot]"'


def has_matplotlib() -> bool:
    """Whether matplotlib can be imported (it is the optional ``plot`` extra)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def require_matplotlib(option: str) -> None:
    """Fail with one line naming the extra where ``option`` asks for a plot and matplotlib is not installed."""
    if not has_matplotlib():
        raise DasknnError(f"{option} draws with matplotlib, which is not installed: {PLOT_EXTRA}")


def plural(count: int, noun: str) -> str:
    """``count`` and ``noun``, with an s unless there is exactly one: "1 worker", "2 workers"."""
    return f"{count} {noun}{'' if count == 1 else 's'}"


def loss_lines(recoveries: list[dict]) -> str:
    """One line for each loss of workers a run survived (the report's ``recoveries``): who was lost, in which
    phase, how long the run waited and on how many workers it went on, with what it kept and redid.

    A run that lost a worker still succeeds; these lines say why it took longer, and on fewer workers where one was
    not replaced. Empty when nothing was lost.
    """
    lines = []
    for loss in recoveries:
        redone = [f"{key.replace('_', ' ')} {value}" for key, value in loss.items()
                  if key not in ("lost", "phase", "waited_seconds", "workers_now")]
        lines.append(f"lost {', '.join(loss['lost'])} in the {loss['phase']} phase: waited "
                     f"{loss['waited_seconds']:.1f} s, went on with {plural(loss['workers_now'], 'worker')}"
                     + (f" ({', '.join(redone)})" if redone else ""))
    return "\n".join(lines)


def say_losses(args, recoveries: list[dict]) -> None:
    """With ``--json``, each loss of workers the run survived (:func:`loss_lines`) as one line on stderr: stdout
    holds only the JSON object (its ``recoveries``), and a run that went on with fewer workers says so where a
    person reads. The text output carries the same lines after its figures."""
    if getattr(args, "json", False):
        for line in loss_lines(recoveries).splitlines():
            print(f"dasknn: {line}", file=sys.stderr, flush=True)


def mismatch_line(mismatched: int, images: int, dtype: str) -> str:
    """How many images differ from the truth; for a few in float32, that float64 gives the exact answer."""
    line = f"{mismatched} image{'s differ' if mismatched != 1 else ' differs'} from the truth"
    if dtype == "float32" and mismatched <= max(5, images // 100):
        # the published truth is computed in float64: float32 rounding flips images that sit on the threshold
        line += " (float32 rounding; --dtype float64 gives the exact answer)"
    return line
