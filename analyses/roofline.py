"""Roofline: where each layer (or the whole model, per batch size) sits against the machine's ceilings.

The roof: attainable FLOP/s = ``min(peak_flops_per_s, intensity * bandwidth_bytes_per_s)``. The **ridge
point** is ``peak_flops_per_s / bandwidth_bytes_per_s`` (FLOP per byte): a point whose arithmetic intensity
(``flops / bytes``) lies left of it is **memory-bound**, right of it (or on it) **compute-bound**.
Achieved FLOP/s = theoretical FLOPs / measured time.

- :func:`compute` -- per layer: costs (``layer_index, layer_name, layer_type, flops, bytes``, e.g. from
  ``mlms_nb.theory``) joined to measured layer latency (:func:`analyses.layers.latency`, ``by="layer"``;
  the layer's self time, so a nested padding layer's time is not charged to its convolution).
- :func:`compute_model` -- per framework and batch size: the model's total FLOPs and bytes at that batch
  size against the evaluation's median latency per call.

Everything is plain numbers and frames in; the ceilings (peak FLOP/s, memory bandwidth) come from wherever
they were measured or looked up (per framework: that framework's own best kernels), and the note says which
numbers were used. Every point above its roof is flagged (:mod:`._roof_check`: ``roof_check``,
``roof_check_why``) and drawn with its own marker, never silently above 100% of attainable.
"""
from __future__ import annotations

from typing import Mapping

import numpy as np
import pandas as pd

from mlms_nb.display import people_table
from mlms_nb.schema.evaluation import LATENCY

from . import _plot
from ._plot import AnalysisError
from ._roof_check import ABOVE, WITHIN, RoofContext, check, summary
from .phases import PHASE_COLOURS

__all__ = ["RoofContext", "attainable", "classify", "compute", "compute_model", "plot", "ridge_point"]

MODEL_LATENCY = LATENCY.pick("framework", "batch_size", "median_ms", "median_ci_low_ms", "median_ci_high_ms")
"""The latency columns :func:`compute_model` reads (the CI bounds may be missing)."""

COST_COLUMNS = ("layer_name", "flops", "bytes")



def ridge_point(peak_flops_per_s: float, bandwidth_bytes_per_s: float) -> float:
    """The ridge point of the roofline, FLOP/byte: ``peak / bandwidth``."""
    return _plot.positive(peak_flops_per_s, "peak_flops_per_s") / _plot.positive(bandwidth_bytes_per_s,
                                                                                  "bandwidth_bytes_per_s")


def attainable(intensity_flop_per_byte, peak_flops_per_s: float, bandwidth_bytes_per_s: float) -> np.ndarray:
    """The roof at each intensity, FLOP/s: ``min(peak, intensity * bandwidth)``."""
    return np.minimum(float(peak_flops_per_s), np.asarray(intensity_flop_per_byte, dtype=float) * bandwidth_bytes_per_s)


def classify(intensity_flop_per_byte, ridge_flop_per_byte: float) -> np.ndarray:
    """``"memory"`` left of the ridge (intensity < ridge), ``"compute"`` at or right of it."""
    x = np.asarray(intensity_flop_per_byte, dtype=float)
    return np.where(x < ridge_flop_per_byte, "memory", "compute")


def _costs_by_batch(costs) -> pd.DataFrame:
    """A costs frame (optionally with ``batch_size``) or ``{batch_size: costs frame}`` -> one frame."""
    if isinstance(costs, Mapping):
        parts = [pd.DataFrame(frame).assign(batch_size=int(bs)) for bs, frame in costs.items()]
        if not parts:
            raise AnalysisError("costs: the mapping {batch_size: costs frame} is empty")
        costs = pd.concat(parts, ignore_index=True)
    _plot.require_columns(costs, COST_COLUMNS, "costs frame")
    return costs


def _occurrence(frame: pd.DataFrame, name: str, keys: list[str], order: str) -> pd.Series:
    """k-th call of the same layer name (0, 1, ...), in ``order`` -- a shared module (one ReLU6 called twice)
    gets one row per call on both sides."""
    return frame.sort_values(keys + [order], kind="stable").groupby(keys + [name]).cumcount().reindex(frame.index)


