"""The Zarr layer store: the out-of-core format every later stage reads.

Layout of a store (a Zarr v3 group)::

    STORE.zarr/                     attrs["dasknn"]: format, version, neurons, layers, bias, ymax, edges, source,
                                                     dtype, complete
      layers/1 .. layers/L          one binsparse group per layer: W_k in CSC form
        pointers_to_1  (N+1,) int64    column pointers, chunked by blocks of output neurons
        indices_1      (nnz,) int32    input neuron of each entry
        values         (nnz,) float    weight of each entry
      inputs/                       optional: the images as a binsparse CSR matrix (images x N), chunked by images
        truth          (c,)  int64     optional: 0-based indices of the images the truth says are categories
      partitions/...                written by later stages
      plans/DIGEST/                 part plans (model mode out of core): per layer l{k} and part p{q}, the part's
                                    block (binsparse CSC over the rows it reads) and its exchange lists

Why CSC of the challenge's ``W`` (that is, CSR of ``W^T``, the seed paper's row-wise orientation): everything
output neuron ``j`` needs is one contiguous run of entries, so a block of output neurons, the unit a worker owns,
reads without reading the layer. Every array carries a CRC-32C checksum, so a flipped byte on disk is an error
rather than a wrong answer.

A store is written under a temporary name and renamed into place when complete; the ``complete`` attribute is
set last, so an interrupted write never opens as valid.

One module per kind of thing stored: :mod:`.common` (format constants, codecs, locations, array checks, atomic
replacement), :mod:`.sparse` (a binsparse matrix written and read by blocks), :mod:`.layers` (the network),
:mod:`.inputs` (images and truth), :mod:`.partitions`, :mod:`.plans` (part plans), :mod:`.results` (a run's
chunks), :mod:`.streams` (layers read ahead, out of core) and :mod:`.held` (reads kept in memory as stored, so a
stream read again fetches once). Everything is re-exported here; the chunk sizes
are read from :mod:`.common` when a store is written, so that is where to change them.
"""

from __future__ import annotations

from ..errors import DasknnError
from .common import (
    CHUNK_ENTRIES,
    CHUNK_ROWS,
    FORMAT,
    FULL_CHECK_ENTRIES,
    INPUTS_FORMAT,
    SAFE_CODECS,
    VERSION,
    check_array,
    is_url,
    location,
    replace_atomically,
    store_dtype,
)
from .inputs import Inputs, open_inputs, write_inputs, write_inputs_store
from .layers import NetworkStore, StoreWriter, is_store, open_store, write_network
from .partitions import load_partition, partition_name, save_partition, stored_partitions
from .plans import (
    PLAN_FORMAT,
    PlanStore,
    create_plan_store,
    finish_plan_store,
    open_plan_store,
    plan_digest,
    read_plan_owners,
    resume_plan_store,
    write_plan_layer,
)
from .results import RESULTS_FORMAT, open_results, read_activations, read_results, write_chunk_result
from .streams import LayerStream, PartStream, ReadAhead

__all__ = [
    "CHUNK_ENTRIES",
    "CHUNK_ROWS",
    "FORMAT",
    "FULL_CHECK_ENTRIES",
    "INPUTS_FORMAT",
    "PLAN_FORMAT",
    "RESULTS_FORMAT",
    "SAFE_CODECS",
    "VERSION",
    "DasknnError",
    "Inputs",
    "LayerStream",
    "NetworkStore",
    "PartStream",
    "PlanStore",
    "ReadAhead",
    "StoreWriter",
    "check_array",
    "create_plan_store",
    "finish_plan_store",
    "is_store",
    "is_url",
    "load_partition",
    "location",
    "open_inputs",
    "open_plan_store",
    "open_results",
    "open_store",
    "partition_name",
    "plan_digest",
    "read_activations",
    "read_plan_owners",
    "read_results",
    "replace_atomically",
    "resume_plan_store",
    "save_partition",
    "store_dtype",
    "stored_partitions",
    "write_chunk_result",
    "write_inputs",
    "write_inputs_store",
    "write_network",
    "write_plan_layer",
]
