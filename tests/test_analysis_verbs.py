"""The analyses reachable from the objects, the ``mlms`` command and ``%mlms``: roofline, layers, compare,
timeline on a real traced evaluation; runs named by history id or by notebook variable; bad input as sentences."""
from __future__ import annotations

import json
import re

import numpy as np
import pytest

import mlms_nb
from mlms_nb.api import Analysis
from mlms_nb.cli import main
from mlms_nb.schema.evaluation import TRACE_OVERHEAD


@pytest.fixture(scope="module")
def runs(traced_evaluation, models_home):
    """The PyTorch part of the session's traced evaluation (stored: its id and history rows answer the CLI) and an
    untraced ONNX Runtime run."""
    traced = traced_evaluation.for_framework("torch")
    plain = mlms_nb.evaluate("efficientnet_lite0", framework="onnxruntime", batch_sizes=[1, 2], dataset="synthetic:2",
                             warmup=1, min_repeats=5, min_time_s=0, progress=False)
    return traced, plain


def torch_row(traced_evaluation) -> str:
    """The history row of the traced evaluation's PyTorch part."""
    rows = mlms_nb.history()
    row = rows[(rows["evaluation_id"] == traced_evaluation.id) & (rows["framework"] == "torch")]
    return str(row["id"].iloc[0])


def cli_json(capsys, *argv) -> dict:
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_object_methods_return_analyses(runs):
    traced, _ = runs
    roof = traced.roofline(per="model")
    assert isinstance(roof, Analysis) and set(roof.table["batch_size"]) == {1, 2}
    assert set(roof.table["bound"]) <= {"memory", "compute"} and "ridge" in roof.title
    ceilings = roof.extra["ceilings"].set_index("metric")["value"]
    assert ceilings["ridge_flop_per_byte"] == pytest.approx(
        ceilings["peak_flops_per_s"] / ceilings["bandwidth_bytes_per_s"])
    occurrence = traced.layers("occurrence").table
    assert occurrence.set_index("layer_type").loc["Conv2dStaticSamePadding", "count"] == 49
    assert traced.trace.layers("memory").table["memory_bytes"].notna().any()
    assert TRACE_OVERHEAD.problems(traced.trace_overhead) == [] and len(traced.trace_overhead) == 2
    bundle = traced.batch_scaling()._repr_mimebundle_()
    assert "saturation" in bundle["text/plain"] and "<table" in bundle["text/html"]


def test_cli_roofline_layers_and_timeline_by_history_id(runs, traced_evaluation, shared_home, capsys, tmp_path):
    traced, _ = runs
    data = cli_json(capsys, "roofline", traced.id, "--plot", "none")
    rows = data["rows"]
    bounds = {r["layer_type"]: r["bound"] for r in rows}
    assert set(bounds.values()) == {"memory", "compute", "none"}  # none: layers with no FLOPs (padding)
    assert bounds["ZeroPad2d"] == "none" and bounds["ReLU6"] == "memory"
    conv = next(r for r in rows if r["layer_name"] == "_blocks.1._project_conv" and r["batch_size"] == 1)
    assert conv["intensity_flop_per_byte"] == pytest.approx(conv["flops"] / conv["bytes"])
    row_id = torch_row(traced_evaluation)
    data = cli_json(capsys, "layers", row_id, "--what", "latency", "--by", "type", "--plot", "none")
    assert {"ReLU6", "BatchNorm2d"} <= {r["layer_type"] for r in data["rows"]}
    page = tmp_path / "timeline.html"
    assert main(["timeline", traced.id, "--html", str(page)]) == 0
    text = page.read_text()
    assert "FRAMEWORK" in capsys.readouterr().out and "<script" in text
    assert not re.search(r"<script[^>]*\bsrc=[\"']?https?:", text)  # BokehJS inlined: works offline


def test_cli_compare_two_runs(runs, shared_home, capsys):
    traced, plain = runs
    data = cli_json(capsys, "compare", traced.id, plain.id, "--plot", "none")
    assert {r["batch_size"] for r in data["rows"]} == {1, 2}
    # the id names the whole traced run (PyTorch and ONNX Runtime): compared on ONNX Runtime, PyTorch named as left out
    assert {r["framework"] for r in data["rows"]} == {"onnxruntime"}
    assert data["warnings"] == ["left out: torch measured in A only"]
    assert all(0 <= r["p_value"] <= 1 for r in data["rows"])


