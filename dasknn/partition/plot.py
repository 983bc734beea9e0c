"""Drawing a partition's cost against the baselines."""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np
import scipy.sparse as sp

from .methods import partition_network
from .metrics import _as_layers, _owners_for, layer_imbalance, layer_volumes, part_sends, part_work


# --------------------------------------------------------------------------------------------- plot
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
    x = np.arange(1, len(ws) + 1)
    # distinct line styles and markers: series that coincide (block and random on some networks) stay visible
    styles = [("-", "o"), ("--", "s"), (":", "^"), ("-.", "D")]
    for (name, vol), (ls, marker) in zip(series.items(), styles):
        ax1.plot(x, np.maximum(vol, 0.5), label=f"{name} (total {int(vol.sum()):,})", lw=1.2, ls=ls, marker=marker,
                 markevery=max(1, len(x) // 20), markersize=4, markerfacecolor="none")
    ax1.set_yscale("log")
    ax1.set_xlabel("layer")
    ax1.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax1.set_ylabel("entries sent per image (connectivity - 1)")
    ax1.set_title(f"volume per layer, K = {k}, N = {ws[0].shape[0]}")
    ax1.legend(fontsize=8)
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
