"""The example notebooks run end to end on a real kernel, in a fresh MLMS_HOME per run (the converted models are
shared), say what they should (cells found by their tags, not their position), and print nothing but mlms-nb's
own output: no stderr stream and no warning in any cell, except those listed in `ALLOWED_STDERR` with why."""
from __future__ import annotations

import os
import re
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
    """``name`` executed once per test run, shared by the tests that read it (any pytest-xdist worker): see
    :func:`tests.helpers.once_per_run`; keyed by the notebook's sha256 too."""
    import hashlib

    from tests.helpers import once_per_run

    digest = hashlib.sha256((NOTEBOOKS / name).read_bytes()).hexdigest()[:16]
    return nbformat.reads(once_per_run(f"{digest}-{name}", lambda: nbformat.writes(run_notebook(name))),
                          as_version=4)


#: stderr a notebook may show, each with why (a regex matched against each stderr line)
ALLOWED_STDERR: dict[str, str] = {
    # 08 starts `mlms scheduler` / `mlms agent` processes itself; their log lines are the notebook's subject
    r"^(scheduler|agent) ": "08_agents starts a scheduler and agents and reads their address from their output",
}


def stray_stderr(nb) -> list[str]:
    """Every stderr line or warning output of ``nb`` that is not listed in `ALLOWED_STDERR`, with its cell's tag
    or number."""
    import re

    found = []
    for number, cell in enumerate(c for c in nb.cells if c.cell_type == "code"):
        where = ",".join(cell.get("metadata", {}).get("tags", [])) or f"code cell {number}"
        for out in cell.get("outputs", []):
            lines = []
            if out.get("output_type") == "stream" and out.get("name") == "stderr":  # warnings print here too
                lines = out.get("text", "").splitlines()
            found += [f"{where}: {line}" for line in lines
                      if line.strip() and not any(re.search(rx, line) for rx in ALLOWED_STDERR)]
    return found


def cell(nb, tag: str):
    """The code cell tagged ``tag``."""
    tagged = [c for c in nb.cells if tag in c.get("metadata", {}).get("tags", [])]
    assert len(tagged) == 1, f"{len(tagged)} cells tagged {tag!r}"
    return tagged[0]


@pytest.fixture
def fresh_home(shared_home, monkeypatch):
    """A new MLMS_HOME for this notebook: emptied of history, logs and caches, with the session's converted models
    linked in. One per test run and pytest worker, beside the run's own home (a converted copy, the INT8 model
    included, records its files relative to the home, so the link to this run's artifacts is all it needs)."""
    import shutil

    home = shared_home.parent / f"{shared_home.name}-notebooks-{os.environ.get('PYTEST_XDIST_WORKER', 'main')}"
    if home.exists():
        for entry in home.iterdir():
            if entry.name != "artifacts":
                shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()
    home.mkdir(parents=True, exist_ok=True)
    (shared_home / "artifacts").mkdir(parents=True, exist_ok=True)
    if not (home / "artifacts").is_symlink():
        (home / "artifacts").symlink_to(shared_home / "artifacts", target_is_directory=True)
    monkeypatch.setenv("MLMS_HOME", str(home))
    # the link resolves outside this home: allow the shared artifacts as a manifest's files may come from there
    allowed = [p for p in os.environ.get("MLMS_ALLOW_PATHS", "").split(os.pathsep) if p]
    monkeypatch.setenv("MLMS_ALLOW_PATHS", os.pathsep.join([*allowed, str((shared_home / "artifacts").resolve())]))
    return home


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
def test_01_models(fresh_home):
    nb = run_notebook("01_models.ipynb")
    assert stray_stderr(nb) == []
    assert "efficientnet_lite0" in text_of(cell(nb, "models"))
    assert "20 photos -> input batch (20, 3, 224, 224) float32" in text_of(cell(nb, "batch"))
    assert "top-1" in text_of(cell(nb, "top1"))
    comparison = text_of(cell(nb, "agreement"))
    assert comparison.count("True") >= 4 and "False" not in comparison


@pytest.mark.slow
def test_02_evaluate(fresh_home):
    nb = run_notebook("02_evaluate.ipynb")
    assert stray_stderr(nb) == []
    summary = text_of(cell(nb, "summary"))
    for fw in ("torch", "onnxruntime", "tensorflow"):
        assert fw in summary
    assert any(o.get("data", {}).get("image/png") for o in cell(nb, "plot").outputs)  # the plot rendered
    assert "efficientnet_lite0" in text_of(cell(nb, "history"))  # the history listing


@pytest.mark.slow
def test_03_tracing(fresh_home):
    nb = run_notebook("03_tracing.ipynb")
    assert stray_stderr(nb) == []
    overhead = text_of(cell(nb, "evaluate"))
    assert "torch" in overhead and "onnxruntime" in overhead and "overhead (%)" not in overhead  # read against noise
    assert any(reading in overhead for reading in ("within noise (±", "% (±", "none: traced"))
    levels = text_of(cell(nb, "levels"))
    for needle in ("APPLICATION", "MODEL", "FRAMEWORK", "ML_LIBRARY", "layer", "op"):
        assert needle in levels
    assert "aten::" in text_of(cell(nb, "ops"))  # ops of one layer
    both = text_of(cell(nb, "both"))
    # ONNX Runtime fuses Conv+BatchNorm+Clip into one node named after the activation module: 35 shared names
    assert int(both.split(" layers traced in both frameworks")[0].split()[-1]) >= 30
    assert "perf" in text_of(cell(nb, "hardware")) and "psutil" in text_of(cell(nb, "hardware"))  # reasons and counters
    assert "True" in text_of(cell(nb, "chrome"))  # the Chrome trace came back equal
    assert "APPLICATION" in text_of(cell(nb, "cell-trace")) and "layer" in text_of(cell(nb, "cell-trace"))


