"""Published GraphChallenge files into a dasknn store: the network's layers, and optionally its inputs and truth."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from .errors import DasknnError


def import_network(
    network: str | os.PathLike[str],
    out: str | os.PathLike[str],
    inputs: str | os.PathLike[str] | None = None,
    truth: str | os.PathLike[str] | None = None,
    layers: int | None = None,
    bias: float | None = None,
    ymax: float = 32.0,
    overwrite: bool = False,
    progress: Callable[[int], None] | None = None,
    any_name: bool = False,
    stage: Callable[[str, int], Callable[[int], None] | None] | None = None,
) -> Path | str:
    """Import a GraphChallenge network (directory or tar.gz), and optionally its inputs and truth, into a store.

    Parameters
    ----------
    network : path
        A directory of ``n{N}-l{k}.tsv`` files, or ``neuron{N}.tar.gz``.
    out : path or URL
        The store to write.
    inputs, truth : path, optional
        ``sparse-images-{N}.tsv[.gz]`` and ``neuron{N}-l{L}-categories.tsv`` to store with the network (the truth
        needs the inputs).
    layers : int, optional
        Import only the first ``layers`` layers.
    bias : float, optional
        The layer bias (default: the challenge's for N).
    ymax : float
        The activation clamp.
    overwrite : bool
        Replace ``out`` if it exists.
    progress : callable, optional
        Called with the number of layers written after each layer.
    stage : callable, optional
        ``stage(name, total)`` is called as each stage begins, once the network's files are found ("reading the
        images" where there are inputs, then "importing layers"); what it returns is called with the steps done
        (else ``progress``), as :func:`dasknn.generate.write`'s.

    Returns
    -------
    Path or str
        ``out`` (a URL stays a URL).
    """
    from . import io, store
    from .network import challenge_bias

    neurons, depth, layer_iter = io.iter_network_layers(network, layers)
    if truth and not inputs:
        raise DasknnError("--truth needs --inputs")
    if inputs and stage is not None and Path(inputs).exists():
        # (a file not there, or named for another network: its one line alone)
        io.check_name(inputs, "images", neurons, any_name=any_name)
        if truth:
            io.check_name(truth, "a truth", neurons, depth, any_name)
        stage("reading the images", 0)
    images = io.read_images(inputs, neurons=neurons, any_name=any_name) if inputs else None
    cats = (io.checked_truth(truth, images.shape[0], neurons, depth, any_name) if truth and images is not None
            else None)
    b = challenge_bias(neurons) if bias is None else bias
    step = (stage("importing layers", depth) if stage is not None else None) or progress
    with store.StoreWriter(out, neurons, depth, b, ymax, source=os.fspath(network), overwrite=overwrite) as w:
        for k, layer in enumerate(layer_iter, start=1):
            w.write_layer(k, layer)
            if step is not None:
                step(k)
        if images is not None:
            w.write_inputs(images, cats)
    return w.path
