"""The example notebooks run end to end on a real kernel, and say what they should."""
from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = Path(__file__).resolve().parent.parent / "example_notebooks"


def run_notebook(name: str) -> nbformat.NotebookNode:
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOKS)}}).execute()
    return nb


def text_of(cell) -> str:
    parts = []
    for out in cell.get("outputs", []):
        if "text" in out:
            parts.append(out["text"])
        data = out.get("data", {})
        parts.append(data.get("text/plain", ""))
        parts.append(data.get("text/html", ""))
    return "\n".join(parts)


@pytest.mark.slow
def test_01_models(shared_home):
    nb = run_notebook("01_models.ipynb")
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert "efficientnet_lite0" in text_of(code[0])
    assert "20 photos -> input batch (20, 3, 224, 224) float32" in text_of(code[2])
    assert "top-1" in text_of(code[3])
    comparison = text_of(code[4])
    assert comparison.count("True") >= 4 and "False" not in comparison


@pytest.mark.slow
def test_02_evaluate(shared_home):
    nb = run_notebook("02_evaluate.ipynb")
    code = [c for c in nb.cells if c.cell_type == "code"]
    summary = text_of(code[2])
    for fw in ("torch", "onnxruntime", "tensorflow"):
        assert fw in summary
    assert any(o.get("data", {}).get("image/png") for o in code[4].outputs)  # the plot rendered
    assert "efficientnet_lite0" in text_of(code[-1])  # the history listing
