"""A Keras model (or a SavedModel) -> ONNX with tf2onnx (``pip install 'mlms-nb[convert]'``).

``tf2onnx.convert.from_function`` traces ``model(x, training=False)`` for one float input with a dynamic batch
axis; the graph keeps the model's layout (NHWC for Keras image models). Node names follow the Keras layer
names (``functional_1/<layer>_1/Relu``): this route does not give PyTorch-scoped names.
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from mlms_nb._optional import require
from mlms_nb.frameworks.converters.torch_onnx import Attempt, ConversionError, OnnxExport

TF2ONNX_OPSET = 17


def load_keras_file(path: Path, trust: bool = False):
    """A ``.keras`` file (safe mode unless trusted: no Lambda code runs) or, trusted only, a SavedModel folder."""
    keras = require("keras")
    if path.is_dir():
        if not trust:
            raise ConversionError(f"{path} is a SavedModel, whose graph functions run as code: convert it with "
                                  "trust=True (--trust) if you trust its source")
        return keras.layers.TFSMLayer(str(path), call_endpoint="serving_default")
    return keras.models.load_model(str(path), compile=False, safe_mode=not trust)


def keras_to_onnx(model, out: Path, label: str = "model", tolerance: float = 1e-4) -> OnnxExport:
    """Convert a Keras model (one float input) to ``out``; checks ONNX Runtime against Keras on random inputs."""
    tf = require("tensorflow")
    tf2onnx = require("tf2onnx")
    ort = require("onnxruntime")
    started = time.perf_counter()
    shape = tuple(model.inputs[0].shape[1:]) if getattr(model, "inputs", None) else None
    if shape is None or any(d is None for d in shape):
        raise ConversionError(f"{label}: tf2onnx needs a model whose input has a fixed shape after the batch axis")
    try:
        spec = (tf.TensorSpec((None, *shape), tf.float32, name="input"),)
        fn = tf.function(lambda t: model(t, training=False))
        tf2onnx.convert.from_function(fn, input_signature=spec, opset=TF2ONNX_OPSET, output_path=str(out))
        x = np.random.default_rng(0).standard_normal((2, *shape)).astype(np.float32)
        expected = np.asarray(model(x, training=False))
        session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
        actual = session.run(None, {session.get_inputs()[0].name: x})[0]
        diff = float(np.max(np.abs(actual - expected)))
    except Exception as err:  # noqa: BLE001 - the converter's own error, named
        line = next((x for x in str(err).splitlines() if x.strip()), "")
        attempt = Attempt("tf2onnx", False, time.perf_counter() - started, f"{type(err).__name__}: {line[:300]}")
        raise ConversionError(f"{label}: tf2onnx could not convert it ({attempt.error})") from None
    scale = max(1.0, float(np.max(np.abs(expected))))
    attempt = Attempt("tf2onnx", diff <= tolerance * scale, time.perf_counter() - started, "", diff)
    if not attempt.ok:
        raise ConversionError(f"{label}: tf2onnx's graph differs from Keras by {diff:.3g} on random inputs")
    return OnnxExport(out, "tf2onnx", [attempt], [], diff)
