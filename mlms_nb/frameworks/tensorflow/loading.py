"""How the TensorFlow predictor gets its model: a ``.keras``/``.h5`` file, a SavedModel folder or an entrypoint.

Keras files load with ``safe_mode`` on (no ``Lambda`` layers, no custom objects) unless trusted; SavedModels run
TensorFlow ops of their own graph, so they load only when trusted (:mod:`mlms_nb.trust`). A trusted SavedModel or
Keras file loads from a private copy whose sha256 was computed from the bytes copied, never from its path again.
Every failure of a bad file or folder is a `ModelFileError` naming it.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from mlms_nb.errors import ModelFileError, UntrustedError
from mlms_nb.frameworks.modelfiles import build_from_entrypoint, refuse_other_framework, unreadable
from mlms_nb.manifest import Manifest
from mlms_nb.trust import require_trust, trusted_copy

_SAFE_MODE_WORDS = ("safe_mode", "lambda", "custom object", "unknown layer", "could not locate class")


def load_model_file(path: Path, manifest: Manifest, trust: bool) -> tuple[Any, str]:
    """The model at ``path`` and its kind (``saved_model`` or ``keras``)."""
    kind = refuse_other_framework(path, "tensorflow", manifest)
    if path.is_dir():
        if kind != "savedmodel":
            raise ModelFileError(f"model.graph_path {path} is a folder but not a TensorFlow SavedModel (it has no "
                                 "saved_model.pb); TensorFlow runs a SavedModel folder or a .keras file")
        source = trusted_copy(path, "savedmodel", trust)  # a private copy, hashed as it was copied
        import tensorflow as tf

        try:
            loaded = tf.saved_model.load(str(source))
        except Exception as err:  # noqa: BLE001 - TF raises several types on a damaged SavedModel
            raise unreadable(path, "tensorflow", "a SavedModel", err) from None
        if "serving_default" not in getattr(loaded, "signatures", {}):
            raise ModelFileError(f"SavedModel {path} has no serving_default signature; export it with one "
                                 "(tf.saved_model.save(model, path, signatures=...))")
        return loaded, "saved_model"
    if kind != "keras":
        raise ModelFileError(f"model.graph_path {path}: TensorFlow runs a .keras (or legacy .h5) file or a "
                             "SavedModel folder, and this is neither")
    import keras

    source, safe = path, not trust
    if not trust:
        try:  # a trusted file loads from the private copy whose bytes were checked, not from its path again
            source, safe = trusted_copy(path, "keras-code", False), False
        except UntrustedError:
            pass  # not trusted: safe mode, in which none of its own code runs
    try:
        return keras.models.load_model(str(source), compile=False, safe_mode=safe), "keras"
    except Exception as err:  # noqa: BLE001 - ValueError, OSError, zipfile errors ... on a bad file
        text = str(err).lower()
        if safe and any(word in text for word in _SAFE_MODE_WORDS):
            try:
                require_trust(path, "keras-code", False)
            except UntrustedError as refused:
                raise refused from None
        raise unreadable(path, "tensorflow", "a Keras model", err) from None


def build_entrypoint(manifest: Manifest, trust: bool, weights: Path | None) -> Any:
    """The ``keras.Model`` of ``model.entrypoint`` (trusted only), with a ``.weights.h5`` file loaded when given."""
    import keras

    model = build_from_entrypoint(manifest, trust, keras.Model, "a keras.Model")
    if weights is not None:
        try:
            model.load_weights(str(weights))
        except Exception as err:  # noqa: BLE001
            raise unreadable(weights, "tensorflow", "Keras weights for this model", err) from None
    return model
