"""How one table column reads for people: its header with the unit, one scale and one precision per column
(:func:`describe_column`), a number as the report prints it (:func:`format_number`) and a whole frame as strings
(:func:`format_frame`).

Units come from the column names, as the house spells them (``median_ms``, ``memory_bytes``,
``throughput_per_s``, ``flops``, ``share_pct``, ``intensity_flop_per_byte``). Bytes, FLOPs and rates are scaled
to one prefix per column (MiB, GFLOP, GFLOP/s, ...) named in the header; every number in a column gets the
same number of decimals, chosen for about three significant digits of the column's typical value -- except the
latency statistics and the throughput of a frame that holds the 95% CI of the median: each row shows the digits
its own CI supports (torch.utils.benchmark's rule: ``floor(log10(median / half-width))`` significant figures,
1 to 4; :func:`spread_decimals`). Integers show
as integers with thousands separators (no e-notation), times as ``YYYY-MM-DD HH:MM:SS``.

Imports nothing from mlms_nb.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np
import pandas as pd

#: Columns that identify a row, shown first (in this order) and repeated in every part of a split table.
KEY_COLUMNS = ("run", "framework", "scenario", "batch_size", "layer_index", "layer_name", "name", "layer_type",
               "metric", "option", "what")

#: Headers for names that read badly when only the underscores are replaced.
HEADERS = {
    "batch_size": "batch size", "samples": "calls", "iqr_over_median": "IQR/median (%)",
    "throughput_per_s": "throughput (/s)", "median_ci_low_ms": "median CI low (ms)",
    "median_ci_high_ms": "median CI high (ms)", "iqr_ms": "IQR (ms)", "p90_ms": "p90 (ms)", "p99_ms": "p99 (ms)",
    "p25_ms": "p25 (ms)", "p75_ms": "p75 (ms)", "warmup_calls": "warm-up calls", "top1": "top-1 (%)",
    "top5": "top-5 (%)", "load_ms": "load (ms)", "first_inference_ms": "first inference (ms)",
    "untraced_median_ms": "untraced median (ms)", "traced_median_ms": "traced median (ms)",
    "overhead_pct": "overhead (%)", "intensity_flop_per_byte": "intensity (FLOP/byte)",
    "ridge_flop_per_byte": "ridge (FLOP/byte)", "pct_of_attainable": "of attainable (%)",
    "percent": "share (%)", "share_pct": "share (%)", "calls_per_predict": "calls per predict",
    "delta_ci_low_ms": "delta CI low (ms)", "delta_ci_high_ms": "delta CI high (ms)", "p_value": "p value",
}

#: Columns holding fractions 0..1 shown as percentages.
FRACTIONS = ("top1", "top5", "iqr_over_median")

_BINARY = ((2**40, "TiB"), (2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB"), (1, "bytes"))
_DECIMAL = ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"), (1, ""))
MISSING = "-"
#: Widest table part, in characters: about a 7.5 pt table across an A4 page, or a notebook's output column.
MAX_CHARS = 125


@dataclass
class Column:
    """How one column is shown: its header (with unit), the factor its values are divided by, its decimals."""
    name: str
    header: str
    scale: float = 1.0
    decimals: int | None = None  # None: not a float column


def _strip(name: str, suffix: str) -> str:
    return name[: -len(suffix)] if name.endswith(suffix) else name


_ACRONYMS = {"iqr": "IQR", "ci": "CI", "ttft": "TTFT", "tpot": "TPOT", "itl": "ITL", "qps": "QPS"}


def _words(name: str) -> str:
    return " ".join(_ACRONYMS.get(w, w) for w in name.replace("_", " ").split())


def _typical(values: np.ndarray) -> float:
    """The magnitude a column's precision is chosen for: its small values (10th percentile of the non-zero
    magnitudes), so that 10.3 next to 291 still shows its decimal."""
    v = np.abs(values[np.isfinite(values) & (values != 0)])
    return float(np.percentile(v, 10)) if v.size else 0.0


def _large(values: np.ndarray) -> float:
    """The magnitude a column's unit prefix is chosen for (the median of the non-zero magnitudes)."""
    v = np.abs(values[np.isfinite(values) & (values != 0)])
    return float(np.median(v)) if v.size else 0.0


