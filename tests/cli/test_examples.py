"""The cluster examples (SLURM, MPI, GPU) and the packaging: the same options as ``dasknn infer``, real runs."""

from __future__ import annotations

import email
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

from dasknn import io
from dasknn.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


def _env() -> dict[str, str]:
    # the examples run as scripts: make them import this checkout's dasknn, not an installed copy
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _options(parser) -> set[str]:
    return {s for a in parser._actions for s in a.option_strings}


# ids with ".py": a bare "gpu" id would read as the gpu marker and be skipped without a device
@pytest.mark.parametrize("name", ["slurm", "mpi", "gpu"], ids=["slurm.py", "mpi.py", "gpu.py"])
def test_examples_take_every_infer_option(name):
    infer = build_parser()._subparsers._group_actions[0].choices["infer"]
    assert "--report" in _options(infer)
    missing = _options(infer) - _options(_load(name).build_parser())
    assert not missing, f"examples/{name}.py lacks {sorted(missing)}"
    args = _load(name).build_parser().parse_args(["--network", "n.zarr", "--dtype", "float64", "--batch", "7"])
    # (a store argument is a location: a local one a Path, a URL a string; dasknn.locations.as_location)
    assert (str(args.network), args.dtype, args.batch) == ("n.zarr", "float64", 7)


@pytest.mark.subprocess
def test_slurm_job_script():
    pytest.importorskip("dask_jobqueue", reason="dask-jobqueue is not installed (pip install 'dasknn[cluster]')")
    proc = subprocess.run([sys.executable, str(EXAMPLES / "slurm.py"), "--workers", "4", "--workers-per-job", "2",
                           "--threads-per-worker", "3", "--memory-limit", "8GB", "--queue", "compute",
                           "--account", "proj42", "--walltime", "02:30:00", "--job-extra=--exclusive",
                           "--print-job-script"], capture_output=True, text=True, timeout=120, env=_env())
    assert proc.returncode == 0, proc.stderr
    script = proc.stdout
    lines = script.splitlines()
    assert lines[0].startswith("#!")
    for directive in ("#SBATCH -p compute", "#SBATCH -A proj42", "#SBATCH -t 02:30:00", "#SBATCH --exclusive",
                      "#SBATCH --cpus-per-task=6", "#SBATCH -J dasknn"):
        assert directive in lines, (directive, script)
    mem = [ln for ln in lines if ln.startswith("#SBATCH --mem=")]
    assert mem and mem[0] in ("#SBATCH --mem=15G", "#SBATCH --mem=16G"), mem  # 2 workers x 8 GB
    worker = [ln for ln in lines if "distributed.cli.dask_worker" in ln]
    assert len(worker) == 1 and worker[0].startswith(sys.executable)
    assert "--nthreads 3" in worker[0] and "--nworkers 2" in worker[0] and "tcp://" in worker[0]


def test_slurm_job_script_starts_no_scheduler(monkeypatch, capsys):
    jobqueue = pytest.importorskip("dask_jobqueue", reason="dask-jobqueue is not installed")

    def started(*args, **kwargs):
        raise AssertionError("a SLURMCluster (and its scheduler) was started")

    monkeypatch.setattr(jobqueue, "SLURMCluster", started)
    assert _load("slurm").main(["--workers", "2", "--queue", "compute", "--print-job-script"]) == 0
    script = capsys.readouterr().out
    assert "#SBATCH -p compute" in script.splitlines() and "distributed.cli.dask_worker" in script


