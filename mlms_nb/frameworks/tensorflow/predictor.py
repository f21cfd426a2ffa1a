"""TensorFlow predictor: a Keras model (``.keras`` file or built-in architecture) or a SavedModel folder.

Tracing: at FRAMEWORK and deeper levels ``tf.profiler`` (``tf.profiler.experimental.start``, writing into a
temporary folder: :mod:`mlms_nb.frameworks.profiling`) runs from ``start_tracing`` to ``stop_tracing``; each traced ``predict`` wraps its call in a profiler marker
(:data:`~mlms_nb.frameworks.tensorflow.xplane.MARKER`, ``step_num`` = the call's number) and records its
``perf_counter_ns`` window. On stop the XSpace is read and turned into Keras-layer spans (FRAMEWORK) and TF-op
spans (ML_LIBRARY), see :mod:`mlms_nb.frameworks.tensorflow.xplane`. The model keeps running as the same ``tf.function``
graph: the op events come from the executor's threads, so nothing is run eagerly (running Keras eagerly would
show layers in call order, but costs ~9x at batch 1 on EfficientNet-Lite0 -- 290 ms against 33 ms -- and would
time a different execution than the untraced one). The profiler is process-wide: while one TensorFlow
predictor traces, another cannot (its FRAMEWORK/ML_LIBRARY levels are then noted as unavailable in
``tracer.metadata["unavailable"]``).
"""
from __future__ import annotations

from pathlib import Path
from typing import Mapping

import numpy as np
import tensorflow as tf

from mlms_nb.data.assets import resolve_asset
from mlms_nb.data.feeds import named_outputs
from mlms_nb.errors import PredictorError
from mlms_nb.manifest import Manifest
from mlms_nb.schema.levels import TraceLevel
from mlms_nb.frameworks.base import Predictor, PredictorInfo, PredictorOptions, device_kind, register_predictor
from mlms_nb.frameworks.profiling import FrameworkProfile
from mlms_nb.frameworks.tensorflow.loading import build_entrypoint, load_model_file
from mlms_nb.frameworks.tensorflow.xplane import MARKER, PROFILER_OPTIONS


