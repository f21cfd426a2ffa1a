"""The predictor contract and the registry of predictors by framework name.

A predictor runs one model in one framework. :class:`Predictor` declares everything a caller may use; nothing
else is read from a predictor outside its own framework folder (``mlms_nb/frameworks/<name>/``):

- ``open(manifest, device, options)`` loads the model, ``predict(batch)`` maps a numpy batch laid out as the
  manifest's fed input (NCHW or NHWC) to a numpy array of the first output (logits for classifiers), and a
  mapping input name -> array (:mod:`mlms_nb.data.feeds`: constants and zero states are added, shapes checked) to
  a mapping output name -> array of every output; ``close()`` frees it, ``info()`` says what ran it;
  ``manifest``, ``device`` and ``options`` are what ``open`` was given; ``reset()`` calls the model's declared
  reset method (``model.reset``, torch) that clears the state it keeps between calls;
- ``native_model``: the framework's own model object; ``artifact_path``: the file it was loaded from;
- ``capture(...)``: per-layer outputs keyed by PyTorch module calls (:mod:`mlms_nb.frameworks.capture`);
- tracing, below.

Predictors never import the runner; the runner only talks to this contract.

Tracing: ``start_tracing(tracer)`` makes a predictor emit its spans into a
:class:`~mlms_nb.tracing.Tracer` (a MODEL ``predict`` span per call, plus whatever its framework can give:
layers at FRAMEWORK, ops at ML_LIBRARY), ``stop_tracing()`` ends it and flushes what the framework buffered.
``tracing_levels()`` says, per level, how it is traced or why not. A predictor also follows the *current*
tracer (:func:`mlms_nb.tracing.use_tracer`): called inside an active tracer it starts tracing into it by
itself, and :func:`stop_auto_traced` stops every predictor that did so (``mlms_nb.trace()`` / ``%%mlms trace``).

Writing a predictor for a fourth framework: subclass :class:`Predictor` in ``frameworks/<name>/predictor.py``,
implement the abstract members, override ``_start_framework_tracing`` / ``_stop_framework_tracing`` to record
layers and ops, add the class to ``_BUILTIN``. Note that **``predict`` is wrapped when the subclass is created**
(``__init_subclass__``, :func:`_traced_predict`): the ``predict`` you write runs inside the MODEL ``predict``
span of the tracer the predictor emits into, and outside any tracer it costs one context-variable read more.
"""
from __future__ import annotations

import functools
import importlib
import threading
import weakref
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar, Collection, Mapping

import numpy as np

from mlms_nb._optional import require
from mlms_nb.data.feeds import FeedBuilder
from mlms_nb.errors import PredictorError
from mlms_nb.frameworks.capture import Key, LayerCapture
from mlms_nb.manifest import FRAMEWORKS, Manifest, canonical_framework
from mlms_nb.schema.levels import TraceLevel
from mlms_nb.tracing.tracer import current_tracer

_MODEL = TraceLevel.MODEL + 0


@dataclass
class PredictorOptions:
    """How to run: ``threads`` (intra-op; None = the framework's default), ``trust`` (allow code steps),
    ``graph_optimization_level`` (ONNX Runtime: disabled | basic | extended | all; None = the manifest's, else
    ``all``), ``extra`` (framework-specific settings, passed through)."""
    threads: int | None = None
    inter_op_threads: int | None = None
    trust: bool = False
    extra: dict[str, Any] = field(default_factory=dict)
    graph_optimization_level: str | None = None


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

    def __str__(self) -> str:
        """One line people read: ``torch 2.13.0+cpu on cpu, 2 threads; artifact …; providers: …``."""
        threads = "threads: the framework's default" if self.threads is None else \
            f"{self.threads} thread{'s' if self.threads != 1 else ''}"
        parts = [f"{self.framework} {self.framework_version} on {self.device}, {threads}"]
        if self.artifact:
            parts.append(f"artifact {self.artifact}")
        parts += [f"{key.replace('_', ' ')}: {', '.join(map(str, value)) if isinstance(value, (list, tuple)) else value}"
                  for key, value in self.details.items()]
        return "; ".join(parts)


