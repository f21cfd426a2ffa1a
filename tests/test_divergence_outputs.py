"""`diverge --outputs` (issue 11): the output-level divergence through the same verb as the layer-level one, for
models the layer-level one cannot follow -- the two-input streamer with a scalar constant and a state tensor
(tests/test_io_stateful.py) and the dynamic-size mask net over photos of different sizes (tests/test_io_dynamic.py),
both built, exported and run for real in PyTorch and ONNX Runtime -- from Python, the ``mlms`` command and the
``%mlms`` magic; the options that make no sense with it are refused by name."""
from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("onnxruntime")

import mlms_nb  # noqa: E402
from mlms_nb import display  # noqa: E402
from mlms_nb.cli import main  # noqa: E402
from mlms_nb.divergence import OutputDivergence  # noqa: E402
from mlms_nb.errors import MlmsError  # noqa: E402
from tests.test_io_dynamic import masknet_folder  # noqa: E402,F401  (the fixture: a real dynamic-size model)
from tests.test_io_stateful import streamer_models  # noqa: E402,F401  (the fixture: a real two-input model)


@pytest.fixture
def streamer(streamer_models, mlms_home, monkeypatch):  # noqa: F811
    monkeypatch.setenv("MLMS_MANIFEST_PATH", str(streamer_models["manifests"]))
    return str(streamer_models["folder"] / "signals.npz")


def test_python_outputs_true_compares_every_output_with_user_metrics(streamer):
    pairs = []

    def largest_gap(output, reference):
        pairs.append(output.shape)
        return float(np.max(np.abs(output - reference)))

    result = mlms_nb.diverge("streamer", outputs=True, trust=True, dataset=streamer, limit=4, batch_size=2,
                             metrics={"largest_gap": largest_gap, "mse": "mse"})
    assert isinstance(result, OutputDivergence) and result.frameworks == ["torch", "onnxruntime"]
    assert result.diverged == []
    rows = result.table.set_index(["output", "metric"])
    assert set(rows.index.get_level_values("output")) == {"out", "new_state"}
    assert (rows["inputs"] == 4).all()
    assert rows.loc[("new_state", "max_rel_error"), "value"] < 1e-4
    assert rows.loc[("out", "mse"), "unit"] == "output's unit²" and rows.loc[("new_state", "cosine"), "unit"] == "-1..1"
    assert ("out", "cosine") not in rows.index  # one value per input: a cosine would only say its sign
    assert 0 <= rows.loc[("out", "largest_gap"), "value"] <= rows.loc[("out", "max_abs_error"), "value"]
    assert sorted(set(pairs)) == [(1,), (8,)] and len(pairs) == 2 * 4  # per input, shaped as the output
    bundle = result._repr_mimebundle_()
    assert "<table" in bundle["text/html"] and "largest_gap" in bundle["text/html"]
    assert "Output divergence of streamer (reference: torch)" in bundle["text/plain"]


def test_cli_outputs_prints_text_and_json(streamer, capsys):
    args = ["diverge", "streamer", "--outputs", "--trust", "--dataset", streamer, "--limit", "3", "--metrics", "mse,mae"]
    assert main(args + ["--plot", "none"]) == 0
    text = capsys.readouterr().out
    assert "Output divergence of streamer" in text and "3 inputs of" in text and "new_state" in text
    assert main(args + ["--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["title"] == "Output divergence of streamer (reference: torch)"
    metrics = {(r["output"], r["metric"]) for r in data["rows"]}
    assert {("out", "mse"), ("new_state", "mae"), ("new_state", "max_rel_error")} <= metrics
    assert all(r["inputs"] == 3 and r["diverges"] is False for r in data["rows"])


def test_magic_outputs_returns_the_result(streamer):
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    try:
        shell.run_line_magic("load_ext", "mlms_nb")
        result = shell.run_line_magic("mlms", f"diverge streamer --outputs --trust --dataset {streamer} --limit 2 "
                                              "--plot none -o")
    finally:
        InteractiveShell.clear_instance()
    assert isinstance(result, OutputDivergence)
    assert set(result.table["output"]) == {"out", "new_state"} and (result.table["inputs"] == 2).all()


def test_layer_level_refusal_says_to_use_outputs(streamer, capsys):
    with pytest.raises(MlmsError, match=r"cannot follow streamer: .*2 inputs.*instead with outputs=True"):
        mlms_nb.diverge("streamer", trust=True, dataset=streamer)
    assert main(["diverge", "streamer", "--trust", "--dataset", streamer]) != 0
    assert "instead with --outputs" in capsys.readouterr().err


@pytest.mark.parametrize("keywords, message", [
    ({"quantized": True}, r"quantized=True belongs to the layer-level divergence, not to outputs=True"),
    ({"latency_repeats": 3}, r"latency_repeats=3 belongs to the layer-level divergence"),
    ({"metrics": ["nope"]}, r"unknown metric 'nope'"),
    ({"frameworks": "torch"}, r"at least two frameworks"),
])
def test_options_that_make_no_sense_with_outputs_are_refused(streamer, keywords, message):
    with pytest.raises(MlmsError, match=message):
        mlms_nb.diverge("streamer", outputs=True, trust=True, dataset=streamer, **keywords)


def test_metrics_without_outputs_are_refused_by_flag(streamer, capsys):
    assert main(["diverge", "streamer", "--metrics", "mse"]) != 0
    assert "--metrics applies to the output-level divergence: add --outputs" in capsys.readouterr().err


def test_dynamic_sizes_one_photo_at_a_time(masknet_folder, mlms_home, monkeypatch):  # noqa: F811
    monkeypatch.setenv("MLMS_MANIFEST_PATH", str(masknet_folder["folder"]))
    result = mlms_nb.diverge("masknet", outputs=True, trust=True, dataset=str(masknet_folder["photos"]), limit=3)
    shapes = result.outputs.groupby("input_id")["shape"].first().map(tuple)
    assert len(set(shapes)) == 3  # three aspect ratios, three mask sizes, in one dataset
    rows = result.table.set_index("metric")
    assert rows.loc["iou", "value"] > 0.99 and rows.loc["max_rel_error", "value"] < 1e-4  # the manifest's metric


def test_a_pytorch_manifest_path_gets_its_converted_copy(tmp_path, mlms_home):
    import torch

    from tests.data.byom_cnn import seeded

    torch.save(seeded().state_dict(), tmp_path / "small_cnn.pth")
    path = tmp_path / "small_cnn.yaml"
    path.write_text("""\
name: small_cnn
framework: {name: torch}
inputs: [{type: image, dimensions: [3, 32, 32], mean: [123.675, 116.28, 103.53], scale: [58.395, 57.12, 57.375]}]
outputs: [{type: classification, classes: 10}]
model: {entrypoint: "tests.data.byom_cnn:SmallCNN", entrypoint_args: {classes: 10}, weights_path: small_cnn.pth}
""")
    result = mlms_nb.diverge(str(path), outputs=True, trust=True, dataset="imagenet-samples", limit=2)
    assert result.frameworks == ["torch", "onnxruntime"] and result.diverged == []
    assert (result.table["inputs"] == 2).all() and set(result.outputs["framework"]) == {"torch", "onnxruntime"}
