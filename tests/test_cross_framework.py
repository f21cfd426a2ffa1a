"""The same weights in three frameworks give the same answers on the 20 packaged ImageNet photos."""
from __future__ import annotations

import numpy as np
import pytest

from mlms_nb.data.datasets import open_dataset
from mlms_nb.data.transforms import Postprocessor, Preprocessor
from mlms_nb.errors import FrameworkNotInstalledError, PredictorError
from mlms_nb.manifest import find_manifest
from mlms_nb.frameworks import get_predictor_class, open_predictor
from mlms_nb.frameworks import base as predictor_base


def outputs(model: str, framework: str):
    manifest = find_manifest(model, framework=framework)
    dataset = open_dataset("imagenet-samples", manifest)
    batch = next(dataset.iter_batches(len(dataset), Preprocessor(manifest)))
    with open_predictor(manifest) as predictor:
        info = predictor.info()
        logits = predictor.predict(batch.data)
    return logits, Postprocessor(manifest)(logits), batch.labels, info


@pytest.fixture(scope="module")
def lite0(tmp_path_factory):
    from tests.conftest import SESSION_HOME

    mp = pytest.MonkeyPatch()
    SESSION_HOME.mkdir(parents=True, exist_ok=True)
    mp.setenv("MLMS_HOME", str(SESSION_HOME))
    try:
        yield {fw: outputs("efficientnet_lite0", fw) for fw in ("torch", "onnxruntime", "tensorflow")}
    finally:
        mp.undo()


def test_reference_accuracy(lite0):
    _, pred, labels, info = lite0["torch"]
    assert info.framework == "torch" and info.framework_version.startswith("2.13")
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
    import importlib

    real = importlib.import_module

    def no_tensorflow(name, *args, **kwargs):
        if name == "tensorflow":
            raise ImportError("No module named 'tensorflow'")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(predictor_base.importlib, "import_module", no_tensorflow)
    monkeypatch.delitem(predictor_base._REGISTERED, "tensorflow", raising=False)
    with pytest.raises(FrameworkNotInstalledError) as info:
        get_predictor_class("tensorflow")
    assert str(info.value) == "tensorflow is not installed: pip install 'mlms-nb[tf]'"


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
    with open_predictor(manifest) as predictor:
        assert predictor.info().details["kind"] == "torchscript"
        logits = predictor.predict(batch.data)
    assert np.abs(logits - lite0["torch"][0]).max() <= 1e-4
    shutil.rmtree(tmp_path, ignore_errors=True)