def _prefix(typical: float, table) -> tuple[float, str]:
    for factor, name in table:
        if typical >= factor:
            return factor, name
    return table[-1]


def decimals_for(typical: float, significant: int = 3) -> int:
    """Decimals that show ``typical`` with about ``significant`` significant digits (0 to 4)."""
    if not typical or not math.isfinite(typical):
        return 0
    return int(min(4, max(0, significant - 1 - math.floor(math.log10(abs(typical))))))


def _percent_decimals(typical: float) -> int:
    """Percentages: one decimal, more only for shares below 0.1%."""
    return 1 if typical >= 0.1 or not typical else decimals_for(typical, 2)


#: Latency statistics whose digits follow the spread of the median (when the frame holds its 95% CI)
SPREAD_COLUMNS = ("median_ms", "mean_ms", "p25_ms", "p75_ms", "p90_ms", "p99_ms", "min_ms", "max_ms",
                  "median_ci_low_ms", "median_ci_high_ms", "iqr_ms")
#: Rates whose digits follow a latency's spread: inputs/s is batch size / mean latency, so its relative spread is
#: the mean's (95% CI from ``std_ms`` and ``samples``), or, in a frame without them, the median's
RATE_COLUMNS = ("throughput_per_s",)


def significant_figures(median: np.ndarray, ci_low: np.ndarray, ci_high: np.ndarray) -> np.ndarray:
    """Per row, the significant figures the 95% CI of the median supports: ``floor(log10(median / half-width))``
    between 1 and 4 (torch.utils.benchmark's ``Measurement.significant_figures``); 4 when the CI has no width."""
    half = (np.asarray(ci_high, dtype=float) - np.asarray(ci_low, dtype=float)) / 2
    median = np.abs(np.asarray(median, dtype=float))
    with np.errstate(divide="ignore", invalid="ignore"):
        figures = np.floor(np.log10(median / half))
    figures = np.where(np.isfinite(figures), figures, 4)
    return np.clip(figures, 1, 4).astype(int)


def _numbers(frame: pd.DataFrame, name: str) -> np.ndarray:
    return pd.to_numeric(frame[name], errors="coerce").to_numpy(dtype=float)


#: Columns that count the calls a median is taken over (for the notch's CI when a frame has no bootstrap CI)
COUNT_COLUMNS = ("samples", "repetitions")
NOTCH = 1.57
"""A box plot's notch: median +- 1.57 IQR / sqrt(n) is an approximate 95% CI of the median (McGill, Tukey and
Larsen 1978; matplotlib's ``notch=True``), used where a frame holds the IQR and the count but no bootstrap CI."""


def _ci_figures(value: np.ndarray, low: np.ndarray, high: np.ndarray) -> np.ndarray:
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
    median = _numbers(frame, median_col)
    figures = np.full(len(frame), -1)
    low, high = f"{prefix}median_ci_low_ms", f"{prefix}median_ci_high_ms"
    if low in frame.columns and high in frame.columns:
        figures = _ci_figures(median, _numbers(frame, low), _numbers(frame, high))
    if f"{prefix}iqr_ms" in frame.columns:
        iqr = _numbers(frame, f"{prefix}iqr_ms")
    elif f"{prefix}p25_ms" in frame.columns and f"{prefix}p75_ms" in frame.columns:
        iqr = _numbers(frame, f"{prefix}p75_ms") - _numbers(frame, f"{prefix}p25_ms")
    else:
        iqr = None
    if iqr is not None:
        count = next((c for c in (f"{prefix}repetitions", *COUNT_COLUMNS) if c in frame.columns), None)
        with np.errstate(divide="ignore", invalid="ignore"):
            half = NOTCH * iqr / np.sqrt(_numbers(frame, count)) if count else iqr / 2
        figures = np.where(figures < 0, _ci_figures(median, median - half, median + half), figures)
    return figures if (figures >= 0).any() else None