def _ceilings_note(peak: float, bw: float, ridge: float, source: str | None) -> str:
    return (f"roof: peak {peak / 1e9:.4g} GFLOP/s, memory bandwidth {bw / 1e9:.4g} GB/s, ridge point "
            f"{ridge:.3g} FLOP/byte (= peak / bandwidth){f' ({source})' if source else ''}")


@people_table
def compute(costs, layer_latency: pd.DataFrame, peak_flops_per_s: float, bandwidth_bytes_per_s: float, *,
            ceilings_source: str | None = None, roof: RoofContext | None = None) -> pd.DataFrame:
    """Per layer (and framework, batch size): ``flops, bytes, intensity_flop_per_byte, median_ms, p25_ms,
    p75_ms`` (the layer's measured self time), ``achieved_flops_per_s`` (flops / median time) with
    ``achieved_low_flops_per_s`` / ``achieved_high_flops_per_s`` (at p75 / p25 time), ``attainable_flops_per_s``,
    ``pct_of_attainable`` and ``bound`` ("memory" | "compute"; "none" for layers with no FLOPs); ``roof_check``
    and ``roof_check_why`` flag every point above its roof (``roof``: the ceilings' spread and what else the
    check may use, :class:`RoofContext`).

    ``costs``: rows with ``layer_name, flops, bytes`` (and ``layer_type``, ``layer_index``), for the batch size
    measured -- or with a ``batch_size`` column, or a ``{batch_size: costs}`` mapping, when the latency frame
    holds several. Rows are matched on layer name and its call count (the k-th call of a module name on each
    side); layers moving no bytes (views) and layers not in both frames are left out (the note counts them).

    A generate trace (a ``phase`` column in the latency frame, :func:`analyses.layers.latency`) needs costs with a
    ``phase`` column too, counted at that phase's shapes (prefill: the prompt; decode: one token against the KV
    cache): each layer is then a point per phase, matched within its phase.
    """
    ridge = ridge_point(peak_flops_per_s, bandwidth_bytes_per_s)
    peak, bw = float(peak_flops_per_s), float(bandwidth_bytes_per_s)
    shapes = ({bs: getattr(f, "attrs", {}).get("phases") for bs, f in costs.items()} if isinstance(costs, Mapping)
              else {None: getattr(costs, "attrs", {}).get("phases")})
    costs = _costs_by_batch(costs).copy()
    lat = layer_latency
    _plot.require_columns(lat, ("framework", "batch_size", "layer_index", "name"), "layer latency frame")
    cols = ("self_median_ms", "self_p25_ms", "self_p75_ms") if "self_median_ms" in lat else ("median_ms", "p25_ms",
                                                                                             "p75_ms")
    _plot.require_columns(lat, cols, "layer latency frame")
    lat = lat.drop(columns=[c for c in ("median_ms", "p25_ms", "p75_ms") if c not in cols and c in lat])
    lat = lat.rename(columns=dict(zip(cols, ("median_ms", "p25_ms", "p75_ms"))))
    if "batch_size" not in costs:
        if lat["batch_size"].nunique() > 1:
            raise AnalysisError("the costs frame has no batch_size column but the latency frame holds batch sizes "
                                f"{sorted(lat['batch_size'].unique())}; give costs per batch size "
                                "({batch_size: costs frame}) or filter the latency frame to one batch size")
        costs["batch_size"] = int(lat["batch_size"].iloc[0])
    if "layer_index" not in costs:
        costs["layer_index"] = np.arange(len(costs))
    phased = "phase" in lat and (lat["phase"] != "").any()
    if phased and "phase" not in costs:
        raise AnalysisError("the layer latency frame is per phase (a generate trace: prefill and decode) but the "
                            "costs frame has no phase column; count costs at each phase's shapes")
    by = ["phase"] if phased else []
    costs["call"] = _occurrence(costs, "layer_name", ["batch_size"] + by, "layer_index")
    lat = lat.assign(layer_name=lat["name"].astype(str))
    lat["call"] = _occurrence(lat, "layer_name", ["framework", "batch_size"] + by, "layer_index")
    keep = ["framework", "batch_size"] + by + ["layer_index", "layer_name", "call", "median_ms", "p25_ms", "p75_ms"]
    if "layer_type" in lat:
        keep.append("layer_type")
    cost_cols = ["batch_size"] + by + ["layer_name", "call", "flops", "bytes"] + (
        ["layer_type"] if "layer_type" in costs and "layer_type" not in lat else [])
    key = ["batch_size"] + by + ["layer_name", "call"]
    merged = lat[keep].merge(costs[cost_cols], on=key, how="inner")
    relevant = costs[costs["batch_size"].isin(lat["batch_size"])][key]
    unmatched_costs = int((~relevant.merge(merged[key].drop_duplicates(), on=key, how="left", indicator=True)
                          ["_merge"].eq("both")).sum())
    unmatched_layers = len(lat) - len(merged)
    moving = merged["bytes"] > 0
    views = int((~moving).sum())
    merged = merged[moving].reset_index(drop=True)
    if merged.empty:
        raise AnalysisError("no layer of the costs frame matches a measured layer by name: check that both come "
                            "from the same model (costs layer_name vs latency name)")
    out = merged.drop(columns="call")
    out["flops"] = out["flops"].astype(float)
    out["bytes"] = out["bytes"].astype(float)
    out["intensity_flop_per_byte"] = out["flops"] / out["bytes"]
    seconds = out["median_ms"] / 1e3
    out["achieved_flops_per_s"] = out["flops"] / seconds
    out["achieved_low_flops_per_s"] = out["flops"] / (out["p75_ms"] / 1e3)
    out["achieved_high_flops_per_s"] = out["flops"] / (out["p25_ms"] / 1e3)
    out["attainable_flops_per_s"] = attainable(out["intensity_flop_per_byte"], peak, bw)
    out["pct_of_attainable"] = 100.0 * out["achieved_flops_per_s"] / out["attainable_flops_per_s"].where(
        out["attainable_flops_per_s"] > 0)
    out["bound"] = np.where(out["flops"] > 0, classify(out["intensity_flop_per_byte"], ridge), "none")
    out["ridge_flop_per_byte"] = ridge
    out = out.sort_values(["framework", "batch_size"] + by + ["layer_index"], ignore_index=True)
    check(out, peak, bw, ridge, roof)
    _finish(out, "roofline_layers", peak, bw, ridge)
    phase_note = ""
    if phased:
        said = "; ".join(f"{'' if bs is None else f'batch size {bs}: '}{', '.join(f'{k} {v}' for k, v in p.items())}"
                         for bs, p in shapes.items() if p)
        phase_note = ("; per phase of generation, each at its own shapes" + (f" ({said})" if said else "")
                      + ", decode times aggregated over every traced decode step")
    out.attrs["note"] = (
        "per layer: theoretical FLOPs and minimum bytes (weights + inputs + outputs) from the costs frame, over "
        "the layer's measured self time (median, p25-p75 over the traced predict calls, tracer overhead included); "
        + _ceilings_note(peak, bw, ridge, ceilings_source)
        + "; bound: memory if intensity < ridge, else compute ('none': no FLOPs)"
        + (f"; left out: {views} layer(s) moving no bytes" if views else "")
        + (f"; {unmatched_costs} cost row(s) without a measured layer of that name (e.g. ops in a container's "
           f"forward)" if unmatched_costs else "")
        + (f"; {unmatched_layers} measured layer call(s) without costs" if unmatched_layers else "")
        + phase_note + (f"; {summary(out)}" if summary(out) else ""))
    out.attrs["title"] = "Roofline per layer" + (" and phase" if phased else "")
    return out


