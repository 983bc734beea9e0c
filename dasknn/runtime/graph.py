"""Task graphs pinned to workers, references between their tasks, the one Dask span, a values-only tree sum."""

from __future__ import annotations

import uuid

#: One Dask span for every graph this process submits. Without it each submission opens a span of its own,
#: and every worker keeps its fine-grained metrics per span for ever (``Server.digests_total``): a long-lived
#: cluster running many inferences would grow by about 50 KB per run.
SPAN = {"name": ("dasknn",), "ids": (f"dasknn-{uuid.uuid4()}",)}


class PinnedGraph:
    """A task graph whose keys are pinned to workers: one HighLevelGraph layer per worker.

    Parameters
    ----------
    run
        Suffix of every key (``{name}-{run}``), so the graphs of different runs never share a key.
    """

    def __init__(self, run: str):
        self.run = run
        self.by_worker: dict[str, dict] = {}

    def add(self, worker: str, name: str, task: tuple) -> str:
        """Add ``task`` (a Dask task tuple) as ``{name}-{run}``, to run on ``worker`` only; return its key."""
        key = f"{name}-{self.run}"
        self.by_worker.setdefault(worker, {})[key] = task
        return key

    def __len__(self) -> int:
        return sum(len(d) for d in self.by_worker.values())

    def submit(self, client, keys: list[str]) -> list:
        """Submit the graph to ``client`` and return the futures of ``keys``, in order."""
        from dask.highlevelgraph import HighLevelGraph, MaterializedLayer

        layers = {f"w{i}-{self.run}": MaterializedLayer(d, annotations={"workers": [w], "allow_other_workers": False,
                                                                         "span": SPAN})
                  for i, (w, d) in enumerate(self.by_worker.items())}
        deps = {name: set(layers) - {name} for name in layers}
        return client.get(HighLevelGraph(layers, deps), keys, sync=False)


def ref(key: str):
    """A task argument that stands for the result of the task ``key``."""
    from dask._task_spec import TaskRef

    return TaskRef(key)


def refs(keys: list[str]):
    """A list argument whose items are the results of the tasks ``keys``."""
    from dask._task_spec import List, TaskRef

    return List(*(TaskRef(k) for k in keys))


def refs_of(args: list):
    """A list argument of ``args`` (task references among them are replaced by their tasks' results)."""
    from dask._task_spec import List

    return List(*args)


def add(a, b):
    """``a + b``: one step of :func:`tree_sum`."""
    return a + b


def tree_sum(graph: PinnedGraph, keys: list[str], where: list[str], name: str) -> str:
    """Sum the values of ``keys`` (held on workers ``where``) by a binary tree of pinned tasks.

    Only the values travel, never the tasks' other state. Returns the root's key (``keys[0]`` when there is one).
    """
    keys, where = list(keys), list(where)
    level = 0
    while len(keys) > 1:
        nk, nw = [], []
        for i in range(0, len(keys), 2):
            if i + 1 < len(keys):
                nk.append(graph.add(where[i], f"{name}-sum{level}-{i}", (add, ref(keys[i]), ref(keys[i + 1]))))
            else:
                nk.append(keys[i])
            nw.append(where[i])
        keys, where, level = nk, nw, level + 1
    return keys[0]


def pairwise_sum(values: list):
    """The sum of ``values`` in the order :func:`tree_sum` adds them (pairs, then pairs of pairs): where the values
    are summed in one place, the result is the tree's to the last bit."""
    values = list(values)
    while len(values) > 1:
        values = [add(values[i], values[i + 1]) if i + 1 < len(values) else values[i]
                  for i in range(0, len(values), 2)]
    return values[0]
