"""``dasknn generate``, ``import``, ``export`` and ``info``: networks and images into, out of and about stores."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from ..generate import WEIGHTS
from ..ingest import import_network
from ..locations import as_location
from .common import Stages, add_name_arguments, emit, local_argument


def cmd_generate(args: argparse.Namespace) -> int:
    """``dasknn generate``: write a challenge-like network (and images) and print what was written."""
    from .. import generate

    stages = Stages(bars=not args.json)
    t0 = time.perf_counter()
    try:
        out = generate.write(args.out, args.neurons, args.layers, args.images, args.seed, truth=args.truth,
                             overwrite=args.overwrite, bias=args.bias, stage=stages.begin, weights=args.weights)
    finally:
        stages.close()
    seconds = time.perf_counter() - t0
    report = {"out": str(out), "neurons": args.neurons, "layers": args.layers, "edges": 32 * args.neurons * args.layers,
              "images": args.images, "seed": args.seed, "weights": args.weights, "seconds": round(seconds, 3)}
    emit(args, report, f"wrote {out}: {args.neurons} neurons x {args.layers} layers, {args.images} images "
                       f"in {seconds:.1f} s")
    return 0


def cmd_import(args: argparse.Namespace) -> int:
    """``dasknn import``: published TSV files into a store."""
    from ..store import open_store

    t0 = time.perf_counter()
    stages = Stages(bars=not args.json)
    try:
        out = import_network(args.network, args.out, args.inputs, args.truth, args.layers, args.bias, args.ymax,
                             args.overwrite, any_name=args.any_name, stage=stages.begin)
    finally:
        stages.close()
    s = open_store(out)
    report = {"out": str(out), "neurons": s.neurons, "layers": s.depth, "edges": s.edges,
              "images": s.inputs.images if s.inputs else 0, "bytes_on_disk": s.nbytes_on_disk(),
              "seconds": round(time.perf_counter() - t0, 3)}
    emit(args, report, f"wrote {out}: {s.neurons} neurons x {s.depth} layers, {s.edges} edges, "
                       f"{report['images']} images, {report['bytes_on_disk'] / 1e6:.1f} MB")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    """``dasknn export``: a store back into the published TSV layout."""
    from .. import io
    from ..store import open_store

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
    emit(args, {"out": str(args.out), "written": written}, f"wrote {', '.join(written)}")
    return 0


def cmd_info(args: argparse.Namespace) -> int:
    """``dasknn info``: describe (and with ``--check`` verify) a store."""
    from ..store import open_store, stored_partitions

    s = open_store(args.store, check="full" if args.check else "auto")
    truth = None if s.inputs is None else s.inputs.truth()
    report = {"store": str(s.path), "neurons": s.neurons, "layers": s.depth, "edges": s.edges, "bias": s.bias,
              "ymax": s.ymax, "dtype": s.attrs.get("dtype"), "source": s.source,
              "images": s.inputs.images if s.inputs else 0,
              "truth": None if truth is None else int(truth.size),
              "bytes_on_disk": s.nbytes_on_disk(),
              # the partitions kept in the store, each computed once and reused by every run with its parts
              "partitions": stored_partitions(s.root)}
    if args.check:
        # (a damaged value ends the command with its line before this): what was read whole and checked
        report["check"] = {"passed": True, "layers": s.depth, "entries": s.edges,
                           "images": s.inputs.images if s.inputs else 0, "truth": truth is not None}
    emit(args, report, "\n".join(f"{k:>14}: {v}" for k, v in _info_text(report).items()))
    return 0


def _info_text(report: dict) -> dict:
    """``info``'s figures as a reader needs them: the storage type apart from the arithmetic, counts with units."""
    text = dict(report)
    # the store keeps values in the narrowest exact type; inference computes in --dtype, whatever is stored
    text["dtype"] = f"stored as {report['dtype']} (arithmetic float64 by default; --dtype float32 is faster)"
    if report["truth"] is not None:
        text["truth"] = f"{report['truth']} categories (images with a nonzero last row)"
    text["partitions"] = ", ".join(f"{p['name']} ({p['parts']} parts)" for p in report["partitions"]) or "none"
    checked = report.get("check")
    if checked:
        text["check"] = (f"passed: read and checked every value of the {checked['layers']} layers "
                         f"({checked['entries']:,} entries)"
                         + (f" and the {checked['images']:,} images" if checked["images"] else "")
                         + (" and their truth" if checked["truth"] else ""))
    return text


