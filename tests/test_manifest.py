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


def changed(base: dict, **changes) -> dict:
    """A deep copy of ``base`` with fields set by path: ``model__graph_path=...``, ``inputs__0__dimensions=...``."""
    data = copy.deepcopy(base)
    for path, value in changes.items():
        target = data
        *parents, leaf = path.split("__")
        for p in parents:
            target = target[int(p)] if p.isdigit() else target[p]
        target[int(leaf) if leaf.isdigit() else leaf] = value
    return data


def bad(**changes):
    return changed(GOOD, **changes)


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
    assert "model: expected one of architecture (built in), graph_path (a model file) or entrypoint" in error_of(data)


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


# ---------------------------------------------------------------- hostile files (issue 12): refused, bounded

def lite0_text() -> str:
    from mlms_nb.paths import builtin_manifest_dir

    return (builtin_manifest_dir() / "efficientnet_lite0" / "torch.yaml").read_text()


def load_error(tmp_path, content: str | bytes, name: str = "hostile.yaml") -> str:
    path = tmp_path / name
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(ManifestError) as info:
        load_manifest(path)
    return str(info.value)


def billion_laughs(levels: int = 10, width: int = 9) -> str:
    lines = ["  lol0: &lol0 [" + ", ".join(["lol"] * width) + "]"]
    lines += [f"  lol{i}: &lol{i} [" + ", ".join([f"*lol{i - 1}"] * width) + "]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


def test_billion_laughs_in_attributes_is_refused_at_load_with_bounded_memory(tmp_path):
    import time
    import tracemalloc

    text = lite0_text() + billion_laughs()  # inside attributes:, the last block of the built-in manifest
    tracemalloc.start()
    t0 = time.perf_counter()
    message = load_error(tmp_path, text)
    elapsed_ms = (time.perf_counter() - t0) * 1e3
    _, peak_bytes = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert "expands to more than 100,000 values through its aliases (*lol" in message
    assert "remove the anchors and aliases" in message
    assert peak_bytes < 16 << 20, f"peak {peak_bytes / 2**20:.1f} MiB in {elapsed_ms:.1f} ms"
    # a few aliases (a shared mean/scale) are fine
    shared = "name: ok\nx: &m [1, 2]\ny: *m\n"
    message = load_error(tmp_path, shared)  # refused for its fields, not for the alias
    assert "x: unknown field" in message and "alias" not in message


@pytest.mark.parametrize("depth", [800, 100_000])
def test_deep_nesting_is_refused_before_pyyaml_recurses(tmp_path, depth):
    message = load_error(tmp_path, "name: x\nattributes:\n  deep: " + "[" * depth + "]" * depth + "\n")
    assert "attributes.deep[0][0]" in message and "nests deeper than 50 levels (line 3, column" in message
    message = load_error(tmp_path, "attributes: " + "{a: " * 5000 + "1" + "}" * 5000 + "\n")
    assert "nests deeper than 50 levels" in message


def test_size_limit_encoding_and_file_kind(tmp_path):
    import os

    big = lite0_text() + "  blob: " + "x" * (1 << 20) + "\n"
    assert "over the 1,048,576-byte (1 MiB) limit for a manifest" in load_error(tmp_path, big)
    latin1 = lite0_text().replace("name: efficientnet_lite0", "name: café").encode("latin-1")
    assert "not UTF-8 text (byte 0xe9 at line 2, column 10); save the file as UTF-8" in load_error(tmp_path, latin1)
    assert "not valid YAML at line 1, column 8: character #x0000 is not allowed" in load_error(tmp_path, "name: a\0b\n")
    os.mkfifo(tmp_path / "fifo.yaml")  # opening it would block: refused from its stat
    with pytest.raises(ManifestError, match="fifo.yaml: not a regular file"):
        load_manifest(tmp_path / "fifo.yaml")
    with pytest.raises(ManifestError, match="not a regular file"):
        load_manifest(tmp_path)
    with pytest.raises(ManifestError, match="cannot read the manifest"):
        load_manifest(tmp_path / "missing.yaml")


def test_duplicate_keys_and_recursive_aliases_are_refused_with_their_path(tmp_path):
    onnx = lite0_text().replace("name: torch", "name: onnxruntime")
    message = load_error(tmp_path, onnx + "framework: {name: torch}\n")
    assert "hostile.yaml: framework: duplicate key at line" in message and "(first at line 10)" in message
    message = load_error(tmp_path, lite0_text().replace("  weights: pretrained", "  weights: pretrained\n  weights: random"))
    assert "model.weights: duplicate key" in message
    message = load_error(tmp_path, "name: x\nattributes:\n  a: &loop [1, *loop]\n")
    assert "attributes.a[1]: alias *loop at line 3" in message and "recursive" in message
    merged = "name: x\nbase: &b {p: 1}\nother:\n  <<: *b\n  p: 2\n"  # a merge key is not a duplicate
    assert "duplicate key" not in load_error(tmp_path, merged)


LITE0 = yaml.safe_load(lite0_text())  # the built-in manifest, changed one field at a time below


def lite0_with(**changes):
    return changed(LITE0, **changes)


@pytest.mark.parametrize("changes, expected", [
    ({"preprocess__3__normalize__scale": [float("nan"), 128, 128]},
     "preprocess[3].normalize.scale[0]: expected a finite number, got nan"),
    ({"preprocess__3__normalize__scale": [0, 128, 128]}, "preprocess[3].normalize.scale[0]: expected a positive divisor"),
    ({"preprocess__3__normalize__mean": [float("inf")]}, "preprocess[3].normalize.mean[0]: expected a finite number"),
    ({"preprocess__3__normalize__mean": [1, 2, 3, 4]},
     "preprocess[3].normalize.mean: expected 1 or 3 values (one per channel of inputs[0]), got 4"),
    ({"preprocess__3__normalize__scale": [1, 2]}, "preprocess[3].normalize.scale: expected 1 or 3 values"),
    ({"inputs__0__scale": [float("nan")]}, "inputs[0].scale[0]: expected a finite number, got nan"),
    ({"preprocess__1__resize__size": 0}, "preprocess[1].resize.size: expected a whole number of pixels from 1 to 4,096, got 0"),
    ({"preprocess__1__resize__size": -426955}, "preprocess[1].resize.size: expected a whole number of pixels from 1 to 4,096"),
    ({"preprocess__1__resize__size": 100_000}, "preprocess[1].resize.size: expected a whole number of pixels from 1 to 4,096"),
    ({"preprocess__1__resize__size": [256, float("nan")]}, "preprocess[1].resize.size[1]: expected a whole number of pixels"),
    ({"preprocess__2__center_crop__size": True}, "preprocess[2].center_crop.size: expected a whole number of pixels"),
    ({"preprocess__2__center_crop__size": 200},
     "preprocess[2].center_crop.size: the steps make 200x200 images but inputs[0].dimensions says 224x224"),
    ({"postprocess__0": {"softmax": {"axis": 3}}}, "postprocess[0].softmax.axis: postprocessing sees outputs shaped (N, classes)"),
    ({"postprocess__1__top_k__k": 0}, "postprocess[1].top_k.k: expected a whole number of classes from 1 to 10,000,000, got 0"),
    ({"inputs__0__dimensions": [3, 2**63, 224]},
     "inputs[0].dimensions[1]: expected a whole number of elements from 1 to 1,048,576, got 9223372036854775808"),
    ({"inputs__0__dimensions": [3, 0, 224]}, "inputs[0].dimensions[1]: expected a whole number of elements from 1"),
    ({"inputs__0__dimensions": [3, 8192, 224]}, "inputs[0].dimensions[1]: an image height of at most 4096 pixels"),
    ({"outputs__0__classes": -1}, "outputs[0].classes: expected a whole number of classes from 1"),
    ({"version": 1.0}, 'version: 1.0 is a YAML number; write a quoted semantic version such as "1.0.0"'),
    ({"framework__version": 2}, 'framework.version: 2 is a YAML number; write the range as a quoted string, such as ">=2"'),
    ({"name": "Efficient Net"}, "name: expected lower-case letters, digits and . _ -"),
    ({"preprocess__0__decode__color_mode": "GRAY"}, "preprocess[0].decode.color_mode: decoding gives 1 channel but "
                                                    "inputs[0].dimensions has 3"),
    ({"model__weights_path": "a\0b"}, "model.weights_path: an asset URI must not contain a NUL character"),
    ({"model": {"architecture": "efficientnet_lite0"}},
     "model.weights_path: architecture 'efficientnet_lite0' with pretrained weights needs a weights_path"),
])
def test_numeric_bounds_and_coherence_name_the_field(changes, expected):
    assert expected in error_of(lite0_with(**changes))


def test_every_step_error_is_reported_with_one_wording():
    message = error_of(lite0_with(preprocess__2={"center_crop": {"szie": 224}},
                                  postprocess__1={"top_k": {"k": -1, "kk": 3}}))
    assert "preprocess[2].center_crop.size: required field is missing" in message
    assert "preprocess[2].center_crop.szie: unknown field" in message
    assert "postprocess[1].top_k.k: expected a whole number of classes" in message
    assert "postprocess[1].top_k.kk: unknown field" in message
    assert "Extra inputs are not permitted" not in message


def test_preprocessing_that_cannot_give_the_input_is_refused():
    pre = LITE0["preprocess"]
    assert "preprocess: the steps leave the image size to each image; end them with a resize or center_crop to " \
           "[224, 224]" in error_of(lite0_with(preprocess=[pre[0], pre[1], pre[3], pre[4]]))
    assert "preprocess[5]: decode must be the first step" in error_of(lite0_with(preprocess=[*pre, pre[0]]))
    assert "preprocess[5]: resize works on height x width x channels images" in \
        error_of(lite0_with(preprocess=[*pre, {"resize": {"size": [224, 224]}}]))
    # an exact resize alone fixes the size: accepted (a no-op for images of that size already)
    assert parse_manifest(lite0_with(preprocess=[pre[0], {"resize": {"size": [224, 224]}}])).key


def test_duplicated_inputs_and_outputs_are_refused():
    data = lite0_with()
    data["outputs"].append(copy.deepcopy(data["outputs"][0]))
    assert "outputs[1]: repeats outputs[0]; remove the copy" in error_of(data)
    data = lite0_with(inputs__0__name="image")
    data["inputs"].append(dict(copy.deepcopy(data["inputs"][0]), type="tensor", dimensions=[1]))
    assert "inputs[1].name: 'image' is also the name of inputs[0]" in error_of(data)


# ---------------------------------------------------------------- the catalog: hostile neighbours, precedence

def hostile_files(folder):
    """One of each file that used to crash the catalog, each named like a model of its own."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "deep.yaml").write_text("name: deep\nattributes: " + "[" * 800 + "]" * 800 + "\n")
    (folder / "latin.yaml").write_bytes(lite0_text().replace("efficientnet_lite0", "latin_café").encode("latin-1"))
    (folder / "laughs.yaml").write_text(lite0_text().replace("efficientnet_lite0", "laughs") + billion_laughs())
    (folder / "dup.yaml").write_text(lite0_text().replace("efficientnet_lite0", "dup") + "name: dup2\n")
    (folder / "big.yml").write_text("name: big\nx: '" + "y" * (1 << 20) + "'\n")
    (folder / "tiny.yaml").write_text(yaml.safe_dump(bad(inputs__0__dimensions=[3, 0, 32])))


def test_hostile_files_in_the_search_path_are_listed_never_fatal(tmp_path, monkeypatch, capsys):
    from mlms_nb import api, cli

    hostile_files(tmp_path / "user")
    monkeypatch.setenv("MLMS_MANIFEST_PATH", str(tmp_path / "user"))
    catalog = ManifestCatalog()
    assert sorted(k.rsplit("/", 1)[1] for k in catalog.errors) == [
        "big.yml", "deep.yaml", "dup.yaml", "latin.yaml", "laughs.yaml", "tiny.yaml"]
    assert catalog.find("efficientnet_lite0").key == "efficientnet_lite0@1.0.0/torch"
    frame = api.models()
    assert "efficientnet_lite0" in set(frame["model"]) and len(frame.attrs["errors"]) == 6
    assert cli.main(["models"]) == 0
    out = capsys.readouterr().out
    assert "Manifests that failed to load:" in out and "deep.yaml" in out and "nests deeper than 50 levels" in out


def test_a_name_whose_manifest_failed_says_why_not_unknown_model(tmp_path, monkeypatch, capsys):
    import mlms_nb
    from mlms_nb import cli

    hostile_files(tmp_path / "user")
    monkeypatch.setenv("MLMS_MANIFEST_PATH", str(tmp_path / "user"))
    with pytest.raises(ManifestError) as info:
        find_manifest("tiny")
    assert str(info.value).startswith("the manifest of model 'tiny' failed to load: ")
    assert "tiny.yaml: inputs[0].dimensions[1]: expected a whole number of elements from 1" in str(info.value)
    with pytest.raises(ManifestError, match="the manifest of model 'deep' failed to load: .*nests deeper"):
        mlms_nb.evaluate("deep", framework="onnxruntime", history=False)
    assert cli.main(["eval", "tiny", "--framework", "onnxruntime", "--no-history"]) == 2
    assert "mlms eval: the manifest of model 'tiny' failed to load: " in capsys.readouterr().err
    # a framework whose manifest failed, beside one that loads
    (tmp_path / "user" / "tiny_ok.yaml").write_text(yaml.safe_dump(bad(framework__name="torch")))
    assert find_manifest("tiny", framework="torch").framework.name == "torch"
    with pytest.raises(ManifestError, match="failed to load"):
        find_manifest("tiny", framework="onnxruntime")
    with pytest.raises(UnknownModelError, match="unknown model 'nothing_like_it'"):
        find_manifest("nothing_like_it")


def test_a_user_manifest_with_a_builtin_name_does_not_shadow_it(tmp_path, monkeypatch, caplog):
    from mlms_nb import api

    user = lite0_with(version="9.0.0", description="a user's copy")
    user["model"]["weights"] = "random"
    (tmp_path / "mine.yaml").write_text(yaml.safe_dump(user))
    monkeypatch.setenv("MLMS_MANIFEST_PATH", str(tmp_path))
    with caplog.at_level("WARNING", logger="mlms_nb.manifest"):
        chosen = find_manifest("efficientnet_lite0", framework="torch")
    assert chosen.version == "1.0.0" and ManifestCatalog().is_builtin(chosen)
    assert "efficientnet_lite0@1.0.0/torch: using the built-in manifest 1.0.0;" in caplog.text
    assert "mine.yaml (9.0.0) from MLMS_MANIFEST_PATH has the same name and framework and is not used" in caplog.text
    assert find_manifest("efficientnet_lite0@9.0.0").description == "a user's copy"
    assert find_manifest("efficientnet_lite0", version="^9").version == "9.0.0"
    assert find_manifest(str(tmp_path / "mine.yaml")).version == "9.0.0"
    frame = api.models(framework="torch")
    origins = dict(zip(frame["version"] + " " + frame["model"], frame["origin"]))
    assert origins["9.0.0 efficientnet_lite0"] == "user, not the default"
    assert origins["1.0.0 efficientnet_lite0"] == "built-in"
    assert "has the name of a built-in manifest (1.0.0), which is used by default: eval it by its path or as " \
           "efficientnet_lite0@9.0.0" in frame.attrs["note"]


def test_the_task_is_declared_or_read_from_the_inputs_and_outputs():
    """`effective_task` says what a model does (the models listing's task column): what the manifest declares, else
    what its fed input and first output imply; a declared classification task needs a classification output."""
    assert parse_manifest(GOOD).effective_task == "image-classification"
    tokens = {"type": "tensor", "element_type": "int64", "dimensions": [None]}
    assert parse_manifest(bad(inputs=[tokens], preprocess=[])).effective_task == "text-classification"
    floats = {"type": "tensor", "dimensions": [10]}
    assert parse_manifest(bad(inputs=[floats], preprocess=[])).effective_task == "classification"
    assert parse_manifest(bad(inputs=[floats], preprocess=[], outputs=[{"type": "tensor"}])).effective_task == "tensor"
    assert parse_manifest(bad(task="text-classification")).effective_task == "text-classification"  # declared wins
    assert "task: image-classification reads classes from the first output, which is of type tensor" in error_of(
        bad(task="image-classification", outputs=[{"type": "tensor"}]))
    assert {m.effective_task for m in ManifestCatalog().select(None) if m.name == "tiny_gpt2"} == {"text-generation"}


def test_steps_read_as_a_table_of_their_arguments():
    """A manifest's steps as people read them: one row per argument, in the order they run (not a grid of NaN)."""
    table = find_manifest("efficientnet_lite0", framework="torch").steps_table("preprocess")
    assert list(table.columns) == ["step", "op", "argument", "value"] and not table.isna().any().any()
    assert table[table["op"] == "resize"][["argument", "value"]].values.tolist() == [["size", "256"],
                                                                                     ["interpolation", "bilinear"]]
    assert str(parse_manifest(GOOD).preprocess[0]) == "resize(size=36, interpolation=bilinear)"
