"""How many digits a measured number deserves: torch.utils.benchmark's rule (``floor(log10(median / half-width))``
significant figures of a 95% CI, 1 to 4), per row, from whatever spread a frame holds (a bootstrap CI, the box
plot's notch, an IQR, a low/high range, what the frame's maker says), and the decimals that puts each value at.

Imports nothing from mlms_nb but :mod:`mlms_nb.display.units`.
"""
from __future__ import annotations

import re

import numpy as np
import pandas as pd

from mlms_nb.display.units import DECIMAL, prefix_for


def numbers(frame: pd.DataFrame, name: str) -> np.ndarray:
    """A column as floats (NaN where not a number)."""
    return pd.to_numeric(frame[name], errors="coerce").to_numpy(dtype=float)


#: Latency statistics whose digits follow the spread of the median (when the frame holds its 95% CI)
SPREAD_COLUMNS = ("median_ms", "mean_ms", "p25_ms", "p75_ms", "p90_ms", "p99_ms", "min_ms", "max_ms",
                  "median_ci_low_ms", "median_ci_high_ms", "iqr_ms")
#: Rates whose digits follow the median latency's spread, in every frame that holds it (a summary has no ``std_ms``
#: for the mean's CI, the latency frame has): one rule, so one throughput reads the same in every view
RATE_COLUMNS = ("throughput_per_s",)
#: The fewest significant figures a measured number is shown with: one figure rounds 1.808/s to "2" (a 10% step,
#: more than most CIs of a timed loop); two keep the spread's place without reading as a whole number
MIN_FIGURES = 2


def significant_figures(median: np.ndarray, ci_low: np.ndarray, ci_high: np.ndarray) -> np.ndarray:
    """Per row, the significant figures the 95% CI of the median supports: ``floor(log10(median / half-width))``
    between 1 and 4 (torch.utils.benchmark's ``Measurement.significant_figures``); 4 when the CI has no width."""
    half = (np.asarray(ci_high, dtype=float) - np.asarray(ci_low, dtype=float)) / 2
    median = np.abs(np.asarray(median, dtype=float))
    with np.errstate(divide="ignore", invalid="ignore"):
        figures = np.floor(np.log10(median / half))
    figures = np.where(np.isfinite(figures), figures, 4)
    return np.clip(figures, 1, 4).astype(int)


#: Columns that count the calls a median is taken over (for the notch's CI when a frame has no bootstrap CI)
COUNT_COLUMNS = ("samples", "repetitions")
NOTCH = 1.57
"""A box plot's notch: median +- 1.57 IQR / sqrt(n) is an approximate 95% CI of the median (McGill, Tukey and
Larsen 1978; matplotlib's ``notch=True``), used where a frame holds the IQR and the count but no bootstrap CI."""


def ci_figures(value: np.ndarray, low: np.ndarray, high: np.ndarray) -> np.ndarray:
    """significant_figures per row; -1 where the value or its CI is missing."""
    ok = np.isfinite(value) & np.isfinite(low) & np.isfinite(high) & (value != 0)
    return np.where(ok, significant_figures(np.where(ok, value, 1), np.where(ok, low, 0), np.where(ok, high, 2)), -1)


