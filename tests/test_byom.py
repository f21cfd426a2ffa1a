"""Ways in for a user's own model (issue 10 item 1): an entrypoint manifest with a state dict, a live object, a
manifest built in Python; all evaluated on the suite's real photos (imagenet-samples). Model files (TorchScript,
.pt2, ONNX, .keras, SavedModel) are evaluated by the guide's own examples (tests/test_docs.py).

The model is a small real CNN of the test's own, in a package written to a temp folder put on ``sys.path``.
"""
from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import mlms_nb
from mlms_nb.errors import ManifestError, UntrustedError

torch = pytest.importorskip("torch")

RUN = dict(batch_sizes=[1], warmup=1, min_repeats=2, min_time_s=0.01, progress=False, history=False, limit=6,
           keep_probabilities=True)
MEAN, SCALE = [123.675, 116.28, 103.53], [58.395, 57.12, 57.375]
INPUT = {"type": "image", "layout": "NCHW", "dimensions": [3, 64, 64], "mean": MEAN, "scale": SCALE}

PACKAGE = '''
import torch
from torch import nn


class TinyCNN(nn.Module):
    def __init__(self, classes=10, width=8):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, width, 3, stride=2, padding=1), nn.BatchNorm2d(width), nn.ReLU(),
            nn.Conv2d(width, 2 * width, 3, stride=2, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1))
        self.classifier = nn.Linear(2 * width, classes)

    def forward(self, x):
        return self.classifier(torch.flatten(self.features(x), 1))


def build(classes=10, width=8):
    return TinyCNN(classes, width)
'''


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The package on sys.path, the model with seeded weights, and its weights as safetensors and .pth."""
    from safetensors.torch import save_file

    root = tmp_path_factory.mktemp("byom")
    (root / "pkg" / "tinycnn").mkdir(parents=True)
    (root / "pkg" / "tinycnn" / "__init__.py").write_text(PACKAGE)
    sys.path.insert(0, str(root / "pkg"))
    import tinycnn

    torch.manual_seed(0)
    model = tinycnn.build(classes=12, width=8).eval()
    with torch.no_grad():  # a BatchNorm with statistics of its own, so the weights matter
        model.features[1].running_mean.uniform_(-0.5, 0.5)
        model.features[1].running_var.uniform_(0.5, 2.0)
    save_file(model.state_dict(), str(root / "tiny.safetensors"))
    torch.save(model.state_dict(), str(root / "tiny.pth"))
    yield root, model
    sys.path.remove(str(root / "pkg"))
    sys.modules.pop("tinycnn", None)


def _entrypoint_manifest(root: Path, weights: str = "tiny.safetensors", name: str = "entry.yaml") -> Path:
    path = root / name
    path.write_text(textwrap.dedent(f"""\
        name: tinycnn
        framework: {{name: torch}}
        inputs: [{{type: image, layout: NCHW, dimensions: [3, 64, 64], mean: {MEAN}, scale: {SCALE}}}]
        outputs: [{{type: classification, classes: 12}}]
        model:
          entrypoint: "tinycnn:build"
          entrypoint_args: {{classes: 12, width: 8}}
          weights_path: {weights}
        """))
    return path


def test_entrypoint_needs_trust_then_matches_the_model(tiny):
    root, model = tiny
    manifest = _entrypoint_manifest(root)
    with pytest.raises(UntrustedError) as refused:
        mlms_nb.evaluate(str(manifest), **RUN)
    assert "entrypoint tinycnn:build" in str(refused.value) and str(manifest.resolve()) in str(refused.value)

    ev = mlms_nb.evaluate(str(manifest), trust=True, **RUN)
    assert ev.complete and list(ev.accuracy["dataset"]) == ["imagenet-samples"]
    live = mlms_nb.evaluate(model, inputs=INPUT, outputs={"type": "classification", "classes": 12}, **RUN)
    assert live.frameworks == ["torch"]
    # the live object and the entrypoint + safetensors weights give the same probabilities on the same photos
    np.testing.assert_allclose(ev.probabilities["torch"], live.probabilities["torch"], atol=1e-6)
    assert len(set(ev.predictions["top1"])) > 1  # a real model on real photos, not a constant

    pth = mlms_nb.evaluate(str(_entrypoint_manifest(root, "tiny.pth", "entry_pth.yaml")), trust=True, **RUN)
    np.testing.assert_allclose(pth.probabilities["torch"], ev.probabilities["torch"], atol=1e-6)


def test_manifest_built_in_python_saves_and_reloads(tiny, monkeypatch):
    root, _ = tiny
    monkeypatch.chdir(root)  # a manifest built in Python reads relative paths from the working folder
    manifest = mlms_nb.Manifest(
        name="tinycnn", framework={"name": "torch"}, inputs=[INPUT],
        outputs=[{"type": "classification", "classes": 12}],
        model={"entrypoint": "tinycnn:build", "entrypoint_args": {"classes": 12, "width": 8},
               "weights_path": "tiny.safetensors"})
    saved = manifest.save(root / "tiny.yaml")  # ... and a saved one from its own folder
    again = mlms_nb.load_manifest(saved)
    assert again.to_dict() == manifest.to_dict()
    first = mlms_nb.evaluate(manifest, trust=True, **RUN)
    second = mlms_nb.evaluate(str(saved), trust=True, **RUN)
    np.testing.assert_array_equal(first.probabilities["torch"], second.probabilities["torch"])


def test_comparing_a_users_model_with_a_built_in_one_says_they_differ(tiny, real_evaluation):
    """EfficientNet-Lite0 against the user's own CNN: the comparison runs (a user may mean it) but says, in its title
    and a warning, that two different models are compared; and the latency change's interval stays a change a
    latency can make (above -100%), however far apart the two are."""
    _, model = tiny
    mine = mlms_nb.evaluate(model, inputs=torch.zeros(1, 3, 64, 64), **{**RUN, "keep_probabilities": False})
    ab = mlms_nb.compare(real_evaluation, mine)
    [warning] = ab.warnings
    assert "two different models" in warning and "efficientnet_lite0" in warning and mine.model in warning
    assert "two different models" in ab.title and warning in ab.to_text() and warning in ab._repr_html_()
    assert (ab.table["latency_ratio_low"] > 0).all()


def test_live_object_with_an_example_batch_and_magic(tiny):
    _, model = tiny
    ev = mlms_nb.evaluate(model, inputs=torch.zeros(2, 3, 64, 64), **{**RUN, "keep_probabilities": False})
    assert ev.complete and ev.manifests["torch"]["inputs"][0]["dimensions"] == [3, 64, 64]
    assert not ev.latency.empty and ev.accuracy.empty  # synthetic tensors: latency only
    assert ev.latency["batch_size"].tolist() == [1]  # batch_sizes given: it wins over the example's 2
    unsized = {k: v for k, v in RUN.items() if k != "batch_sizes"}
    ev = mlms_nb.evaluate(model, inputs=torch.zeros(3, 3, 64, 64), **{**unsized, "keep_probabilities": False})
    assert ev.latency["batch_size"].tolist() == [3] and ev.options["batch_sizes"] == [3]  # the batch passed is timed
    with pytest.raises(ManifestError, match="inputs="):
        mlms_nb.evaluate(model, **RUN)

    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    try:
        shell.run_line_magic("load_ext", "mlms_nb")
        shell.user_ns.update(my_cnn=model, example=torch.zeros(2, 3, 64, 64))
        out = shell.run_line_magic("mlms", "eval my_cnn --inputs example --dataset synthetic:2 --min-time 0.01 "
                                           "--no-history -o")
        assert out.complete and out.model == "tinycnn" and out.latency["batch_size"].tolist() == [2]
    finally:
        InteractiveShell.clear_instance()


@pytest.mark.slow  # two ONNX exports and one Keras port of the tiny CNN (cached after the first)
def test_a_manifest_found_by_name_converts_exactly_as_by_path(tiny, monkeypatch, tmp_path):
    """A user's PyTorch manifest in MLMS_MANIFEST_PATH, asked by its name in three frameworks, runs the kept
    converters' copies as the same file asked by its path does (issue 24 item 1: resolved in one place)."""
    pytest.importorskip("onnxruntime")
    pytest.importorskip("tensorflow")
    root, _ = tiny
    manifest = _entrypoint_manifest(root, name="byname.yaml")
    monkeypatch.setenv("MLMS_MANIFEST_PATH", str(manifest))
    monkeypatch.setenv("MLMS_HOME", str(tmp_path / "home"))
    three = dict(RUN, framework="torch,onnxruntime,tensorflow", trust=True, limit=4)
    by_name = mlms_nb.evaluate("tinycnn", **three)
    by_path = mlms_nb.evaluate(str(manifest), **three)
    for ev in (by_name, by_path):
        assert ev.complete and ev.frameworks == ["torch", "onnxruntime", "tensorflow"], ev.missing()
    for fw in ("torch", "onnxruntime", "tensorflow"):
        np.testing.assert_allclose(by_name.probabilities[fw], by_path.probabilities[fw], atol=1e-6)
        np.testing.assert_allclose(by_name.probabilities[fw], by_name.probabilities["torch"], atol=1e-4)
    with pytest.raises(mlms_nb.errors.UnknownModelError):  # a version it does not have: refused before running
        mlms_nb.evaluate("tinycnn@^9", **three)
