"""Divergence between frameworks running the same model: numbers from arrays, tables, one plot.

Pure: arrays and frames in, frames and figures out (no framework, nothing from ``mlms_nb`` but the schema).
Definitions (``a`` is the reference tensor of a pair, ``b`` the other one, over all inputs of a run):

- ``max_abs_error`` = max |b - a|, in the tensor's own units;
- ``max_rel_error`` = max |b - a| / max |a|: the largest error relative to the layer's range of values
  (an element-wise |b - a| / |a| explodes on the zeros a ReLU makes, so it is not used). A worst case over
  every element of every input: one element far off (an INT8 activation rounded to the other side of a ReLU6's
  clip) makes it large while the layer as a whole agrees;
- ``rms_rel_error`` = sqrt(sum (b - a)^2 / sum a^2): the typical error relative to the layer's typical value
  (the root mean square of the error over that of the reference), what the layer as a whole is off by;
- ``cosine_similarity`` = <a, b> / (|a| |b|) over the flattened outputs of all inputs (1 = same direction);
- output divergences of softmax(logits): ``KL(p_a || p_b)`` and Jensen-Shannon ``JS(p_a, p_b)`` in nats,
  mean and max over inputs; ``top1_agreement`` = share of inputs whose top-1 classes are equal.

The layer table (:func:`layer_table`) has one row per aligned layer in execution order and, per pair
``a~b``, the columns ``max_abs_error[a~b]``, ``max_rel_error[a~b]``, ``rms_rel_error[a~b]``,
``cosine_similarity[a~b]`` (NaN where one of the two frameworks has no such tensor), then per framework
``latency_ms[f]`` and ``latency_iqr_ms[f]``. :func:`implausible_layers` says, in sentences, where a layer's error
contradicts the agreement of the outputs (what must hold: a model whose outputs agree has no layer that is wholly
off).
"""
from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np
import pandas as pd

from mlms_nb.schema.divergence import METRICS, column, pair_label  # noqa: F401 (the names of the layer table)

from . import _plot

ANALYSIS = "divergence.layers"


# ------------------------------------------------------------------------------------------ tensors

class ErrorStats:
    """Running error statistics of one tensor pair, fed batch by batch (float64 sums)."""

    __slots__ = ("max_abs_error", "max_abs_reference", "dot", "norm_a", "norm_b", "squared_error", "count")

    def __init__(self) -> None:
        self.max_abs_error = 0.0
        self.max_abs_reference = 0.0
        self.dot = self.norm_a = self.norm_b = self.squared_error = 0.0
        self.count = 0

    def update(self, a: np.ndarray, b: np.ndarray) -> "ErrorStats":
        """Add a batch: ``a`` (reference) and ``b`` of the same number of elements (``b`` is reshaped)."""
        a = np.asarray(a)
        b = np.asarray(b)
        if a.size != b.size:
            raise ValueError(f"tensor sizes differ: {a.shape} vs {b.shape}")
        a64 = a.astype(np.float64, copy=False).ravel()
        b64 = b.astype(np.float64, copy=False).ravel()
        if a64.size:
            diff = b64 - a64
            self.max_abs_error = max(self.max_abs_error, float(np.max(np.abs(diff))))
            self.squared_error += float(diff @ diff)  # summed directly: norms' differences cancel badly near 0
            self.max_abs_reference = max(self.max_abs_reference, float(np.max(np.abs(a64))))
            self.dot += float(a64 @ b64)
            self.norm_a += float(a64 @ a64)
            self.norm_b += float(b64 @ b64)
            self.count += a64.size
        return self

    def result(self) -> dict[str, float]:
        """``max_abs_error``, ``max_rel_error``, ``rms_rel_error``, ``cosine_similarity`` (NaN when undefined)."""
        rel = self.max_abs_error / self.max_abs_reference if self.max_abs_reference > 0 else (
            0.0 if self.max_abs_error == 0 else np.inf)
        rms = np.sqrt(self.squared_error / self.norm_a) if self.norm_a > 0 else (
            0.0 if self.squared_error == 0 else np.inf)
        denominator = np.sqrt(self.norm_a) * np.sqrt(self.norm_b)
        cosine = self.dot / denominator if denominator > 0 else (1.0 if self.norm_a == self.norm_b == 0 else np.nan)
        if not self.count:
            return dict(max_abs_error=np.nan, max_rel_error=np.nan, rms_rel_error=np.nan, cosine_similarity=np.nan)
        return dict(max_abs_error=self.max_abs_error, max_rel_error=float(rel), rms_rel_error=float(rms),
                    cosine_similarity=float(cosine))


