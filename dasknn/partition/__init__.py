"""Who owns which neuron: partitioning a sparse network across workers, and what a partition costs.

Every neuron of every layer, the input pixels included, has one owner (a *part*). A partition is an ``int32``
array ``owners`` of shape ``(layers + 1, neurons)``: row 0 owns the input pixels, row ``k`` owns the outputs of
layer ``k``.

Computing output ``j`` of layer ``k`` (column ``j`` of ``W_k``) needs every input ``i`` with ``W_k[i, j] != 0``.
The value of input ``i`` is sent by its owner to every *other* part that owns such a ``j``, so the
communication volume of layer ``k`` is ``sum_i (lambda_i - 1)``, where ``lambda_i`` is the number of distinct
parts in ``{owners[k-1, i]} | {owners[k, j] : W_k[i, j] != 0}``. That is the connectivity-1 metric of a
hypergraph with one net per (layer, input neuron). The work of a part in layer ``k`` is the number of
nonzeros in the columns it owns; a partition is balanced when, in every layer,
``max_part_work / mean_part_work - 1 <= epsilon``.

Methods
-------
``block``
    Contiguous index ranges, the same for every row of ``owners`` (what a naive split does).
``random``
    A seeded random balanced assignment, independent per row (the no-locality baseline).
``hypergraph-shared``
    One owner per neuron *index*, shared by all rows; Mt-KaHyPar minimises connectivity-1 over the nets of
    all layers at once (``N`` vertices, one net ``{i} | row_i(W_k)`` per layer and input). Each layer is
    balanced exactly when every layer's columns have the same nonzero count (the challenge networks); other
    networks are balanced on the summed work only.
``hypergraph-layered``
    Each row gets its own owners: row 1 from the hypergraph of layer 1, then row by row with the previous
    row's owners fixed (Mt-KaHyPar fixed vertices: the nets of layer ``k`` are exactly its volume), then
    refinement sweeps, backward then forward, that re-partition one row with *both* neighbouring rows fixed
    (the exact volume of the two layers it touches) and keep it only if that volume drops. Every row is
    balanced on its own layer's work, whatever the network.
``hypergraph``
    The default: ``hypergraph-layered`` without the sweeps, or ``hypergraph-shared`` where that sends less
    and still balances every layer (both are computed). Its rows are solved on a smaller, equivalent
    hypergraph: the fixed neighbouring rows as one hub vertex per part, twins (outputs on the same nets)
    contracted (:mod:`.twins`), equal nets merged, and Mt-KaHyPar's DEFAULT preset without community
    detection. On the challenge network (1024 x 120) the
    forward pass alone sends 26-31 % less than ``hypergraph-shared`` at K = 4 and 16 (1 % less at K = 64) in
    similar time, because a RadiX-Net layer's locality changes from layer to layer and one owner per index
    cannot follow it, and it keeps every layer balanced on any network, where one shared owner can balance
    only the summed work. The sweeps win a further 0.2-1 % for 1.5-2 times the forward pass's time each
    (see BENCHMARKS.md).
``fast``
    Row 1 by Mt-KaHyPar, then every row by greedy placement and label propagation in Numba with the previous
    row fixed, then one backward sweep refining every row with both neighbours fixed (:mod:`.fast`). Several
    times faster than the layered Mt-KaHyPar pass per layer, but it sends about twice as much on the
    challenge network (see BENCHMARKS.md), so it is not the default.
``fast-segments``
    ``fast`` on four runs of layers partitioned independently (in parallel on a cluster), stitched: each
    run's parts relabelled to agree with the previous run's last row (a maximum-weight matching of parts),
    and the rows around each seam refined (:mod:`.segments`).

Mt-KaHyPar is seeded, but with more than one thread its parallel refinement is not bit-for-bit
deterministic: two runs may differ slightly in volume (never in validity or balance). ``preset="deterministic"``
(Mt-KaHyPar's deterministic preset) gives the same owners on every run, at some cost in time.

The package's modules: ``metrics`` (checks and costs), ``simple`` (baselines, balance), ``hypergraph``
(Mt-KaHyPar methods), ``twins`` and ``mtk_presets`` (what makes the default's rows small), ``fast`` and ``segments`` (the Numba method and stitching), ``methods`` (the entry
point) and ``plot``.
"""

from .hypergraph import PRESETS
from .methods import METHODS, partition_network
from .metrics import (
    check_partition_arguments,
    layer_imbalance,
    layer_volumes,
    part_sends,
    part_work,
    partition_report,
    validate_partition,
)
from .plot import draw_volumes, plot_partition

__all__ = [
    "METHODS",
    "PRESETS",
    "check_partition_arguments",
    "draw_volumes",
    "layer_imbalance",
    "layer_volumes",
    "part_sends",
    "part_work",
    "partition_network",
    "partition_report",
    "plot_partition",
    "validate_partition",
]
