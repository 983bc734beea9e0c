"""``dasknn warm``: compile the kernels on every worker of a cluster (and here) once, so that their Numba cache
holds them before any run."""

from __future__ import annotations

import argparse

from ..errors import DasknnError
from .common import emit, positive_int

DTYPES = ("float32", "float64")
#: ``dasknn warm --help``
DESCRIPTION = ("Compile (or load from Numba's cache) every kernel a run calls, on every worker of a cluster and in "
               "this process, and print where each keeps its cache. A run compiles what it needs before its clock "
               "anyway (its compile_seconds); warming a cluster's nodes once makes that milliseconds on every later "
               "fresh worker.")


def cmd_warm(args: argparse.Namespace) -> int:
    """``dasknn warm``: warm every worker and this process; print where each keeps its cache and how long it took."""
    from ..cluster import local_client, tls_options
    from ..engine.warm import every_kernel, longest, warm, warm_workers
    from ..runtime.recovery import WorkersLost

    dtypes = tuple(dict.fromkeys(args.dtype or DTYPES))
    backend = "gpu" if args.gpu else "cpu"
    with local_client(args.workers, 1, args.scheduler, gpu=args.gpu, **tls_options(args)) as client:
        workers = sorted(client.nthreads())
        if not workers:
            raise DasknnError("the Dask cluster has no workers")
        try:
            reports = warm_workers(client, workers, every_kernel(dtypes, backend))
        except WorkersLost as lost:
            raise DasknnError(f"a worker left the cluster while it compiled ({', '.join(lost.lost)})") from None
    # this process runs the CPU kernels (single-process training, the reference), whatever the workers run
    here = warm(every_kernel(dtypes, "cpu"))
    lines = [f"compiled the kernels ({', '.join(dtypes)}, training; {backend}) on {len(workers)} workers and here; "
             "where each keeps its Numba cache:"]
    for name, r in [("client", here), *reports.items()]:
        caches = ", ".join(f"{c.path} ({c.compiled} compiled, {c.loaded} loaded)" for c in r.caches)
        lines.append(f"  {name} on {r.host}: {r.seconds:.2f} s, {caches}")
    emit(args, {"dtypes": list(dtypes), "backend": backend, "seconds": round(longest(reports.values()), 3),
                "client": here.as_dict(), "workers": {w: r.as_dict() for w, r in reports.items()}}, "\n".join(lines))
    return 0


def add_warm_parser(sub) -> None:
    """Add ``warm`` to an argparse subparsers object."""
    from ..cluster import add_tls_arguments

    f = sub.add_parser("warm", help="compile the kernels on every worker of a cluster once (fills their Numba cache)",
                       description=DESCRIPTION)
    f.add_argument("--workers", type=positive_int, help="local worker processes (default: one per core)")
    f.add_argument("--scheduler", help="address of a running Dask scheduler (instead of a local cluster)")
    add_tls_arguments(f)
    f.add_argument("--dtype", action="append", choices=DTYPES,
                   help="the arithmetic to compile for; repeat for both (default: float32 and float64)")
    f.add_argument("--gpu", action="store_true",
                   help="the CUDA kernels on the workers' GPUs (a dask-cuda cluster when local)")
    f.add_argument("--json", action="store_true", help="print one JSON object")
    f.set_defaults(func=cmd_warm)
