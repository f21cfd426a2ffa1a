"""Manifests: validation names the field path; discovery finds built-in and user manifests."""
from __future__ import annotations

import copy

import pytest
import yaml

from mlms_nb.errors import ManifestError, UnknownModelError
from mlms_nb.manifest import ManifestCatalog, find_manifest, load_manifest, parse_manifest

GOOD = {
    "name": "tiny",
    "version": "1.2.3",
    "framework": {"name": "onnxruntime", "version": ">=1.17"},
    "inputs": [{"type": "image", "layout": "NCHW", "dimensions": [3, 32, 32], "mean": [127], "scale": [128]}],
    "outputs": [{"type": "classification"}],
    "preprocess": [{"resize": {"size": 36}}, {"center_crop": {"size": 32}}, "to_layout"],
    "model": {"graph_path": "tiny.onnx"},
}


def bad(**changes):
    data = copy.deepcopy(GOOD)
    for path, value in changes.items():
        target = data
        *parents, leaf = path.split("__")
        for p in parents:
            target = target[int(p)] if p.isdigit() else target[p]
        target[int(leaf) if leaf.isdigit() else leaf] = value
    return data


def error_of(data) -> str:
    with pytest.raises(ManifestError) as info:
        parse_manifest(data)
    return str(info.value)


def test_good_manifest_parses_with_defaults():
    good = copy.deepcopy(GOOD)
    good["preprocess"][2] = {"to_layout": {"layout": "NCHW"}}
    m = parse_manifest(good)
    assert m.key == "tiny@1.2.3/onnxruntime"
    assert m.inputs[0].height_width == (32, 32) and m.inputs[0].channels == 3
    assert [s.op for s in m.preprocess] == ["resize", "center_crop", "to_layout"]
    assert m.preprocess[0].args.size == 36 and m.preprocess[0].args.interpolation == "bilinear"
    assert m.framework.accepts("1.31.1") and not m.framework.accepts("1.16.0")


def test_dimensions_error_names_the_field_path():
    assert error_of(bad(inputs__0__dimensions=[3, 224])) == \
        "inputs[0].dimensions: expected 3 integers (NCHW without the batch), got 2"


@pytest.mark.parametrize("changes, expected", [
    ({"framework__name": "caffe"}, "framework.name: unknown framework 'caffe'"),
    ({"framework__version": "not a range!"}, "framework.version: not an npm-style version range"),
    ({"version": "one"}, "version: expected a semantic version like 1.0.0, got 'one'"),
    ({"inputs__0__mean": [1.0, 2.0]}, "inputs[0].mean: expected 1 or 3 values (one per channel), got 2"),
    ({"inputs__0__layout": "NWHC"}, "inputs[0].layout: Input should be 'NCHW' or 'NHWC'"),
    ({"preprocess__0": {"resize": {"size": "big"}}}, "preprocess[0].resize.size"),
    ({"preprocess__0": {"blur": {}}}, "preprocess[0]: unknown step 'blur'"),
    ({"preprocess__0": "softmax"}, "preprocess[0]: step 'softmax' does not belong in preprocess"),
    ({"model__sha256": {"graph_path": "abc"}}, "model.sha256.graph_path: expected 64 hex digits"),
    ({"colour": "red"}, "colour: unknown field"),
])
def test_errors_name_the_field(changes, expected):
    assert expected in error_of(bad(**changes))


def test_missing_required_fields():
    data = copy.deepcopy(GOOD)
    del data["framework"]
    assert "framework: required field is missing" in error_of(data)
    data = copy.deepcopy(GOOD)
    data["model"] = {}
    assert "model: expected an architecture or a graph_path" in error_of(data)


def test_bad_yaml_and_file_name_in_message(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("name: [unclosed\n")
    with pytest.raises(ManifestError, match=r"broken.yaml: not valid YAML at line"):
        load_manifest(path)
    path.write_text(yaml.safe_dump(bad(inputs__0__dimensions=[3])))
    with pytest.raises(ManifestError, match=r"broken.yaml: inputs\[0\].dimensions: expected 3 integers \(NCHW"):
        load_manifest(path)


def test_builtin_catalog_has_three_frameworks_for_lite0():
    catalog = ManifestCatalog()
    assert not catalog.errors
    fws = {m.framework.name for m in catalog.manifests if m.name == "efficientnet_lite0"}
    assert fws == {"torch", "onnxruntime", "tensorflow"}
    resnet = catalog.find("resnet50", framework="torch")
    assert resnet.model.weights == "random" and not resnet.pretrained
    # without a framework, PyTorch (the reference) is chosen
    assert catalog.find("efficientnet_lite0").framework.name == "torch"
    assert catalog.find("efficientnet-lite0", framework="tf").framework.name == "tensorflow"


def test_unknown_model_suggests_the_closest():
    with pytest.raises(UnknownModelError) as info:
        find_manifest("efficientnet_lite")
    assert "unknown model 'efficientnet_lite'; did you mean efficientnet_lite" in str(info.value)
    with pytest.raises(UnknownModelError, match="has no manifest for framework 'tensorflow'"):
        find_manifest("resnet50", framework="tensorflow")


def test_user_manifest_path_and_version_ranges(tmp_path, monkeypatch):
    for version in ("1.0.0", "1.4.0", "2.0.0"):
        data = copy.deepcopy(GOOD)
        data["version"] = version
        (tmp_path / f"tiny-{version}.yaml").write_text(yaml.safe_dump(data))
    (tmp_path / "broken.yml").write_text("name: 3\n")
    monkeypatch.setenv("MLMS_MANIFEST_PATH", str(tmp_path))
    catalog = ManifestCatalog()
    assert catalog.find("tiny").version == "2.0.0"
    assert catalog.find("tiny", version="^1.0").version == "1.4.0"
    assert any("broken.yml" in k for k in catalog.errors)  # kept aside, not fatal
    with pytest.raises(UnknownModelError, match="no version matching"):
        catalog.find("tiny", version="^3")
    # a single file works too, and its relative assets resolve from its folder
    assert find_manifest(str(tmp_path / "tiny-1.0.0.yaml")).version == "1.0.0"
