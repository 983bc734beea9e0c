"""Drawing a partition's cost against the baselines."""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np
import scipy.sparse as sp

from .methods import partition_network
from .metrics import _as_layers, _owners_for, layer_imbalance, layer_volumes, part_sends, part_work


#: One (line style, marker) per series of volumes, in the order they are drawn.
VOLUME_STYLES = (("-", "o"), ("--", "s"), (":", "^"), ("-.", "D"))


# --------------------------------------------------------------------------------------------- plot
def draw_volumes(ax, series: dict[str, np.ndarray]) -> None:
    """Draw each method's volume per layer on ``ax`` (log scale, legend with totals), every series visible.

    Series that coincide (block and random on some networks have equal volumes) must not hide each other: each
    has its own line style and hollow marker, its markers fall on other layers than the others' (staggered), the
    lines are slightly transparent, and the later ones are drawn thinner, on top.

    Parameters
    ----------
    ax
        A matplotlib ``Axes``.
    series
        Entries sent per image, one value per layer, by the method's name (at most four).
    """
    from matplotlib.ticker import MaxNLocator

    if len(series) > len(VOLUME_STYLES):
        raise ValueError(f"at most {len(VOLUME_STYLES)} series of volumes, not {len(series)}")
    layers = len(next(iter(series.values()), ()))
    x = np.arange(1, layers + 1)
    every = max(len(series), layers // 20)
    for i, ((name, vol), (ls, marker)) in enumerate(zip(series.items(), VOLUME_STYLES)):
        vol = np.asarray(vol)
        # a zero volume sits at 0.5 on the log scale, below every positive one
        ax.plot(x, np.maximum(vol, 0.5), label=f"{name} (total {int(vol.sum()):,})", lw=2.0 - 0.4 * i, ls=ls,
                marker=marker, markevery=(i * every // len(series), every), markersize=5, markerfacecolor="none",
                alpha=0.85, zorder=2 + i)
    ax.set_yscale("log")
    ax.set_xlabel("layer")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.legend(fontsize=8)


def plot_partition(
    layers: Sequence[sp.csc_matrix],
    owners: np.ndarray,
    method: str,
    path: str | os.PathLike[str],
    *,
    seed: int = 0,
    parts: int | None = None,
):
    """Draw a partition's cost against the ``block`` and ``random`` baselines into one PNG.

    Left: communication volume per layer for ``method``, ``block`` and ``random`` (same ``K``). Right: each
    part's load under ``method``, work (nonzeros owned, summed over layers) and entries sent.

    Parameters
    ----------
    layers, owners
        The network and the partition to draw.
    method
        Label for ``owners``.
    path
        Where to write the PNG.
    seed
        Seed of the ``random`` baseline.
    parts
        Number of parts; inferred as ``owners.max() + 1`` when omitted.

    Returns
    -------
    matplotlib.figure.Figure
        The figure written (its axes can be inspected).
    """
    from matplotlib.figure import Figure  # lazily: plotting is optional and matplotlib is slow to import
    from matplotlib.ticker import MaxNLocator

    ws = _as_layers(layers)
    o, k = _owners_for(ws, owners, parts)
    series = {method: layer_volumes(ws, o, parts=k)}
    for base in ("block", "random"):
        if base != method:
            series[base] = layer_volumes(ws, partition_network(ws, k, base, seed=seed), parts=k)
    work = part_work(ws, o, parts=k).sum(axis=0)
    sends = part_sends(ws, o, parts=k).sum(axis=0)

    fig = Figure(figsize=(12, 4.5), layout="constrained")
    ax1, ax2 = fig.subplots(1, 2)
    draw_volumes(ax1, series)
    ax1.set_ylabel("entries sent per image (connectivity - 1)")
    ax1.set_title(f"volume per layer, K = {k}, N = {ws[0].shape[0]}")
    ids = np.arange(k)
    ax2.bar(ids - 0.2, work, width=0.4, label="work (nonzeros owned)", color="tab:blue")
    ax2.set_xlabel("part")
    ax2.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax2.set_ylabel("work (nonzeros owned, all layers)", color="tab:blue")
    ax3 = ax2.twinx()
    ax3.bar(ids + 0.2, sends, width=0.4, label="entries sent", color="tab:orange", hatch="//")
    ax3.set_ylabel("entries sent per image (all layers)", color="tab:orange")
    ax2.set_title(f"load per part ({method}): worst layer imbalance {layer_imbalance(ws, o, parts=k).max():.2%}")
    fig.savefig(os.fspath(path), dpi=110)
    return fig
