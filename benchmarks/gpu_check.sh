#!/usr/bin/env bash
# The GPU check of issue 9, in one script for the offline GPU machine (see ../shared/device/README.md):
# installs the wheels, runs the gpu-marked tests, runs benchmarks/bench_gpu.py; the benchmark's table is last.
#
# On the CPU machine, from the repository root, first:
#   bash ../shared/device/fetch-wheels.sh tqdm        # .whl/ (add numba llvmlite if the GPU machine lacks numba)
#   bash benchmarks/gpu_check.sh prepare              # copies the challenge data into .gpu-data/ (git-ignored)
# then on the GPU machine (the device tool's run, carrying .whl and .gpu-data; about 5 to 8 minutes):
#   bash benchmarks/gpu_check.sh
# Only the repository travels to that machine (not ../shared), within 64 MiB: the data is 26 MB and the wheels
# about 20 MB without llvmlite (60 MB). If numba must be brought too, install the wheels in one call
# (SITE=.site bash benchmarks/gpu_check.sh install, carrying .whl) and run in the next (SITE=.site, carrying
# .gpu-data only): ignored folders stay on a warm machine between calls.
# Everything printed is also kept in $OUT/gpu_check.log (the device tool brings $OUT back).
set -uo pipefail
cd "$(dirname "$0")/.."
SITE=${SITE:-/tmp/site}
DATA=${DASKNN_GPU_DATA:-.gpu-data}
step=${1:-run}

if [ "$step" = prepare ]; then
    mkdir -p "$DATA"
    cp ../shared/data/graphchallenge/{README.md,neuron1024.tar.gz,sparse-images-1024.tsv.gz,neuron1024-l120-categories.tsv} "$DATA"/
    for p in "/$DATA/" /.whl/ /.site/; do grep -qxF "$p" .git/info/exclude 2>/dev/null || echo "$p" >> .git/info/exclude; done
    du -sh "$DATA" .whl 2>/dev/null
    exit 0
fi

OUT=${OUT:-/tmp/gpu-check-out}
mkdir -p "$OUT"
exec > >(tee "$OUT/gpu_check.log") 2>&1
export PYTHONUNBUFFERED=1
start=$(date +%s)
echo "== $(date -Is) $(hostname)"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || echo "nvidia-smi: not found"

if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target "$SITE" .whl/*.whl || echo "pip install: failed"
fi
export PYTHONPATH=$SITE:$PWD
[ "$step" = install ] && exit 0

echo "== modules"
python3 - <<'EOF'
import importlib
missing = []
for m in ("numpy", "scipy", "cupy", "numba", "dask", "distributed", "zarr", "numcodecs", "tqdm", "psutil",
          "dask_cuda", "pytest"):
    try:
        mod = importlib.import_module(m)
        print(f"{m} {getattr(mod, '__version__', '?')}")
    except Exception as e:
        missing.append(m)
        print(f"{m}: MISSING ({type(e).__name__}: {e})")
try:
    import cupy
    print("devices:", cupy.cuda.runtime.getDeviceCount())
except Exception as e:
    print(f"devices: none ({type(e).__name__}: {e})")
if set(missing) - {"dask_cuda"}:
    print("missing modules:", ", ".join(missing))
EOF

echo "== gpu tests ($(($(date +%s) - start)) s)"
# DASKNN_REQUIRE_GPU: a gpu test that would skip fails instead (tests/conftest.py), so none can skip silently
DASKNN_REQUIRE_GPU=1 timeout 200 python3 -m pytest tests -m gpu -q -p no:cacheprovider -rs
echo "pytest exit: $?"

echo "== benchmark ($(($(date +%s) - start)) s)"
timeout $((450 - ($(date +%s) - start))) python3 benchmarks/bench_gpu.py --data "$DATA" --repeats 5 \
    --generated 4096,16384,65536
echo "bench exit: $? after $(($(date +%s) - start)) s"
