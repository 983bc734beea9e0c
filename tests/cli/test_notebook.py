"""examples/notebook.ipynb runs top to bottom in a real kernel (nbclient) and shows what it says it shows."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

NOTEBOOK = Path(__file__).resolve().parents[2] / "examples" / "notebook.ipynb"


@pytest.mark.slow
def test_notebook_runs_top_to_bottom(tmp_path, monkeypatch):
    nbformat = pytest.importorskip("nbformat", reason="nbformat is not installed (pip install 'dasknn[test]')")
    nbclient = pytest.importorskip("nbclient", reason="nbclient is not installed (pip install 'dasknn[test]')")
    pytest.importorskip("ipykernel", reason="ipykernel is not installed (pip install 'dasknn[test]')")
    monkeypatch.setenv("JUPYTER_PLATFORM_DIRS", "1")  # jupyter_core warns about its old paths otherwise
    # the kernel imports this checkout's dasknn, whatever is installed
    root = str(NOTEBOOK.parents[1])
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    # its working folder under this test's (the notebook removes it at its end; one that fails midway leaves it here)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbclient.NotebookClient(nb, timeout=180, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}}).execute()

    def text(cell) -> str:
        out = []
        for o in cell.get("outputs", []):
            out.append(o.get("text", ""))
            out.append(o.get("data", {}).get("text/plain", ""))
        return "".join(out)

    code = [c for c in nb.cells if c.cell_type == "code"]
    everything = "\n".join(text(c) for c in code)
    assert not [o for c in code for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert "dashboard: http://127.0.0.1:" in everything
    assert "matches the truth" in everything and "DIFFERS" not in everything
    for method in ("hypergraph", "block", "random"):
        assert f"{method}:" in everything
    assert "'steps': 6" in everything  # the training cell ran its 6 steps
    pictures = sum("image/png" in o.get("data", {}) for c in code for o in c.get("outputs", []))
    assert pictures == 3, "volume per layer; time per layer and surviving images; training loss"
    assert not list(tmp_path.glob("dasknn-notebook-*")), "the notebook's last cell removes its working folder"