class Predictor(ABC):
    """One model, opened in one framework (the contract: see the module docstring).

    ``predict`` of every subclass is wrapped at class creation so that traced calls run inside a MODEL
    ``predict`` span (see :func:`_traced_predict`); subclasses implement ``open``, ``predict``, ``info`` and
    ``native_model``, and override ``artifact_path``, ``capture`` and the two tracing hooks where they can.
    """

    framework: ClassVar[str]
    #: the pip extra that installs this framework
    extra: ClassVar[str]
    #: True when :meth:`cancel` can stop a ``predict`` call in progress from another thread (the per-call timeout
    #: without a worker process; see :mod:`mlms_nb.launchers.watch`)
    cancellable: ClassVar[bool] = False

    def __init__(self) -> None:
        self.manifest: Manifest | None = None
        self.device = "cpu"
        self.options = PredictorOptions()
        self._tracer = None   # the Tracer this predictor emits into, or None
        self._auto = False    # True when it started tracing by itself, following the current tracer
        self._feeds: FeedBuilder | None = None

    @property
    def feeds(self) -> FeedBuilder:
        """Completes and checks this manifest's feeds (:class:`~mlms_nb.data.feeds.FeedBuilder`)."""
        if self._feeds is None or self._feeds.manifest is not self.manifest:
            self._feeds = FeedBuilder(self.manifest)
        return self._feeds

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "predict" in cls.__dict__ and not getattr(cls.__dict__["predict"], "__isabstractmethod__", False):
            cls.predict = _traced_predict(cls.__dict__["predict"])

    @abstractmethod
    def open(self, manifest: Manifest, device: str = "cpu", options: PredictorOptions | None = None) -> "Predictor":
        """Load the model the manifest describes onto ``device``; returns self."""

    @abstractmethod
    def predict(self, batch: np.ndarray | Mapping[str, np.ndarray]) -> np.ndarray | dict[str, np.ndarray]:
        """Run one batch and return the raw outputs as numpy: an array (the fed input, N first, manifest layout)
        gives the first output's array; a mapping input name -> array gives every output by name.

        A subclass's ``predict`` is replaced, when the class is created, by :func:`_traced_predict` wrapped around
        it: callers always get the wrapper, which opens the MODEL ``predict`` span when the predictor traces."""

    def close(self) -> None:
        """Free the model (stopping any tracing first). Safe to call twice."""
        if self._tracer is not None:
            self.stop_tracing()
        self.manifest = None

    def reset(self) -> None:
        """Clear the state the model keeps between calls: call the method the manifest's ``model.reset`` names
        (torch only; the evaluation calls it before every item of the full pass and before every timed loop)."""
        raise PredictorError(f"{self.framework} models have no reset method mlms-nb can call (model.reset is torch "
                             "only): describe the state as explicit state: inputs and outputs")

    def cancel(self) -> None:
        """Stop the ``predict`` call in progress (called from another thread); it then raises. Only where
        ``cancellable``; later calls run normally."""
        raise NotImplementedError(f"{type(self).__name__} cannot cancel a call in progress")

    @abstractmethod
    def info(self) -> PredictorInfo:
        """Framework, version, device and threads of the opened model."""

    @property
    @abstractmethod
    def native_model(self) -> Any:
        """The framework's own model object (an ``nn.Module`` or TorchScript module, an
        ``onnxruntime.InferenceSession``, a ``keras.Model`` or a loaded SavedModel); None before open / after close."""

    @property
    def artifact_path(self) -> str:
        """The file or folder the model was loaded from (graph, ``.keras`` file, TorchScript file or weights);
        "" when it was built from an architecture with random weights, or is not open."""
        return ""

    def capture(self, module_names: Collection[str] = (), rekey: Mapping[Key, Key] | None = None) -> LayerCapture:
        """Per-layer outputs of the opened model, keyed by PyTorch module calls (:mod:`mlms_nb.frameworks.capture`).

        ``module_names``: the PyTorch model's module names, where a framework's layer names need them to map
        back exactly; ``rekey``: points whose tensor stands for another point (an ONNX Conv with the following
        BatchNorm folded into it gives that BatchNorm's output). Raises PredictorError where this model cannot
        give its layers' outputs (say why)."""
        raise PredictorError(f"{self.framework}: this predictor cannot capture per-layer outputs")

    # ------------------------------------------------------------------------------------------ tracing

    def tracing_levels(self) -> dict[str, str]:
        """Per TraceLevel name, how this predictor traces that level, or a sentence saying why it does not
        (starting with "not supported" or "unavailable"). Levels absent here are not this predictor's to trace."""
        return {"MODEL": "a predict span per call (time.perf_counter_ns)"}

    def start_tracing(self, tracer) -> None:
        """Emit spans into ``tracer`` from now on (replacing any tracer this predictor was emitting into)."""
        if tracer is self._tracer:
            return
        if self._tracer is not None:
            self.stop_tracing()
        self._tracer = tracer
        self._auto = False
        self._start_framework_tracing(tracer)

    def stop_tracing(self) -> None:
        """Stop emitting spans; the framework's buffered records (profiles) are converted into the tracer now."""
        tracer, self._tracer, self._auto = self._tracer, None, False
        if tracer is not None:
            self._stop_framework_tracing(tracer)

    def _start_framework_tracing(self, tracer) -> None:
        """Framework hook: install layer/op instrumentation for ``tracer``'s level (default: none)."""

    def _stop_framework_tracing(self, tracer) -> None:
        """Framework hook: remove instrumentation and add buffered spans to ``tracer`` (default: none)."""

    def _follow_current_tracer(self):
        """The tracer ``predict`` should emit into: the one started explicitly, else the current one (auto)."""
        current = current_tracer()
        if current is self._tracer:
            return current
        if self._auto:
            self.stop_tracing()
        if current.max_level <= 0:
            return None
        self.start_tracing(current)
        self._auto = True
        with _AUTO_LOCK:
            _AUTO_TRACED.setdefault(id(current), weakref.WeakSet()).add(self)
        return current

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


