"""Per-block compute kernels: the fused challenge layer step, on raw arrays.

A kernel takes raw arrays (activations, and a layer block as ``indptr, indices, data``) and returns raw arrays;
Dask never appears here. Activations are held transposed and dense (``N x B``: one row per neuron, one column per
image). Everything done with arrays of one library is one backend (:class:`~dasknn.kernels.backend.Backend`):
``"cpu"`` (NumPy, :mod:`.cpu`) and ``"gpu"`` (CuPy, :mod:`.gpu`), looked up by name (:func:`backend_named`) or
by array type (:func:`backend_of`) in :mod:`.dispatch`, where each is registered lazily: CuPy is imported only
when a CuPy array arrives, so importing dasknn never imports CuPy.

Modules: :mod:`.backend` (the contract), :mod:`.dispatch` (the registry), :mod:`.cpu` (the Numba layer step and
loop), :mod:`.gpu` (CUDA source, launch shapes, CuPy loop), :mod:`.messages` (model mode's boundary messages),
:mod:`.arrays` (placement helpers), :mod:`.grad` (the training kernels, Numba and CUDA), :mod:`.nvrtc`,
:mod:`.ell` and :mod:`.gpu_ell` (issue 44's opt-in GPU loop: sliced ELL, compaction on the device). The
functions below (``layer_step``, ``to_host``, ``weight_grad``, ...) forward to the backend of their array.
"""

from __future__ import annotations

from . import gpu, grad
from .arrays import (
    activations_of_rows,
    alive,
    array_module,
    dense_transposed,
    empty_like_kind,
    held_layers,
    rows_on_host,
    to_device,
    to_host,
)
from .backend import Backend, BackendUnsupported
from .cpu import layer_step_numpy, layer_step_tiles, release_scratch, run_layers_numpy, tile_for, tile_inputs
from .dispatch import (
    Dispatch,
    backend_named,
    backend_names,
    backend_of,
    keep_columns,
    layer_step,
    register_backend,
    release_backends,
    run_layers,
    run_layers_device,
    unregister_backend,
)
from .gpu import (
    CUDA_SOURCE,
    GPU_COMPACT_EVERY,
    GPU_MAX_GRID_Y,
    GPU_ROWS,
    GPU_STAGED_MAX_BYTES,
    GPU_STAGED_WARPS,
    GPU_TILE,
    GPU_VARIANTS,
    GpuLaunch,
    cuda_code,
    gpu_launch,
    gpu_step,
    keep_on_device,
    layer_step_cusparse,
    layer_step_gpu,
    release_device_layers,
    run_layers_gpu,
)
from .grad import back_input, weight_grad
from .messages import CONSTANT, DENSE, SPARSE, message_bytes, pack_rows, unpack_rows

__all__ = [
    "Backend", "BackendUnsupported", "CONSTANT", "CUDA_SOURCE", "DENSE", "Dispatch", "GPU_COMPACT_EVERY",
    "GPU_MAX_GRID_Y", "GPU_ROWS", "GPU_STAGED_MAX_BYTES", "GPU_STAGED_WARPS", "GPU_TILE", "GPU_VARIANTS",
    "GpuLaunch", "SPARSE", "activations_of_rows", "alive", "array_module", "back_input", "backend_named",
    "backend_names", "backend_of", "cuda_code", "dense_transposed", "empty_like_kind", "gpu", "gpu_launch",
    "gpu_step", "grad", "held_layers", "keep_columns", "keep_on_device", "layer_step", "layer_step_cusparse", "layer_step_gpu",
    "layer_step_numpy", "layer_step_tiles", "message_bytes", "pack_rows", "register_backend", "release_backends",
    "release_device_layers", "release_scratch", "rows_on_host", "run_layers", "run_layers_device", "run_layers_gpu",
    "run_layers_numpy", "tile_for", "tile_inputs", "to_device", "to_host", "unpack_rows", "unregister_backend",
    "weight_grad",
]
