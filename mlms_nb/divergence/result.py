"""The result of :func:`mlms_nb.divergence.diverge`: tables, the first divergent layer per pair, a plot."""
from __future__ import annotations

import html
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from mlms_nb.analyses import divergence as _analysis


@dataclass
class Divergence:
    """Where the outputs of one model drift apart across frameworks, layer by layer.

    - ``layers``: one row per aligned layer in PyTorch execution order (``layer_index``, ``layer`` (label),
      ``layer_name``, ``call``, ``layer_type``, ``shape``), per pair ``max_abs_error[a~b]``,
      ``max_rel_error[a~b]``, ``cosine_similarity[a~b]``, per framework ``latency_ms[f]`` / ``latency_iqr_ms[f]``;
    - ``outputs``: per pair, KL and JS divergence of the softmax outputs (nats), top-1 agreement;
    - ``per_input``: per input and framework: label, predicted top-1, correct, top-5 correct;
    - ``accuracy``: top-1/top-5 per framework and the delta vs the reference (``frameworks[0]``);
    - ``first_divergent_layer``: per pair, the first layer whose ``max_rel_error`` exceeds ``tolerance``
      (None when no layer does);
    - ``notes``: how things were aligned and measured;
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
    def reference(self) -> str:
        return self.frameworks[0]

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
        title = (f"{self.model}: {metric} per layer vs {self.reference} on {self._inputs()} inputs of {self.dataset}; "
                 f"latency: median of timed calls, batch 1")
        try:
            return _analysis.plot(self.layers, backend=backend, metric=metric, title=title)
        except ImportError as err:
            from mlms_nb.errors import FrameworkNotInstalledError

            raise FrameworkNotInstalledError(str(err)) from None

    # ------------------------------------------------------------------------------------------ display

    def _inputs(self) -> int:
        return int(self.per_input["input_id"].nunique()) if len(self.per_input) else 0

    def _summary(self) -> list[tuple[str, str]]:
        lines = [("Model", f"{self.model} on {self._inputs()} inputs of {self.dataset}"),
                 ("Frameworks", ", ".join(self.frameworks) + f" (reference: {self.reference})"),
                 ("Tolerance", f"{self.tolerance:g}, on max_rel_error = max|b - a| / max|a| per layer")]
        for (a, b) in self.pairs:
            key = _analysis.pair_label(a, b)
            first = self.first_divergent_layer.get(key)
            col = self.layers[_analysis.column("max_rel_error", key)]
            worst = col.max(skipna=True)
            out = self.outputs.set_index("pair").loc[key]
            lines.append((key, f"first layer over tolerance: {first or 'none'}; largest max_rel_error {worst:.3g}; "
                               f"top-1 agreement {out['top1_agreement']:.0%}, JS mean {out['js_mean_nats']:.3g} nats, "
                               f"max |logit error| {out['max_abs_logit_error']:.3g}"))
        acc = ", ".join(f"{r.framework} {r.top1:.0%} ({r.top1_delta:+.0%})" for r in self.accuracy.itertuples())
        lines.append(("Top-1 accuracy (delta vs reference)", acc))
        return lines

    def to_text(self) -> str:
        parts = [f"Divergence of {self.model}"]
        parts += [f"  {label}: {text}" for label, text in self._summary()]
        shown = ["layer"] + [_analysis.column("max_rel_error", _analysis.pair_label(*p)) for p in self.pairs] + \
                [_analysis.column("latency_ms", f) for f in self.frameworks]
        parts.append(self.layers[shown].to_string(max_rows=20, float_format=lambda v: f"{v:.3g}"))
        parts += [f"  {k}: {v}" for k, v in self.notes.items()]
        return "\n".join(parts)

    def __repr__(self) -> str:
        return self.to_text()

    def _repr_html_(self) -> str:
        esc = html.escape
        parts = ['<div class="mlms-divergence">', f"<h4>Divergence of {esc(self.model)}</h4>"]
        parts += [f"<div><b>{esc(label)}:</b> {esc(text)}</div>" for label, text in self._summary()]
        parts.append("<details><summary>outputs per pair</summary>" + self.outputs.to_html(index=False, float_format="{:.4g}".format) + "</details>")
        parts.append("<details><summary>accuracy per framework</summary>" + self.accuracy.to_html(index=False, float_format="{:.4g}".format) + "</details>")
        parts.append("<details><summary>per layer (error, latency in ms)</summary>"
                     + self.layers.drop(columns=["layer_name", "call"]).to_html(index=False, max_rows=200, float_format="{:.3g}".format)
                     + "</details>")
        parts.append("<ul>" + "".join(f"<li><b>{esc(k)}</b>: {esc(v)}</li>" for k, v in self.notes.items()) + "</ul></div>")
        return "\n".join(parts)
