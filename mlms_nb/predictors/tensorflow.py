"""TensorFlow predictor: a Keras model (``.keras`` file or built-in architecture) or a SavedModel folder."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import tensorflow as tf

from ..data.assets import resolve_asset
from ..errors import PredictorError
from ..manifest import Manifest
from .base import Predictor, PredictorInfo, PredictorOptions, device_kind, register_predictor


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
            if spec.graph_path:
                path = resolve_asset(spec.graph_path, spec.sha256.get("graph_path"), base)
                self.artifact = str(path)
                if path.is_dir():  # a SavedModel
                    loaded = tf.saved_model.load(str(path))
                    signature = loaded.signatures["serving_default"]
                    self.model, self.kind = loaded, "saved_model"
                    self._fn = lambda x: next(iter(signature(x).values()))
                else:
                    import keras

                    self.model, self.kind = keras.models.load_model(str(path), compile=False), "keras"
            elif spec.architecture:
                from ..models.registry import build_keras_model

                weights = None
                if spec.weights == "pretrained":
                    weights = str(resolve_asset(spec.weights_path, spec.sha256.get("weights_path"), base)) if spec.weights_path else None
                    if weights is None:
                        raise PredictorError(f"manifest {manifest.key}: pretrained weights need model.weights_path")
                self.model, self.kind = build_keras_model(spec.architecture, weights), "keras"
                self.artifact = weights or f"{spec.architecture} (random weights)"
            else:
                raise PredictorError(f"manifest {manifest.key}: TensorFlow needs model.graph_path or model.architecture")
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

    def predict(self, batch: np.ndarray) -> np.ndarray:
        if self._fn is None:
            raise PredictorError("predict() before open(), or after close()")
        with tf.device(self._tf_device):
            return self._fn(tf.convert_to_tensor(batch)).numpy()

    def close(self) -> None:
        self.model, self._fn = None, None
        super().close()

    def info(self) -> PredictorInfo:
        threads = tf.config.threading.get_intra_op_parallelism_threads() or None
        return PredictorInfo(
            framework="tensorflow", framework_version=tf.__version__, device=self.device, threads=threads,
            artifact=self.artifact, details={"kind": self.kind, "notes": list(self.notes)})
