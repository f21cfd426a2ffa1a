"""Kept converters on a small real CNN of this test's own (not in the zoo): PyTorch -> ONNX -> TensorFlow with the same
top-1 and logits within 1e-4, cached with sha256 checksums, layers aligned by the export's own scope names so the
divergence compares every layer; Keras -> ONNX through tf2onnx; unsupported ops named per node."""
from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
ort = pytest.importorskip("onnxruntime")
keras = pytest.importorskip("keras")

from mlms_nb.frameworks.converters import ConversionError, read_record, to_onnx, to_tensorflow  # noqa: E402
from tests.data.byom_cnn import seeded  # noqa: E402 - the SmallCNN of the tests' own


@pytest.fixture(scope="module")
def cnn():
    return seeded()


@pytest.fixture(scope="module")
def inputs():
    x = np.random.default_rng(0).standard_normal((8, 3, 32, 32)).astype(np.float32)
    return x * np.linspace(0.2, 3.0, 8, dtype=np.float32)[:, None, None, None]  # inputs of different scales


@pytest.fixture(scope="module")
def copies(cnn, inputs, tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MLMS_HOME", str(tmp_path_factory.mktemp("home")))
        onnx_path = to_onnx(cnn, inputs[:1], label="small_cnn")
        keras_path = to_tensorflow(onnx_path)
        yield onnx_path, keras_path


def test_same_top1_and_logits_in_torch_onnxruntime_and_tensorflow(cnn, inputs, copies):
    onnx_path, keras_path = copies
    with torch.no_grad():
        expected = cnn(torch.from_numpy(inputs)).numpy()
    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    from_ort = session.run(None, {session.get_inputs()[0].name: inputs})[0]
    model = keras.models.load_model(str(keras_path), compile=False)  # standard layers only: no custom objects
    from_tf = np.asarray(model(inputs.transpose(0, 2, 3, 1), training=False))
    for name, out in (("onnxruntime", from_ort), ("tensorflow", from_tf)):
        assert np.max(np.abs(out - expected)) <= 1e-4, name
        assert (out.argmax(1) == expected.argmax(1)).all(), name
    assert len(set(expected.argmax(1))) > 1  # the classes differ between inputs: top-1 is really compared


def test_conversions_are_recorded_and_cached_by_checksum(cnn, inputs, copies):
    from mlms_nb._fs import sha256_file

    onnx_path, keras_path = copies
    record = read_record(onnx_path)
    assert record["route"] == "legacy" and record["attempts"][0]["ok"] and record["max_abs_diff"] < 1e-5
    assert record["sha256"] == sha256_file(onnx_path, memo=False) and "stem.0" in record["module_names"]
    keras_record = read_record(keras_path)
    assert keras_record["source_sha256"] == record["sha256"] and keras_record["route"] == "onnx_keras_port"
    mtime = keras_path.stat().st_mtime_ns
    assert to_tensorflow(onnx_path) == keras_path and keras_path.stat().st_mtime_ns == mtime  # reused
    keras_path.write_bytes(keras_path.read_bytes() + b"tampered")
    assert to_tensorflow(onnx_path) == keras_path  # the checksum no longer matches: rebuilt
    assert read_record(keras_path)["sha256"] == sha256_file(keras_path, memo=False)


def test_layers_align_by_the_exports_own_names(cnn, inputs, copies):
    from mlms_nb.divergence.modules import diverge_module

    onnx_path, keras_path = copies
    result = diverge_module(cnn, inputs, onnx_path=onnx_path, keras_path=keras_path, name="small_cnn")
    layers = result.layers
    # every module call two frameworks have: a conv and its BatchNorm are one row (the exporter folds them; the
    # Keras port has the folded conv), the shared ReLU6 is two rows (two calls)
    assert list(layers["layer"]) == ["stem.1", "stem.2", "stem.3", "bn", "act", "act#1", "pool", "head"]
    errors = layers.filter(like="max_rel_error")
    assert errors.shape[1] == 3 and errors.notna().all().all() and (errors.to_numpy() <= 1e-4).all()
    assert set(result.first_divergent_layer.values()) == {None}
    assert (result.outputs["top1_agreement"] == 1.0).all()
    assert "small_cnn" in result.to_text()


def test_a_model_with_an_unported_op_names_it(tmp_path, monkeypatch):
    monkeypatch.setenv("MLMS_HOME", str(tmp_path))

    class Odd(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 4, 1)

        def forward(self, x):
            return torch.sin(self.conv(x)).mean(dim=(2, 3))

    onnx_path = to_onnx(Odd().eval(), torch.zeros(1, 3, 8, 8), label="odd")
    with pytest.raises(ConversionError, match=r"odd: no Keras equivalent .* /Sin \(Sin\)"):
        to_tensorflow(onnx_path)


def test_keras_to_onnx_with_tf2onnx(tmp_path, monkeypatch):
    pytest.importorskip("tf2onnx")
    monkeypatch.setenv("MLMS_HOME", str(tmp_path))
    keras.utils.set_random_seed(0)
    x_in = keras.Input((16, 16, 3))
    y = keras.layers.Conv2D(8, 3, padding="same", name="conv")(x_in)
    y = keras.layers.BatchNormalization(name="bn")(y)
    y = keras.layers.ReLU(name="relu")(y)
    y = keras.layers.GlobalAveragePooling2D(name="pool")(y)
    model = keras.Model(x_in, keras.layers.Dense(5, name="fc")(y))
    path = tmp_path / "mine.keras"
    model.save(path)
    onnx_path = to_onnx(path)
    record = read_record(onnx_path)
    assert record["route"] == "tf2onnx" and record["max_abs_diff"] <= 1e-4
    x = np.random.default_rng(1).standard_normal((3, 16, 16, 3)).astype(np.float32)
    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(session.run(None, {session.get_inputs()[0].name: x})[0], np.asarray(model(x)),
                               atol=1e-4)


def test_untrusted_code_files_are_refused(tmp_path):
    script = tmp_path / "m.pt"
    torch.jit.script(torch.nn.ReLU()).save(str(script))
    with pytest.raises(ConversionError, match="trust=True"):
        to_onnx(script, torch.zeros(1, 3))
    with pytest.raises(ConversionError, match="does not exist"):
        to_onnx(tmp_path / "missing.onnx")
    assert json.dumps(read_record(tmp_path / "nothing.onnx")) == "{}"


@pytest.mark.slow  # ~11 s: torch.export and onnxscript's rewriter, first use in the process
def test_dynamo_export_lines_up_like_the_legacy_one(cnn, inputs, tmp_path, monkeypatch):
    pytest.importorskip("onnxscript")
    from mlms_nb.divergence.modules import diverge_module

    monkeypatch.setenv("MLMS_HOME", str(tmp_path))
    onnx_path = to_onnx(cnn, inputs[:1], routes=("dynamo",), label="small_cnn")
    assert read_record(onnx_path)["route"] == "dynamo"
    result = diverge_module(cnn, inputs, onnx_path=onnx_path, name="small_cnn")
    assert list(result.layers["layer"]) == ["stem.1", "stem.2", "stem.3", "bn", "act", "act#1", "pool", "head"]
    assert (result.layers.filter(like="max_rel_error").to_numpy() <= 1e-4).all()
    assert (result.outputs["max_abs_logit_error"] <= 1e-4).all()


def test_converted_manifests_open_and_trace_in_onnxruntime_and_tensorflow(cnn, inputs, copies):
    from mlms_nb.frameworks import open_predictor
    from mlms_nb.frameworks.converters.manifests import converted_manifest
    from mlms_nb.manifest import parse_manifest
    from mlms_nb.schema.levels import TraceLevel
    from mlms_nb.tracing.tracer import Tracer

    onnx_path, keras_path = copies
    source = parse_manifest({
        "name": "small_cnn", "version": "1.0.0", "framework": {"name": "onnxruntime"},
        "inputs": [{"type": "image", "dimensions": [3, 32, 32]}], "outputs": [{"type": "classification"}],
        "preprocess": [{"decode": {"color_mode": "RGB"}}, {"resize": {"size": 32}}, {"center_crop": {"size": 32}}, {"to_layout": {"layout": "NCHW"}}],
        "model": {"graph_path": str(onnx_path)}})
    with torch.no_grad():
        expected = cnn(torch.from_numpy(inputs)).numpy()
    for framework, path, batch in (("onnxruntime", onnx_path, inputs),
                                   ("tensorflow", keras_path, np.ascontiguousarray(inputs.transpose(0, 2, 3, 1)))):
        manifest = converted_manifest(source, framework, path)
        assert manifest.framework.name == framework and manifest.model.sha256["graph_path"]
        with open_predictor(manifest) as predictor:
            np.testing.assert_allclose(predictor.predict(batch), expected, atol=1e-4)
            tracer = Tracer(TraceLevel.FRAMEWORK)
            predictor.start_tracing(tracer)
            predictor.predict(batch[:2])
            predictor.stop_tracing()
        layers = tracer.trace().spans.query("kind == 'layer'")
        if framework == "tensorflow":  # one span per Keras layer call, named after its PyTorch module
            assert {"stem.0", "stem.3", "conv", "act", "head"} <= set(layers["name"])
        else:  # nodes of the optimised graph, each naming the original nodes it stands for
            covered = {n for a in layers["attrs"] for n in json.loads(a)["original_nodes"]}
            import onnx

            assert covered == {n.name for n in onnx.load(str(onnx_path)).graph.node}
    assert converted_manifest(source, "tensorflow", keras_path).inputs[0].dimensions == [32, 32, 3]
