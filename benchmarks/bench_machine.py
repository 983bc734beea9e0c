"""This machine's limits: peak multiply-add rate per core and cache / memory read bandwidth.

Usage (from the repository root)::

    python benchmarks/bench_machine.py [--max-mb 1024] [--seconds 0.3]

The peak is a Numba loop of independent multiply-adds on a short array that the compiler keeps in vector
registers: ``x = x * m + c`` with the multiply and the add rounded separately (as the layer kernel must, to stay
bit-equal to the reference; a fused multiply-add would count twice as fast on hardware that has it). The
bandwidth is a streaming read (an OR over the buffer's 64-bit words, which vectorises without reordering any
floating-point sum) over buffers from 16 KB to ``--max-mb``: the small ones stay in L1 / L2, the large ones
come from memory. Both run on one core; the figures are the best of a few repeats, since the VM is shared.
"""

from __future__ import annotations

import argparse
import time

import numba
import numpy as np

LANES = 256  # independent chains: enough to cover the add latency on every vector unit


@numba.njit(nogil=True, boundscheck=False)
def _madd_loop(x, m, c, reps):  # pragma: no cover - compiled
    for _ in range(reps):
        for b in range(LANES):
            x[b] = x[b] * m + c
    return x[0]


@numba.njit(nogil=True, boundscheck=False)
def _read_loop(words, reps):  # pragma: no cover - compiled
    acc = np.uint64(0)
    for _ in range(reps):
        for i in range(words.size):
            acc |= words[i]
    return acc


def _best_rate(call, work: float, seconds: float) -> float:
    """Best work per second over repeats of ``call`` lasting about ``seconds`` in all."""
    call()  # compile and warm the caches
    best = 0.0
    end = time.perf_counter() + seconds
    while True:
        t0 = time.perf_counter()
        call()
        best = max(best, work / (time.perf_counter() - t0))
        if time.perf_counter() > end:
            return best


def peak_madd(dtype: type, seconds: float) -> float:
    """Multiply-adds per second on one core in ``dtype`` (separately rounded multiply and add)."""
    x = np.linspace(0.5, 1.0, LANES).astype(dtype)
    m, c = dtype(0.999), dtype(0.0001)
    reps = 200_000
    return _best_rate(lambda: _madd_loop(x, m, c, reps), float(LANES) * reps, seconds)


def read_bandwidth(nbytes: int, seconds: float) -> float:
    """Bytes per second of a streaming read over a buffer of ``nbytes``."""
    words = np.ones(max(1, nbytes // 8), dtype=np.uint64)
    reps = max(1, (64 << 20) // nbytes)  # at least 64 MB per timing, so small buffers are timed well
    return _best_rate(lambda: _read_loop(words, reps), float(words.size * 8 * reps), seconds)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-mb", type=int, default=1024, help="largest buffer (MB)")
    ap.add_argument("--seconds", type=float, default=0.3, help="time per figure")
    args = ap.parse_args()
    print("| what (one core) | measured |")
    print("|---|---|")
    for dtype in (np.float32, np.float64):
        print(f"| peak multiply-adds/s, {np.dtype(dtype).name} | {peak_madd(dtype, args.seconds):.3g} |")
    size = 16 << 10
    while size <= args.max_mb << 20:
        label = f"{size >> 10} KB" if size < 1 << 20 else f"{size >> 20} MB"
        print(f"| read bandwidth, {label} buffer | {read_bandwidth(size, args.seconds) / 1e9:.1f} GB/s |")
        size *= 4


if __name__ == "__main__":
    main()