@pytest.mark.slow
def test_05_divergence(fresh_home):
    nb = run_notebook("05_divergence.ipynb")
    assert stray_stderr(nb) == []
    assert "torch~onnxruntime-int8" in text_of(cell(nb, "first-divergent")) and "'_swish'" in text_of(cell(nb, "first-divergent"))
    # the INT8 copy's worst elements are far off while top-1 agrees: said, and said not to be a misalignment
    summary = text_of(cell(nb, "divergence"))
    assert "Warnings:" in summary and "not a misalignment" in summary and "contradict" not in summary
    assert "rms rel error" in text_of(cell(nb, "int8-layers")).lower()
    assert "top1 delta" in text_of(cell(nb, "accuracy"))
    assert any(o.get("data", {}).get("image/png") for o in cell(nb, "plot").outputs)


@pytest.mark.slow
def test_06_timeline(fresh_home):
    nb = run_notebook("06_timeline.ipynb")
    assert stray_stderr(nb) == []
    assert "ML_LIBRARY=" in text_of(cell(nb, "trace"))                                   # the trace
    assert "FRAMEWORK" in text_of(cell(nb, "tracks"))                                     # the tracks table
    assert "(raw)" in text_of(cell(nb, "levels"))                                         # the levels table
    assert any('class="mlms-bokeh"' in o.get("data", {}).get("text/html", "") for o in cell(nb, "figure").outputs)
    assert "works offline" in text_of(cell(nb, "page"))
    assert any(o.get("data", {}).get("image/png") for o in cell(nb, "static").outputs)   # the static figure


@pytest.mark.slow  # ~15 s CPU: a kernel importing torch, ONNX Runtime and TensorFlow; the model work is 32 px, 4 photos
def test_07_bring_your_own_model(fresh_home):
    nb = run_notebook("07_bring_your_own_model.ipynb")
    assert stray_stderr(nb) == []
    fitted = re.search(r"top-1 (\d+)% on the 20 photos", text_of(cell(nb, "fit")))
    assert fitted and int(fitted.group(1)) >= 90  # fitted to its own labelled photos in a few seconds
    evaluated = text_of(cell(nb, "refused"))
    assert "refused: " in evaluated and "it was not run: trust it with" in evaluated
    # accuracy measured on the photos' own 10 classes in every framework: no n/a, no label-space warning
    assert evaluated.count("cifar10 (20 inputs)") >= 3 and "n/a" not in evaluated and "(0 inputs)" not in evaluated
    assert "same top-1 everywhere: True" in text_of(cell(nb, "top1"))
    layers = text_of(cell(nb, "layer-spans"))
    for fw in ("torch", "onnxruntime", "tensorflow"):
        assert int(layers.split(f"{fw}: ")[1].split()[0]) >= 5  # layer spans of a FRAMEWORK trace
    # ONNX Runtime's nodes by the model's names: the fused conv is dw (not act), the node it inserted says so
    assert re.search(r"\bdw\s+Conv\+Clip\b", layers) and "ReorderOutput (inserted by onnxruntime)" in layers
    assert "'torch~onnxruntime': None, 'torch~tensorflow': None, 'onnxruntime~tensorflow': None" in text_of(cell(nb, "divergence"))


@pytest.mark.slow  # a scheduler and two agents start (~3 s CPU each); each agent loads efficientnet_lite0 in torch
def test_08_agents(fresh_home):
    pytest.importorskip("distributed", reason="agents need Dask distributed: pip install -e '.[distributed]'")
    nb = run_notebook("08_agents.ipynb")
    assert stray_stderr(nb) == []
    assert "scheduler at tcp://127.0.0.1:" in text_of(cell(nb, "start"))
    listing = text_of(cell(nb, "agents"))
    assert "one-thread" in listing and "two-threads" in listing
    runs = text_of(cell(nb, "runs"))
    assert "one-thread | on mlms agent one-thread" in runs and "threads: 2" in runs
    assert "identical top-1 on both agents: True" in text_of(cell(nb, "same"))
    assert any(o.get("data", {}).get("image/png") for o in cell(nb, "across").outputs) and "latency ratio" in text_of(cell(nb, "across"))
    assert "p value" in text_of(cell(nb, "compare"))
    assert text_of(cell(nb, "history")).count(" at tcp://127.0.0.1:") >= 2  # the history's agent column
    assert "stopped" in text_of(cell(nb, "stop"))


@pytest.mark.slow  # a kernel importing torch and transformers, then four short generate runs of a 2-layer decoder
def test_09_language_models(fresh_home):
    nb = run_notebook("09_language_models.ipynb")
    assert stray_stderr(nb) == []
    evaluated = text_of(cell(nb, "evaluate"))
    assert "TTFT median (ms)" in evaluated and "Greedy agreement" in evaluated
    assert "goodput" in text_of(cell(nb, "server"))
    assert "prefill" in text_of(cell(nb, "trace")) and "decode" in text_of(cell(nb, "trace"))
    roof = text_of(cell(nb, "phase-roofline"))  # the phases' bounds: decode one token per step, memory-bound
    assert re.search(r"decode\s+memory", roof) and "prefill" in roof
    assert "image/png" in cell(nb, "phase-roofline-plot")["outputs"][0]["data"]
    assert "timeline_phase_decode" in text_of(cell(nb, "timeline"))
