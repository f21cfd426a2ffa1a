"""`diverge` on a model that has only a PyTorch manifest: its ONNX and TensorFlow copies are converted with the kept
converters and its layers aligned from the export's own names (no per-architecture table, no zoo Keras model)."""
from __future__ import annotations

import numpy as np
import pytest
import yaml

pytest.importorskip("torch")
pytest.importorskip("onnxruntime")
pytest.importorskip("keras")


@pytest.mark.slow  # ~30-60 s on 2 cores: EfficientNet-Lite0 exported, ported to Keras and compared in 3 frameworks
def test_diverge_converts_and_aligns_a_model_with_only_a_torch_manifest(shared_home, tmp_path, monkeypatch):
    import mlms_nb
    from mlms_nb.frameworks.converters import read_record
    from mlms_nb.manifest import find_manifest
    from mlms_nb.paths import builtin_manifest_dir

    data = find_manifest("efficientnet_lite0", framework="torch").to_dict()
    data["name"] = "my_lite0"
    data["outputs"][0]["labels"] = str(builtin_manifest_dir() / "labels" / "imagenet1k.txt")
    folder = tmp_path / "models" / "my_lite0"
    folder.mkdir(parents=True)
    (folder / "torch.yaml").write_text(yaml.safe_dump(data))
    monkeypatch.setenv("MLMS_MANIFEST_PATH", str(tmp_path / "models"))

    d = mlms_nb.diverge("my_lite0", frameworks="torch,onnxruntime,tensorflow", limit=4, latency_repeats=2)
    assert d.frameworks == ["torch", "onnxruntime", "tensorflow"]
    errors = d.layers.filter(like="max_rel_error")
    assert len(d.layers) > 100 and errors.shape[1] == 3
    both = errors.notna().all(axis=1)  # rows all three have: every layer but the convs folded into a BatchNorm
    assert both.mean() > 0.9 and (errors[both].to_numpy() < 1e-3).all()
    assert (d.outputs["top1_agreement"] == 1.0).all() and (d.outputs["max_abs_logit_error"] <= 1e-4).all()
    assert set(d.first_divergent_layer.values()) == {None}
    assert np.isfinite(d.latency["total_ms"]).all()
    onnx_copy = d.traces["onnxruntime"].metadata
    assert onnx_copy["onnxruntime.graph"]["unmapped_nodes"] == 0
    records = [read_record(p) for p in shared_home.glob("artifacts/user/*/tensorflow/model.keras")]
    assert "onnx_keras_port" in {r["route"] for r in records if r.get("name") == "my_lite0"}