def test_magic_takes_notebook_variables_and_shows_the_figure(runs):
    from IPython.core.interactiveshell import InteractiveShell

    traced, plain = runs
    shell = InteractiveShell.instance()
    try:
        shell.run_line_magic("load_ext", "mlms_nb")
        shell.user_ns.update(ev=traced, ev_ort=plain)
        roof = shell.run_line_magic("mlms", "roofline ev --per layer --plot matplotlib -o")
        assert isinstance(roof, Analysis) and (roof.table["layer_type"] == "Conv2dStaticSamePadding").sum() == 2 * 49
        shell.run_line_magic("mlms", "compare ev ev_ort --plot none --save ab")
        assert set(shell.user_ns["ab"].table["batch_size"]) == {1, 2}
    finally:
        InteractiveShell.clear_instance()


def test_bad_runs_are_sentences(runs, shared_home, capsys):
    _, plain = runs
    assert main(["layers", plain.id, "--plot", "none"]) == 2
    assert "was not traced" in capsys.readouterr().err
    assert main(["roofline", "no-such-run", "--plot", "none"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("mlms roofline: ") and "no-such-run" in err and "Traceback" not in err
    with pytest.raises(mlms_nb.errors.MlmsError, match="per='tensor': expected 'layer' or 'model'"):
        mlms_nb.roofline(plain, per="tensor")
    assert np.isfinite(plain.latency["median_ms"]).all()  # nothing measured was lost


@pytest.fixture(scope="module")
def two_framework_runs(traced_evaluation, models_home):
    """The session's traced evaluation (PyTorch and ONNX Runtime) and a second, smaller one of both."""
    return traced_evaluation, mlms_nb.evaluate(
        "efficientnet_lite0", framework="torch,onnxruntime", batch_sizes=[1], dataset="synthetic:2", warmup=1,
        min_repeats=3, min_time_s=0, trace_level="FRAMEWORK", trace_repeats=2, progress=False)


@pytest.mark.slow
def test_compare_by_evaluation_id_of_two_multi_framework_traced_runs(two_framework_runs, shared_home, capsys):
    """By evaluation id from the CLI: every framework both runs traced, side by side; one pair with
    --framework-a/--framework-b; the magic takes the same flags; `layers` draws a panel per framework."""
    a, b = two_framework_runs
    data = cli_json(capsys, "compare", a.id, b.id, "--plot", "none")
    assert {r["framework"] for r in data["rows"]} == {"torch", "onnxruntime"}
    assert data["warnings"] == [f"left out: {fw} at batch size(s) 2, measured in A only" for fw in a.frameworks]
    layers = data["layers"]
    assert {r["framework"] for r in layers} == {"torch", "onnxruntime"}
    assert all(0 <= r["p_value"] <= 1 for r in layers)
    data = cli_json(capsys, "compare", a.id, b.id, "--framework-a", "torch", "--framework-b", "onnxruntime",
                    "--plot", "none")
    assert {r["framework"] for r in data["layers"]} == {"torch vs onnxruntime"}
    assert main(["compare", a.id, b.id, "--framework-a", "tensorflow", "--plot", "none"]) == 2
    assert "not 'tensorflow'" in capsys.readouterr().err

    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    try:
        shell.run_line_magic("load_ext", "mlms_nb")
        shell.user_ns.update(ev_a=a)
        ab = shell.run_line_magic("mlms", f"compare ev_a {b.id} --framework-a onnxruntime --plot none -o")
        assert set(ab.extra["layers"]["framework"]) == {"onnxruntime"}
        per_fw = shell.run_line_magic("mlms", "layers ev_a --what occurrence --plot none -o")
        figure = per_fw.plot("bokeh")
        assert len(figure.children) == 2  # one panel per framework, stacked
        titles = [child.title.text for child in figure.children]
        assert any("torch" in t for t in titles) and any("onnxruntime" in t for t in titles)
        only = shell.run_line_magic("mlms", "layers ev_a --what occurrence --framework torch --plot none -o")
        assert set(only.table["framework"]) == {"torch"}
    finally:
        InteractiveShell.clear_instance()
