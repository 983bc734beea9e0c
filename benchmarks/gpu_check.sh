#!/usr/bin/env bash
# The GPU check of issues 9 and 19, in one script for the offline GPU machine (see ../shared/device/README.md):
# installs the carried wheels, checks that dasknn imports, runs the gpu-marked tests (none may skip), then
# benchmarks/bench_gpu.py section by section (plain loop, Dask engine, generated widths, cupyx loop last), each
# section's table printed as soon as it is measured. About 5 minutes in all (303 s on 2026-12-04), within one call of 510 s.
#
# On the CPU machine, from the repository root, first:
#   bash ../shared/device/fetch-wheels.sh msgspec     # .whl/: the Dask stack, zarr and what it imports, dask-cuda
#   bash benchmarks/gpu_check.sh prepare              # copies the challenge data into .gpu-data/ (git-ignored)
#   bash benchmarks/gpu_check.sh rehearse             # the install and imports on Python 3.12, as step 6 of that
#                                                     # README describes (a missing wheel shows up here)
# then on the GPU machine (the device tool's run, carrying .whl and .gpu-data, about 30 MB and 26 MB):
#   bash benchmarks/gpu_check.sh
# or, for issue 44 (the ELL loop: its gpu tests, ncu on both loops, the ELL loop against today's), in one call:
#   GPU_CHECK_SECONDS=540 bash benchmarks/gpu_check.sh ell      (ELL_GENERATED=65536 for the widest network)
# Rehearse that without a device: python benchmarks/bench_gpu_kernels.py --data .gpu-data --dry-run
# The image there has numpy, scipy, cupy, numba, llvmlite, pytest, hypothesis, tqdm and psutil (KINDS.md in the
# device entry lists them); the wheels bring the rest. Everything printed is also kept in $OUT/gpu_check.log
# (the device tool brings $OUT back). Exit status: 0 only when the install, every gpu test and every benchmark
# section passed.
set -uo pipefail
cd "$(dirname "$0")/.."
SITE=${SITE:-/tmp/site}
WHEELS=${WHEELS:-.whl}
DATA=${DASKNN_GPU_DATA:-.gpu-data}
TOTAL=${GPU_CHECK_SECONDS:-450}
step=${1:-run}

# what the checks import; a wheel missing from $WHEELS fails here, before any device time is spent on it
IMPORTS="import zarr, numcodecs, google_crc32c, dask, distributed, dasknn.store, dasknn.engine, dasknn.cli"

install() {  # $1: the Python to install for
    ls "$WHEELS"/*.whl >/dev/null 2>&1 || { echo "no wheels in $WHEELS: run ../shared/device/fetch-wheels.sh"; return 1; }
    "$1" -m pip install -q --no-index --no-deps --no-compile --target "$SITE" "$WHEELS"/*.whl || return 1
    PYTHONPATH=$SITE:$PWD "$1" -c "$IMPORTS" && echo "imports: ok ($IMPORTS)"
}

if [ "$step" = prepare ]; then
    mkdir -p "$DATA"
    cp ../shared/data/graphchallenge/{README.md,neuron1024.tar.gz,sparse-images-1024.tsv.gz,neuron1024-l120-categories.tsv} "$DATA"/
    exclude=$(git rev-parse --git-path info/exclude)
    for p in "/$DATA/" /.whl/ /.site/; do grep -qxF "$p" "$exclude" 2>/dev/null || echo "$p" >> "$exclude"; done
    du -sh "$DATA" "$WHEELS" 2>/dev/null
    exit 0
fi

if [ "$step" = rehearse ]; then
    # a Python 3.12 venv with the image's own packages that dasknn needs, then the carried wheels
    RH=${RH:-/tmp/rh}
    SITE=${SITE_REHEARSE:-/tmp/rh-site}
    # a pyenv shim named python3.12 may exist and still fail (3.12 not selected): ask it to run first
    py312=$(ls /root/.pyenv/versions/3.12*/bin/python3.12 2>/dev/null | head -1)
    [ -n "$py312" ] || { python3.12 -c pass 2>/dev/null && py312=$(command -v python3.12); }
    [ -n "$py312" ] || { echo "rehearse: no python3.12 here"; exit 1; }
    [ -x "$RH/bin/python" ] || "$py312" -m venv "$RH" || exit 1
    "$RH/bin/python" -m pip install -q numpy scipy numba msgpack psutil pyyaml cloudpickle toolz click jinja2 \
        fsspec sortedcontainers packaging typing-extensions urllib3 tqdm pytest hypothesis || exit 1
    rm -rf "$SITE"
    install "$RH/bin/python" || exit 1
    # the gpu tests collect (every test module imports) and skip without a device; dask_cuda needs a driver to
    # import, so only its wheel's presence is checked
    ls "$WHEELS"/dask_cuda-*.whl || exit 1
    PYTHONPATH=$SITE:$PWD "$RH/bin/python" -m pytest tests -m gpu -q -p no:cacheprovider --co >/dev/null \
        && echo "gpu tests: collected"
    exit $?
