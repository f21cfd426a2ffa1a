"""Device kernels: GPU time against host (CPU) time per layer, and a table of the kernels themselves.

Input: a spans frame (or a Trace: its ``metadata["unavailable"]`` then explains a missing profiler) traced at
SYSTEM_LIBRARY level on a GPU. A *device span* is a span of kind ``kernel``, ``memcpy`` or ``memset`` on a
device other than the host (``cuda:0``...); it belongs to its nearest enclosing layer span (CUPTI files a
kernel under the runtime call that launched it, itself inside the layer).

- :func:`compute` -- per layer call position: host time (the layer span's self time: nested layers' time is
  theirs) and GPU time (the sum of the durations of the device spans it launched itself), median and p25/p75
  over the predict calls, and kernels per call.
- :func:`kernel_table` -- per kernel name: launches, total / median / p25 / p75 duration, % of GPU time.

With no device spans (a CPU-only trace) both return an empty frame whose ``attrs["note"]`` says so.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from mlms_nb.display import people_table

from . import _plot, layers
from ._plot import AnalysisError

DEVICE_KINDS = ("kernel", "memcpy", "memset")
LAYER_COLUMNS = ("framework", "batch_size", "layer_index", "name", "layer_type", "repetitions", "kernels_per_call",
                 "cpu_median_ms", "cpu_p25_ms", "cpu_p75_ms", "gpu_median_ms", "gpu_p25_ms", "gpu_p75_ms",
                 "gpu_over_cpu")
KERNEL_COLUMNS = ("name", "kind", "device", "count", "total_ms", "median_ms", "p25_ms", "p75_ms", "mean_ms",
                  "gpu_time_pct")


def _unpack(trace) -> tuple[pd.DataFrame, dict]:
    spans = getattr(trace, "spans", trace)
    meta = getattr(trace, "metadata", {}) or {}
    _plot.require_columns(spans, layers.SPAN_COLUMNS_USED + ("device",), "spans frame")
    return spans.reset_index(drop=True), meta


def _device_mask(spans: pd.DataFrame) -> np.ndarray:
    device = spans["device"].astype(str).to_numpy()
    return np.isin(spans["kind"].astype(str).to_numpy(), DEVICE_KINDS) & ~np.isin(device, ("cpu", ""))


def _empty(columns, analysis: str, meta: dict) -> pd.DataFrame:
    frame = pd.DataFrame({c: [] for c in columns})
    unavailable = (meta.get("unavailable") or {}) if isinstance(meta, dict) else {}
    why = "; ".join(f"{k}: {v}" for k, v in unavailable.items() if "cupti" in k.lower() or "SYSTEM" in k)
    warning = ((meta.get("cupti") or {}).get("warning") if isinstance(meta, dict) else None)
    why = "; ".join(w for w in (why, warning) if w)
    frame.attrs["analysis"] = analysis
    frame.attrs["note"] = ("there are no device kernels in this trace (no span of kind kernel/memcpy/memset on a "
                           "GPU): it ran on the CPU, or was not traced at SYSTEM_LIBRARY level"
                           + (f"; the trace says: {why}" if why else ""))
    frame.attrs["title"] = "GPU kernels"
    return frame


def _clock_warning(meta: dict) -> str:
    """A note clause when CUPTI's clock mapping did not hold (:mod:`mlms_nb.profilers.cupti_clock`): the kernels'
    times, and so the layers they are filed under, may then be wrong."""
    check = ((meta.get("cupti") or {}) if isinstance(meta, dict) else {}).get("clock_check") or {}
    if not check or check.get("holds", True):
        return ""
    return (f"; WARNING: CUPTI's clock mapping put {check.get('outside_recording')} of {check.get('api_calls')} API "
            f"calls outside the recording, so kernel times and the layers they are filed under may be wrong")


@people_table
def compute(trace) -> pd.DataFrame:
    """GPU vs CPU time per layer (see the module doc); an empty frame, with the reason in its note, when the
    trace holds no device kernels."""
    spans, meta = _unpack(trace)
    device = _device_mask(spans)
    if not device.any():
        return _empty(LAYER_COLUMNS, "kernels_layers", meta)
    calls = layers.layer_calls(spans)
    kind = spans["kind"].astype(str).to_numpy()
    rows = np.flatnonzero(device)
    owner = layers.nearest_ancestor(layers._positions(spans), rows, kind == "layer")
    attributed = owner >= 0
    trace_ids = spans["trace_id"].astype(str).to_numpy()
    dev = pd.DataFrame({"trace_id": trace_ids[owner[attributed]],
                        "span_id": spans["span_id"].to_numpy(np.int64)[owner[attributed]],
                        "gpu_ns": spans["duration_ns"].to_numpy(np.int64)[rows[attributed]]})
    per_layer = dev.groupby(["trace_id", "span_id"]).agg(gpu_ns=("gpu_ns", "sum"), kernels=("gpu_ns", "size"))
    calls = calls.merge(per_layer.reset_index(), on=["trace_id", "span_id"], how="left")
    calls[["gpu_ns", "kernels"]] = calls[["gpu_ns", "kernels"]].fillna(0)
    keys = ["framework", "batch_size", "layer_index", "name", "layer_type"]
    g = calls.groupby(keys, sort=True)
    cpu = g["self_ns"].quantile([0.25, 0.5, 0.75]).unstack() / 1e6
    gpu = g["gpu_ns"].quantile([0.25, 0.5, 0.75]).unstack() / 1e6
    table = pd.DataFrame({"repetitions": g["repetition"].nunique(), "kernels_per_call": g["kernels"].median(),
                          "cpu_median_ms": cpu[0.5], "cpu_p25_ms": cpu[0.25], "cpu_p75_ms": cpu[0.75],
                          "gpu_median_ms": gpu[0.5], "gpu_p25_ms": gpu[0.25], "gpu_p75_ms": gpu[0.75]}).reset_index()
    table["gpu_over_cpu"] = table["gpu_median_ms"] / table["cpu_median_ms"]
    unowned = int((~attributed).sum())
    device_ns = spans["duration_ns"].to_numpy(np.int64)[rows]
    unowned_pct = 100.0 * device_ns[~attributed].sum() / device_ns.sum() if device_ns.sum() else 0.0
    table.attrs["analysis"] = "kernels_layers"
    table.attrs["note"] = ("cpu = the layer span's host self time (its duration minus nested layers'), gpu = the sum "
                           "of the durations of the device spans (kernels, copies, sets) it launched itself, as CUPTI "
                           "recorded them; median and p25/p75 over the traced predict calls; kernels run "
                           "asynchronously, so gpu can exceed cpu"
                           + (f"; {unowned} device span(s), {unowned_pct:.1f}% of the device time, were launched "
                              f"outside any layer and are not counted here" if unowned else "")
                           + _clock_warning(meta))
    table.attrs["title"] = "GPU vs CPU time per layer"
    return table


@people_table
def kernel_table(trace) -> pd.DataFrame:
    """Per device-span name (and kind, device): ``count`` (launches in the whole traced pass), ``total_ms``,
    ``median_ms``, ``p25_ms``, ``p75_ms``, ``mean_ms`` per launch, ``gpu_time_pct`` (of all device time)."""
    spans, meta = _unpack(trace)
    device = _device_mask(spans)
    if not device.any():
        return _empty(KERNEL_COLUMNS, "kernels_table", meta)
    dev = spans.loc[device, ["name", "kind", "device", "duration_ns"]].astype({"name": str, "kind": str, "device": str})
    g = dev.groupby(["name", "kind", "device"], sort=False)["duration_ns"]
    q = g.quantile([0.25, 0.5, 0.75]).unstack() / 1e6
    table = pd.DataFrame({"count": g.size(), "total_ms": g.sum() / 1e6, "median_ms": q[0.5], "p25_ms": q[0.25],
                          "p75_ms": q[0.75], "mean_ms": g.mean() / 1e6}).reset_index()
    table["gpu_time_pct"] = 100.0 * table["total_ms"] / table["total_ms"].sum()
    table = table.sort_values("total_ms", ascending=False, ignore_index=True)
    table.attrs["analysis"] = "kernels_table"
    table.attrs["note"] = ("device spans (kernels, memory copies and sets) recorded by CUPTI during the traced pass, "
                           "every batch size and repetition together; durations on the device's clock converted to "
                           "ns; per launch: median, p25, p75, mean" + _clock_warning(meta))
    table.attrs["title"] = "GPU kernels"
    return table


def plot(df: pd.DataFrame, backend: str = "bokeh", *, framework: str | None = None, batch_size: int | None = None,
         top: int = 30, title: str | None = None):
    """Per-layer frame: paired bars of host and GPU median time (p25-p75 whiskers) for the ``top`` layers by
    host time; kernel table: total time of the ``top`` kernels."""
    kind = _plot.require_analysis(df, "kernels_layers", "kernels_table")
    if df.empty:
        raise AnalysisError(f"nothing to plot: {df.attrs.get('note', 'the frame is empty')}")
    if kind == "kernels_table":
        part = df.head(top)
        labels = [f"{n[:60]} ({k})" for n, k in zip(part["name"], part["kind"])]
        panel = _plot.charts(backend, [dict(
            title=title or f"GPU kernels: the {len(part)} with the most device time",
            subtitle="total device time per kernel over the traced pass (CUPTI)",
            x_label="total device time (ms)", y_label="kernel", categories=labels)],
            height=layers._height(len(labels)))[0]
        panel.hbars(labels, part["total_ms"])
        panel.text(part["total_ms"], labels,
                   [f"{c} launches, {p:.1f}%" for c, p in zip(part["count"], part["gpu_time_pct"])])
        return _plot.combine([panel])
    part, which = layers._select(df, framework, batch_size)
    part = part.sort_values("cpu_median_ms", ascending=False).head(top)
    labels = [f"{i} {n} ({t})" for i, n, t in zip(part["layer_index"], part["name"], part["layer_type"])]
    panel = _plot.charts(backend, [dict(
        title=title or f"GPU vs CPU time per layer ({which})",
        subtitle="median and p25-p75 over the traced predict calls; CPU = layer span, GPU = its kernels (CUPTI)",
        x_label="time per call (ms)", y_label="layer", categories=labels)], height=layers._height(2 * len(labels)))[0]
    panel.hbars(labels, part["cpu_median_ms"], color=_plot.color(0), label="CPU (host) time", offset=-0.2,
                thickness=0.4)
    panel.hbars(labels, part["gpu_median_ms"], color=_plot.color(1), label="GPU (kernel) time", offset=0.2,
                thickness=0.4)
    panel.whiskers(labels, part["cpu_p25_ms"], part["cpu_p75_ms"], horizontal=True, offset=-0.2)
    panel.whiskers(labels, part["gpu_p25_ms"], part["gpu_p75_ms"], horizontal=True, offset=0.2)
    return _plot.combine([panel])
