"""How the CUDA sources (the layer step's in :mod:`.gpu`, training's in :mod:`.grad`) are compiled: NVRTC's
options, shared so both compile alike and neither module imports the other for them."""

from __future__ import annotations

#: NVRTC options: C++17 is the default dialect of CUDA 12 and 13 alike.
GPU_COMPILE_OPTIONS = ("--std=c++17",)
