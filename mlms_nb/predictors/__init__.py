"""Predictors: one model in one framework behind one small contract (see base.py)."""
from .base import (
    Predictor,
    PredictorInfo,
    PredictorOptions,
    framework_available,
    get_predictor_class,
    open_predictor,
    register_predictor,
)

__all__ = [
    "Predictor", "PredictorInfo", "PredictorOptions", "framework_available", "get_predictor_class",
    "open_predictor", "register_predictor",
]