def _mean_figures(frame: pd.DataFrame, fallback: np.ndarray) -> np.ndarray:
    """Per row, the figures of the mean latency: a normal 95% CI, 1.96 std / sqrt(samples), where the frame has
    them; else ``fallback`` (the median's)."""
    if not all(c in frame.columns for c in ("mean_ms", "std_ms", "samples")):
        return fallback
    mean, std, n = (_numbers(frame, c) for c in ("mean_ms", "std_ms", "samples"))
    with np.errstate(divide="ignore", invalid="ignore"):
        half = 1.96 * std / np.sqrt(np.where(n > 1, n, np.nan))
    figures = _ci_figures(mean, mean - half, mean + half)
    return np.where(figures >= 0, figures, fallback)


def _decimals(values: np.ndarray, figures: np.ndarray) -> np.ndarray:
    """Decimals that show each value with its row's significant figures (0 at least; -1 where a row has none)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        lead = np.floor(np.log10(np.abs(values)))
    lead = np.where(np.isfinite(lead), lead, 0)
    return np.where(figures > 0, np.maximum(0, figures - 1 - lead), -1).astype(int)


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
    - the throughput without a range of its own, at its mean latency's figures (inputs/s is batch size / mean);
    - ``frame.attrs["figures"]`` (column -> one value per row), where the frame's maker knows better (the
      tracing overhead's medians, from its noise; one clock reading per span: 3 figures).

    :func:`spread_decimals` also takes ``frame.attrs["decimals"]`` (column -> decimals per row: a fixed place).
    """
    out: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    median_figures = None
    for prefix in PREFIXES:
        figures = _median_figures(frame, prefix)
        if figures is None:
            continue
        median_figures = figures if prefix == "" else median_figures
        anchor = _numbers(frame, f"{prefix}median_ms")
        out.update({f"{prefix}{c}": (figures, anchor) for c in SPREAD_COLUMNS if f"{prefix}{c}" in frame.columns})
    for name in frame.columns:
        m = _RANGE_LOW.match(str(name))
        if not m:
            continue
        stat, high = f"{m['stat']}_{m['unit']}", str(name).replace("_low_", "_high_")
        if stat in frame.columns and high in frame.columns and stat not in out:
            value = _numbers(frame, stat)
            figures = _ci_figures(value, _numbers(frame, name), _numbers(frame, high))
            out.update({stat: (figures, value), name: (figures, value), high: (figures, value)})
    if median_figures is not None:
        for c in RATE_COLUMNS:
            if c in frame.columns and c not in out:
                out[c] = (_mean_figures(frame, median_figures), _numbers(frame, c))
    for name, values in (frame.attrs.get("figures") or {}).items():
        if name in frame.columns and len(values) >= len(frame):
            out[name] = (np.asarray(values[: len(frame)], dtype=int), _numbers(frame, name))
    return out


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


