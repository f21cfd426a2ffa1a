"""The predictor contract and the registry of predictors by framework name.

A predictor runs one model in one framework: ``open(manifest, device, options)`` loads it,
``predict(batch)`` maps a float32 numpy batch laid out as the manifest's input (NCHW or NHWC) to a
numpy array of outputs (logits for classifiers), ``close()`` frees it, ``info()`` says what ran it.
Predictors never import the runner; the runner only talks to this contract.
"""
from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar

import numpy as np

from ..errors import FrameworkNotInstalledError, PredictorError
from ..manifest import FRAMEWORKS, Manifest, canonical_framework


@dataclass
class PredictorOptions:
    """How to run: ``threads`` (intra-op; None = the framework's default), ``trust`` (allow code steps),
    ``extra`` (framework-specific settings, passed through)."""
    threads: int | None = None
    inter_op_threads: int | None = None
    trust: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class PredictorInfo:
    """What ran the model: framework name and version, device, thread count, and the model artifact."""
    framework: str
    framework_version: str
    device: str
    threads: int | None
    artifact: str = ""
    details: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class Predictor(ABC):
    """One model, opened in one framework."""

    framework: ClassVar[str]
    #: the pip extra that installs this framework
    extra: ClassVar[str]

    def __init__(self) -> None:
        self.manifest: Manifest | None = None
        self.device = "cpu"
        self.options = PredictorOptions()

    @abstractmethod
    def open(self, manifest: Manifest, device: str = "cpu", options: PredictorOptions | None = None) -> "Predictor":
        """Load the model the manifest describes onto ``device``; returns self."""

    @abstractmethod
    def predict(self, batch: np.ndarray) -> np.ndarray:
        """Run one batch (N first, manifest layout) and return the raw outputs as numpy (N first)."""

    def close(self) -> None:
        """Free the model. Safe to call twice."""
        self.manifest = None

    @abstractmethod
    def info(self) -> PredictorInfo:
        """Framework, version, device and threads of the opened model."""

    def __enter__(self) -> "Predictor":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _check(self, manifest: Manifest) -> None:
        if manifest.framework.name != self.framework:
            raise PredictorError(
                f"manifest {manifest.key} is for framework {manifest.framework.name!r}, not {self.framework!r}")
        if device_kind(self.device) not in ("cpu", "cuda"):
            raise PredictorError(f"unknown device {self.device!r}; expected cpu or cuda[:N]")


def device_kind(device: str) -> str:
    """``cuda:1`` -> ``cuda``; ``cpu`` -> ``cpu``."""
    return device.split(":", 1)[0].lower()


# ---------------------------------------------------------------- registry

#: framework name -> (module, class, pip extra, import name of the framework)
_BUILTIN = {
    "torch": ("mlms_nb.predictors.torch", "TorchPredictor", "torch", "torch"),
    "onnxruntime": ("mlms_nb.predictors.onnxruntime", "OnnxRuntimePredictor", "onnx", "onnxruntime"),
    "tensorflow": ("mlms_nb.predictors.tensorflow", "TensorFlowPredictor", "tf", "tensorflow"),
}
_REGISTERED: dict[str, type[Predictor]] = {}


def register_predictor(cls: type[Predictor]) -> type[Predictor]:
    """Class decorator: make ``cls`` the predictor for ``cls.framework``."""
    _REGISTERED[cls.framework] = cls
    return cls


def framework_available(name: str) -> tuple[bool, str]:
    """(True, version) when the framework imports, else (False, a sentence naming the extra)."""
    name = canonical_framework(name)
    if name not in _BUILTIN:
        return False, f"unknown framework {name!r}; expected one of {', '.join(FRAMEWORKS)}"
    _, _, extra, module = _BUILTIN[name]
    try:
        mod = importlib.import_module(module)
    except ImportError:
        return False, f"{name} is not installed: pip install 'mlms-nb[{extra}]'"
    return True, getattr(mod, "__version__", "unknown")


def get_predictor_class(name: str) -> type[Predictor]:
    """The predictor class for a framework name (``torch``, ``onnxruntime``, ``tensorflow`` or an alias)."""
    name = canonical_framework(name)
    if name in _REGISTERED:
        return _REGISTERED[name]
    if name not in _BUILTIN:
        raise PredictorError(f"unknown framework {name!r}; expected one of {', '.join(FRAMEWORKS)}")
    ok, why = framework_available(name)
    if not ok:
        raise FrameworkNotInstalledError(why)
    module, cls_name, _, _ = _BUILTIN[name]
    cls = getattr(importlib.import_module(module), cls_name)
    _REGISTERED[name] = cls
    return cls


def open_predictor(manifest: Manifest, device: str = "cpu", options: PredictorOptions | None = None) -> Predictor:
    """Instantiate the manifest's framework predictor and open the model."""
    return get_predictor_class(manifest.framework.name)().open(manifest, device=device, options=options)