def add_data_parsers(sub) -> None:
    """Add ``generate``, ``import``, ``export`` and ``info`` to an argparse subparsers object."""
    g = sub.add_parser("generate", help="make a challenge-like network (and images)",
                       description="Generate a RadiX-Net-style network: 32 nonzeros per row and column, values 1/16.")
    g.add_argument("--neurons", type=int, required=True, help="neurons per layer (a power of two, e.g. 1024)")
    g.add_argument("--layers", type=int, required=True, help="number of layers")
    g.add_argument("--out", required=True, type=as_location,
                   help="a .zarr store (a path or a URL), or a directory for the published TSV layout")
    g.add_argument("--images", type=int, default=0, help="also make this many synthetic images (default 0)")
    g.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    g.add_argument("--truth", action="store_true", help="also compute the images' categories with the SciPy reference (float64 and float32), on every "
                        "core: far slower than the network itself (see the README)")
    g.add_argument("--bias", type=float, help="layer bias (default: the challenge's for N)")
    g.add_argument("--weights", choices=WEIGHTS, default="constant",
                   help="weight values: the challenge's constant 1/16 (default), or random (uniform in [1/32, 3/32), "
                        "mean 1/16: the same wiring and bias, stored bytes that do not compress, as a real network's)")
    g.add_argument("--overwrite", action="store_true", help="replace --out if it exists")
    g.add_argument("--json", action="store_true", help="print one JSON object")
    g.set_defaults(func=cmd_generate)

    i = sub.add_parser("import", help="import a GraphChallenge network (and inputs) into a Zarr store",
                       description="Read n{N}-l{k}.tsv files (a directory or neuron{N}.tar.gz) into a dasknn store.")
    i.add_argument("network", type=local_argument("the network's files"),
                   help="directory of n{N}-l{k}.tsv files, or neuron{N}.tar.gz")
    i.add_argument("--out", required=True, type=as_location, help="the store to write (STORE.zarr, a path or a URL)")
    i.add_argument("--inputs", type=local_argument("--inputs"),
                   help="sparse-images-{N}.tsv[.gz] to store with the network")
    add_name_arguments(i)
    i.add_argument("--layers", type=int, help="import only the first LAYERS layers")
    i.add_argument("--bias", type=float, help="layer bias (default: the challenge's for N)")
    i.add_argument("--ymax", type=float, default=32.0, help="activation clamp (default 32)")
    i.add_argument("--overwrite", action="store_true", help="replace --out if it exists")
    i.add_argument("--json", action="store_true", help="print one JSON object")
    i.set_defaults(func=cmd_import)

    e = sub.add_parser("export", help="write a store back as GraphChallenge TSV files")
    e.add_argument("store", type=as_location, help="a dasknn store")
    e.add_argument("--out", required=True, type=local_argument("--out of export"),
                   help="directory to write neuron{N}/n{N}-l{k}.tsv (and inputs) into")
    e.add_argument("--json", action="store_true", help="print one JSON object")
    e.set_defaults(func=cmd_export)

    s = sub.add_parser("info", help="describe and check a store")
    s.add_argument("store", type=as_location, help="a dasknn store")
    s.add_argument("--check", action="store_true", help="read and check every value, however large the store")
    s.add_argument("--json", action="store_true", help="print one JSON object")
    s.set_defaults(func=cmd_info)
