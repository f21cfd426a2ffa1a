"""Bad model files give one sentence naming the file and the framework (issue 12 item 5), never a raw
IndexError / UnpicklingError / RuntimeError; a file of another framework is refused with the fix."""
from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest

from mlms_nb import cli
from mlms_nb.errors import ModelFileError, MlmsError, UntrustedError
from mlms_nb.frameworks import PredictorOptions, open_predictor
from mlms_nb.manifest import load_manifest

GARBAGE = os.urandom(4096)


def _manifest(folder: Path, framework: str, model: str, name: str = "m.yaml", dims=(3, 8, 8), layout="NCHW") -> Path:
    path = folder / name
    path.write_text(textwrap.dedent(f"""\
        name: bad
        framework: {{name: {framework}}}
        inputs: [{{type: tensor, layout: {layout}, dimensions: {list(dims)}}}]
        outputs: [{{type: tensor}}]
        model: {model}
        """))
    return path


def _open(path: Path, trust: bool = True):
    return open_predictor(load_manifest(path), options=PredictorOptions(trust=trust))


def _refused(path: Path, file: Path, framework_words: str, trust: bool = True) -> str:
    with pytest.raises(ModelFileError) as info:
        _open(path, trust)
    message = str(info.value)
    assert str(file) in message and framework_words in message and "\n" not in message, message
    return message