def _median_figures(frame: pd.DataFrame, prefix: str = "") -> np.ndarray | None:
    """Per row, the figures of ``<prefix>median_ms``: from its bootstrap 95% CI, else from the notch
    (:data:`NOTCH`: the IQR -- or p75 - p25 -- and the count), else from the IQR itself (half of it as the
    half-width: wider than a CI, so never more digits than the data hold); -1 where a row has none of these;
    None when the frame has no way to tell."""
    median_col = f"{prefix}median_ms"
    if median_col not in frame.columns:
        return None
    median = numbers(frame, median_col)
    figures = np.full(len(frame), -1)
    low, high = f"{prefix}median_ci_low_ms", f"{prefix}median_ci_high_ms"
    if low in frame.columns and high in frame.columns:
        figures = ci_figures(median, numbers(frame, low), numbers(frame, high))
    if f"{prefix}iqr_ms" in frame.columns:
        iqr = numbers(frame, f"{prefix}iqr_ms")
    elif f"{prefix}p25_ms" in frame.columns and f"{prefix}p75_ms" in frame.columns:
        iqr = numbers(frame, f"{prefix}p75_ms") - numbers(frame, f"{prefix}p25_ms")
    else:
        iqr = None
    if iqr is not None:
        count = next((c for c in (f"{prefix}repetitions", *COUNT_COLUMNS) if c in frame.columns), None)
        with np.errstate(divide="ignore", invalid="ignore"):
            half = NOTCH * iqr / np.sqrt(numbers(frame, count)) if count else iqr / 2
        figures = np.where(figures < 0, ci_figures(median, median - half, median + half), figures)
    return figures if (figures >= 0).any() else None


def _decimals(values: np.ndarray, figures: np.ndarray) -> np.ndarray:
    """Decimals that show each value with its row's significant figures, :data:`MIN_FIGURES` at least (0 decimals
    at least; -1 where a row has none)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        lead = np.floor(np.log10(np.abs(values)))
    lead = np.where(np.isfinite(lead), lead, 0)
    shown = np.maximum(figures, MIN_FIGURES)
    return np.where(figures > 0, np.maximum(0, shown - 1 - lead), -1).astype(int)


_RANGE_LOW = re.compile(r"^(?P<stat>.+?)_(?:ci_)?low_(?P<unit>.+)$")
#: Prefixes of a frame's latency statistics: the plain ones, a layer's self time, the two runs of a comparison
PREFIXES = ("", "self_", "a_", "b_")


def spread_figures(frame: pd.DataFrame) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per column: the significant figures its rows' measured spread supports (-1: none) and the values whose
    leading digit places them. Each row gets its own: a 0.5 ms row and a 50 ms row are measured to different places.

    - the latency statistics (:data:`SPREAD_COLUMNS`, under each of :data:`PREFIXES`) read to the place of
      their row's median, at the figures its 95% CI supports (see :func:`_median_figures`);
    - any other ``<stat>_<unit>`` with ``<stat>_[ci_]low_<unit>`` / ``<stat>_[ci_]high_<unit>`` beside it (a
      throughput's CI, a roofline point's achieved rate over p25..p75), at the figures of that range;
    - the throughput without a range of its own, at its median latency's figures (:data:`RATE_COLUMNS`);
    - ``frame.attrs["figures"]`` (column -> one value per row), where the frame's maker knows better (the
      tracing overhead's medians, from its noise; one clock reading per span: 3 figures);
    - ``frame.attrs["row_figures"]`` (the same form) for a column none of the above reads: the figures the whole
      frame had before a selection dropped its CI (:func:`carried_figures`).

    :func:`spread_decimals` also takes ``frame.attrs["decimals"]`` (column -> decimals per row: a fixed place).
    """
    out: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    median_figures = None
    for prefix in PREFIXES:
        figures = _median_figures(frame, prefix)
        if figures is None:
            continue
        median_figures = figures if prefix == "" else median_figures
        anchor = numbers(frame, f"{prefix}median_ms")
        out.update({f"{prefix}{c}": (figures, anchor) for c in SPREAD_COLUMNS if f"{prefix}{c}" in frame.columns})
    for name in frame.columns:
        m = _RANGE_LOW.match(str(name))
        if not m:
            continue
        stat, high = f"{m['stat']}_{m['unit']}", str(name).replace("_low_", "_high_")
        if stat in frame.columns and high in frame.columns and stat not in out:
            value = numbers(frame, stat)
            figures = ci_figures(value, numbers(frame, name), numbers(frame, high))
            out.update({stat: (figures, value), name: (figures, value), high: (figures, value)})
    if median_figures is not None:
        for c in RATE_COLUMNS:
            if c in frame.columns and c not in out:
                out[c] = (median_figures, numbers(frame, c))
    for name, values in (frame.attrs.get("figures") or {}).items():
        if name in frame.columns and len(values) >= len(frame):
            out[name] = (np.asarray(values[: len(frame)], dtype=int), numbers(frame, name))
    for name, values in (frame.attrs.get("row_figures") or {}).items():  # carried from the whole frame
        if name in frame.columns and name not in out and len(values) >= len(frame):
            out[name] = (np.asarray(values[: len(frame)], dtype=int), numbers(frame, name))
    return out


