"""Batch inference on an MPI allocation, through dask-mpi.

Takes every option of ``dasknn infer`` (``--threads-per-worker`` and ``--memory-limit`` apply to the workers; the
number of workers is the MPI size less two). Rank 0 runs the Dask scheduler, rank 1 this script's client, every
other rank a worker::

    pip install "dasknn[cluster]"
    mpirun -np 6 python examples/mpi.py --network n1024.zarr --dtype float64 --json     # 4 workers

Inside a batch job, ``srun python examples/mpi.py ...`` does the same.
"""

from __future__ import annotations

import argparse
import logging
import sys

from dasknn.cli import add_infer_arguments, run_guarded, run_infer


def build_parser() -> argparse.ArgumentParser:
    """``dasknn infer``'s options and the MPI ones."""
    p = argparse.ArgumentParser(prog="mpi.py", description=__doc__.splitlines()[0])
    add_infer_arguments(p)
    m = p.add_argument_group("MPI")
    m.add_argument("--interface", help="network interface the ranks talk over, e.g. ib0")
    m.add_argument("--local-directory", help="worker scratch folder")
    return p


def main(argv: list[str] | None = None) -> int:
    # every rank parses the same arguments, so a usage error stops them all before any starts Dask
    args = build_parser().parse_args(argv)
    if args.scheduler or args.gpu:
        raise SystemExit("mpi.py: --scheduler and --gpu do not apply here (the cluster is the MPI ranks)")
    from dask_mpi import initialize
    from distributed import Client
    from mpi4py import MPI

    workers = MPI.COMM_WORLD.Get_size() - 2
    logging.getLogger("distributed").setLevel(logging.WARNING)  # every rank would log its start and stop
    # ranks 0 and 2.. serve (scheduler, workers) inside initialize and exit when rank 1's client is done
    initialize(interface=args.interface, nthreads=args.threads_per_worker, memory_limit=args.memory_limit or "auto",
               local_directory=args.local_directory, dashboard_address="127.0.0.1:0")
    with Client() as client:
        client.wait_for_workers(workers)
        try:
            return run_infer(args, client)
        finally:
            # workers leave before the scheduler stops (dask-mpi stops it when this rank exits): no lost-connection
            # tracebacks at the end
            client.retire_workers(close_workers=True)


if __name__ == "__main__":
    sys.exit(run_guarded(main))
