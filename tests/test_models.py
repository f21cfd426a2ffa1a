"""The model zoo: the same EfficientNet-Lite weights in PyTorch, ONNX Runtime and Keras; conversion cache; ResNet-50."""
from __future__ import annotations

import json
import logging
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("efficientnet_lite_pytorch")

from mlms_nb._fs import sha256_file  # noqa: E402
from mlms_nb.errors import AssetError, PredictorError  # noqa: E402
from mlms_nb.manifest import find_manifest  # noqa: E402
from mlms_nb.frameworks import convert as conv  # noqa: E402
from mlms_nb.naming import keras_layer_to_torch_name, onnx_node_to_torch_name, torch_to_keras_name  # noqa: E402
from mlms_nb.zoo.registry import ARCHITECTURES, build_keras_model, build_torch_model  # noqa: E402

pytestmark = pytest.mark.filterwarnings(
    "ignore:__array__ implementation doesn't accept a copy keyword:DeprecationWarning")  # inside Keras

TOLERANCE = 1e-4  # max |logit difference| allowed between frameworks


@pytest.fixture(scope="module", autouse=True)
def fresh_home(tmp_path_factory):
    """An empty MLMS_HOME of this module's own: the conversions here are built from scratch (and one tampered with),
    never the session's shared artifacts."""
    home = tmp_path_factory.mktemp("mlms_home")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MLMS_HOME", str(home))
        yield home


def _weights(name: str) -> str:
    m = find_manifest(name, framework="torch")
    return str(conv._source_weights(m)[0])


def _inputs(size: int, batch: int = 2, seed: int = 0) -> np.ndarray:
    """Random 0..255 pixels, normalised (x - 127) / 128, NCHW float32."""
    pixels = np.random.default_rng(seed).uniform(0, 255, (batch, 3, size, size))
    return ((pixels - 127.0) / 128.0).astype(np.float32)


@pytest.fixture(scope="module")
def lite0_torch():
    return build_torch_model("efficientnet_lite0", _weights("efficientnet_lite0"))


@pytest.fixture(scope="module")
def lite1_torch():
    return build_torch_model("efficientnet_lite1", _weights("efficientnet_lite1"))


@pytest.fixture(scope="module")
def lite1_keras():
    pytest.importorskip("keras")
    return build_keras_model("efficientnet_lite1", _weights("efficientnet_lite1"))


@pytest.fixture(scope="module")
def lite0_onnx():
    pytest.importorskip("onnxruntime")
    return conv.convert("efficientnet_lite0", to="onnxruntime")


# ----------------------------------------------------------------------------- PyTorch

@pytest.mark.filterwarnings("ignore:`torch.jit.trace:DeprecationWarning")
def test_torch_lite_models_classify_and_trace(lite0_torch):
    x = torch.from_numpy(_inputs(224))
    with torch.inference_mode():
        out = lite0_torch(x)
    assert out.shape == (2, 1000) and torch.isfinite(out).all()
    assert not lite0_torch.training
    traced = torch.jit.trace(lite0_torch, x[:1], check_trace=False)
    with torch.inference_mode():
        assert torch.allclose(traced(x), out, atol=1e-5)


def test_resnet50_shape_and_deterministic():
    x = torch.from_numpy(_inputs(224, seed=1) * 2)
    a, b = build_torch_model("resnet50"), build_torch_model("resnet50")
    with torch.inference_mode():
        ya, yb = a(x), b(x)
    assert ya.shape == (2, 1000)
    assert torch.equal(ya, yb)
    assert sum(p.numel() for p in a.parameters()) == 25_557_032
    assert ARCHITECTURES["resnet50"].build_keras is None
    with pytest.raises(PredictorError, match="no Keras definition"):
        build_keras_model("resnet50")


def test_unknown_architecture_lists_known_ones():
    with pytest.raises(PredictorError, match="efficientnet_lite0, efficientnet_lite1, efficientnet_lite2, resnet50"):
        build_torch_model("mobilenet_v9")


# ----------------------------------------------------------------------------- Keras

def test_keras_lite1_matches_torch(lite1_torch, lite1_keras):
    x = _inputs(240)
    with torch.inference_mode():
        expected = lite1_torch(torch.from_numpy(x)).numpy()
    actual = np.asarray(lite1_keras(x.transpose(0, 2, 3, 1), training=False))
    diff = float(np.abs(actual - expected).max())
    print(f"efficientnet_lite1 keras vs torch: max |diff| = {diff:.2e}")
    assert diff <= TOLERANCE


def test_keras_lite0_artifact_reloads_and_matches_torch():
    pytest.importorskip("keras")
    diff = conv.compare_with_torch("efficientnet_lite0", "tensorflow", _inputs(224))
    print(f"efficientnet_lite0 keras (saved .keras) vs torch: max |diff| = {diff:.2e}")
    assert diff <= TOLERANCE


def test_keras_layer_names_map_to_torch_modules(lite1_torch, lite1_keras):
    modules = dict(lite1_torch.named_modules())
    names = [layer.name for layer in lite1_keras.layers]
    assert "_blocks__3___depthwise_conv" in names
    assert keras_layer_to_torch_name("_blocks__3___depthwise_conv") == "_blocks.3._depthwise_conv"
    missing = [n for n in names if keras_layer_to_torch_name(n) not in modules]
    assert not missing
    assert all(torch_to_keras_name(keras_layer_to_torch_name(n)) == n for n in names)
    # every weight-bearing torch module has its Keras layer
    with_params = {n for n, m in modules.items() if list(m.parameters(recurse=False))}
    assert with_params <= {keras_layer_to_torch_name(n) for n in names}


