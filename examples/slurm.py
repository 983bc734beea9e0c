"""Batch inference on a SLURM cluster, through dask-jobqueue.

Takes every option of ``dasknn infer`` (``--workers`` is the number of Dask workers to start as SLURM jobs,
``--threads-per-worker`` their cores, ``--memory-limit`` their memory), plus the SLURM settings below. Run it on
the login node; the scheduler runs here, the workers in the jobs::

    pip install "dasknn[cluster]"
    python examples/slurm.py --network n16k.zarr --workers 8 --threads-per-worker 4 --memory-limit 16GB \\
        --queue compute --account myproject --walltime 01:00:00 --json
    python examples/slurm.py --workers 8 --print-job-script      # show the job script, submit nothing
"""

from __future__ import annotations

import argparse
import sys

from dasknn.cli import add_infer_arguments, run_guarded, run_infer


def build_parser() -> argparse.ArgumentParser:
    """``dasknn infer``'s options and the SLURM job's."""
    p = argparse.ArgumentParser(prog="slurm.py", description=__doc__.splitlines()[0])
    add_infer_arguments(p)
    s = p.add_argument_group("SLURM")
    s.add_argument("--workers-per-job", type=int, default=1, help="Dask worker processes per SLURM job (default 1)")
    s.add_argument("--queue", help="SLURM partition (#SBATCH -p)")
    s.add_argument("--account", help="SLURM account (#SBATCH -A)")
    s.add_argument("--walltime", default="01:00:00", help="job time limit (default 01:00:00)")
    s.add_argument("--interface", help="network interface the workers and scheduler talk over, e.g. ib0")
    s.add_argument("--local-directory", help="worker scratch folder on the compute nodes (e.g. $TMPDIR)")
    s.add_argument("--job-extra", action="append", default=[], metavar="DIRECTIVE",
                   help="an extra #SBATCH directive, e.g. --job-extra='--exclusive' (repeatable)")
    s.add_argument("--print-job-script", action="store_true", help="print the job script and exit")
    return p


def job_options(args: argparse.Namespace) -> dict:
    """What each SLURM job asks for and runs: ``--workers-per-job`` workers of ``--threads-per-worker`` cores and
    ``--memory-limit`` each, the queue, account, walltime and directives."""
    from dask.utils import format_bytes, parse_bytes

    per_job = args.workers_per_job
    memory = args.memory_limit or "4GB"  # per worker; jobqueue needs a figure to request
    return dict(
        cores=args.threads_per_worker * per_job,
        processes=per_job,
        memory=format_bytes(parse_bytes(memory) * per_job).replace(" ", ""),
        queue=args.queue,
        account=args.account,
        walltime=args.walltime,
        interface=args.interface,
        local_directory=args.local_directory,
        job_name="dasknn",
        job_extra_directives=args.job_extra,
        python=sys.executable,
    )


def make_cluster(args: argparse.Namespace):
    """A ``dask_jobqueue.SLURMCluster`` whose jobs each run ``--workers-per-job`` workers (its scheduler starts
    here)."""
    from dask_jobqueue import SLURMCluster

    return SLURMCluster(**job_options(args))


def job_script(args: argparse.Namespace) -> str:
    """The script each SLURM job would run, made without starting a scheduler: its address is a placeholder (the
    cluster fills in its own)."""
    from dask_jobqueue.slurm import SLURMJob

    return SLURMJob(scheduler="tcp://<scheduler-address>:8786", name="dummy-name", config_name="slurm",
                    **job_options(args)).job_script()


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.scheduler or args.gpu:
        raise SystemExit("slurm.py: --scheduler and --gpu do not apply here (the cluster is SLURM's)")
    if args.print_job_script:
        print(job_script(args))
        return 0
    from distributed import Client

    with make_cluster(args) as cluster:
        workers = args.workers or 1
        cluster.scale(n=workers)
        with Client(cluster) as client:
            client.wait_for_workers(workers)  # jobs may wait in the queue first
            return run_infer(args, client)


if __name__ == "__main__":
    sys.exit(run_guarded(main))
