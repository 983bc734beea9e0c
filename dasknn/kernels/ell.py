"""The sliced-ELL layout of a layer for the GPU's whole-chunk loop (:mod:`.gpu_ell`), and a NumPy model of it.

Issue 44's candidate after Hidayetoglu et al. (SpDNN Challenge 2020): a block of threads (:data:`ELL_THREADS` by
default) computes one output neuron a thread for a minibatch of images a thread (the weight read once, used for every
image of the minibatch, held in a register). The inputs the block's outputs read (its *footprint*, in input
order) are staged in shared memory a *buffer* at a time; each warp's 32 outputs are stored as ELLPACK slots padded
to the warp's longest row (slot ``m`` of lane ``t`` at ``m * 32 + t``: a warp's load of a slot is one coalesced
transaction), each slot holding the input's position in its buffer and the weight.

Exactness: every output is summed in its CSC entry order (the CPU kernel's), so the slots of one output follow
its entries, buffer by buffer; a column whose entries would need an earlier buffer after a later one is refused
(:class:`ValueError`). A padded slot adds ``0 * y``, a zero for any finite ``y``, and a sum that starts at +0 is
never -0 under round-to-nearest (``x + (-x)`` is +0), so adding it changes no bit.

Everything here is NumPy; :func:`ell_loop_numpy` replays the kernel's order of work (stage, slots, rule, alive
flags, the compaction of :func:`ell_compact_numpy`) so the CPU tests check the layout and the loop's indexing bit
for bit against :func:`dasknn.kernels.cpu.run_layers_numpy`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

#: Threads a block of the ELL kernel unless asked otherwise: one output neuron each, so a block covers this many
#: outputs (Hidayetoglu's 256; 1,024 stages each input once a minibatch where 256 stage it once a block of outputs).
ELL_THREADS = 256
#: Lanes a warp: the ELL slots are padded to a warp's longest row.
ELL_WARP = 32
#: Shared memory a block stages its inputs in (one buffer: ``inputs x minibatch`` activations). 64 KiB leaves
#: three blocks a multiprocessor on sm_90 (227 KiB) and holds all 1,024 inputs of n1024 at minibatch 16 float32.
ELL_SHARED_BYTES = 64 * 1024
#: Largest buffer: positions in a buffer are stored as 16-bit indices (as Hidayetoglu's ``unsigned short``).
ELL_MAX_BUFFER = 65536


@dataclass(frozen=True)
class EllLayer:
    """One layer in sliced ELL, as the kernel reads it (all NumPy, host side).

    Attributes
    ----------
    n_in, n_out
        Input and output neurons.
    threads
        Outputs a block (its threads, a multiple of 32).
    buffer_inputs
        Inputs a buffer holds at most (its shared memory is ``buffer_inputs x minibatch`` activations).
    block_buffers
        ``blocks + 1`` offsets: block ``b``'s buffers are ``block_buffers[b]:block_buffers[b + 1]``.
    map_ptr, map
        Buffer ``g`` stages the input neurons ``map[map_ptr[g]:map_ptr[g + 1]]`` (int32, ascending).
    warp_ptr
        ``buffers * warps + 1`` offsets: the slots of warp ``w`` in buffer ``g`` are
        ``warp_ptr[g * warps + w]:warp_ptr[g * warps + w + 1]``.
    index, value
        ``slots * 32`` entries: lane ``t``'s slot ``m`` at ``m * 32 + t``; ``index`` is the position in the
        buffer (uint16), ``value`` the weight (zero where padded).
    entries
        The layer's CSC entries (the stored slots less the padding).
    """

    n_in: int
    n_out: int
    threads: int
    buffer_inputs: int
    block_buffers: np.ndarray
    map_ptr: np.ndarray
    map: np.ndarray
    warp_ptr: np.ndarray
    index: np.ndarray
    value: np.ndarray

    entries: int

    @property
    def blocks(self) -> int:
        return self.block_buffers.size - 1

    @property
    def padding(self) -> float:
        """Share of the stored slots that are padding (the ELL's cost over CSC)."""
        return 0.0 if self.value.size == 0 else 1.0 - self.entries / self.value.size


def buffer_inputs_for(minibatch: int, itemsize: int, shared_bytes: int = ELL_SHARED_BYTES) -> int:
    """Inputs a buffer holds: the most whose ``inputs x minibatch`` activations fit ``shared_bytes``."""
    if minibatch < 1 or shared_bytes < minibatch * itemsize:
        raise ValueError(f"a minibatch of {minibatch} images of {itemsize} bytes does not fit {shared_bytes} bytes")
    return min(ELL_MAX_BUFFER, shared_bytes // (minibatch * itemsize))


def ell_layer(indptr: np.ndarray, indices: np.ndarray, data: np.ndarray, n_in: int, buffer_inputs: int,
              dtype=np.float32, threads: int = ELL_THREADS) -> EllLayer:
    """The sliced-ELL form of a CSC layer (``indptr`` over outputs, ``indices`` its inputs, ``data`` weights) for
    blocks of ``threads`` outputs.

    Raises :class:`ValueError` where a column's entries would be summed out of their order (its inputs cross
    buffers backwards; CSC with sorted indices never does) or an index is outside ``n_in``.
    """
    indptr = np.asarray(indptr, dtype=np.int64)
    indices = np.asarray(indices, dtype=np.int64)
    data = np.asarray(data, dtype=dtype)
    n_out = indptr.size - 1
    if not 1 <= buffer_inputs <= ELL_MAX_BUFFER:
        raise ValueError(f"a buffer holds 1 to {ELL_MAX_BUFFER} inputs, not {buffer_inputs}")
    if threads % ELL_WARP or not ELL_WARP <= threads <= 1024:
        raise ValueError(f"a block has a multiple of {ELL_WARP} threads up to 1024, not {threads}")
    if indices.size and (indices.min() < 0 or indices.max() >= n_in):
        raise ValueError(f"layer indices must lie in 0..{n_in - 1}")
    warps = threads // ELL_WARP
    blocks = max(1, -(-n_out // threads))
    col = np.repeat(np.arange(n_out, dtype=np.int64), np.diff(indptr))
    block = col // threads
    # the footprint of each block: its distinct inputs, ascending; an entry's rank in its block's footprint
    keys, inverse = np.unique(block * n_in + indices, return_inverse=True)
    key_block = keys // n_in
    footprint = np.bincount(key_block, minlength=blocks)
    first_key = np.concatenate([[0], np.cumsum(footprint)])
    rank = inverse - first_key[block]
    nbuf = -(-footprint // buffer_inputs)
    block_buffers = np.concatenate([[0], np.cumsum(nbuf)]).astype(np.int64)
    buffers = int(block_buffers[-1])
    buf_local = rank // buffer_inputs
    buf = block_buffers[block] + buf_local
    if indices.size:
        same_col = col[1:] == col[:-1]
        if (same_col & (buf[1:] < buf[:-1])).any():
            j = int(col[1:][same_col & (buf[1:] < buf[:-1])][0])
            raise ValueError(f"output {j}'s inputs are not in ascending order across buffers of {buffer_inputs}: "
                             "its sum would change order")
    # map: each buffer's inputs (the footprint cut every buffer_inputs)
    key_rank = np.arange(keys.size, dtype=np.int64) - first_key[key_block]
    key_buf = block_buffers[key_block] + key_rank // buffer_inputs
    map_ptr = np.concatenate([[0], np.cumsum(np.bincount(key_buf, minlength=buffers))]).astype(np.int64)
    in_map = (keys % n_in).astype(np.int32)
    # slot of each entry: its place among its column's entries in the same buffer (they are consecutive)
    group = col * max(buffers, 1) + buf
    starts = np.flatnonzero(np.concatenate([[True], group[1:] != group[:-1]])) if indices.size else np.empty(0, int)
    group_start = np.repeat(starts, np.diff(np.concatenate([starts, [indices.size]])))
    slot = np.arange(indices.size, dtype=np.int64) - group_start
    warp = (col % threads) // ELL_WARP
    lane = col % ELL_WARP
    cell = buf * warps + warp  # (buffer, warp)
    warp_slots = np.zeros(buffers * warps, dtype=np.int64)
    if indices.size:
        np.maximum.at(warp_slots, cell, slot + 1)
    warp_ptr = np.concatenate([[0], np.cumsum(warp_slots)]).astype(np.int64)
    total = int(warp_ptr[-1])
    index = np.zeros(total * ELL_WARP, dtype=np.uint16)
    value = np.zeros(total * ELL_WARP, dtype=dtype)
    at = (warp_ptr[cell] + slot) * ELL_WARP + lane
    index[at] = (rank % buffer_inputs).astype(np.uint16)
    value[at] = data
    return EllLayer(n_in, n_out, threads, buffer_inputs, block_buffers, map_ptr, in_map, warp_ptr, index, value,
                    int(indices.size))


def ell_compact_numpy(alive: np.ndarray, count: int, src: np.ndarray, ids: np.ndarray):
    """The compaction kernel's work after a layer: ``(src_next, ids_next, count_next)``.

    Slot ``s < count`` of the layer's output came from slot ``src[s]`` of its input, so its id is
    ``ids[src[s]]``; the next layer reads the alive slots, ascending (the CPU loop's order of survivors).
    ``alive`` is cleared for the next layer, as the kernel does.
    """
    ids_next = ids[src[:count]]
    src_next = np.flatnonzero(alive[:count]).astype(np.int32)
    alive[:count] = 0
    return src_next, ids_next, int(src_next.size)


def ell_step_numpy(layer: EllLayer, act: np.ndarray, src: np.ndarray, count: int, bias: float, ymax: float,
                   out: np.ndarray, alive: np.ndarray) -> None:
    """The ELL layer kernel's work: output slot ``s < count`` (image ``act[:, src[s]]``) of every output neuron
    written to ``out[:, s]``, ``alive[s]`` set where nonzero.

    Each (output, image) sum sees the kernel's sequence: the buffers of its block in order, its warp's slots in
    order (padding included), one separately rounded multiply and add each (NumPy's element-wise operations
    round as the kernel's ``__fmul_rn`` and ``__fadd_rn``). Which images share a block's minibatch changes no
    sum, so every slot's image is computed at once here.
    """
    T = act.dtype.type
    warps = layer.threads // ELL_WARP
    slots = np.arange(count)
    images = src[:count]
    for b in range(layer.blocks):
        acc = np.zeros((layer.threads, count), dtype=act.dtype)
        for g in range(layer.block_buffers[b], layer.block_buffers[b + 1]):
            staged = act[layer.map[layer.map_ptr[g]:layer.map_ptr[g + 1]]][:, images]  # the shared buffer
            for w in range(warps):
                lanes = slice(w * ELL_WARP, (w + 1) * ELL_WARP)
                for m in range(layer.warp_ptr[g * warps + w], layer.warp_ptr[g * warps + w + 1]):
                    at = slice(m * ELL_WARP, (m + 1) * ELL_WARP)
                    acc[lanes] = acc[lanes] + staged[layer.index[at].astype(np.int64)] * layer.value[at][:, None]
        j = np.arange(b * layer.threads, min((b + 1) * layer.threads, layer.n_out))
        v = acc[: j.size]
        v = np.where(v != 0, np.minimum(np.maximum(v + T(bias), T(0)), T(ymax)), v)
        out[np.ix_(j, slots)] = v
        alive[slots[(v != 0).any(axis=0)]] = 1


def ell_loop_numpy(yt: np.ndarray, layers: Iterable[EllLayer], bias: float, ymax: float, ids: np.ndarray):
    """The whole-chunk ELL loop (:class:`dasknn.kernels.gpu_ell.EllLoop`) modelled in NumPy: slots that
    follow the alive images, a compaction every layer, the survivors gathered once at the end. Returns
    ``(yt, ids, counts)``, ``counts[l]`` the images alive into layer ``l + 1``."""
    cap = yt.shape[1]
    act = np.ascontiguousarray(yt)
    src = np.arange(cap, dtype=np.int32)
    ids = np.asarray(ids)
    alive = np.zeros(cap, dtype=np.int32)
    counts = [cap]
    for layer in layers:
        out = np.full((layer.n_out, cap), np.nan, dtype=act.dtype)  # slots past the count stay unwritten
        ell_step_numpy(layer, act, src, counts[-1], bias, ymax, out, alive)
        src, ids, count = ell_compact_numpy(alive, counts[-1], src, ids)
        counts.append(count)
        act = out
    keep = src[: counts[-1]]
    return np.ascontiguousarray(act[:, keep]), ids[keep], counts