# ----------------------------------------------------------------------------- ONNX

@pytest.mark.parametrize("name,size", [("efficientnet_lite0", 224), ("efficientnet_lite1", 240)])
def test_onnxruntime_matches_torch(name, size, lite0_onnx):
    diff = conv.compare_with_torch(name, "onnxruntime", _inputs(size, batch=3))  # batch axis is dynamic
    print(f"{name} onnxruntime vs torch: max |diff| = {diff:.2e}")
    assert diff <= TOLERANCE


def test_onnx_graph_is_checked_and_nodes_map_to_torch_modules(lite0_onnx, lite0_torch):
    import onnx

    model = onnx.load(str(lite0_onnx.path))
    onnx.checker.check_model(model)
    assert [i.name for i in model.graph.input] == ["input"]
    assert [o.name for o in model.graph.output] == ["logits"]
    assert model.opset_import[0].version == conv.OPSET
    modules = dict(lite0_torch.named_modules())
    mapped = {n.name: onnx_node_to_torch_name(n.name) for n in model.graph.node}
    assert mapped["/_blocks.0/_depthwise_conv/Conv"] == "_blocks.0._depthwise_conv"
    assert not [n for n, t in mapped.items() if t is None or t not in modules]
    assert sum(n.op_type == "Conv" for n in model.graph.node) == sum(
        isinstance(m, torch.nn.Conv2d) for m in modules.values())


def test_onnx_node_names_with_sequential_and_repeated_calls():
    assert onnx_node_to_torch_name("/layer1/layer1.0/relu_2/Relu") == "layer1.0.relu"
    assert onnx_node_to_torch_name("/layer2/layer2.0/downsample/downsample.0/Conv") == "layer2.0.downsample.0"
    assert onnx_node_to_torch_name("/_blocks.4/_swish_1/Clip") == "_blocks.4._swish"
    assert onnx_node_to_torch_name("/Reshape") == ""
    assert onnx_node_to_torch_name("Constant_7") is None
    assert onnx_node_to_torch_name("/conv_1/Conv", {"", "conv_1"}) == "conv_1"


# ----------------------------------------------------------------------------- the artifact cache

def test_artifact_layout_and_metadata(lite0_onnx, fresh_home):
    path = lite0_onnx.path
    assert path == fresh_home / "artifacts" / "efficientnet_lite0" / "1.0.0" / "onnxruntime" / "model.onnx"
    meta = json.loads((path.parent / "artifact.json").read_text())
    assert meta["sha256"] == lite0_onnx.sha256 == sha256_file(path, memo=False)
    assert meta["source_weights_sha256"] == find_manifest("efficientnet_lite0", framework="torch").model.sha256["weights_path"]
    assert {"torch", "onnx", "opset"} <= set(meta["versions"]) and meta["created_at"]
    assert not [p for p in path.parent.iterdir() if p.name.startswith(".tmp-")]


def test_second_convert_reuses_the_file(lite0_onnx, caplog):
    before = lite0_onnx.path.stat().st_mtime_ns
    with caplog.at_level(logging.INFO, logger="mlms_nb.frameworks.convert"):
        again = conv.convert("efficientnet_lite0", to="onnx")
    assert again == lite0_onnx
    assert again.path.stat().st_mtime_ns == before
    assert "building" not in caplog.text


def test_tampered_artifact_is_rebuilt(lite0_onnx, caplog):
    with open(lite0_onnx.path, "r+b") as f:
        f.seek(1000)
        f.write(b"tampered")
    with caplog.at_level(logging.INFO, logger="mlms_nb.frameworks.convert"):
        rebuilt = conv.convert("efficientnet_lite0", to="onnxruntime")
    assert "rebuilding" in caplog.text and "building" in caplog.text
    assert rebuilt.path == lite0_onnx.path
    assert sha256_file(rebuilt.path, memo=False) == rebuilt.sha256
    assert rebuilt.sha256 == lite0_onnx.sha256  # the export is deterministic


def test_resolve_artifact_uri(lite0_onnx):
    assert conv.resolve_artifact_uri("artifact://efficientnet_lite0/onnxruntime") == lite0_onnx.path
    with pytest.raises(AssetError, match="artifact://MODEL_NAME/FRAMEWORK"):
        conv.resolve_artifact_uri("artifact://efficientnet_lite0")
    with pytest.raises(AssetError, match="cannot convert to 'caffe'"):
        conv.resolve_artifact_uri("artifact://efficientnet_lite0/caffe")


def test_a_missing_framework_names_its_extra(monkeypatch):
    from mlms_nb.errors import FrameworkNotInstalledError

    monkeypatch.setitem(sys.modules, "keras", None)  # what Python does for a module that cannot be imported
    with pytest.raises(FrameworkNotInstalledError, match=r"^building efficientnet_lite0 in Keras needs Keras, which "
                                                         r"is not installed: pip install 'mlms-nb\[tf\]'$"):
        build_keras_model("efficientnet_lite0")