@register_predictor
class TensorFlowPredictor(Predictor):
    framework = "tensorflow"
    extra = "tf"

    def __init__(self) -> None:
        super().__init__()
        self.model = None
        self._fn = None
        self.kind = ""
        self.artifact = ""
        self.notes: list[str] = []
        self._profile: FrameworkProfile | None = None  # while tf.profiler runs

    def open(self, manifest: Manifest, device: str = "cpu", options: PredictorOptions | None = None) -> "TensorFlowPredictor":
        self.manifest, self.device, self.options = manifest, device, options or PredictorOptions()
        self._check(manifest)
        self._set_threads()
        if device_kind(device) == "cuda" and not tf.config.list_physical_devices("GPU"):
            raise PredictorError(f"device {device!r} requested but TensorFlow {tf.__version__} sees no GPU")
        tf_device = "/CPU:0" if device_kind(device) == "cpu" else f"/GPU:{device.split(':', 1)[1] if ':' in device else 0}"
        base = Path(manifest.source).parent if manifest.source else None
        spec = manifest.model
        with tf.device(tf_device):
            if spec.instance is not None:  # a live keras.Model from the notebook: the user's own object
                import keras

                if not isinstance(spec.instance, keras.Model):
                    raise PredictorError(f"{manifest.key}: TensorFlow runs a keras.Model, got {type(spec.instance).__name__}")
                self.model, self.kind = spec.instance, "keras"
                self.artifact = f"{type(spec.instance).__name__} (a live object)"
            elif spec.graph_path:
                path = resolve_asset(spec.graph_path, spec.sha256.get("graph_path"), base)
                self.artifact = str(path)
                self.model, self.kind = load_model_file(path, manifest, self.options.trust)
                if self.kind == "saved_model":
                    signature = self.model.signatures["serving_default"]
                    self._fn = lambda x: (signature(**x) if isinstance(x, dict) else
                                          next(iter(signature(x).values())))
            elif spec.entrypoint:
                weights = None
                if spec.weights_path and spec.weights == "pretrained":
                    weights = resolve_asset(spec.weights_path, spec.sha256.get("weights_path"), base)
                self.model, self.kind = build_entrypoint(manifest, self.options.trust, weights), "keras"
                self.artifact = str(weights) if weights else f"{spec.entrypoint} ({spec.weights} weights)"
            elif spec.architecture:
                from mlms_nb.zoo.registry import build_keras_model

                weights = None
                if spec.weights == "pretrained":
                    weights = str(resolve_asset(spec.weights_path, spec.sha256.get("weights_path"), base)) if spec.weights_path else None
                    if weights is None:
                        raise PredictorError(f"manifest {manifest.key}: pretrained weights need model.weights_path")
                self.model, self.kind = build_keras_model(spec.architecture, weights), "keras"
                self.artifact = weights or f"{spec.architecture} (random weights)"
            else:
                raise PredictorError(f"manifest {manifest.key}: TensorFlow needs model.graph_path (.keras, SavedModel "
                                     "folder), model.entrypoint or model.architecture")
            if self._fn is None:
                model = self.model
                self._fn = tf.function(lambda x: model(x, training=False), reduce_retracing=True)
        self._tf_device = tf_device
        return self

    def _set_threads(self) -> None:
        """Thread pools can only be set before TF's runtime starts; later calls are noted, not fatal."""
        cfg = tf.config.threading
        for want, getter, setter in (
            (self.options.threads, cfg.get_intra_op_parallelism_threads, cfg.set_intra_op_parallelism_threads),
            (self.options.inter_op_threads, cfg.get_inter_op_parallelism_threads, cfg.set_inter_op_parallelism_threads),
        ):
            if want and getter() != want:
                try:
                    setter(want)
                except RuntimeError:
                    self.notes.append(
                        f"TensorFlow thread pools were already initialised with {getter() or 'default'} threads; "
                        f"could not set {want} in this process")

    def predict(self, batch):
        if self._fn is None:
            raise PredictorError("predict() before open(), or after close()")
        plain = self.feeds.plain and isinstance(batch, np.ndarray)
        profile = self._profile
        with tf.device(self._tf_device):
            x = tf.convert_to_tensor(batch) if plain else self._model_inputs(self.feeds(batch))
            if profile is None:
                out = self._fn(x)
            else:
                parent = self._tracer.current_span_id() if self._tracer is not None else 0
                with profile.call(parent) as step, tf.profiler.experimental.Trace(MARKER, step_num=step):
                    out = self._fn(x)
        if plain and isinstance(out, tf.Tensor):
            return out.numpy()
        outputs = self._named(out)
        return outputs if isinstance(batch, Mapping) else next(iter(outputs.values()))

    def _model_inputs(self, feed: dict):
        """Keras takes several inputs as a dict by input name (when every manifest name is one) or a list in
        manifest order; one input as its tensor."""
        tensors = {k: tf.convert_to_tensor(v) for k, v in feed.items()}
        if len(tensors) == 1:
            return next(iter(tensors.values()))
        keras_names = [getattr(t, "name", "").split(":")[0] for t in getattr(self.model, "inputs", None) or []]
        if keras_names and all(k in keras_names for k in tensors):
            return tensors
        return list(tensors.values())

    def _named(self, out) -> dict[str, np.ndarray]:
        """The model's result (a tensor, a list by position, a dict by name) as numpy, named by outputs[]."""
        if isinstance(out, dict):
            results = dict(out)
        elif isinstance(out, (list, tuple)):
            results = list(out)
        else:
            results = out
        named = named_outputs(self.manifest, results, "the Keras model")
        return {k: (v.numpy() if hasattr(v, "numpy") else np.asarray(v)) for k, v in named.items()}

    @property
    def native_model(self):
        """The ``keras.Model``, or the loaded SavedModel object."""
        return self.model

    @property
    def artifact_path(self) -> str:
        return self.artifact if self.model is not None and Path(self.artifact).exists() else ""

    def capture(self, module_names=(), rekey=None):
        """Every Keras layer call's output (see :class:`~.capture.KerasCapture`)."""
        from mlms_nb.frameworks.tensorflow.capture import KerasCapture

        if self.model is None:
            raise PredictorError("capture() before open(), or after close()")
        if self.kind != "keras":
            raise PredictorError(f"{self.manifest.key}: per-layer outputs need a Keras model, not a {self.kind}")
        return KerasCapture(self.model, rekey=rekey)

    # ------------------------------------------------------------------------------------------ tracing

    def tracing_levels(self) -> dict[str, str]:
        levels = super().tracing_levels()
        if self.kind == "keras":
            levels["FRAMEWORK"] = ("one span per Keras layer call: the envelope of the layer's data-path TF ops "
                                   "from tf.profiler (the layer's name scope in the tf.function graph)")
        else:
            levels["FRAMEWORK"] = (f"not supported for a {self.kind or 'non-Keras'} model: its graph has no "
                                   "Keras layers to group ops by (ML_LIBRARY ops are still recorded)")
        levels["ML_LIBRARY"] = "one span per executed TF op from tf.profiler (host plane), nested in its layer"
        levels["SYSTEM_LIBRARY"] = (
            "not supported by this predictor: CUDA kernels come from CUPTI at SYSTEM_LIBRARY (the runner's kernel "
            "recorder)" if device_kind(self.device) == "cuda" else
            "not supported on cpu: the Eigen/oneDNN calls inside TF kernels are not exposed by tf.profiler")
        return levels

    def _start_framework_tracing(self, tracer) -> None:
        if self._fn is None or not tracer.enabled(TraceLevel.FRAMEWORK):
            return

        def start_profiler(folder: Path) -> None:
            tf.profiler.experimental.start(str(folder), options=tf.profiler.experimental.ProfilerOptions(
                **PROFILER_OPTIONS))

        try:
            self._profile = FrameworkProfile.start("mlms_tf_profile_", start_profiler)
        except Exception as err:  # AlreadyExistsError: one profiler per process
            why = (f"unavailable: tf.profiler could not start ({type(err).__name__}: "
                   f"{str(err).strip() or 'another profiler session is running in this process'})")
            unavailable = tracer.metadata.setdefault("unavailable", {})
            for level in ("FRAMEWORK", "ML_LIBRARY"):
                unavailable[f"tensorflow {level}"] = why

    def _stop_framework_tracing(self, tracer) -> None:
        profile, self._profile = self._profile, None
        if profile is None:
            return

        def read(profile: FrameworkProfile) -> dict:
            from mlms_nb.frameworks.tensorflow import graph, xplane

            tf.profiler.experimental.stop()
            events = xplane.host_events(xplane.load_xspace(xplane.find_xplane(profile.folder)))
            return xplane.add_tf_profile(tracer, events, profile.wall_offset_ns, profile.windows,
                                         graph.model_graph(self.model if self.kind == "keras" else None, self._fn))

        profile.finish(tracer, "tensorflow.profiler", read)

    def close(self) -> None:
        super().close()  # stops tracing first, while the model is still there
        self.model, self._fn = None, None

    def info(self) -> PredictorInfo:
        threads = tf.config.threading.get_intra_op_parallelism_threads() or None
        return PredictorInfo(
            framework="tensorflow", framework_version=tf.__version__, device=self.device, threads=threads,
            artifact=self.artifact, details={"kind": self.kind, "notes": list(self.notes)})
