"""Framework warnings that matter become one sentence of ours (issue 22, Deliver 2): each entry of the catalogue
is provoked with the real framework where that is cheap on a CPU, or matched against the framework's own message
template in the installed package where only a GPU emits it. The raw text stays in $MLMS_HOME/logs/frameworks.log;
the sentence is stored with the evaluation and shown once."""
from __future__ import annotations

import re
import warnings
from pathlib import Path

import numpy as np
import pytest

import mlms_nb
from mlms_nb._quiet import chatter_log, quiet
from mlms_nb._translate import CATALOGUE, heard_since, mark, translate


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("MLMS_HOME", str(tmp_path))
    monkeypatch.delenv("MLMS_VERBOSE", raising=False)
    return tmp_path


def _heard(block) -> list[str]:
    start = mark()
    with warnings.catch_warnings():
        warnings.simplefilter("default")
        with quiet(label="test"):
            block()
    return heard_since(start)


def _log() -> str:
    return chatter_log().read_text(encoding="utf-8") if chatter_log().exists() else ""


def _package_text(package: str, relative: str, phrase: str) -> str:
    """The text around ``phrase`` in a file of an installed package (a shared library's bytes included)."""
    module = pytest.importorskip(package)
    path = Path(module.__file__).parent / relative
    data = path.read_bytes()
    at = data.find(phrase.encode())
    assert at >= 0, f"{phrase!r} is no longer in {path}: the catalogue entry needs the framework's new wording"
    end = data.find(b"\0", at)
    return data[at:end if end > 0 else at + 400].decode("utf-8", "replace")


def test_onnxruntime_missing_provider_is_one_sentence_and_the_raw_warning_stays_in_the_log(home, capfd):
    ort = pytest.importorskip("onnxruntime")
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper

    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("this onnxruntime has CUDA: the warning is not emitted")
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = home / "identity.onnx"
    onnx.save(model, str(path))
    heard = _heard(lambda: ort.InferenceSession(str(path), providers=["CUDAExecutionProvider",
                                                                       "CPUExecutionProvider"]))
    assert heard == [translate("warning", "UserWarning",
                               "Specified provider 'CUDAExecutionProvider' is not in available provider names")]
    assert heard[0].startswith("onnxruntime: the CUDAExecutionProvider asked for")
    err = capfd.readouterr().err
    assert "Specified provider" not in err and "Specified provider 'CUDAExecutionProvider'" in _log()


def test_keras_layer_built_without_its_input_shape(home, capfd):
    keras = pytest.importorskip("keras")

    class Outer(keras.layers.Layer):
        def __init__(self):
            super().__init__(name="outer_block")
            self.inner = keras.layers.Dense(3)

        def call(self, x):
            return self.inner(x)

    heard = _heard(lambda: Outer().build((None, 4)))
    assert len(heard) == 1 and heard[0].startswith("keras: layer 'outer_block' was built without knowing its input")
    assert "unbuilt state" not in capfd.readouterr().err and "unbuilt state" in _log()


def test_a_nan_or_inf_in_numpy_is_said_once_per_kind(home, capfd):
    def nan_and_inf():
        for _ in range(3):  # said once, however often it happens
            np.array([0.0]) / np.array([0.0])
        np.log(np.zeros(2))
        np.exp(np.array([1e4]))

    heard = _heard(nan_and_inf)
    assert heard == ["a computation produced NaN (numpy: invalid value in divide): outputs, metrics or statistics "
                     "computed from it may be NaN",
                     "a computation gave ±inf (numpy: divide by zero in log): outputs, metrics or statistics computed "
                     "from it may be infinite or NaN",
                     "a computation gave ±inf (numpy: overflow in exp): outputs, metrics or statistics computed from "
                     "it may be infinite or NaN"]
    assert "RuntimeWarning" not in capfd.readouterr().err and "overflow encountered in exp" in _log()


def test_torch_tf32_setting_warning_is_translated(home):
    torch = pytest.importorskip("torch")
    setter = getattr(torch._C, "_set_onednn_allow_tf32", None)
    if setter is None:
        pytest.skip("this torch has no oneDNN TF32 switch")
    before = torch._C._get_onednn_allow_tf32()
    try:
        heard = _heard(lambda: setter(True))
    finally:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            setter(bool(before))
    assert len(heard) == 1 and heard[0].startswith("torch: a TF32 (TensorFloat-32) setting")


