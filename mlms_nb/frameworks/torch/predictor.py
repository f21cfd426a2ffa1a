"""PyTorch predictor: an eager ``nn.Module`` (a built-in architecture, an entrypoint, a live object), or a TorchScript
or ``torch.export`` file (see :mod:`.loading`)."""
from __future__ import annotations

from pathlib import Path

from typing import Mapping

import numpy as np
import torch

from mlms_nb.data.assets import resolve_asset
from mlms_nb.data.feeds import named_outputs
from mlms_nb.errors import PredictorError
from mlms_nb.manifest import Manifest
from mlms_nb.schema.levels import TraceLevel
from mlms_nb.frameworks.base import Predictor, PredictorInfo, PredictorOptions, device_kind, register_predictor
from mlms_nb.frameworks.torch.loading import TORCHSCRIPT_SUFFIXES, build_architecture, build_entrypoint, load_program



@register_predictor
class TorchPredictor(Predictor):
    framework = "torch"
    extra = "torch"

    def __init__(self) -> None:
        super().__init__()
        self.model: torch.nn.Module | None = None
        self.kind = ""       # "eager" (a built-in architecture) or "torchscript"
        self.artifact = ""   # what PredictorInfo.artifact says: a file, or "<architecture> (random weights)"
        self._path = ""      # the file loaded: TorchScript graph or weights; "" for random weights
        self._layer_hooks = None
        self._op_profiler = None
        self._keywords: set[str] | None = None  # forward's parameter names (None: not looked at yet)

    def open(self, manifest: Manifest, device: str = "cpu", options: PredictorOptions | None = None) -> "TorchPredictor":
        self.manifest, self.device, self.options = manifest, device, options or PredictorOptions()
        self._check(manifest)
        if device_kind(device) == "cuda" and not torch.cuda.is_available():
            raise PredictorError(f"device {device!r} requested but PyTorch sees no CUDA device (torch {torch.__version__})")
        if self.options.threads:
            torch.set_num_threads(self.options.threads)
        base = Path(manifest.source).parent if manifest.source else None
        spec = manifest.model
        trust = self.options.trust
        weights = None
        if spec.weights_path and spec.weights == "pretrained":
            weights = resolve_asset(spec.weights_path, spec.sha256.get("weights_path"), base)
        if spec.instance is not None:  # a live module from the notebook: the user's own object
            if not isinstance(spec.instance, torch.nn.Module):
                raise PredictorError(f"{manifest.key}: PyTorch runs a torch.nn.Module, got {type(spec.instance).__name__}")
            model = spec.instance
            self.kind, self.artifact, self._path = "eager", f"{type(model).__name__} (a live object)", ""
        elif spec.graph_path:
            path = resolve_asset(spec.graph_path, spec.sha256.get("graph_path"), base)
            model, self.kind = load_program(path, manifest, trust, device)
            self.artifact, self._path = str(path), str(path)
        elif spec.entrypoint:
            model = build_entrypoint(manifest, trust, weights)
            self.kind = "eager"
            self.artifact = str(weights) if weights else f"{spec.entrypoint} ({spec.weights} weights)"
            self._path = str(weights or "")
        elif spec.architecture:
            if spec.weights == "pretrained" and weights is None:
                raise PredictorError(f"manifest {manifest.key}: pretrained weights need model.weights_path")
            model = build_architecture(manifest, weights)
            self.kind, self.artifact, self._path = "eager", str(weights or f"{spec.architecture} (random weights)"), str(weights or "")
        else:
            raise PredictorError(
                f"manifest {manifest.key}: PyTorch needs model.entrypoint, model.architecture or a model.graph_path "
                f"(TorchScript {', '.join(TORCHSCRIPT_SUFFIXES)} or torch.export .pt2)")
        # a torch.export program is in the mode it was exported in, and its module cannot switch (.eval() raises)
        self.model = model if self.kind == "export" else model.to(device).eval()
        if spec.reset and not callable(getattr(self.model, spec.reset, None)):
            exported = " exported with @torch.jit.export" if self.kind == "torchscript" else ""
            raise PredictorError(f"model.reset: {self.artifact} has no method {spec.reset!r}{exported} to clear its "
                                 f"state (manifest {manifest.key})")
        self._keywords = None
        return self

    def predict(self, batch):
        if self.model is None:
            raise PredictorError("predict() before open(), or after close()")
        if self.feeds.plain and isinstance(batch, np.ndarray):
            with torch.inference_mode():
                out = self.model(torch.from_numpy(np.ascontiguousarray(batch)).to(self.device))
            if isinstance(out, torch.Tensor):
                return out.cpu().numpy() if self.device != "cpu" else out.numpy()
            return next(iter(self._named(out).values()))
        feed = self.feeds(batch)
        tensors = {name: torch.from_numpy(np.ascontiguousarray(value)).to(self.device) for name, value in feed.items()}
        with torch.inference_mode():
            if self._by_keyword(list(tensors)):
                out = self.model(**tensors)
            else:
                out = self.model(*tensors.values())
        outputs = self._named(out)
        return outputs if isinstance(batch, Mapping) else next(iter(outputs.values()))

    def reset(self) -> None:
        """Call the module's ``model.reset`` method (in inference mode, as its forward runs: state tensors its forward
        made are inference tensors, which only inference mode may change in place)."""
        if self.model is None:
            raise PredictorError("reset() before open(), or after close()")
        name = self.manifest.model.reset
        if not name:
            raise PredictorError(f"manifest {self.manifest.key} declares no model.reset method")
        with torch.inference_mode():
            getattr(self.model, name)()

    def _named(self, out) -> dict[str, np.ndarray]:
        """forward's result (a tensor, a tuple or list by position, a dict by key) as numpy, named by outputs[]."""
        if isinstance(out, dict):
            results = {k: v for k, v in out.items()}
        elif isinstance(out, (tuple, list)):
            results = list(out)
        else:
            results = out
        named = named_outputs(self.manifest, results, "forward")
        return {k: (v.detach().cpu().numpy() if isinstance(v, torch.Tensor) else np.asarray(v)) for k, v in named.items()}

    def _by_keyword(self, names: list[str]) -> bool:
        """Inputs go to forward by keyword when every manifest name is one of its parameters, else by position
        (manifest order)."""
        if self._keywords is None:
            import inspect

            try:
                params = inspect.signature(self.model.forward).parameters
                self._keywords = set(params) if not any(p.kind == p.VAR_POSITIONAL for p in params.values()) else set()
            except (TypeError, ValueError, AttributeError):
                self._keywords = set()
        return bool(self._keywords) and all(n in self._keywords for n in names) and any(
            spec.name for spec in self.manifest.inputs)

    @property
    def native_model(self) -> torch.nn.Module | None:
        return self.model

    @property
    def artifact_path(self) -> str:
        return self._path if self.model is not None else ""

    def capture(self, module_names=(), rekey=None):
        """Forward hooks on every submodule of the eager module (see :class:`~.capture.TorchCapture`); its points
        are found by one forward pass of zeros of the manifest's input shape."""
        from mlms_nb.frameworks.torch.capture import TorchCapture

        if self.model is None:
            raise PredictorError("capture() before open(), or after close()")
        if self.kind != "eager":
            raise PredictorError(f"{self.manifest.key}: per-layer outputs need an eager PyTorch module (a built-in "
                                 f"architecture), not a {self.kind} model whose graph calls no module forwards")
        capture = TorchCapture(self.model)
        capture.structure(np.zeros((1, *self.manifest.inputs[0].dimensions), np.float32))
        return capture

    # ------------------------------------------------------------------------------------------ tracing

    def tracing_levels(self) -> dict[str, str]:
        levels = super().tracing_levels()
        if self.kind in ("torchscript", "export"):
            levels["FRAMEWORK"] = (f"not supported for {self.kind} models: a compiled graph does not call the Python "
                                   "module forwards that layer spans wrap (ML_LIBRARY ops are still recorded)")
        else:
            levels["FRAMEWORK"] = ("every call of a layer module (no children, or parameters of its own) timed around "
                                   "its forward, time.perf_counter_ns's clock (by the compiled layer call where it "
                                   "could be built: mlms_nb.frameworks.torch.native)")
        levels["ML_LIBRARY"] = "torch.profiler CPU ops (record_shapes), nested in their layer by time"
        if device_kind(self.device) == "cuda":
            levels["SYSTEM_LIBRARY"] = "CUDA kernels, copies and runtime calls through CUPTI (the runner's recorder)"
        else:
            levels["SYSTEM_LIBRARY"] = ("not supported on cpu: the oneDNN/MKL calls below aten ops are not "
                                        "exposed to a profiler here")
        return levels

    def _start_framework_tracing(self, tracer) -> None:
        from mlms_nb.frameworks.torch.ops import OpProfiler
        from mlms_nb.frameworks.torch.tracing import LayerHooks

        if self.model is None:
            return
        if tracer.level >= TraceLevel.FRAMEWORK and self.kind == "eager":
            self._layer_hooks = LayerHooks(self.model, tracer, cuda=device_kind(self.device) == "cuda")
        if tracer.level >= TraceLevel.ML_LIBRARY:
            self._op_profiler = OpProfiler(tracer)

    def _stop_framework_tracing(self, tracer) -> None:
        hooks, profiler, self._layer_hooks, self._op_profiler = self._layer_hooks, self._op_profiler, None, None
        if hooks is not None:
            hooks.remove()
        if profiler is not None:
            found = profiler.stop()
            tracer.metadata.setdefault("torch.profiler", {}).update(found)

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