@pytest.mark.subprocess
@pytest.mark.slow
def test_mpi_example_under_mpirun(slice_store, slice_truth, tmp_path):
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        pytest.skip("mpirun is not installed (Debian: apt-get install openmpi-bin libopenmpi-dev)")
    pytest.importorskip("mpi4py", reason="mpi4py is not installed (pip install 'dasknn[cluster]')")
    pytest.importorskip("dask_mpi", reason="dask-mpi is not installed (pip install 'dasknn[cluster]')")
    root = ["--allow-run-as-root"] if hasattr(os, "geteuid") and os.geteuid() == 0 else []
    out = tmp_path / "categories.tsv"
    proc = subprocess.run([mpirun, *root, "--oversubscribe", "-np", "4", sys.executable, str(EXAMPLES / "mpi.py"),
                           "--network", str(slice_store), "--dtype", "float64", "--json", "--out", str(out)],
                          capture_output=True, text=True, timeout=300, env=_env(), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # OpenMPI may add terminal escapes of its own to the output, and give the ranks a terminal (where --json is
    # indented over several lines): the report is the JSON object that starts on a line of its own
    lines = proc.stdout.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("{"))
    report, _ = json.JSONDecoder().raw_decode("\n".join(lines[start:]))
    assert report["workers"] == 2  # 4 ranks: scheduler, client, 2 workers
    assert report["matches_truth"] is True
    np.testing.assert_array_equal(io.read_categories(out), slice_truth)


@pytest.mark.subprocess
def test_gpu_example_without_dask_cuda_says_so():
    if importlib.util.find_spec("dask_cuda") is not None:
        pytest.skip("dask-cuda is installed: the GPU test below runs it")
    proc = subprocess.run([sys.executable, str(EXAMPLES / "gpu.py"), "--network", "n.zarr"], capture_output=True,
                          text=True, timeout=60, env=_env())
    assert proc.returncode != 0 and "pip install 'dasknn[gpu]'" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.subprocess
@pytest.mark.gpu
def test_gpu_example_runs(slice_store, slice_truth, tmp_path):
    pytest.importorskip("dask_cuda", reason="dask-cuda is not installed (pip install 'dasknn[gpu]')")
    out = tmp_path / "categories.tsv"
    proc = subprocess.run([sys.executable, str(EXAMPLES / "gpu.py"), "--network", str(slice_store), "--workers", "1",
                           "--dtype", "float64", "--json", "--out", str(out)], capture_output=True, text=True,
                          timeout=300, env=_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    np.testing.assert_array_equal(io.read_categories(out), slice_truth)


def _installed_backend_builds() -> bool:
    # whether this environment's setuptools is the one pyproject.toml asks for (68 or later): then the wheel builds
    # offline with it; else (a fresh venv's is 65.5) pip builds it in an isolated environment, as `pip install .` does
    try:
        import setuptools
        import wheel  # noqa: F401 - the build's other requirement
    except ImportError:
        return False
    return int(setuptools.__version__.split(".")[0]) >= 68


@pytest.mark.subprocess
def test_wheel_builds_with_extras_and_entry_point(tmp_path):
    # build from a copy: a build in the checkout would write build/ and *.egg-info under others' feet
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src)
    shutil.copytree(ROOT / "dasknn", src / "dasknn", ignore=shutil.ignore_patterns("__pycache__"))
    offline = ["--no-build-isolation"] if _installed_backend_builds() else []
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", *offline, "-q",
                           "-w", str(tmp_path / "dist"), str(src)], capture_output=True, text=True, timeout=300)
    if proc.returncode != 0 and not offline and ("No matching distribution" in proc.stderr
                                                 or "Could not find a version" in proc.stderr):
        pytest.skip(f"no package index to fetch the build backend from: {proc.stderr.strip().splitlines()[-1]}")
    assert proc.returncode == 0, proc.stderr
    (wheel,) = (tmp_path / "dist").glob("dasknn-*.whl")
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        meta = email.message_from_bytes(z.read(next(n for n in names if n.endswith(".dist-info/METADATA"))))
        entry = z.read(next(n for n in names if n.endswith(".dist-info/entry_points.txt"))).decode()
    for module in ("cli/__init__", "cli/main", "engine/__init__", "engine/infer", "runtime/graph", "store/__init__",
                   "kernels/__init__", "kernels/grad", "challenge", "ingest", "__main__"):
        assert f"dasknn/{module}.py" in names
    assert {"gpu", "cluster", "notebook", "test"} <= set(meta.get_all("Provides-Extra"))
    assert "dasknn = dasknn.cli:main" in entry