@pytest.mark.parametrize("package, relative, phrase, key", [
    ("torch", "lib/libtorch_cpu.so", " does not have a deterministic implementation, but you set "
     "'torch.use_deterministic_algorithms(True, warn_only=True)'", "torch-not-deterministic"),
    ("onnxruntime", next((p.name for p in Path(__import__("importlib").util.find_spec("onnxruntime").origin).parent
                          .joinpath("capi").glob("onnxruntime_pybind11_state*.so")), "capi/missing"),
     "Some nodes were not assigned to the preferred execution providers", "onnxruntime-nodes-not-on-provider"),
    ("keras", "src/layers/layer.py", "was passed an input with a mask attached to it", "keras-mask-dropped"),
])
def test_gpu_only_warnings_match_the_frameworks_own_wording(package, relative, phrase, key):
    """These need a GPU (or an op with no deterministic CPU kernel) to be emitted: the catalogue's phrase is
    checked against the sentence template in the installed framework instead."""
    if package == "onnxruntime" and not relative.startswith("capi/"):
        relative = f"capi/{relative}"
    text = _package_text(package, relative, phrase)
    entry = next(e for e in CATALOGUE if e.key == key)
    if key == "torch-not-deterministic":
        text = "index_add_cuda_" + text
    elif key == "keras-mask-dropped":  # the f-string's pieces, as keras joins them
        source = _package_text(package, relative, "f\"Layer '{self.name}' (of type")
        pieces = re.findall(r'"([^"]*)"', source[:600])
        text = "".join(pieces).replace("{self.name}", "masked").replace("{self.__class__.__name__}", "Dense")
    sentence = entry.match(entry.source, entry.category, text)
    assert sentence is not None and "{" not in sentence, text[:300]


def test_an_evaluation_stores_and_shows_the_sentence_once(home):
    """A live model whose forward pass meets a NaN in numpy: the evaluation's warnings say so in our words, once,
    in its text and in the stored copy; the log keeps numpy's own line."""
    torch = pytest.importorskip("torch")

    class Odd(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(4, 3)

        def forward(self, x):
            np.sqrt(np.array([-1.0]))  # numpy: invalid value encountered in sqrt
            return self.linear(x)

    ev = mlms_nb.evaluate(Odd().eval(), inputs={"type": "tensor", "dimensions": [4]},
                          outputs={"type": "classification", "classes": 3}, dataset="synthetic:4", batch_sizes=[1],
                          warmup=1, min_repeats=2, min_time_s=0, progress=False, history=True)
    sentence = translate("warning", "RuntimeWarning", "invalid value encountered in sqrt")
    assert ev.warnings.count(sentence) == 1 and ev.to_text().count(sentence) == 1
    stored = mlms_nb.load_evaluation(ev.id)
    assert stored.warnings.count(sentence) == 1
    assert "invalid value encountered in sqrt" in _log()


def test_a_warning_heard_in_an_isolated_worker_reaches_the_evaluation(home, tmp_path):
    """With ``isolate=True`` the framework runs in a worker process: what it heard comes back as our sentence, in
    the evaluation's warnings, once; numpy's own line is kept in the log (by the worker)."""
    pytest.importorskip("torch")
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "nanmodel.py").write_text(
        "import numpy as np\nimport torch\n\n\n"
        "class Odd(torch.nn.Module):\n"
        "    def __init__(self):\n        super().__init__()\n        self.linear = torch.nn.Linear(4, 3)\n\n"
        "    def forward(self, x):\n        np.log(np.array([-1.0]))  # numpy: invalid value encountered in log\n"
        "        return self.linear(x)\n\n\n"
        "def build():\n    return Odd().eval()\n")
    (folder / "odd.yaml").write_text(
        "name: odd\nframework: {name: torch}\ninputs: [{type: tensor, dimensions: [4]}]\n"
        "outputs: [{type: classification, classes: 3}]\nmodel: {entrypoint: 'nanmodel:build'}\n")
    ev = mlms_nb.evaluate(str(folder / "odd.yaml"), trust=True, isolate=True, dataset="synthetic:4", batch_sizes=[1],
                          warmup=1, min_repeats=2, min_time_s=0, progress=False, history=True)
    sentence = translate("warning", "RuntimeWarning", "invalid value encountered in log")
    assert ev.complete and ev.warnings.count(sentence) == 1
    assert mlms_nb.load_evaluation(ev.id).warnings.count(sentence) == 1
    assert "invalid value encountered in log" in _log()


def test_torchs_own_log_lines_stay_in_the_log(home):
    """torch's loggers print through handlers of torch's own, in glog's format with a path (the ONNX exporter's
    "torchvision is not installed" lines), set up when torch is first imported, inside the block or before it:
    kept back like the C++ lines, not shown."""
    pytest.importorskip("torch")
    import os
    import subprocess
    import sys

    say = ("logging.getLogger('torch.onnx._internal.exporter._registration').warning("
           "'torchvision is not installed. Skipping %s', 'torchvision::{}')")
    code = ("import logging\nfrom mlms_nb._quiet import quiet\n"
            "with quiet(label='test'):\n    import torch._logging\n    " + say.format("nms") + "\n"
            "with quiet(label='test'):\n    " + say.format("roi_align") + "\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "MLMS_HOME": str(home)})
    assert "torchvision" not in out.stderr + out.stdout
    assert "Skipping torchvision::nms" in _log() and "Skipping torchvision::roi_align" in _log()