def describe_column(name: str, values: pd.Series) -> Column:
    """The header (with unit), scale and decimals of column ``name``."""
    numeric = pd.api.types.is_numeric_dtype(values) and not pd.api.types.is_bool_dtype(values)
    header = HEADERS.get(name)
    if not numeric:
        return Column(name, header or _words(name))
    floats = pd.to_numeric(values, errors="coerce").to_numpy(dtype=float)
    integer = pd.api.types.is_integer_dtype(values) or (
        np.isfinite(floats).any() and np.all(floats[np.isfinite(floats)] == np.round(floats[np.isfinite(floats)]))
        and _large(floats) >= 10)
    already_pct = name in ("top1", "top5") and np.nanmax(np.abs(floats), initial=0) > 1  # a manifest's 75.1 (%)
    if name in FRACTIONS and not already_pct:
        return Column(name, header or f"{_words(name)} (%)", 0.01, _percent_decimals(_typical(floats) * 100))
    scale, unit = 1.0, None
    if name.endswith("_bytes") or name == "bytes":
        scale, unit = _prefix(_large(floats), _BINARY)
        base = _words(_strip(name, "_bytes")) or "bytes"
        header = header or (base if base == unit else f"{base} ({unit})")
    elif name.endswith("flops_per_s"):
        scale, p = _prefix(_large(floats), _DECIMAL)
        header = header or f"{_words(_strip(name, 'flops_per_s')) or 'rate'} ({p}FLOP/s)"
    elif name.endswith("_bytes_per_s"):
        scale, p = _prefix(_large(floats), _DECIMAL)
        header = header or f"{_words(_strip(name, '_bytes_per_s'))} ({p}B/s)"
    elif name == "flops" or name.endswith("_flops"):
        scale, p = _prefix(_large(floats), _DECIMAL)
        header = header or f"{_words(name)} ({p}FLOP)"
    elif name.endswith("_per_s"):
        header = header or f"{_words(_strip(name, '_per_s'))} (/s)"
    else:
        for suffix, u in (("_ms", "ms"), ("_ns", "ns"), ("_us", "µs"), ("_s", "s"), ("_pct", "%"),
                          ("_flop_per_byte", "FLOP/byte")):
            if name.endswith(suffix):
                header = header or f"{_words(_strip(name, suffix))} ({u})"
                break
        else:
            if integer and pd.api.types.is_integer_dtype(values):
                return Column(name, header or _words(name), 1.0, None)
    scaled = floats / scale
    if name.endswith("_pct") or name == "percent":
        return Column(name, header or _words(name), 1.0, _percent_decimals(_typical(scaled)))
    decimals = 0 if (integer and scale == 1.0) else decimals_for(_typical(scaled))
    return Column(name, header or _words(name), scale, decimals)


def format_number(value, decimals: int | None, scale: float = 1.0) -> str:
    """One number as the report shows it: thousands separators, ``decimals`` decimals, ``-`` when missing;
    a value too small for the column's decimals keeps two significant digits."""
    if value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value)):
        return MISSING
    if isinstance(value, (bool, np.bool_)):
        return "yes" if value else "no"
    try:
        v = float(value) / scale
    except (TypeError, ValueError):
        return str(value)
    if math.isnan(v):
        return MISSING
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    if decimals is None:
        return f"{int(round(v)):,}"
    if v != 0 and abs(v) < 0.5 * 10 ** -decimals:
        return f"{v:.2g}"
    return f"{v:,.{decimals}f}"


def order_columns(columns: Iterable[str], key: Sequence[str] | None = None) -> list[str]:
    """Key columns first (``key``, else the house's :data:`KEY_COLUMNS` present), then the rest in order."""
    columns = list(columns)
    keys = [c for c in (key if key is not None else KEY_COLUMNS) if c in columns]
    return keys + [c for c in columns if c not in keys]


def key_columns(columns: Iterable[str], key: Sequence[str] | None = None) -> list[str]:
    columns = list(columns)
    return [c for c in (key if key is not None else KEY_COLUMNS) if c in columns]


#: Units a long-format ``value`` column is scaled in, per row, with a decimal prefix
_SCALED_UNITS = {"FLOP/s": "FLOP/s", "bytes/s": "B/s", "B/s": "B/s", "FLOP": "FLOP"}


def scale_units(frame: pd.DataFrame) -> pd.DataFrame:
    """A long-format frame (``value`` and ``unit`` columns, an ``iqr`` beside them) with each row's value (and
    IQR) scaled to a decimal prefix of its unit (76,513,947,298 FLOP/s -> 76.5 GFLOP/s), the value read to the
    figures its IQR allows (half the IQR as its spread); other frames as they are."""
    if not {"value", "unit"} <= set(frame.columns) or not frame["unit"].isin(list(_SCALED_UNITS)).any():
        return frame
    out = frame.copy()
    value = _numbers(frame, "value")
    factor, units = np.ones(len(frame)), list(frame["unit"])
    for i, (v, unit) in enumerate(zip(value, frame["unit"])):
        if unit in _SCALED_UNITS and np.isfinite(v):
            factor[i], prefix = _prefix(abs(v), _DECIMAL)
            units[i] = prefix + _SCALED_UNITS[unit]
    out["value"] = value / factor
    out["unit"] = units
    figures = np.full(len(frame), -1)
    if "iqr" in frame.columns:
        iqr = _numbers(frame, "iqr") / factor
        out["iqr"] = iqr
        figures = _ci_figures(out["value"].to_numpy(dtype=float), out["value"] - iqr / 2, out["value"] + iqr / 2)
    out.attrs = dict(frame.attrs)
    out.attrs["figures"] = {**out.attrs.get("figures", {}), "value": list(figures), "iqr": list(figures)}
    return out


