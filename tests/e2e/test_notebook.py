"""CI executes the analysis notebook (notebooks/journal_index.ipynb) against a hand-built
workspace, with a real Jupyter kernel (nbclient + ipykernel)."""

from __future__ import annotations

import os

from tests.conftest import REPO, need
from tests.helpers.index_ledger import build

NOTEBOOK = REPO / "notebooks" / "journal_index.ipynb"


def _outputs(nb) -> str:
    out = []
    for cell in nb.cells:
        for o in cell.get("outputs", []):
            out.append(o.get("text", ""))
            for k, v in o.get("data", {}).items():
                out.append(f"{k}: {v}")
    return "\n".join(out)


def test_notebook_runs_on_a_workspace(workspace, monkeypatch):
    try:
        import nbformat
        from nbclient import NotebookClient
    except ImportError:
        need(False, "nbclient and nbformat (dev extra)")
    build(workspace)
    workspace.close()  # the kernel opens the workspace itself
    monkeypatch.setenv("FORGE_HOME", str(workspace.home))
    monkeypatch.setenv("PYTHONPATH", str(REPO.parent) + os.pathsep
                       + os.environ.get("PYTHONPATH", ""))
    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = NotebookClient(nb, timeout=180, kernel_name="python3",
                            resources={"metadata": {"path": str(REPO)}})
    client.execute()
    out = _outputs(nb)
    assert "image/svg+xml" in out and "plotted 7 points in 4 runtime profiles" in out
    # The answers, from the hand-built ledger: best throughput per model/accelerator ...
    assert "qwen-h20@1" in out and "1100.0" in out and "2200.0" in out
    # ... the rejected DeepGEMM direction and the gate that decided it ...
    assert "DeepGEMM MoE path broke the outputs on H20" in out and "correctness" in out
    # ... and the profile comparison.
    assert "output_throughput" in out and "delta" in out
