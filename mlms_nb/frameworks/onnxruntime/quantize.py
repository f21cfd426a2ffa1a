"""An INT8 copy of a model's ONNX graph: ONNX Runtime static quantization, built once and cached.

``onnxruntime.quantization.quantize_static`` with:

- format **QDQ** (QuantizeLinear/DequantizeLinear pairs around the fp32 ops): the graph keeps the fp32
  node and tensor names, so every int8 tensor maps back to its fp32 tensor and PyTorch module, and ONNX
  Runtime fuses the pairs into QLinearConv/QLinearAdd/... kernels when it loads the model (QOperator would
  rename every node and tensor);
- activations ``QUInt8`` (asymmetric), weights ``QInt8`` per output channel (per-tensor weights ruin the
  depthwise convolutions of EfficientNet-Lite), MinMax calibration;
- calibration data: every photo of the packaged ``imagenet-samples`` dataset, preprocessed as the model's
  manifest says. The same 20 photos are then used to measure accuracy, so the int8 accuracy is, if
  anything, optimistic (no other labelled images ship with the package).

The artifact lives next to the other conversions, ``artifacts_dir()/NAME/VERSION/onnxruntime-int8/model.onnx``,
with an ``artifact.json`` (sha256, the fp32 ONNX's sha256 and path, relative to MLMS_HOME when inside it, the
settings, versions); it is rebuilt when the
fp32 graph, the settings or the file's own sha256 change. Built under the same lock and temp-file rules as
:mod:`mlms_nb.frameworks.convert`. :func:`quantized_manifest` is the ONNX Runtime manifest pointed at it, so the
INT8 copy opens, runs and traces like any model (``open_predictor``).
"""
from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np

from mlms_nb._optional import require
from mlms_nb.errors import PredictorError
from mlms_nb.paths import mlms_home
from mlms_nb.manifest import Manifest
from mlms_nb.frameworks.convert import Artifact, artifact_folder, build_artifact, convert

log = logging.getLogger(__name__)

FRAMEWORK = "onnxruntime-int8"
ALIASES = ("onnxruntime-int8", "ort-int8", "onnx-int8", "int8")
CALIBRATION_DATASET = "imagenet-samples"
SETTINGS = {"format": "QDQ", "activation_type": "QUInt8", "weight_type": "QInt8", "per_channel": True,
            "calibrate_method": "MinMax", "calibration_dataset": CALIBRATION_DATASET}


def _calibration_batch(manifest: Manifest) -> tuple[np.ndarray, list[str]]:
    from mlms_nb.data.datasets import open_dataset
    from mlms_nb.data.transforms import Preprocessor

    dataset = open_dataset(CALIBRATION_DATASET, manifest)
    batch = next(dataset.iter_batches(len(dataset), Preprocessor(manifest)))
    return batch.data, list(batch.ids)


def _quantize(source: Path, out: Path, manifest: Manifest) -> list[str]:
    quantization = require("onnxruntime.quantization", "quantizing a model")
    CalibrationDataReader, QuantFormat, QuantType = (quantization.CalibrationDataReader, quantization.QuantFormat,
                                                     quantization.QuantType)
    data, ids = _calibration_batch(manifest)

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self._items = iter([{"input": data[i:i + 1]} for i in range(len(data))])

        def get_next(self):
            return next(self._items, None)

    quiet = logging.getLogger()
    level = quiet.level
    quiet.setLevel(logging.ERROR)  # "consider pre-processing" warnings: the graph is already folded by convert
    try:
        quantization.quantize_static(str(source), str(out), Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                                     activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
    finally:
        quiet.setLevel(level)
    return ids


def _onnxruntime_manifest(model: str | Manifest) -> Manifest:
    from mlms_nb.manifest import find_manifest

    m = model if isinstance(model, Manifest) else find_manifest(model, framework="onnxruntime")
    return m if m.framework.name == "onnxruntime" else find_manifest(m.name, framework="onnxruntime")


def quantized_manifest(model: str | Manifest) -> Manifest:
    """The model's ONNX Runtime manifest with ``model.graph_path`` set to its INT8 copy (built on first use);
    ``attributes["quantization"]`` holds the settings and ``attributes["quantized_from"]`` the fp32 graph it was
    quantized from (its node names say which layer each quantized tensor belongs to)."""
    m = _onnxruntime_manifest(model)
    artifact, fp32 = _quantized(m, force=False)  # the fp32 graph of this MLMS_HOME, wherever the copy was built
    spec = m.model.model_copy(update={"graph_path": str(artifact.path), "sha256": {"graph_path": artifact.sha256}})
    return m.model_copy(update={"model": spec, "description": f"{m.description} (INT8 copy: {FRAMEWORK})".strip(),
                                "attributes": {**m.attributes, "quantization": dict(SETTINGS),
                                               "quantized_from": str(fp32)}})


def quantized_onnx(model: str | Manifest, force: bool = False) -> Artifact:
    """Build (or reuse) the INT8 ONNX copy of ``model`` (a name or its ``onnxruntime`` manifest)."""
    return _quantized(_onnxruntime_manifest(model), force)[0]


def _recorded(path: Path) -> str:
    """``path`` as artifact.json records it: relative to MLMS_HOME when inside it, so a moved home still reads."""
    try:
        return Path(path).resolve().relative_to(mlms_home().resolve()).as_posix()
    except ValueError:
        return str(path)


def _quantized(m: Manifest, force: bool) -> tuple[Artifact, Path]:
    """The INT8 artifact and the fp32 graph it is (or was just) quantized from, both in this MLMS_HOME."""
    onnxruntime = require("onnxruntime", "quantizing a model")
    try:
        fp32 = convert(m, to="onnxruntime")
    except PredictorError as err:
        raise PredictorError(f"{m.name}: no fp32 ONNX graph to quantize: {err}") from None
    folder = artifact_folder(fp32.name, fp32.version, FRAMEWORK)
    target = folder / "model.onnx"
    source_key = json.dumps({"fp32_sha256": fp32.sha256, **SETTINGS}, sort_keys=True)
    label = f"{m.name}@{m.version} -> {FRAMEWORK}"
    meta = {"name": fp32.name, "version": fp32.version, "framework": FRAMEWORK, "source": _recorded(fp32.path),
            "source_sha256": fp32.sha256, "quantization": SETTINGS,
            "versions": {"onnxruntime": onnxruntime.__version__}}
    digest = build_artifact(folder, target, label,
                            lambda tmp: {"calibration_inputs": _quantize(fp32.path, tmp, m)}, meta, force,
                            source_key=source_key)
    return Artifact(path=target, sha256=digest, framework=FRAMEWORK, name=fp32.name, version=fp32.version), fp32.path
