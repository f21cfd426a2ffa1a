"""Normalised latency: each framework's (or system's) latency divided by a baseline's, batch size by batch size.

Input, one of:

- a latency frame (``Evaluation.latency``: ``framework, batch_size, scenario, median_ms, median_ci_low_ms,
  median_ci_high_ms, ...``), grouped by its column ``by`` (default ``"framework"``);
- a mapping ``{label: latency frame or Evaluation}``, one entry per system (or per anything): the label is
  the group;
- a list of Evaluations: with ``by="system"`` each is labelled by its stack (CPU/GPU, stack hash); with
  ``by="agent"`` by the mlms agent that ran it (``stack["agent"]["name"]``, else the host name), so two agents on
  one kind of machine stay apart; with ``by="framework"`` their latency frames are stacked and grouped by framework.

Rows are matched on ``batch_size`` and ``scenario`` (plus ``framework`` when the groups are not frameworks).
``latency_ratio`` = group median / baseline median (< 1: faster than the baseline); ``speedup`` = 1 / ratio.
Its interval is the conservative combination of the two medians' 95% bootstrap CIs:
``[ci_low / baseline_ci_high, ci_high / baseline_ci_low]``. ``machine_busy``: the row's timed loop or its
baseline's ran on a busy machine (the latency frame's ``busy``, :mod:`mlms_nb.profilers.load`): its ratio then
says more about the other programs than about the groups compared.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from mlms_nb.display import is_set, people_table
from mlms_nb.schema.evaluation import LATENCY

from . import _plot
from ._plot import AnalysisError

REQUIRED = LATENCY.pick("batch_size", "median_ms")
OPTIONAL = LATENCY.pick("framework", "scenario", "median_ci_low_ms", "median_ci_high_ms", "busy")
"""The latency columns read (names from :mod:`mlms_nb.schema.evaluation`); the optional ones may be missing."""


def _system_label(ev: Any) -> str:
    stack = getattr(ev, "stack", {}) or {}
    hw = stack.get("hardware", {}) or {}
    gpus = hw.get("gpus") or []
    device = (gpus[0].get("name") if gpus and isinstance(gpus[0], dict) else None) or hw.get("cpu_model") or "?"
    digest = getattr(ev, "stack_hash", "") or ""
    return f"{device} [{digest[:8]}]" if digest else str(device)


def _agent_label(ev: Any) -> str:
    stack = getattr(ev, "stack", {}) or {}
    agent = stack.get("agent") or {}
    return str(agent.get("name") or stack.get("hostname") or "?")


def _frames(data, by: str) -> tuple[pd.DataFrame, str]:
    """-> one frame with a ``group`` column, and the name of what the groups are."""
    if isinstance(data, pd.DataFrame):
        _plot.require_columns(data, (by, *REQUIRED), "latency frame")
        return data.assign(group=data[by].astype(str)), by
    if isinstance(data, Mapping):
        parts = [getattr(v, "latency", v).assign(group=str(k)) for k, v in data.items()]
        return pd.concat(parts, ignore_index=True), (by if by != "framework" else "system")
    if isinstance(data, Sequence) and data and all(hasattr(ev, "latency") for ev in data):
        if by in ("system", "agent"):
            labels = [(_system_label if by == "system" else _agent_label)(ev) for ev in data]
            labels = [f"{lab} #{i}" if labels.count(lab) > 1 else lab for i, lab in enumerate(labels)]
            return pd.concat([ev.latency.assign(group=lab) for ev, lab in zip(data, labels)], ignore_index=True), by
        frame = pd.concat([ev.latency for ev in data], ignore_index=True)
        return frame.assign(group=frame[by].astype(str)), by
    raise AnalysisError("normalized.compute: expected a latency frame, a mapping {label: latency frame or "
                        f"Evaluation}} or a list of Evaluations, got {type(data).__name__}")


def busy_flags(latency: pd.DataFrame) -> pd.Series:
    """Per latency row, whether its timed loop ran on a busy machine (False where the load was not read)."""
    if "busy" not in latency:
        return pd.Series(False, index=latency.index)
    return latency["busy"].map(is_set).astype(bool)


@people_table
def compute(data, baseline: str | None = None, by: str = "framework") -> pd.DataFrame:
    """Latency normalised to ``baseline`` (a group label; default: the first group).

    Columns: ``<by>`` (the group), ``framework, scenario, batch_size, median_ms, median_ci_low_ms,
    median_ci_high_ms, baseline_median_ms, latency_ratio, latency_ratio_low, latency_ratio_high, speedup``.
    Rows of a group with no baseline row to match are left out (the note counts them).
    """
    frame, what = _frames(data, by)
    _plot.require_columns(frame, REQUIRED, "latency frame")
    if frame.empty:
        raise AnalysisError("nothing to normalise: the latency frame is empty")
    frame = frame.copy()
    for col in ("median_ci_low_ms", "median_ci_high_ms"):
        if col not in frame:
            frame[col] = np.nan
    if "scenario" not in frame:
        frame["scenario"] = "single-stream"
    if "framework" not in frame:
        frame["framework"] = ""
    read = "busy" in frame  # runs made before the machine's load was read have no such column
    frame["busy"] = busy_flags(frame)
    groups = list(dict.fromkeys(frame["group"]))
    baseline = groups[0] if baseline is None else str(baseline)
    if baseline not in groups:
        raise AnalysisError(f"baseline {baseline!r} is not among the {what}s: {', '.join(groups)}")
    keys = ["batch_size", "scenario"] + (["framework"] if what != "framework" else [])
    base = (frame[frame["group"] == baseline][keys + ["median_ms", "median_ci_low_ms", "median_ci_high_ms", "busy"]]
            .rename(columns={"median_ms": "baseline_median_ms", "median_ci_low_ms": "_base_lo",
                             "median_ci_high_ms": "_base_hi", "busy": "_base_busy"}))
    if base.duplicated(keys).any():
        raise AnalysisError(f"the baseline {baseline!r} has several rows per {', '.join(keys)}; "
                            f"give one evaluation per {what}")
    merged = frame.merge(base, on=keys, how="inner")
    dropped = len(frame) - len(merged)
    out = pd.DataFrame({
        what: merged["group"], "framework": merged["framework"], "scenario": merged["scenario"],
        "batch_size": merged["batch_size"].astype(np.int64), "median_ms": merged["median_ms"],
        "median_ci_low_ms": merged["median_ci_low_ms"], "median_ci_high_ms": merged["median_ci_high_ms"],
        "baseline_median_ms": merged["baseline_median_ms"],
        "latency_ratio": merged["median_ms"] / merged["baseline_median_ms"],
        "latency_ratio_low": merged["median_ci_low_ms"] / merged["_base_hi"],
        "latency_ratio_high": merged["median_ci_high_ms"] / merged["_base_lo"],
    })
    out["speedup"] = 1.0 / out["latency_ratio"]
    if read:
        out["machine_busy"] = (merged["busy"] | merged["_base_busy"]).astype(bool)
    busy = int(out["machine_busy"].sum()) if read else 0
    order = {g: i for i, g in enumerate(groups)}
    out = out.sort_values([what, "batch_size"], key=lambda s: s.map(order) if s.name == what else s,
                          kind="stable", ignore_index=True)
    out.attrs["analysis"] = "normalized"
    out.attrs["group"] = what
    out.attrs["baseline"] = baseline
    out.attrs["note"] = (f"median latency per call of each {what} divided by the baseline {baseline!r}'s median at the "
                         f"same {', '.join(keys)} (< 1: faster); the interval combines both medians' 95% bootstrap "
                         f"CIs conservatively (low / baseline high, high / baseline low)"
                         + (f"; {dropped} row(s) had no baseline row to match and are left out" if dropped else "")
                         + (f"; {busy} row(s) timed on a busy machine (machine_busy: that loop or its baseline's, see "
                            f"each evaluation's warnings): their ratios reflect the other programs, not the {what}s"
                            if busy else ""))
    out.attrs["title"] = f"Latency normalised to {baseline}"
    return out


def plot(df: pd.DataFrame, backend: str = "bokeh", title: str | None = None):
    """Latency ratio to the baseline against batch size, one line per group, CI whiskers; 1 = baseline."""
    _plot.require_analysis(df, "normalized")
    what, baseline = df.attrs["group"], df.attrs["baseline"]
    panel = _plot.charts(backend, [dict(
        title=title or df.attrs["title"],
        subtitle="median latency / the baseline's median at each batch size (whiskers: from both medians' 95% "
                 "bootstrap CIs)",
        x_label="batch size (inputs per call)", y_label=f"latency / {baseline} latency (ratio, 1 = same)",
        x_log=True, x_ticks=sorted(df["batch_size"].unique()))], width=760, height=400)[0]
    series = [what] if what == "framework" else [what, "framework"]
    for i, (key, part) in enumerate(df.groupby(series, sort=False)):
        label = " / ".join(map(str, key)) if isinstance(key, tuple) else str(key)
        c = _plot.color(i)
        part = part.sort_values("batch_size")
        panel.line(part["batch_size"], part["latency_ratio"], label=label, color=c)
        panel.points(part["batch_size"], part["latency_ratio"], color=c)
        panel.whiskers(part["batch_size"], part["latency_ratio_low"], part["latency_ratio_high"], color=c)
    return _plot.combine([panel])
