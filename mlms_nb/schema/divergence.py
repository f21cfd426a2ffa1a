"""How a divergence's layer table names its columns (written once; the analysis, the runner and the display
use it).

One row per aligned layer in execution order; per framework pair ``a~b`` (:func:`pair_label`; ``a`` is the
reference) the columns ``max_abs_error[a~b]`` (max |b - a|, the tensor's own units), ``max_rel_error[a~b]``
(max |b - a| / max |a|, a fraction: the worst element against the layer's largest value), ``rms_rel_error[a~b]``
(sqrt(sum (b - a)^2 / sum a^2), a fraction: the typical error against the typical value) and
``cosine_similarity[a~b]`` (1 = same direction); per framework ``f``
the columns ``latency_ms[f]`` and ``latency_iqr_ms[f]`` (ms per layer, median and IQR over the timed calls).
"""
from __future__ import annotations

METRICS = ("max_abs_error", "max_rel_error", "rms_rel_error", "cosine_similarity")
"""The error metrics per pair of frameworks."""
LATENCY_METRICS = ("latency_ms", "latency_iqr_ms")
"""The latency columns per framework (ms)."""


def pair_label(a: str, b: str) -> str:
    """``torch~onnxruntime``: how a framework pair is written in column names."""
    return f"{a}~{b}"


def column(metric: str, key: str) -> str:
    """``max_rel_error[torch~onnxruntime]``, ``latency_ms[torch]``."""
    return f"{metric}[{key}]"