#: Integer columns that name something (a thread, a process, a span) rather than count it: digits as they are
IDENTIFIERS = ("thread", "stream", "pid", "tid", "device_id", "seed")


def is_identifier(name: str) -> bool:
    """Whether an integer column is an identifier, shown without thousands separators."""
    return name in IDENTIFIERS or name.endswith("_id")


def _missing_number(value) -> bool:
    try:
        return value is None or value is pd.NA or not math.isfinite(float(value))
    except (TypeError, ValueError):
        return True


def format_frame(frame: pd.DataFrame, key: Sequence[str] | None = None, columns: Sequence[str] | None = None,
                 max_text: int = 48) -> pd.DataFrame:
    """``frame`` as strings: headers with units, numbers with one precision per column, key columns first.

    ``columns``: only these (in this order after the key columns). Text (not one word: paths, hashes and ids stay
    whole) longer than ``max_text`` characters
    is shortened with an ellipsis. ``.attrs["keys"]``: the headers of the key columns; ``attrs["note"]`` kept.
    """
    frame = scale_units(frame)
    names = [c for c in (columns if columns is not None else frame.columns) if c in frame.columns]
    names = order_columns(names + [c for c in key_columns(frame.columns, key) if c not in names], key)
    out = {}
    keys = []
    described = {name: describe_column(name, frame[name]) for name in names}
    spread = spread_decimals(frame, {n: c.scale for n, c in described.items()})
    for name in names:
        values = frame[name]
        col = described[name]
        if is_identifier(name) and pd.api.types.is_numeric_dtype(values) and not pd.api.types.is_bool_dtype(values):
            text = [MISSING if _missing_number(v) else str(int(v)) for v in values]  # an id: no separators
        elif name in spread and col.decimals is not None:
            text = [format_number(v, col.decimals if d < 0 else int(d), col.scale) for v, d in zip(values, spread[name])]
        elif col.decimals is not None or (pd.api.types.is_numeric_dtype(values) and
                                          not pd.api.types.is_bool_dtype(values)):
            text = [format_number(v, col.decimals, col.scale) for v in values]
        else:
            text = [_text(v, max_text) for v in values]
        header = col.header
        while header in out:
            header += " "
        out[header] = text
        if name in key_columns(frame.columns, key):
            keys.append(header)
    result = pd.DataFrame(out, index=range(len(frame)))
    result.attrs = {"keys": keys, "note": str(frame.attrs.get("note", ""))}
    return result


def _text(value, max_text: int) -> str:
    if value is None or value is pd.NA or value is pd.NaT or (isinstance(value, float) and math.isnan(value)):
        return MISSING
    if isinstance(value, (pd.Timestamp, np.datetime64)):
        stamp = pd.Timestamp(value)
        return stamp.strftime("%Y-%m-%d %H:%M:%S") + ("Z" if stamp.tzinfo is not None else "")
    if isinstance(value, (bool, np.bool_)):
        return "yes" if value else "no"
    if isinstance(value, (list, tuple, np.ndarray)):
        value = "×".join(map(str, value)) if all(isinstance(v, (int, np.integer)) for v in value) else str(list(value))
    text = str(value)
    if _ISO_TIME.match(text):  # a stored timestamp: to the second, in UTC
        return text[:10] + " " + text[11:19] + ("Z" if text.endswith(("Z", "+00:00")) else "")
    if len(text) <= max_text or not any(c.isspace() for c in text):
        return text  # an identifier (a path, a sha256, an id, a URL) is whole or useless: never cut
    return text[: max_text - 1] + "…"


_ISO_TIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:\d\d)?$")

