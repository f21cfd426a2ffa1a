"""Batch scaling: latency and throughput against batch size, and where throughput saturates.

Input: an evaluation's ``latency`` frame (``framework, batch_size, scenario, samples, median_ms,
median_ci_low_ms, median_ci_high_ms, p90_ms, iqr_ms, throughput_per_s``), or the Evaluation itself.

**Saturation rule**: per framework and scenario, the saturation batch size is the smallest batch size whose
throughput is at least ``threshold`` (default 0.9 = 90%) of the highest throughput measured at any batch
size. When that is the largest batch size measured, throughput may still be rising (``saturated_within_range``
is False): measure larger batches to find the plateau.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from mlms_nb.display import people_table
from mlms_nb.schema.evaluation import LATENCY

from . import _plot
from ._plot import AnalysisError

DEFAULT_THRESHOLD = 0.9
REQUIRED = LATENCY.pick("framework", "batch_size", "median_ms", "throughput_per_s")
OPTIONAL = LATENCY.pick("scenario", "samples", "median_ci_low_ms", "median_ci_high_ms", "p90_ms", "iqr_ms")
"""The latency columns read (names from :mod:`mlms_nb.schema.evaluation`); the optional ones may be missing."""


def _latency_frame(latency) -> pd.DataFrame:
    frame = getattr(latency, "latency", latency)  # an Evaluation, or its latency frame
    _plot.require_columns(frame, REQUIRED, "latency frame")
    if frame.empty:
        raise AnalysisError("the latency frame is empty: the evaluation measured no latency")
    frame = frame.copy()
    if "scenario" not in frame:
        frame["scenario"] = "single-stream"
    return frame


def saturation_batch_size(batch_sizes, throughput_per_s, threshold: float = DEFAULT_THRESHOLD) -> int:
    """The smallest batch size whose throughput reaches ``threshold`` x the maximum throughput."""
    bs = np.asarray(batch_sizes, dtype=np.int64)
    tp = np.asarray(throughput_per_s, dtype=float)
    if bs.size == 0 or not np.isfinite(tp).any():
        raise AnalysisError("saturation: no finite throughput to find a saturation point in")
    if not 0 < threshold <= 1:
        raise AnalysisError(f"threshold: expected a fraction in (0, 1], got {threshold!r}")
    reach = np.isfinite(tp) & (tp >= threshold * np.nanmax(tp))
    return int(bs[reach].min())


@people_table
def compute(latency, threshold: float = DEFAULT_THRESHOLD) -> pd.DataFrame:
    """Per framework, scenario and batch size: latency (median, its 95% CI, p90, IQR), latency per input,
    throughput (and its range at the CI of the median), relative throughput, and the saturation batch size.

    Columns: ``framework, scenario, batch_size, samples, median_ms, median_ci_low_ms, median_ci_high_ms,
    p90_ms, iqr_ms, per_input_ms, throughput_per_s, throughput_ci_low_per_s, throughput_ci_high_per_s,
    relative_throughput, saturation_batch_size, saturated, saturated_within_range``.
    """
    frame = _latency_frame(latency)
    rows = []
    for (fw, scenario), part in frame.groupby(["framework", "scenario"], sort=False):
        part = part.sort_values("batch_size")
        bs = part["batch_size"].to_numpy(np.int64)
        tp = part["throughput_per_s"].to_numpy(float)
        sat = saturation_batch_size(bs, tp, threshold)
        med = part["median_ms"].to_numpy(float)
        lo = part["median_ci_low_ms"].to_numpy(float) if "median_ci_low_ms" in part else np.full(len(part), np.nan)
        hi = part["median_ci_high_ms"].to_numpy(float) if "median_ci_high_ms" in part else np.full(len(part), np.nan)
        out = pd.DataFrame({
            "framework": fw, "scenario": scenario, "batch_size": bs,
            "samples": part["samples"].to_numpy() if "samples" in part else np.nan,
            "median_ms": med, "median_ci_low_ms": lo, "median_ci_high_ms": hi,
            "p90_ms": part["p90_ms"].to_numpy(float) if "p90_ms" in part else np.nan,
            "iqr_ms": part["iqr_ms"].to_numpy(float) if "iqr_ms" in part else np.nan,
            "per_input_ms": med / bs,
            "throughput_per_s": tp,
            "throughput_ci_low_per_s": bs * 1e3 / hi, "throughput_ci_high_per_s": bs * 1e3 / lo,
            "relative_throughput": tp / np.nanmax(tp),
            "saturation_batch_size": sat, "saturated": bs >= sat,
            "saturated_within_range": bool(sat < bs.max()),
        })
        rows.append(out)
    table = pd.concat(rows, ignore_index=True)
    table.attrs["analysis"] = "batch_scaling"
    table.attrs["threshold"] = float(threshold)
    table.attrs["note"] = (
        f"latency: median of the timed calls per batch size, 95% bootstrap CI of the median, p90, IQR (from the "
        f"evaluation's untraced sweep); throughput_per_s as the evaluation reports it (inputs/s); its CI columns "
        f"are batch size / the median's CI bounds; saturation batch size = the smallest batch size reaching "
        f">= {threshold:.0%} of the highest throughput measured (per framework and scenario)"
        + "; " + "; ".join(saturation_text(part, label)
                           for label, part in _groups(table)))
    table.attrs["title"] = "Latency and throughput against batch size"
    return table


def saturation_text(part: pd.DataFrame, label: str) -> str:
    """The one sentence on where ``part``'s throughput (one framework and scenario) saturates, used by the note and
    the plot's legend alike: "saturates at B" only when B is below the largest batch size measured."""
    sat, largest = int(part["saturation_batch_size"].iloc[0]), int(part["batch_size"].max())
    if bool(part["saturated_within_range"].iloc[0]):
        return f"{label}: saturates at {sat}"
    return f"{label}: saturation not reached up to batch size {largest}"