def carried_figures(frame: pd.DataFrame) -> dict[str, pd.Series]:
    """The figures :func:`spread_figures` finds in ``frame``, per column as a Series on its index: kept beside a
    shown frame (:class:`~mlms_nb.display.PeopleFrame`) they follow its rows, so
    ``ev.latency[["median_ms", "throughput_per_s"]]`` (no CI left to read) shows the digits the whole frame does
    (given to the display as ``attrs["row_figures"]``, by position); {} for a frame without a unique index."""
    if not frame.index.is_unique:
        return {}
    return {c: pd.Series(figures, index=frame.index) for c, (figures, _) in spread_figures(frame).items()}


def spread_decimals(frame: pd.DataFrame, scales: dict[str, float] | None = None) -> dict[str, np.ndarray]:
    """Per column and row, the decimals :func:`spread_figures` supports once the column is divided by its scale
    (``scales``: column -> factor, e.g. 1e9 for GFLOP/s); -1 where a row has none."""
    scales = scales or {}
    out = {c: _decimals(anchor / scales.get(c, 1.0), figures) for c, (figures, anchor) in spread_figures(frame).items()}
    for name, values in (frame.attrs.get("decimals") or {}).items():  # a fixed place (a clock's resolution)
        if name in frame.columns and len(values) >= len(frame):
            out[name] = np.asarray(values[: len(frame)], dtype=int)
    return out


def ci_decimals(median, low, high) -> int | None:
    """Decimals for one median (and the statistics read beside it) that its 95% CI ``low``..``high`` supports;
    None when the CI is missing (the caller's default precision applies)."""
    try:
        values = np.array([median, low, high], dtype=float)
    except (TypeError, ValueError):
        return None
    if not np.isfinite(values).all() or values[0] == 0:
        return None
    return int(_decimals(values[:1], significant_figures(values[:1], values[1:2], values[2:]))[0])



#: Units a long-format ``value`` column is scaled in, per row, with a decimal prefix
_SCALED_UNITS = {"FLOP/s": "FLOP/s", "bytes/s": "B/s", "B/s": "B/s", "FLOP": "FLOP"}


def scale_units(frame: pd.DataFrame) -> pd.DataFrame:
    """A long-format frame (``value`` and ``unit`` columns, an ``iqr`` beside them) with each row's value (and
    IQR) scaled to a decimal prefix of its unit (76,513,947,298 FLOP/s -> 76.5 GFLOP/s), the value read to the
    figures its IQR allows (half the IQR as its spread); other frames as they are."""
    if not {"value", "unit"} <= set(frame.columns) or not frame["unit"].isin(list(_SCALED_UNITS)).any():
        return frame
    out = frame.copy()
    value = numbers(frame, "value")
    factor, units = np.ones(len(frame)), list(frame["unit"])
    for i, (v, unit) in enumerate(zip(value, frame["unit"])):
        if unit in _SCALED_UNITS and np.isfinite(v):
            factor[i], prefix = prefix_for(abs(v), DECIMAL)
            units[i] = prefix + _SCALED_UNITS[unit]
    out["value"] = value / factor
    out["unit"] = units
    figures = np.full(len(frame), -1)
    if "iqr" in frame.columns:
        iqr = numbers(frame, "iqr") / factor
        out["iqr"] = iqr
        figures = ci_figures(out["value"].to_numpy(dtype=float), out["value"] - iqr / 2, out["value"] + iqr / 2)
    out.attrs = dict(frame.attrs)
    out.attrs["figures"] = {**out.attrs.get("figures", {}), "value": list(figures), "iqr": list(figures)}
    return out