fi

OUT=${OUT:-/tmp/gpu-check-out}
mkdir -p "$OUT"
exec > >(tee "$OUT/gpu_check.log") 2>&1
export PYTHONUNBUFFERED=1
start=$(date +%s)
left() { echo $((TOTAL - ($(date +%s) - start))); }
status=0
echo "== $(date -Is) $(hostname)"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || echo "nvidia-smi: not found"

echo "== install ($(($(date +%s) - start)) s)"
install python3 || { echo "install: FAILED"; exit 1; }
export PYTHONPATH=$SITE:$PWD
[ "$step" = install ] && exit 0
python3 - <<'EOF'
import importlib
for m in ("numpy", "scipy", "cupy", "numba", "dask", "distributed", "zarr", "dask_cuda", "pytest"):
    try:
        print(m, getattr(importlib.import_module(m), "__version__", "?"))
    except Exception as e:
        print(f"{m}: MISSING ({type(e).__name__}: {e})")
import cupy
print("devices:", cupy.cuda.runtime.getDeviceCount())
EOF

if [ "$step" = ell ]; then
    # issue 44 in one call: the ELL loop's gpu tests, Nsight Compute's stall reasons on today's loop and on the
    # ELL loop (a few launches each), then the ELL loop against today's, real and generated networks
    echo "== ell gpu tests ($(($(date +%s) - start)) s)"
    DASKNN_REQUIRE_GPU=1 timeout 150 python3 -m pytest tests/kernels/test_kernels_ell.py -m gpu -q -p no:cacheprovider -rs
    rc=$?; echo "ell gpu tests exit: $rc"; [ $rc -eq 0 ] || status=1
    NCU="--section SpeedOfLight --section Occupancy --section WarpStateStats --section SchedulerStats --section LaunchStats --launch-skip 4 --launch-count 2"
    if command -v ncu >/dev/null; then
        for loop in layers ell; do
            kernel=$([ $loop = layers ] && echo dasknn_staged_f32 || echo dasknn_ell_f32)
            echo "== ncu, $loop loop ($(($(date +%s) - start)) s)"
            timeout 100 ncu $NCU -k "regex:$kernel" python3 benchmarks/bench_gpu_kernels.py --data "$DATA" \
                --profile $loop --minibatches 12 || echo "ncu ($loop): exit $?"
        done
    else
        echo "ncu: not found"
    fi
    echo "== bench ($(($(date +%s) - start)) s): the ELL loop against today's"
    timeout $(($(left) - 120)) python3 benchmarks/bench_gpu_kernels.py --data "$DATA" --sections ell,generated \
        --repeats 5 --generated "${ELL_GENERATED:-4096,16384}" --gen-images 60000 --ell-shared-kib 64,128
    rc=$?; echo "bench exit: $rc after $(($(date +%s) - start)) s"; [ $rc -eq 0 ] || status=1
    echo "== the ELL loop through Dask ($(($(date +%s) - start)) s): plain loop and engine, float32 and float64"
    timeout $(($(left) - 5)) python3 benchmarks/bench_gpu.py --data "$DATA" --repeats 5 --skip generated,cupyx \
        --engine-dtypes float32,float64 --gpu-loop ell
    rc=$?; echo "engine exit: $rc after $(($(date +%s) - start)) s"; [ $rc -eq 0 ] || status=1
    exit $status
fi

echo "== gpu tests ($(($(date +%s) - start)) s)"
# DASKNN_REQUIRE_GPU: a gpu test that would skip errors or fails instead (tests/conftest.py): none may skip
DASKNN_REQUIRE_GPU=1 timeout 200 python3 -m pytest tests -m gpu -q -p no:cacheprovider -rs
rc=$?
echo "gpu tests exit: $rc"
[ $rc -eq 0 ] || status=1

echo "== benchmark ($(($(date +%s) - start)) s): loop, engine, generated, cupyx"
timeout $(($(left) - 10)) python3 benchmarks/bench_gpu.py --data "$DATA" --repeats 5 --cupyx-repeats 1 \
    --generated 4096,16384,65536
rc=$?
echo "bench exit: $rc after $(($(date +%s) - start)) s"
[ $rc -eq 0 ] || status=1
exit $status
