"""Per-block compute kernels: the fused challenge layer step, on raw arrays.

A kernel takes raw arrays (activations, and a layer block as ``indptr, indices, data``) and returns raw arrays;
Dask never appears here. Activations are held transposed and dense (``N x B``: one row per neuron, one column per
image). Kernels are chosen by the activations' array type through dispatchers in the style of dask-image
(:mod:`.dispatch`): NumPy is registered there; CuPy registers itself lazily the first time a CuPy array arrives, so
importing dasknn never imports CuPy.

Modules: :mod:`.cpu` (the Numba layer step and loop), :mod:`.gpu` (CUDA source, launch shapes, CuPy loop),
:mod:`.messages` (model mode's boundary messages), :mod:`.arrays` (placement helpers), :mod:`.dispatch`.
:mod:`.grad` holds the training kernels (weight gradient, error passed down), dispatched the same way.
"""

from __future__ import annotations

from . import gpu, grad
from .arrays import activations_of_rows, alive, dense_transposed, empty_like_kind, to_device, to_host
from .cpu import layer_step_numpy, layer_step_tiles, release_scratch, run_layers_numpy, tile_for, tile_inputs
from .dispatch import Dispatch, keep_columns, layer_step, run_layers, run_layers_device
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
    "CONSTANT", "CUDA_SOURCE", "DENSE", "Dispatch", "GPU_COMPACT_EVERY", "GPU_MAX_GRID_Y", "GPU_ROWS",
    "GPU_STAGED_MAX_BYTES", "GPU_STAGED_WARPS", "GPU_TILE", "GPU_VARIANTS", "GpuLaunch", "SPARSE", "activations_of_rows", "alive", "back_input", "grad", "weight_grad",
    "cuda_code", "dense_transposed", "empty_like_kind", "gpu", "gpu_launch", "gpu_step", "keep_columns", "keep_on_device", "layer_step",
    "layer_step_cusparse", "layer_step_gpu", "layer_step_numpy", "layer_step_tiles", "message_bytes", "pack_rows", "release_device_layers", "release_scratch", "run_layers",
    "run_layers_device", "run_layers_gpu", "run_layers_numpy", "tile_for", "tile_inputs", "to_device", "to_host", "unpack_rows",
]
