"""The result of :func:`mlms_nb.divergence.diverge`: tables, the first divergent layer per pair, a plot."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from mlms_nb.display import FramesForPeople, ShownByDisplay
from mlms_nb.analyses import divergence as _analysis


@dataclass(repr=False)
class Divergence(ShownByDisplay, FramesForPeople):
    """Where the outputs of one model drift apart across frameworks, layer by layer.

    - ``layers``: one row per aligned layer in PyTorch execution order (``layer_index``, ``layer`` (label),
      ``layer_name``, ``call``, ``layer_type``, ``shape``), per pair ``max_abs_error[a~b]``,
      ``max_rel_error[a~b]``, ``rms_rel_error[a~b]``, ``cosine_similarity[a~b]``, per framework ``latency_ms[f]`` /
      ``latency_iqr_ms[f]``;
    - ``outputs``: per pair, KL and JS divergence of the softmax outputs (nats), top-1 agreement;
    - ``per_input``: per input and framework: label, predicted top-1, correct, top-5 correct;
    - ``accuracy``: top-1/top-5 per framework and the delta vs the reference (``frameworks[0]``);
    - ``first_divergent_layer``: per pair, the first layer whose ``max_rel_error`` exceeds ``tolerance``
      (None when no layer does);
    - ``notes``: how things were aligned and measured;
    - ``warnings``: figures that contradict each other, in sentences (a layer far off while the outputs agree);
    - ``traces``: per framework, the FRAMEWORK-level trace its layer latencies were read from
      (``mlms_nb.layers(div.traces["onnxruntime"])`` gives every layer's latency from the same calls).
    """
    model: str
    dataset: str
    frameworks: list[str]
    pairs: list[tuple[str, str]]
    tolerance: float
    layers: pd.DataFrame
    outputs: pd.DataFrame
    per_input: pd.DataFrame
    accuracy: pd.DataFrame
    first_divergent_layer: dict[str, str | None]
    latency: pd.DataFrame
    notes: dict[str, str] = field(default_factory=dict)
    quantization: dict[str, Any] | None = None
    traces: dict[str, Any] = field(default_factory=dict)

    @property
    def warnings(self) -> list[str]:
        """Figures that contradict each other, in sentences: a layer far off while the outputs agree
        (:func:`mlms_nb.analyses.divergence.implausible_layers`); empty when every figure is plausible."""
        return [s for said in _analysis.implausible_layers(self.layers, self.outputs).values() for s in said]

    @property
    def reference(self) -> str:
        return self.frameworks[0]

    @property
    def inputs(self) -> int:
        """How many distinct inputs were compared."""
        return int(self.per_input["input_id"].nunique()) if len(self.per_input) else 0

    def pair_layers(self, a: str, b: str) -> pd.DataFrame:
        """The layer table of one pair with plain column names (``max_abs_error``, ...)."""
        key = _analysis.pair_label(a, b)
        if key not in [_analysis.pair_label(*p) for p in self.pairs]:
            from mlms_nb.errors import MlmsError

            known = ", ".join(_analysis.pair_label(*p) for p in self.pairs)
            raise MlmsError(f"no framework pair {key!r} in this divergence; pairs: {known}")
        base = ["layer_index", "layer", "layer_type", "shape"]
        cols = {_analysis.column(m, key): m for m in _analysis.METRICS}
        return self.layers[base + list(cols)].rename(columns=cols)

    def plot(self, backend: str = "bokeh", metric: str = "max_rel_error"):
        """Error per layer in execution order (log scale, tolerance line) beside the layer latencies."""
        title = (f"{self.model}: {metric} per layer vs {self.reference} on {self.inputs} inputs of {self.dataset}; "
                 f"latency: median of timed calls, batch 1")
        try:
            return _analysis.plot(self.layers, backend=backend, metric=metric, title=title)
        except ImportError as err:
            from mlms_nb.errors import FrameworkNotInstalledError

            raise FrameworkNotInstalledError(str(err)) from None
