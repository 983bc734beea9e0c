"""Which part owns each neuron: a partition resolved from a method name, a file or an array."""

from __future__ import annotations

import os
import time

import numpy as np

from ..errors import DasknnError
from ..store import open_store


def resolve_partition(store_path: str, partition, parts: int, seed: int = 0, client=None) -> np.ndarray:
    """An owners array for ``parts`` parts: a method name (computed once, on ``client``'s cluster where one is
    given, then kept in the store), a ``.npy`` file, or an array."""
    return partition_owners(store_path, partition, parts, seed, client)[0]


def partition_owners(store_path: str, partition, parts: int, seed: int = 0, client=None) -> tuple[np.ndarray, float]:
    """:func:`resolve_partition`, and the seconds spent computing the partition (0 when one was given or stored).

    With ``client``, a partition not stored yet is computed on a worker of its cluster
    (:func:`~dasknn.partition.cluster.partition_on_cluster`: the worker reads the layers, the client gets the
    owners only). A computed partition is kept in the store for the next run where the store is writable.
    """
    from .. import partition as part_mod
    from ..partition.cluster import partition_on_cluster
    from ..store import partition_name, save_partition

    store = open_store(store_path, check="metadata")
    owners = stored_partition(store_path, partition, parts, seed)
    seconds = 0.0
    if owners is None:
        t0 = time.perf_counter()
        if client is None:
            layers = store.partition_layers()
            owners = part_mod.partition_network(layers, parts, str(partition), seed=seed)
            seconds = time.perf_counter() - t0
            report = part_mod.partition_report(layers, owners, str(partition), seconds)
        else:
            owners, report = partition_on_cluster(client, store_path, parts, str(partition), seed=seed)
            seconds = time.perf_counter() - t0
        if os.access(store_path, os.W_OK):
            save_partition(store_path, partition_name(str(partition), parts, seed), owners, report)
    return check_partition(owners, store.depth, store.neurons, parts), seconds


def stored_partition(store_path: str, partition, parts: int, seed: int = 0) -> np.ndarray | None:
    """The owners ``partition`` names without computing anything: the array, the ``.npy`` file, or the partition of
    that method kept in the store; None where the method's partition has not been computed yet."""
    from ..store import load_partition, partition_name

    if isinstance(partition, np.ndarray):
        return partition
    if isinstance(partition, (str, os.PathLike)) and str(partition).endswith(".npy"):
        try:
            return np.load(partition, allow_pickle=False)
        except (OSError, ValueError) as e:
            raise DasknnError(f"cannot read the partition ({e})", partition) from None
    saved = load_partition(store_path, partition_name(str(partition), parts, seed))
    return None if saved is None else saved[0]


def kept_report(store_path: str, owners: np.ndarray, parts: int) -> dict:
    """The report of a partition kept in the store whose owners equal ``owners`` (its volumes, counted as it was
    computed), or ``{}`` where none does: an array given may be one loaded from the store."""
    from ..store import load_partition, stored_partitions

    for kept in stored_partitions(open_store(store_path, check="metadata").root):
        if kept["parts"] == parts:
            saved = load_partition(store_path, kept["name"])
            if saved is not None and np.array_equal(saved[0], owners):
                return saved[1]
    return {}


def check_partition(owners, depth: int, neurons: int, parts: int) -> np.ndarray:
    """``owners`` as ``int32`` where it fits a network of ``depth`` layers x ``neurons`` neurons in ``parts`` parts;
    otherwise one line naming what differs."""
    from .. import partition as part_mod

    a = np.asarray(owners)
    if a.ndim == 2 and a.dtype.kind in "iu":
        differ = [f"{what} {have} where the network has {want}"
                  for what, have, want in (("layers", a.shape[0] - 1, depth), ("neurons", a.shape[1], neurons))
                  if have != want]
        if differ:
            raise DasknnError(f"the partition's shape {a.shape[0]} x {a.shape[1]} does not match the network: it has "
                              f"{' and '.join(differ)}; partition this network again")
    a = part_mod.validate_partition(a, depth, neurons)
    if int(a.max()) + 1 != parts:
        raise DasknnError(f"the partition has {int(a.max()) + 1} parts but each group has {parts} workers; "
                          f"partition with --parts {parts} or change --workers/--group-size")
    return a
