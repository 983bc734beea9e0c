"""Code versions side by side: the ``--tree NAME=PATH`` arguments of the benchmarks that run two source trees (the
code before a change and after it) alternately, each in a process of its own with its tree first on ``PYTHONPATH``
(so the workers it starts import that tree too)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path


def add_tree_argument(parser: argparse.ArgumentParser) -> None:
    """``--tree NAME=PATH``, given once per version."""
    parser.add_argument("--tree", action="append", default=[],
                        help="NAME=PATH of a source tree (its dasknn package inside), in the order they run each round")


def named_trees(args: argparse.Namespace, prog: str) -> list[tuple[str, str]]:
    """The versions given, as (name, resolved path) in their order; refused in one line where none or one is
    malformed."""
    trees = [t.split("=", 1) for t in args.tree]
    if not trees or any(len(t) != 2 for t in trees):
        raise SystemExit(f"{prog}: give each tree as --tree NAME=PATH")
    return [(name, str(Path(path).resolve())) for name, path in trees]


def tree_env(tree: str) -> dict[str, str]:
    """This process's environment with ``tree`` first on ``PYTHONPATH``."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [tree, os.environ.get("PYTHONPATH")]))}


def median(values: list[float]) -> float:
    """The middle value (of an even count, the upper of the two middle ones)."""
    return sorted(values)[len(values) // 2]


def ratios_to(figures: list[float], first: list[float]) -> str:
    """Each figure over the first version's, as ``"0.94, 0.52"``."""
    return ", ".join(f"{a / b:.2f}" for a, b in zip(figures, first))