_AUTO_TRACED: dict[int, "weakref.WeakSet[Predictor]"] = {}
_AUTO_LOCK = threading.Lock()


def stop_auto_traced(tracer) -> None:
    """Stop every predictor that started tracing into ``tracer`` by itself (its framework spans are flushed)."""
    with _AUTO_LOCK:
        predictors = list(_AUTO_TRACED.pop(id(tracer), ()))
    for predictor in predictors:
        if predictor._tracer is tracer:
            predictor.stop_tracing()


def _traced_predict(predict):
    """Wrap a subclass's ``predict``: untraced it costs one context-variable read; traced it runs inside a
    MODEL ``predict`` span of the tracer the predictor emits into."""

    @functools.wraps(predict)
    def traced_predict(self, batch):
        tracer = self._tracer
        if tracer is None or self._auto:
            tracer = self._follow_current_tracer()
            if tracer is None:
                return predict(self, batch)
        if tracer.max_level < _MODEL:
            return predict(self, batch)
        with tracer.span("predict", _MODEL, "model", batch=self.feeds.size(batch), framework=self.framework):
            return predict(self, batch)

    return traced_predict


def device_kind(device: str) -> str:
    """``cuda:1`` -> ``cuda``; ``cpu`` -> ``cpu``."""
    return device.split(":", 1)[0].lower()


# ---------------------------------------------------------------- registry

#: framework name -> (predictor module, class, import name of the framework; its pip extra is in _optional.EXTRAS)
_BUILTIN = {
    "torch": ("mlms_nb.frameworks.torch.predictor", "TorchPredictor", "torch"),
    "onnxruntime": ("mlms_nb.frameworks.onnxruntime.predictor", "OnnxRuntimePredictor", "onnxruntime"),
    "tensorflow": ("mlms_nb.frameworks.tensorflow.predictor", "TensorFlowPredictor", "tensorflow"),
}
_REGISTERED: dict[str, type[Predictor]] = {}


def register_predictor(cls: type[Predictor]) -> type[Predictor]:
    """Class decorator: make ``cls`` the predictor for ``cls.framework``."""
    _REGISTERED[cls.framework] = cls
    return cls


def get_predictor_class(name: str) -> type[Predictor]:
    """The predictor class for a framework name (``torch``, ``onnxruntime``, ``tensorflow`` or an alias)."""
    name = canonical_framework(name)
    if name in _REGISTERED:
        return _REGISTERED[name]
    if name not in _BUILTIN:
        raise PredictorError(f"unknown framework {name!r}; expected one of {', '.join(FRAMEWORKS)}")
    module, cls_name, framework_module = _BUILTIN[name]
    require(framework_module, f"running a model in {name}")
    cls = getattr(importlib.import_module(module), cls_name)
    _REGISTERED[name] = cls
    return cls


def open_predictor(manifest: Manifest, device: str = "cpu", options: PredictorOptions | None = None) -> Predictor:
    """Instantiate the manifest's framework predictor and open the model."""
    return get_predictor_class(manifest.framework.name)().open(manifest, device=device, options=options)