def _groups(df: pd.DataFrame):
    """``(label, rows)`` per framework and scenario, the scenario in the label only when there are several."""
    several = df["scenario"].nunique() > 1
    for (fw, scenario), part in df.groupby(["framework", "scenario"], sort=False):
        yield (f"{fw} ({scenario})" if several else str(fw)), part


def plot(df: pd.DataFrame, backend: str = "bokeh", title: str | None = None):
    """Two panels: median latency per batch (95% CI whiskers) and throughput (CI whiskers) against batch size
    (log2 axis), the saturation batch size marked per framework."""
    _plot.require_analysis(df, "batch_scaling")
    threshold = df.attrs.get("threshold", DEFAULT_THRESHOLD)
    base = title or df.attrs.get("title", "Batch scaling")
    ticks = sorted(df["batch_size"].unique())
    left, right = _plot.charts(backend, [
        dict(title="Median latency per call", subtitle="whiskers: 95% bootstrap CI of the median (untraced timed "
             "loop)", x_label="batch size (inputs per call)", y_label="median latency per call (ms)", x_log=True,
             x_ticks=ticks),
        dict(title="Throughput", subtitle=f"dotted: saturation (the smallest batch size reaching {threshold:.0%} of "
             "the highest throughput)", x_label="batch size (inputs per call)", y_label="throughput (inputs/s)",
             x_log=True, x_ticks=ticks),
    ], width=560, height=380)
    for i, (label, part) in enumerate(_groups(df)):
        c = _plot.color(i)
        left.line(part["batch_size"], part["median_ms"], label=label, color=c)
        left.points(part["batch_size"], part["median_ms"], color=c)
        left.whiskers(part["batch_size"], part["median_ci_low_ms"], part["median_ci_high_ms"], color=c)
        right.line(part["batch_size"], part["throughput_per_s"], label=label, color=c)
        right.points(part["batch_size"], part["throughput_per_s"], color=c)
        right.whiskers(part["batch_size"], part["throughput_ci_low_per_s"], part["throughput_ci_high_per_s"], color=c)
        if bool(part["saturated_within_range"].iloc[0]):  # the line only where saturation was seen
            right.vline(part["saturation_batch_size"].iloc[0], color=c, label=saturation_text(part, label))
        else:
            right.points(part["batch_size"].iloc[-1:], part["throughput_per_s"].iloc[-1:], color=c,
                         label=saturation_text(part, label))
    return _plot.combine([left, right], title=base)
