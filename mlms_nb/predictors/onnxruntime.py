"""ONNX Runtime predictor: an ONNX graph on the CPU execution provider, or CUDA when present."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort

from ..data.assets import resolve_asset
from ..errors import PredictorError
from ..manifest import Manifest
from .base import Predictor, PredictorInfo, PredictorOptions, device_kind, register_predictor


@register_predictor
class OnnxRuntimePredictor(Predictor):
    framework = "onnxruntime"
    extra = "onnx"

    def __init__(self) -> None:
        super().__init__()
        self.session: ort.InferenceSession | None = None
        self.artifact = ""

    def open(self, manifest: Manifest, device: str = "cpu", options: PredictorOptions | None = None) -> "OnnxRuntimePredictor":
        self.manifest, self.device, self.options = manifest, device, options or PredictorOptions()
        self._check(manifest)
        if not manifest.model.graph_path:
            raise PredictorError(f"manifest {manifest.key}: ONNX Runtime needs model.graph_path (an .onnx file)")
        base = Path(manifest.source).parent if manifest.source else None
        path = resolve_asset(manifest.model.graph_path, manifest.model.sha256.get("graph_path"), base)
        self.artifact = str(path)
        providers = ["CPUExecutionProvider"]
        if device_kind(device) == "cuda":
            if "CUDAExecutionProvider" not in ort.get_available_providers():
                raise PredictorError(
                    f"device {device!r} requested but this onnxruntime {ort.__version__} has no CUDAExecutionProvider "
                    "(install onnxruntime-gpu)")
            index = int(device.split(":", 1)[1]) if ":" in device else 0
            providers = [("CUDAExecutionProvider", {"device_id": index}), "CPUExecutionProvider"]
        so = self.session_options()
        try:
            self.session = ort.InferenceSession(str(path), sess_options=so, providers=providers)
        except Exception as err:  # ORT raises its own exception types; say which file failed
            raise PredictorError(f"ONNX Runtime could not load {path}: {err}") from None
        self._input = self.session.get_inputs()[0].name
        self._outputs = [self.session.get_outputs()[0].name]
        return self

    def session_options(self) -> ort.SessionOptions:
        """Session options from the predictor options (threads; ``extra`` keys set as attributes)."""
        so = ort.SessionOptions()
        if self.options.threads:
            so.intra_op_num_threads = self.options.threads
        if self.options.inter_op_threads:
            so.inter_op_num_threads = self.options.inter_op_threads
        for key, value in self.options.extra.items():
            if not hasattr(so, key):
                raise PredictorError(f"unknown ONNX Runtime session option {key!r}")
            setattr(so, key, value)
        return so

    def predict(self, batch: np.ndarray) -> np.ndarray:
        if self.session is None:
            raise PredictorError("predict() before open(), or after close()")
        return self.session.run(self._outputs, {self._input: batch})[0]

    def close(self) -> None:
        self.session = None
        super().close()

    def info(self) -> PredictorInfo:
        providers = self.session.get_providers() if self.session else []
        return PredictorInfo(
            framework="onnxruntime", framework_version=ort.__version__, device=self.device,
            threads=self.options.threads, artifact=self.artifact, details={"providers": providers})