@people_table
def compute_model(model_costs, latency, peak_flops_per_s: float, bandwidth_bytes_per_s: float, *,
                  ceilings_source: str | None = None, roof: RoofContext | None = None) -> pd.DataFrame:
    """Per framework and batch size: the whole model on the roofline.

    ``model_costs``: a frame with ``batch_size, flops, bytes`` (the model's totals for one call at that batch
    size), or ``{batch_size: per-layer costs frame}`` (summed here). ``latency``: an evaluation's latency frame
    (or the Evaluation): ``framework, batch_size, median_ms`` (+ ``median_ci_low_ms, median_ci_high_ms``).
    Columns: ``framework, batch_size, flops, bytes, intensity_flop_per_byte, median_ms, achieved_flops_per_s``
    (+ low/high at the median's 95% CI), ``attainable_flops_per_s, pct_of_attainable, bound``, ``roof_check,
    roof_check_why`` (as in :func:`compute`).
    """
    ridge = ridge_point(peak_flops_per_s, bandwidth_bytes_per_s)
    peak, bw = float(peak_flops_per_s), float(bandwidth_bytes_per_s)
    if isinstance(model_costs, Mapping):
        model_costs = pd.DataFrame([{"batch_size": int(bs), "flops": float(pd.DataFrame(f)["flops"].sum()),
                                     "bytes": float(pd.DataFrame(f)["bytes"].sum())} for bs, f in model_costs.items()])
    _plot.require_columns(model_costs, ("batch_size", "flops", "bytes"), "model costs frame")
    lat = getattr(latency, "latency", latency)
    _plot.require_columns(lat, MODEL_LATENCY[:3], "latency frame")
    lat = lat.copy()
    for col in ("median_ci_low_ms", "median_ci_high_ms"):
        if col not in lat:
            lat[col] = np.nan
    if "scenario" in lat and lat["scenario"].nunique() > 1:
        lat = lat[lat["scenario"] == lat["scenario"].iloc[0]]
    merged = lat[list(MODEL_LATENCY)].merge(
        model_costs[["batch_size", "flops", "bytes"]], on="batch_size", how="inner")
    if merged.empty:
        raise AnalysisError(f"no batch size is in both the costs ({sorted(model_costs['batch_size'])}) and the "
                            f"latency frame ({sorted(lat['batch_size'].unique())})")
    out = merged[["framework", "batch_size", "flops", "bytes"]].astype({"flops": float, "bytes": float})
    out["intensity_flop_per_byte"] = out["flops"] / out["bytes"]
    out["median_ms"] = merged["median_ms"]
    out["achieved_flops_per_s"] = out["flops"] / (merged["median_ms"] / 1e3)
    out["achieved_low_flops_per_s"] = out["flops"] / (merged["median_ci_high_ms"] / 1e3)
    out["achieved_high_flops_per_s"] = out["flops"] / (merged["median_ci_low_ms"] / 1e3)
    out["attainable_flops_per_s"] = attainable(out["intensity_flop_per_byte"], peak, bw)
    out["pct_of_attainable"] = 100.0 * out["achieved_flops_per_s"] / out["attainable_flops_per_s"]
    out["bound"] = classify(out["intensity_flop_per_byte"], ridge)
    out["ridge_flop_per_byte"] = ridge
    out = out.sort_values(["framework", "batch_size"], ignore_index=True)
    check(out, peak, bw, ridge, roof)
    _finish(out, "roofline_model", peak, bw, ridge)
    out.attrs["note"] = ("per framework and batch size: the model's theoretical FLOPs and minimum bytes per call over "
                         "the evaluation's median latency per call (untraced timed loop; low/high at the 95% "
                         "bootstrap CI of the median); " + _ceilings_note(peak, bw, ridge, ceilings_source)
                         + "; bound: memory if intensity < ridge, else compute"
                         + (f"; {summary(out)}" if summary(out) else ""))
    out.attrs["title"] = "Roofline of the whole model per batch size"
    return out


