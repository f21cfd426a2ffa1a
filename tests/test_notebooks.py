"""The example notebooks run end to end on a real kernel, and say what they should."""
from __future__ import annotations

import os
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = Path(__file__).resolve().parent.parent / "example_notebooks"


def run_notebook(name: str) -> nbformat.NotebookNode:
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOKS)}}).execute()
    return nb


def run_notebook_once(name: str) -> nbformat.NotebookNode:
    """``name`` executed once per test run, shared by the tests that read it (any pytest-xdist worker): the first
    caller executes it under a file lock and keeps it in this run's folder; the others wait and read that copy.
    Keyed by the run (PYTEST_XDIST_TESTRUNUID, else this process), so a later run never sees an old result."""
    import fcntl
    import hashlib
    import tempfile

    run = os.environ.get("PYTEST_XDIST_TESTRUNUID") or f"pid{os.getpid()}"
    digest = hashlib.sha256((NOTEBOOKS / name).read_bytes()).hexdigest()[:16]
    folder = Path(tempfile.gettempdir()) / f"mlms-nb-tests-{run}"
    folder.mkdir(exist_ok=True)
    done = folder / f"{digest}-{name}"
    with open(folder / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            nb = run_notebook(name)
            nbformat.write(nb, str(done) + ".part")
            os.replace(str(done) + ".part", done)
    return nbformat.read(done, as_version=4)


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


@pytest.mark.slow
def test_03_tracing(shared_home):
    nb = run_notebook("03_tracing.ipynb")
    code = [c for c in nb.cells if c.cell_type == "code"]
    overhead = text_of(code[0])
    assert "torch" in overhead and "onnxruntime" in overhead and "overhead_pct" in overhead
    levels = text_of(code[1])
    for needle in ("APPLICATION", "MODEL", "FRAMEWORK", "ML_LIBRARY", "layer", "op"):
        assert needle in levels
    assert "aten::" in text_of(code[4])  # ops of one layer
    both = text_of(code[5])
    # ONNX Runtime fuses Conv+BatchNorm+Clip into one node named after the activation module: 35 shared names
    assert int(both.split(" layers traced in both frameworks")[0].split()[-1]) >= 30
    assert "perf" in text_of(code[6]) and "psutil" in text_of(code[6])  # reasons and counters
    assert "True" in text_of(code[7])  # the Chrome trace came back equal
    assert "APPLICATION" in text_of(code[-1]) and "layer" in text_of(code[-1])


@pytest.mark.slow
def test_05_divergence(shared_home):
    nb = run_notebook("05_divergence.ipynb")
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert "torch~onnxruntime-int8" in text_of(code[1]) and "'_swish'" in text_of(code[1])
    assert "top1_delta" in text_of(code[3])
    assert any(o.get("data", {}).get("image/png") for o in code[-1].outputs)


@pytest.mark.slow
def test_06_timeline(shared_home):
    nb = run_notebook("06_timeline.ipynb")
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert "ML_LIBRARY=" in text_of(code[0])                                   # the trace
    assert "FRAMEWORK" in text_of(code[1])                                     # the tracks table
    assert "(raw)" in text_of(code[2])                                         # the levels table
    assert any('class="mlms-bokeh"' in o.get("data", {}).get("text/html", "") for o in code[3].outputs)
    assert "works offline" in text_of(code[4])
    assert any(o.get("data", {}).get("image/png") for o in code[5].outputs)   # the static figure


@pytest.mark.slow  # ~15 s CPU: a kernel importing torch, ONNX Runtime and TensorFlow; the model work is 32 px, 4 photos
def test_07_bring_your_own_model(shared_home):
    nb = run_notebook("07_bring_your_own_model.ipynb")
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert "refused: " in text_of(code[2]) and "it was not run: trust it with" in text_of(code[2])
    assert "same top-1 everywhere: True" in text_of(code[3])
    for fw in ("torch", "onnxruntime", "tensorflow"):
        assert int(text_of(code[4]).split(f"{fw}: ")[1].split()[0]) >= 5  # layer spans of a FRAMEWORK trace
    assert "'torch~onnxruntime': None, 'torch~tensorflow': None, 'onnxruntime~tensorflow': None" in text_of(code[5])


@pytest.mark.slow  # a scheduler and two agents start (~3 s CPU each); each agent loads efficientnet_lite0 in torch
def test_08_agents(shared_home):
    pytest.importorskip("distributed", reason="agents need Dask distributed: pip install -e '.[distributed]'")
    nb = run_notebook("08_agents.ipynb")
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert "scheduler at tcp://127.0.0.1:" in text_of(code[0])
    listing = text_of(code[1])
    assert "one-thread" in listing and "two-threads" in listing
    runs = text_of(code[2])
    assert "one-thread | on mlms agent one-thread" in runs and "threads: 2" in runs
    assert "identical top-1 on both agents: True" in text_of(code[3])
    assert any(o.get("data", {}).get("image/png") for o in code[4].outputs) and "latency_ratio" in text_of(code[4])
    assert "p_value" in text_of(code[5])
    assert text_of(code[6]).count(" at tcp://127.0.0.1:") >= 2  # the history's agent column
    assert "stopped" in text_of(code[-1])


@pytest.mark.slow  # a kernel importing torch and transformers, then four short generate runs of a 2-layer decoder
def test_09_language_models(shared_home):
    nb = run_notebook("09_language_models.ipynb")
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert "TTFT median (ms)" in text_of(code[0]) and "Greedy agreement" in text_of(code[0])
    assert "goodput_fraction" in text_of(code[4])
    assert "prefill" in text_of(code[5]) and "decode" in text_of(code[5])
