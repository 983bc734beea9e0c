"""The house rules a reading of the tree can check: no per-worker state in module globals of the engine or training
(it belongs in the run's object on each worker), and a kernel backend or transport found where the tree says."""

from __future__ import annotations

import importlib
import pkgutil
import types

import pytest

import dasknn

#: Module-level mutable containers allowed in ``engine`` and ``train``: registries (none today).
REGISTRIES: set[tuple[str, str]] = set()
MUTABLE = (dict, list, set, bytearray)


def _modules(package: str) -> list[types.ModuleType]:
    root = importlib.import_module(package)
    names = [package] + [m.name for m in pkgutil.walk_packages(root.__path__, prefix=f"{package}.")
                         if not m.name.endswith("__main__")]  # (those run the command line)
    return [importlib.import_module(name) for name in names]


@pytest.mark.parametrize("package", ["dasknn.engine", "dasknn.train"])
def test_no_module_level_mutable_state(package):
    found = []
    for module in _modules(package):
        for name, value in vars(module).items():
            if name.startswith("__") or (module.__name__, name) in REGISTRIES:
                continue
            if isinstance(value, MUTABLE):
                found.append(f"{module.__name__}.{name}: {type(value).__name__}")
    assert not found, f"per-worker state in module globals (it belongs in a run object): {found}"


def test_the_check_sees_a_global_container(monkeypatch):
    # the test above can fail: a dict put into an engine module is found
    from dasknn.engine import tasks

    monkeypatch.setattr(tasks, "_HELD", {}, raising=False)
    with pytest.raises(AssertionError, match="tasks._HELD: dict"):
        test_no_module_level_mutable_state("dasknn.engine")


def test_every_dasknn_module_imports_without_dask_running():
    # (a module that needs a cluster at import time would fail here)
    assert len(_modules("dasknn")) > 60 and dasknn.__version__