def tensor_errors(a: np.ndarray, b: np.ndarray) -> dict[str, float]:
    """The three error metrics of one tensor pair (see the module docstring)."""
    return ErrorStats().update(a, b).result()


# ------------------------------------------------------------------------------------------ outputs

def softmax(logits: np.ndarray) -> np.ndarray:
    """Row-wise softmax in float64 (max subtracted first)."""
    x = np.asarray(logits, dtype=np.float64)
    x = x - x.max(axis=1, keepdims=True)
    e = np.exp(x)
    return e / e.sum(axis=1, keepdims=True)


def kl_divergence(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """KL(p || q) per row, in nats (terms with p = 0 count 0; q is floored at the float64 tiny)."""
    p = np.asarray(p, dtype=np.float64)
    q = np.maximum(np.asarray(q, dtype=np.float64), np.finfo(np.float64).tiny)
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(p > 0, p * (np.log(np.where(p > 0, p, 1.0)) - np.log(q)), 0.0)
    return np.maximum(terms.sum(axis=1), 0.0)


def js_divergence(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Jensen-Shannon divergence per row, in nats (0 .. ln 2)."""
    m = 0.5 * (np.asarray(p, dtype=np.float64) + np.asarray(q, dtype=np.float64))
    return 0.5 * kl_divergence(p, m) + 0.5 * kl_divergence(q, m)


def output_table(logits: Mapping[str, np.ndarray], pairs: Sequence[tuple[str, str]]) -> pd.DataFrame:
    """One row per pair: KL/JS divergence of the softmax outputs (mean, max over inputs), top-1 agreement,
    max |logit difference| and the number of inputs."""
    rows = []
    for a, b in pairs:
        la, lb = np.asarray(logits[a]), np.asarray(logits[b])
        pa, pb = softmax(la), softmax(lb)
        kl, js = kl_divergence(pa, pb), js_divergence(pa, pb)
        rows.append(dict(pair=pair_label(a, b), reference=a, other=b, n_inputs=len(la),
                         kl_mean_nats=float(kl.mean()), kl_max_nats=float(kl.max()),
                         js_mean_nats=float(js.mean()), js_max_nats=float(js.max()),
                         top1_agreement=float(np.mean(la.argmax(1) == lb.argmax(1))),
                         max_abs_logit_error=float(np.max(np.abs(lb.astype(np.float64) - la)))))
    return pd.DataFrame(rows)


def per_input_table(ids: Sequence[str], labels: np.ndarray | None, logits: Mapping[str, np.ndarray],
                    class_names: Sequence[str] | None = None, k: int = 5) -> pd.DataFrame:
    """One row per input and framework: label, predicted top-1 (and its probability), correct, top-k correct."""
    frames = []
    n = len(ids)
    label_arr = np.full(n, -1, dtype=np.int64) if labels is None else np.asarray(labels, dtype=np.int64)
    for fw, out in logits.items():
        prob = softmax(out)
        order = np.argsort(-prob, axis=1, kind="stable")[:, :k]
        top1 = order[:, 0]
        known = label_arr >= 0
        frame = pd.DataFrame({
            "input_id": list(ids), "framework": fw, "label": label_arr, "top1": top1.astype(np.int64),
            "top1_probability": prob[np.arange(n), top1],
            "correct": np.where(known, top1 == label_arr, False),
            f"top{k}_correct": np.where(known, (order == label_arr[:, None]).any(axis=1), False),
        })
        if class_names is not None:
            names = np.asarray(list(class_names), dtype=object)
            frame.insert(3, "label_name", [names[i] if 0 <= i < len(names) else "" for i in label_arr])
            frame.insert(5, "top1_name", names[top1])
        frames.append(frame)
    return pd.concat(frames, ignore_index=True)


def accuracy_table(per_input: pd.DataFrame, reference: str, k: int = 5) -> pd.DataFrame:
    """Top-1/top-k accuracy per framework (share of labelled inputs) and the delta vs ``reference``,
    computed from ``per_input`` alone; ``changed_vs_reference`` counts inputs whose correctness differs."""
    _plot.require_columns(per_input, ["input_id", "framework", "label", "correct", f"top{k}_correct"], "per_input")
    labelled = per_input[per_input["label"] >= 0]
    ref = labelled[labelled["framework"] == reference].set_index("input_id")
    rows = []
    for fw, group in labelled.groupby("framework", sort=False):
        g = group.set_index("input_id")
        changed = int((g["correct"] != ref["correct"].reindex(g.index)).sum()) if len(ref) else 0
        rows.append(dict(framework=fw, n_inputs=len(g), top1=float(g["correct"].mean()) if len(g) else np.nan,
                         **{f"top{k}": float(g[f"top{k}_correct"].mean()) if len(g) else np.nan},
                         changed_vs_reference=changed))
    table = pd.DataFrame(rows)
    if len(table):
        base = table.set_index("framework").loc[reference] if reference in set(table["framework"]) else None
        for metric in ("top1", f"top{k}"):
            table[f"{metric}_delta"] = table[metric] - (base[metric] if base is not None else np.nan)
    return table


# ------------------------------------------------------------------------------------------ layers

def layer_table(layers: pd.DataFrame, errors: Mapping[tuple[int, str], Mapping[str, float]],
                latency: Mapping[tuple[int, str], tuple[float, float]], pairs: Sequence[tuple[str, str]],
                frameworks: Sequence[str], tolerance: float) -> pd.DataFrame:
    """The wide per-layer table.

    ``layers``: one row per aligned layer (any identifying columns, index 0..n-1 in execution order);
    ``errors[(row, pair_label)]``: the metrics of that layer for that pair (missing = NaN);
    ``latency[(row, framework)]``: (median ms, IQR ms). Tagged ``attrs`` (pairs, frameworks, tolerance) for :func:`plot`.
    """
    table = layers.reset_index(drop=True).copy()
    n = len(table)
    for a, b in pairs:
        key = pair_label(a, b)
        for metric in METRICS:
            table[column(metric, key)] = [errors.get((i, key), {}).get(metric, np.nan) for i in range(n)]
    for fw in frameworks:
        table[column("latency_ms", fw)] = [latency.get((i, fw), (np.nan, np.nan))[0] for i in range(n)]
        table[column("latency_iqr_ms", fw)] = [latency.get((i, fw), (np.nan, np.nan))[1] for i in range(n)]
    table.attrs.update(analysis=ANALYSIS, pairs=[pair_label(a, b) for a, b in pairs], frameworks=list(frameworks),
                       tolerance=float(tolerance))
    return table


def first_divergent(table: pd.DataFrame, pair: str, tolerance: float, metric: str = "max_rel_error") -> int | None:
    """Row position of the first layer (execution order) whose ``metric`` for ``pair`` exceeds ``tolerance``;
    None when none does (layers the pair has no tensor for are skipped)."""
    col = column(metric, pair)
    _plot.require_columns(table, [col], "layer table")
    values = table[col].to_numpy(dtype=float)
    over = np.flatnonzero(np.isfinite(values) & (values > tolerance))
    return int(over[0]) if over.size else None


IMPLAUSIBLE_MAX_REL = 0.5
"""A layer whose worst element is off by more than half the layer's range is checked against the outputs."""
OUTPUTS_AGREE = 0.99
"""Top-1 agreement from which a pair's outputs count as agreeing (every input, up to rounding)."""
WHOLE_LAYER_AGREES = (0.3, 0.95)
"""rms_rel_error at most 30% and cosine similarity at least 0.95: the layer as a whole agrees. An INT8 copy of
EfficientNet-Lite0 stays within 18% and 0.98 at every layer; another layer's tensor compared (ReLU6 outputs
of two layers) has a cosine similarity well below 0.95, a uint8 tensor not dequantized an rms_rel_error in the
tens (1 / its scale)."""


def _named(rows: pd.DataFrame, col: str, most: int = 3) -> str:
    """``_swish#1 (84%), _blocks.3._swish (67%) and 4 more``: the worst rows first."""
    rows = rows.sort_values(col, ascending=False)
    named = ", ".join(f"{layer} ({value:.0%})" for layer, value in zip(rows["layer"].head(most), rows[col].head(most)))
    return named + (f" and {len(rows) - most} more" if len(rows) > most else "")


def implausible_layers(table: pd.DataFrame, outputs: pd.DataFrame) -> dict[str, list[str]]:
    """Per pair with the reference (the first framework), the sentences a reader needs where a layer's
    ``max_rel_error`` is above :data:`IMPLAUSIBLE_MAX_REL` while the pair's outputs agree on top-1
    (:data:`OUTPUTS_AGREE`): what must hold is that outputs which agree come from layers that agree.

    - the layer as a whole agrees (``rms_rel_error`` and cosine similarity within :data:`WHOLE_LAYER_AGREES`):
      the maximum is a few elements far off, said once per pair with the worst layers named;
    - it does not: the error contradicts the outputs' agreement, the worst layers named: the likely causes are a
      misaligned tensor (another layer's output compared) or a quantized tensor compared without dequantizing.
    """
    out: dict[str, list[str]] = {}
    agreement = outputs.set_index("pair")["top1_agreement"] if len(outputs) else pd.Series(dtype=float)
    rms_most, cosine_least = WHOLE_LAYER_AGREES
    reference = (table.attrs.get("frameworks") or [None])[0]
    for pair in table.attrs.get("pairs", []):
        if not pair.startswith(f"{reference}~"):  # a layer off between two others is off against the reference too
            continue
        agree = float(agreement.get(pair, np.nan))
        if not agree >= OUTPUTS_AGREE:
            continue
        mx, rms, cos = (column(m, pair) for m in ("max_rel_error", "rms_rel_error", "cosine_similarity"))
        high = table[table[mx].to_numpy(dtype=float) > IMPLAUSIBLE_MAX_REL]
        if high.empty:
            continue
        whole = (high[rms].to_numpy(dtype=float) <= rms_most) & (high[cos].to_numpy(dtype=float) >= cosine_least)
        said = []
        outliers, wrong = high[whole], high[~whole]
        if len(outliers):
            said.append(
                f"{pair}: {len(outliers)} layer(s) have a max_rel_error above {IMPLAUSIBLE_MAX_REL:.0%} of the layer's "
                f"largest value ({_named(outliers, mx)}) while top-1 agrees on {agree:.0%} of the inputs; not a "
                f"misalignment: as a whole these layers agree (rms_rel_error at most {outliers[rms].max():.1%}, "
                f"cosine similarity at least {outliers[cos].min():.3f}), so the maximum is a few elements far off "
                "(in an INT8 copy: activations rounded across a clipping edge); rms_rel_error is the layer's typical "
                "error")
        if len(wrong):
            worst = wrong.sort_values(mx, ascending=False).to_dict("records")
            named = "; ".join(f"{r['layer']} (max_rel_error {r[mx]:.0%}, rms_rel_error {r[rms]:.0%}, cosine "
                              f"similarity {r[cos]:.3f})" for r in worst[:3])
            whose = (f"layer {named}: its error contradicts" if len(worst) == 1 else
                     f"layers {named}" + (f" and {len(worst) - 3} more" if len(worst) > 3 else "")
                     + ": their errors contradict")
            said.append(
                f"{pair}: {whose} the outputs' agreement (top-1 agrees on {agree:.0%} of the inputs): likely "
                "misaligned (another tensor compared) or a quantized tensor compared without dequantizing")
        out[pair] = said
    return out


def plot(table: pd.DataFrame, backend: str = "bokeh", metric: str = "max_rel_error", title: str | None = None):
    """Error per layer in execution order (log y, tolerance line) beside each framework's latency per layer.

    Left panel: ``metric`` per pair; right panel: latency (median ms) per framework, same x axis.
    """
    _plot.require_analysis(table, ANALYSIS)
    if metric not in METRICS[:3]:
        raise _plot.AnalysisError(f"metric {metric!r}: expected one of {', '.join(METRICS[:3])}")
    pairs, frameworks = table.attrs["pairs"], table.attrs["frameworks"]
    tolerance = float(table.attrs["tolerance"])
    x = np.arange(len(table), dtype=float)
    names = [str(v) for v in table.get("layer", table.index)]
    unit = {"max_rel_error": "(max |error| / max |reference|)",
            "rms_rel_error": "(RMS error / RMS reference)"}.get(metric, "(tensor units)")
    panels = _plot.charts(backend, [
        dict(title=f"{metric} per layer, over all inputs (log scale; dashed: tolerance {tolerance:g})",
             x_label="layer (execution order, index)", y_label=f"{metric} {unit}", y_log=True),
        dict(title="latency per layer: median over timed calls, batch 1", x_label="layer (execution order, index)",
             y_label="latency (ms)"),
    ], width=640, height=380)
    err, lat = panels
    floor = 1e-12  # exact zeros cannot sit on a log axis: drawn at the floor
    for i, pair in enumerate(pairs):
        values = table[column(metric, pair)].to_numpy(dtype=float)
        ok = np.isfinite(values)
        err.line(x[ok], np.maximum(values[ok], floor), color=_plot.color(i), width=1.5)
        err.points(x[ok], np.maximum(values[ok], floor), label=pair, color=_plot.color(i), size=5,
                   hover={"layer": [names[j] for j in np.flatnonzero(ok)]})
    err.line([x.min() if len(x) else 0, x.max() if len(x) else 1], [tolerance, tolerance], color="#555555", dash=True,
             width=1.0, label=f"tolerance {tolerance:g}")
    for i, fw in enumerate(frameworks):
        values = table[column("latency_ms", fw)].to_numpy(dtype=float)
        ok = np.isfinite(values)
        lat.line(x[ok], values[ok], color=_plot.color(len(pairs) + i), width=1.2)
        lat.points(x[ok], values[ok], label=fw, color=_plot.color(len(pairs) + i), size=4,
                   hover={"layer": [names[j] for j in np.flatnonzero(ok)]})
    return _plot.combine(panels, title=title)


def plot_outputs(table: pd.DataFrame, backend: str = "bokeh", tolerance: float = 1e-4, title: str | None = None):
    """Output-level divergence (:mod:`mlms_nb.divergence.outputs`): max_rel_error per framework and output as bars
    (orange: over ``tolerance``)."""
    _plot.require_columns(table, ("framework", "output", "metric", "value"), "an output divergence table")
    rows = table[table["metric"] == "max_rel_error"]
    labels = [f"{fw}: {out}" for fw, out in zip(rows["framework"], rows["output"])]
    values = rows["value"].to_numpy(dtype=float)
    panel = _plot.charts(backend, [dict(
        title=title or "output divergence",
        x_label=f"max_rel_error = max|b - a| / max|a| over the inputs (orange: over tolerance {tolerance:g})",
        y_label="framework: output", categories=labels)], height=max(200, 40 * len(labels) + 120))[0]
    over = values > tolerance
    for sel, color in ((~over, _plot.color(0)), (over, _plot.color(1))):
        if sel.any():
            panel.hbars(np.array(labels)[sel], values[sel], color=color)
    return _plot.combine([panel])