def _finish(out: pd.DataFrame, analysis: str, peak: float, bw: float, ridge: float) -> None:
    out.attrs.update(analysis=analysis, peak_flops_per_s=peak, bandwidth_bytes_per_s=bw, ridge_flop_per_byte=ridge)


def _roof_of(part: pd.DataFrame, df: pd.DataFrame) -> tuple[float, float, float]:
    """Peak, bandwidth and ridge of the rows plotted: each framework has its own roof (the rows carry it)."""
    if "ceiling_peak_flops_per_s" in part and part["ceiling_peak_flops_per_s"].nunique() == 1:
        peak, bw = float(part["ceiling_peak_flops_per_s"].iloc[0]), float(part["ceiling_bandwidth_bytes_per_s"].iloc[0])
        return peak, bw, peak / bw
    return df.attrs["peak_flops_per_s"], df.attrs["bandwidth_bytes_per_s"], df.attrs["ridge_flop_per_byte"]


def plot(df: pd.DataFrame, backend: str = "bokeh", *, framework: str | None = None, batch_size: int | None = None,
         title: str | None = None):
    """Log-log roofline: the roof (bandwidth slope, peak plateau), the ridge point, and each layer (one
    framework and batch size; default the first and the smallest) or each framework x batch size, coloured
    memory- or compute-bound, with whiskers over the spread of the measured time. Points above their roof get a
    marker and colour of their own (red x: above the roof beyond the spread, a measurement problem; diamond: at
    the roof within the spread), with a legend entry each. A whole-model frame whose frameworks have different
    roofs is drawn one framework at a time (``framework``; default the first)."""
    kind = _plot.require_analysis(df, "roofline_layers", "roofline_model")
    if kind == "roofline_layers":
        from .layers import _select

        part, which = _select(df, framework, batch_size)
        part = part[part["flops"] > 0]
        how = "theoretical FLOPs / measured median self time, whiskers p25-p75"
    else:
        part, which = df, "every framework and batch size"
        roofs = ["ceiling_peak_flops_per_s", "ceiling_bandwidth_bytes_per_s"]
        if framework is not None or (set(roofs) <= set(df) and len(df[roofs].drop_duplicates()) > 1):
            fw = framework if framework is not None else df["framework"].iloc[0]
            part, which = df[df["framework"] == fw], str(fw)
        how = "theoretical FLOPs / median latency per call, whiskers 95% CI"
    if part.empty:
        raise AnalysisError("nothing to plot: no layer with FLOPs in this frame")
    peak, bw, ridge = _roof_of(part, df)
    x = part["intensity_flop_per_byte"].to_numpy(float)
    lo_x = min(x.min(), ridge) / 4
    hi_x = max(x.max(), ridge) * 4
    xs = np.geomspace(lo_x, hi_x, 200)
    check = part["roof_check"] if "roof_check" in part else pd.Series("", index=part.index)
    why = "; red x: above its roof, its likely cause in roof_check_why" if (check == ABOVE).any() else ""
    panel = _plot.charts(backend, [dict(
        title=title or f"{df.attrs['title']} ({which})",
        subtitle=f"{how}; roof: {peak / 1e9:.3g} GFLOP/s peak, {bw / 1e9:.3g} GB/s, ridge {ridge:.3g} FLOP/byte"
                 + why,
        x_label="arithmetic intensity (FLOP/byte)", y_label="performance (FLOP/s)", x_log=True, y_log=True)],
        width=820, height=480)[0]
    panel.line(xs, attainable(xs, peak, bw), label="roof: min(peak, intensity x bandwidth)", color="#222222")
    panel.vline(ridge, label=f"ridge point {ridge:.3g} FLOP/byte")
    free = ~check.isin([ABOVE, WITHIN])
    phases = [p for p in PHASE_COLOURS if "phase" in part and p in set(part["phase"])]
    if phases:  # a generate trace: each layer a point per phase, the phase in the colour, the bound in the marker
        groups = [(part[(part["phase"] == ph) & (part["bound"] == bound) & free], f"{ph}, {bound}-bound",
                   PHASE_COLOURS[ph], marker)
                  for ph in phases for bound, marker in (("memory", "circle"), ("compute", "triangle"))]
    else:
        groups = [(part[(part["bound"] == "memory") & free], "memory-bound", _plot.color(0), "circle"),
                  (part[(part["bound"] == "compute") & free], "compute-bound", _plot.color(2), "triangle")]
    groups += [(part[check == WITHIN], "at roof, within spread", _plot.color(1), "diamond"),
              (part[check == ABOVE], "above roof: measurement problem", "#d62728", "x")]
    for sel, label, color, marker in groups:
        if sel.empty:
            continue
        if kind == "roofline_layers":
            hover = {"layer": [f"{i} {n}" for i, n in zip(sel["layer_index"], sel["layer_name"])],
                     "type": list(sel.get("layer_type", pd.Series([""] * len(sel))).astype(str))}
            if "phase" in sel:
                hover["phase"] = list(sel["phase"].astype(str))
        else:
            hover = {"run": [f"{f} batch {b}" for f, b in zip(sel["framework"], sel["batch_size"])]}
        if "roof_check_why" in sel:
            hover["check"] = list(sel["roof_check_why"].astype(str))
        panel.points(sel["intensity_flop_per_byte"], sel["achieved_flops_per_s"], color=color, marker=marker,
                     label=f"{label} ({len(sel)})", hover=hover, size=10 if marker == "x" else 8)
        panel.whiskers(sel["intensity_flop_per_byte"], sel["achieved_low_flops_per_s"],
                       sel["achieved_high_flops_per_s"], color=color)
        if kind == "roofline_model":
            panel.text(sel["intensity_flop_per_byte"], sel["achieved_flops_per_s"],
                       [f"{f} b{b}" for f, b in zip(sel["framework"], sel["batch_size"])])
    return _plot.combine([panel])
