"""Batch inference on the GPUs of one machine, through dask-cuda's ``LocalCUDACluster``.

Takes every option of ``dasknn infer``; ``--workers`` is the number of GPUs to use (one worker each, default all
visible), and the kernels run on CuPy blocks (``--gpu`` is implied)::

    pip install "dasknn[gpu]"        # CuPy for CUDA 12 with its headers ([ctk]) and dask-cuda ("dasknn[gpu13]": CUDA 13)
    python examples/gpu.py --network n65536.zarr --workers 4 --json
"""

from __future__ import annotations

import argparse
import sys

from dasknn.cli import add_infer_arguments, run_guarded, run_infer


def build_parser() -> argparse.ArgumentParser:
    """``dasknn infer``'s options and the GPU ones."""
    p = argparse.ArgumentParser(prog="gpu.py", description=__doc__.splitlines()[0])
    add_infer_arguments(p)
    g = p.add_argument_group("GPU")
    g.add_argument("--devices", help="comma-separated CUDA device ids (default: the first --workers, or all)")
    return p


def make_cluster(args: argparse.Namespace):
    """A ``dask_cuda.LocalCUDACluster``: one worker per chosen GPU, listening on this machine only.

    No RMM pool: the kernels allocate through CuPy's own memory pool, which an RMM pool (without
    ``rmm_allocator_external_lib_list="cupy"``, and RMM itself, which the extras do not install) would only take
    memory from.
    """
    try:
        from dask_cuda import LocalCUDACluster
    except ImportError:
        raise SystemExit("gpu.py needs CuPy and dask-cuda: pip install 'dasknn[gpu]'") from None
    devices = args.devices or (None if args.workers is None else ",".join(str(i) for i in range(args.workers)))
    return LocalCUDACluster(host="127.0.0.1", dashboard_address="127.0.0.1:0", CUDA_VISIBLE_DEVICES=devices,
                            threads_per_worker=args.threads_per_worker, memory_limit=args.memory_limit or "auto")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.gpu = True  # CuPy blocks and kernels on every worker
    if args.scheduler:
        raise SystemExit("gpu.py: --scheduler does not apply here (use dasknn infer --gpu --scheduler ...)")
    from distributed import Client

    with make_cluster(args) as cluster, Client(cluster) as client:
        return run_infer(args, client)


if __name__ == "__main__":
    sys.exit(run_guarded(main))
