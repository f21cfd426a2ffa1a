"""Frameworks: one folder per framework (``torch/``, ``onnxruntime/``, ``tensorflow/``), each holding its
predictor, the import of its own profiler's output into spans, its per-layer cost model and its per-layer output
capture, behind the one contract declared in :mod:`.base`. :mod:`.convert` builds and caches one framework's copy
of a model from another's (ONNX export, Keras port), and :mod:`.costs` picks the cost model for a manifest."""
from mlms_nb.frameworks.base import (
    Predictor,
    PredictorInfo,
    PredictorOptions,
    get_predictor_class,
    open_predictor,
    register_predictor,
)

__all__ = [
    "Predictor", "PredictorInfo", "PredictorOptions", "get_predictor_class",
    "open_predictor", "register_predictor",
]