def test_torch_files(tmp_path, mlms_home):
    torch = pytest.importorskip("torch")
    (tmp_path / "garbage.pt").write_bytes(GARBAGE)
    _refused(_manifest(tmp_path, "torch", "{graph_path: garbage.pt}"), tmp_path / "garbage.pt", "PyTorch")
    _refused(_manifest(tmp_path, "torch", "{graph_path: garbage.pt}"), tmp_path / "garbage.pt", "PyTorch", trust=False)

    scripted = tmp_path / "whole.pt"
    torch.jit.script(torch.nn.Linear(4, 2)).save(str(scripted))
    (tmp_path / "truncated.pt").write_bytes(scripted.read_bytes()[: scripted.stat().st_size // 2])
    _refused(_manifest(tmp_path, "torch", "{graph_path: truncated.pt}"), tmp_path / "truncated.pt", "PyTorch")
    (tmp_path / "garbage.pt2").write_bytes(GARBAGE)
    _refused(_manifest(tmp_path, "torch", "{graph_path: garbage.pt2}"), tmp_path / "garbage.pt2", "PyTorch")

    # weights: random bytes, a truncated safetensors file, a pickle that would run os.system
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "tiny_linear.py").write_text("import torch\n\ndef build():\n    return torch.nn.Linear(192, 4)\n")
    for name, data in (("garbage.pth", GARBAGE), ("garbage.safetensors", GARBAGE[:100])):
        (package / name).write_bytes(data)
        manifest = _manifest(package, "torch", f"{{entrypoint: 'tiny_linear:build', weights_path: {name}}}",
                             name=f"{name}.yaml")
        _refused(manifest, package / name, "PyTorch")

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {tmp_path / 'pwned'}",))

    torch.save({"weight": Evil()}, str(package / "evil.pth"))
    _refused(_manifest(package, "torch", "{entrypoint: 'tiny_linear:build', weights_path: evil.pth}", "evil.yaml"),
             package / "evil.pth", "PyTorch")
    assert not (tmp_path / "pwned").exists()
    torch.save(torch.nn.Linear(3, 4).state_dict(), str(package / "other.pth"))  # weights of another module
    with pytest.raises(ModelFileError, match="does not fit the module"):
        _open(_manifest(package, "torch", "{entrypoint: 'tiny_linear:build', weights_path: other.pth}", "o.yaml"))

    # weights given as a graph, a folder, and a file of another framework
    _refused(_manifest(package, "torch", "{graph_path: other.pth}", "w.yaml"), package / "other.pth", "weights_path")
    (tmp_path / "folder").mkdir()
    _refused(_manifest(tmp_path, "torch", "{graph_path: folder}"), tmp_path / "folder", "PyTorch")
    (tmp_path / "model.onnx").write_bytes(GARBAGE)
    message = _refused(_manifest(tmp_path, "torch", "{graph_path: model.onnx}"), tmp_path / "model.onnx", "ONNX")
    assert "framework.name: onnxruntime" in message


def test_onnx_files(tmp_path, mlms_home):
    pytest.importorskip("onnxruntime")
    (tmp_path / "garbage.onnx").write_bytes(GARBAGE)
    _refused(_manifest(tmp_path, "onnxruntime", "{graph_path: garbage.onnx}"), tmp_path / "garbage.onnx", "ONNX Runtime")
    (tmp_path / "model.keras").write_bytes(GARBAGE)
    message = _refused(_manifest(tmp_path, "onnxruntime", "{graph_path: model.keras}"), tmp_path / "model.keras",
                       "ONNX Runtime")
    assert "framework.name: tensorflow" in message


def test_tensorflow_files(tmp_path, mlms_home):
    pytest.importorskip("tensorflow")
    import keras

    (tmp_path / "garbage.keras").write_bytes(GARBAGE)
    _refused(_manifest(tmp_path, "tensorflow", "{graph_path: garbage.keras}"), tmp_path / "garbage.keras", "TensorFlow")
    (tmp_path / "not_saved").mkdir()
    (tmp_path / "not_saved" / "readme.txt").write_text("no saved_model.pb here")
    _refused(_manifest(tmp_path, "tensorflow", "{graph_path: not_saved}"), tmp_path / "not_saved", "SavedModel")

    inputs = keras.Input((4, 4, 3))
    plain = keras.Model(inputs, keras.layers.Dense(2)(keras.layers.Flatten()(inputs)))
    plain.save(str(tmp_path / "plain.keras"))
    whole = (tmp_path / "plain.keras").read_bytes()
    (tmp_path / "truncated.keras").write_bytes(whole[: len(whole) // 2])
    _refused(_manifest(tmp_path, "tensorflow", "{graph_path: truncated.keras}", dims=(4, 4, 3), layout="NHWC"),
             tmp_path / "truncated.keras", "TensorFlow")
    # a Keras file of standard layers is data: it loads without trust
    _open(_manifest(tmp_path, "tensorflow", "{graph_path: plain.keras}", dims=(4, 4, 3), layout="NHWC"), False).close()

    target = tmp_path / "lambda_ran"
    lam = keras.Model(inputs, keras.layers.Lambda(lambda x: x * 2.0)(inputs))
    lam.save(str(tmp_path / "lambda.keras"))
    manifest = _manifest(tmp_path, "tensorflow", "{graph_path: lambda.keras}", "lam.yaml", (4, 4, 3), "NHWC")
    with pytest.raises(UntrustedError, match="Lambda") as refused:
        _open(manifest, trust=False)
    assert str((tmp_path / "lambda.keras").resolve()) in str(refused.value)
    _open(manifest, trust=True).close()
    assert not target.exists()


def test_wrong_framework_for_a_manifest_path(tmp_path, mlms_home, capsys):
    manifest = _manifest(tmp_path, "torch", "{graph_path: whatever.pt}")
    assert cli.main(["eval", str(manifest), "--framework", "onnxruntime", "--no-history"]) == 2
    err = capsys.readouterr().err
    assert "is for framework torch" in err and "--framework" in err
    import mlms_nb

    with pytest.raises(MlmsError, match="is for framework torch"):
        mlms_nb.evaluate(str(manifest), framework="torch,onnxruntime")
    (tmp_path / "model.onnx").write_bytes(GARBAGE)  # a model file where a manifest is expected
    assert cli.main(["eval", str(tmp_path / "model.onnx")]) == 2
    assert "is a model file, not a manifest" in capsys.readouterr().err


def test_keras_entrypoint_and_live_model(tmp_path, mlms_home):
    """A Keras model built by an entrypoint (with .weights.h5 weights) and the same model as a live object agree."""
    pytest.importorskip("tensorflow")
    import keras
    import numpy as np

    from mlms_nb.frameworks.live import manifest_for

    (tmp_path / "tiny_keras.py").write_text(textwrap.dedent("""\
        import keras

        def build(units=3):
            inputs = keras.Input((4, 4, 3))
            return keras.Model(inputs, keras.layers.Dense(units)(keras.layers.Flatten()(inputs)))
        """))
    import importlib.util
    spec = importlib.util.spec_from_file_location("tiny_keras_check", tmp_path / "tiny_keras.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    live = module.build(units=3)
    live.save_weights(str(tmp_path / "tiny.weights.h5"))
    manifest = _manifest(tmp_path, "tensorflow", "{entrypoint: 'tiny_keras:build', entrypoint_args: {units: 3}, "
                                                 "weights_path: tiny.weights.h5}", dims=(4, 4, 3), layout="NHWC")
    with pytest.raises(UntrustedError, match="entrypoint tiny_keras:build"):
        _open(manifest, trust=False)
    batch = np.random.default_rng(0).random((2, 4, 4, 3), dtype=np.float32)
    built = _open(manifest, trust=True)
    from_live = open_predictor(manifest_for(live, inputs=batch))
    np.testing.assert_allclose(built.predict(batch), from_live.predict(batch), atol=1e-6)
    assert isinstance(from_live.native_model, keras.Model)
    built.close()
    from_live.close()
