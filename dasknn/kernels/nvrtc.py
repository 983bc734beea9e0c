"""How the CUDA sources (the layer step's in :mod:`.gpu` and :mod:`.gpu_ell`, training's in :mod:`.grad`) are
compiled: NVRTC's options, the arithmetic the layer kernels share, and the per-device cache of compiled kernels,
shared so that all compile alike and none imports another for them."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

#: NVRTC options: C++17 is the default dialect of CUDA 12 and 13 alike.
GPU_COMPILE_OPTIONS = ("--std=c++17",)

#: The layer kernels' arithmetic: a multiply and an add each rounded (no fused multiply-add), as the CPU kernel
#: computes, so float32 results agree bit for bit; the rule applied to a sum.
CUDA_ARITHMETIC = r"""
__device__ __forceinline__ float madd(float acc, float y, float w) { return __fadd_rn(acc, __fmul_rn(y, w)); }
__device__ __forceinline__ double madd(double acc, double y, double w) { return __dadd_rn(acc, __dmul_rn(y, w)); }

template <typename T>
__device__ __forceinline__ T rule(T v, T bias, T ymax) {
    if (v != T(0)) {  // the bias goes to nonzero sums only, then ReLU and the clamp
        v = v + bias;
        v = v < T(0) ? T(0) : (v > ymax ? ymax : v);
    }
    return v;
}
"""


def compiled_kernel(name: str, code: Callable[[], str], modules: dict,
                    found: dict) -> tuple[Any, int]:  # pragma: no cover - needs a GPU
    """The kernel ``name`` of the source ``code()`` on the current device, and the most dynamic shared memory one
    launch of it may ask for; ``modules`` and ``found`` are the caller's caches (device id -> module,
    (device id, name) -> (kernel, limit)).

    The source is compiled once per device and each kernel looked up once per device and name, not per launch.
    On first lookup the kernel opts in to the device's shared memory per block less its own static shared memory
    (its alive flags), and the limit returned is the kernel's own ``max_dynamic_shared_size_bytes`` as read back:
    a launch compared with it cannot ask for more than the kernel allows.
    """
    import cupy

    dev = cupy.cuda.Device()
    key = (dev.id, name)
    if key not in found:
        if dev.id not in modules:
            modules[dev.id] = cupy.RawModule(code=code(), options=GPU_COMPILE_OPTIONS)
        kernel = modules[dev.id].get_function(name)
        optin = int(dev.attributes.get("MaxSharedMemoryPerBlockOptin", 48 * 1024)) - int(kernel.shared_size_bytes)
        with warnings.catch_warnings():  # some CuPy versions deprecate the attribute's old spelling
            warnings.simplefilter("ignore", DeprecationWarning)
            if kernel.max_dynamic_shared_size_bytes < optin:
                kernel.max_dynamic_shared_size_bytes = optin  # opt in beyond the default 48 KiB
            found[key] = (kernel, int(kernel.max_dynamic_shared_size_bytes))
    return found[key]
