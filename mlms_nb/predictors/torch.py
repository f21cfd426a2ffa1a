"""PyTorch predictor: an eager ``nn.Module`` from a built-in architecture, or a TorchScript file."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from ..data.assets import resolve_asset
from ..errors import PredictorError
from ..manifest import Manifest
from .base import Predictor, PredictorInfo, PredictorOptions, device_kind, register_predictor

TORCHSCRIPT_SUFFIXES = (".pt", ".ts", ".torchscript", ".jit")


@register_predictor
class TorchPredictor(Predictor):
    framework = "torch"
    extra = "torch"

    def __init__(self) -> None:
        super().__init__()
        self.model: torch.nn.Module | None = None
        self.kind = ""
        self.artifact = ""

    def open(self, manifest: Manifest, device: str = "cpu", options: PredictorOptions | None = None) -> "TorchPredictor":
        self.manifest, self.device, self.options = manifest, device, options or PredictorOptions()
        self._check(manifest)
        if device_kind(device) == "cuda" and not torch.cuda.is_available():
            raise PredictorError(f"device {device!r} requested but PyTorch sees no CUDA device (torch {torch.__version__})")
        if self.options.threads:
            torch.set_num_threads(self.options.threads)
        base = Path(manifest.source).parent if manifest.source else None
        spec = manifest.model
        if spec.graph_path and spec.graph_path.endswith(TORCHSCRIPT_SUFFIXES):
            path = resolve_asset(spec.graph_path, spec.sha256.get("graph_path"), base)
            model = torch.jit.load(str(path), map_location=device)
            self.kind, self.artifact = "torchscript", str(path)
        elif spec.architecture:
            from ..models.registry import build_torch_model

            weights = None
            if spec.weights == "pretrained":
                if not spec.weights_path:
                    raise PredictorError(f"manifest {manifest.key}: pretrained weights need model.weights_path")
                weights = str(resolve_asset(spec.weights_path, spec.sha256.get("weights_path"), base))
            model = build_torch_model(spec.architecture, weights)
            self.kind, self.artifact = "eager", weights or f"{spec.architecture} (random weights)"
        else:
            raise PredictorError(
                f"manifest {manifest.key}: PyTorch needs model.architecture or a TorchScript model.graph_path "
                f"ending in {', '.join(TORCHSCRIPT_SUFFIXES)}")
        self.model = model.to(device).eval()
        return self

    def predict(self, batch: np.ndarray) -> np.ndarray:
        if self.model is None:
            raise PredictorError("predict() before open(), or after close()")
        with torch.inference_mode():
            out = self.model(torch.from_numpy(np.ascontiguousarray(batch)).to(self.device))
        return out.cpu().numpy() if self.device != "cpu" else out.numpy()

    def close(self) -> None:
        self.model = None
        if device_kind(self.device) == "cuda" and torch.cuda.is_available():
            torch.cuda.empty_cache()
        super().close()

    def info(self) -> PredictorInfo:
        return PredictorInfo(
            framework="torch", framework_version=torch.__version__, device=self.device,
            threads=torch.get_num_threads(), artifact=self.artifact,
            details={"kind": self.kind, "interop_threads": torch.get_num_interop_threads()})
