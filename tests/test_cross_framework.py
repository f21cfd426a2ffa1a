"""The same weights in three frameworks give the same answers on the 20 packaged ImageNet photos."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from mlms_nb.data.datasets import open_dataset
from mlms_nb.data.transforms import Postprocessor, Preprocessor
from mlms_nb.errors import FrameworkNotInstalledError, PredictorError
from mlms_nb.frameworks import base as predictor_base
from mlms_nb.frameworks import PredictorOptions, get_predictor_class, open_predictor
from mlms_nb.manifest import find_manifest


def outputs(model: str, framework: str):
    manifest = find_manifest(model, framework=framework)
    dataset = open_dataset("imagenet-samples", manifest)
    batch = next(dataset.iter_batches(len(dataset), Preprocessor(manifest)))
    with open_predictor(manifest) as predictor:
        info = predictor.info()
        logits = predictor.predict(batch.data)
    return logits, Postprocessor(manifest)(logits), batch.labels, info


@pytest.fixture(scope="module")
def lite0(models_home):
    return {fw: outputs("efficientnet_lite0", fw) for fw in ("torch", "onnxruntime", "tensorflow")}


def test_reference_accuracy(lite0):
    _, pred, labels, info = lite0["torch"]
    assert info.framework == "torch" and info.framework_version.startswith("2.13")
    assert str(info).startswith(f"torch {info.framework_version} on cpu, ") and "PredictorInfo(" not in str(info)
    top1 = np.mean(pred.top_k_indices[:, 0] == labels)
    assert len(labels) == 20 and top1 >= 0.85


@pytest.mark.parametrize("framework", ["onnxruntime", "tensorflow"])
def test_same_answers_as_pytorch(lite0, framework):
    ref_logits, ref_pred, _, _ = lite0["torch"]
    logits, pred, _, info = lite0[framework]
    assert info.framework == framework
    assert logits.shape == ref_logits.shape == (20, 1000)
    assert np.abs(logits - ref_logits).max() <= 1e-4
    np.testing.assert_array_equal(pred.top_k_indices[:, 0], ref_pred.top_k_indices[:, 0])
    np.testing.assert_array_equal(pred.top_k_indices, ref_pred.top_k_indices)


def test_missing_framework_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorflow", None)  # what Python does for a module that cannot be imported
    monkeypatch.delitem(predictor_base._REGISTERED, "tensorflow", raising=False)
    with pytest.raises(FrameworkNotInstalledError) as info:
        get_predictor_class("tensorflow")
    assert str(info.value) == ("running a model in tensorflow needs TensorFlow, which is not installed: "
                               "pip install 'mlms-nb[tf]'")


@pytest.mark.parametrize("framework", ["torch", "onnxruntime", "tensorflow"])
def test_the_contract_declares_what_callers_read(lite0, framework):
    """native_model, artifact_path and capture() are declared on Predictor and given by every framework; a
    capture keys layer outputs by PyTorch module call, and after close() nothing is held."""
    manifest = find_manifest("efficientnet_lite0", framework=framework)
    predictor = open_predictor(manifest)
    for name in ("native_model", "artifact_path", "capture", "tracing_levels", "start_tracing", "stop_tracing"):
        assert hasattr(predictor_base.Predictor, name)
    assert predictor.native_model is not None
    assert predictor.artifact_path and Path(predictor.artifact_path).exists()
    batch = next(open_dataset("imagenet-samples", find_manifest("efficientnet_lite0", framework="torch"))
                 .iter_batches(1, Preprocessor(find_manifest("efficientnet_lite0", framework="torch")))).data
    capture = predictor.capture()
    try:
        assert ("_fc", 0) in capture.keys and ("_blocks.3._depthwise_conv", 0) in capture.keys
        outs, logits = capture.run(batch, [("_fc", 0), ("_blocks.3._depthwise_conv", 0)])
        assert logits.shape == (1, 1000) and outs[("_fc", 0)].shape == (1, 1000)
        assert outs[("_blocks.3._depthwise_conv", 0)].ndim == 4  # NCHW, whatever the framework's layout
        np.testing.assert_allclose(outs[("_fc", 0)], lite0["torch"][0][:1], rtol=1e-4, atol=1e-4)
    finally:
        capture.close()
        predictor.close()
    assert predictor.native_model is None and predictor.artifact_path == ""
    with pytest.raises(PredictorError, match="after close"):
        predictor.capture()


def test_unknown_framework_and_device():
    with pytest.raises(PredictorError, match="unknown framework 'mxnet'"):
        get_predictor_class("mxnet")
    manifest = find_manifest("efficientnet_lite0", framework="torch")
    with pytest.raises(PredictorError, match="sees no CUDA device"):
        open_predictor(manifest, device="cuda")


def test_torchscript_manifest_runs_the_same_model(tmp_path, lite0):
    """A TorchScript file named by graph_path (relative to its manifest) gives the eager model's logits."""
    import shutil

    import torch
    import yaml

    from mlms_nb.data.assets import resolve_asset, sha256_file
    from mlms_nb.zoo.registry import build_torch_model

    eager = find_manifest("efficientnet_lite0", framework="torch")
    model = build_torch_model("efficientnet_lite0", str(resolve_asset(eager.model.weights_path)))
    traced = torch.jit.trace(model, torch.zeros(1, 3, 224, 224))
    traced.save(str(tmp_path / "lite0.pt"))
    data = eager.to_dict()
    data["outputs"][0]["labels"] = str(resolve_asset("../labels/imagenet1k.txt", base_dir=resolve_asset(eager.source).parent))
    data["model"] = {"graph_path": "lite0.pt", "sha256": {"graph_path": sha256_file(tmp_path / "lite0.pt")}}
    (tmp_path / "lite0_ts.yaml").write_text(yaml.safe_dump(data))
    manifest = find_manifest(str(tmp_path / "lite0_ts.yaml"))
    dataset = open_dataset("imagenet-samples", manifest)
    batch = next(dataset.iter_batches(len(dataset), Preprocessor(manifest)))
    with open_predictor(manifest, options=PredictorOptions(trust=True)) as predictor:  # TorchScript needs trust
        assert predictor.info().details["kind"] == "torchscript"
        assert predictor.artifact_path == str(tmp_path / "lite0.pt")
        with pytest.raises(PredictorError, match="need an eager PyTorch module"):
            predictor.capture()
        logits = predictor.predict(batch.data)
    assert np.abs(logits - lite0["torch"][0]).max() <= 1e-4
    shutil.rmtree(tmp_path, ignore_errors=True)
