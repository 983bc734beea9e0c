"""Which part owns each neuron: a partition resolved from a method name, a file or an array."""

from __future__ import annotations

import os
import time

import numpy as np

from ..errors import DasknnError
from ..store import open_store


def resolve_partition(store_path: str, partition, parts: int, seed: int = 0) -> np.ndarray:
    """An owners array for ``parts`` parts: a method name (computed once, then kept in the store), a ``.npy``
    file, or an array."""
    from .. import partition as part_mod
    from ..store import load_partition, partition_name, save_partition

    store = open_store(store_path, check="metadata")
    if isinstance(partition, np.ndarray):
        owners = partition
    elif isinstance(partition, (str, os.PathLike)) and str(partition).endswith(".npy"):
        try:
            owners = np.load(partition, allow_pickle=False)
        except (OSError, ValueError) as e:
            raise DasknnError(f"cannot read the partition ({e})", partition) from None
    else:
        name = partition_name(str(partition), parts, seed)
        saved = load_partition(store_path, name)
        if saved is not None:
            owners = saved[0]
        else:
            t0 = time.perf_counter()
            layers = store.partition_layers()
            owners = part_mod.partition_network(layers, parts, str(partition), seed=seed)
            report = part_mod.partition_report(layers, owners, str(partition), time.perf_counter() - t0)
            if os.access(store_path, os.W_OK):
                save_partition(store_path, name, owners, report)
    owners = part_mod.validate_partition(owners, store.depth, store.neurons)
    if int(owners.max()) + 1 != parts:
        raise DasknnError(f"the partition has {int(owners.max()) + 1} parts but each group has {parts} workers; "
                          f"partition with --parts {parts} or change --workers/--group-size")
    return owners
