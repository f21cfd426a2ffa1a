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


def _words(name: str) -> str:
    return name.replace("_", " ").strip()


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


def _figures(frame: pd.DataFrame) -> tuple[np.ndarray, np.ndarray] | None:
    """Per row: the significant figures of the median (from its 95% CI) and of the mean (a normal 95% CI,
    1.96 std / sqrt(samples), where the frame has them; else the median's); -1 where a row has no CI."""
    need = ("median_ms", "median_ci_low_ms", "median_ci_high_ms")
    if not all(c in frame.columns for c in need):
        return None
    median, low, high = (_numbers(frame, c) for c in need)
    ok = np.isfinite(median) & np.isfinite(low) & np.isfinite(high) & (median != 0)
    if not ok.any():
        return None
    figures = np.where(ok, significant_figures(np.where(ok, median, 1), np.where(ok, low, 0), np.where(ok, high, 2)), -1)
    mean_figures = figures
    if all(c in frame.columns for c in ("mean_ms", "std_ms", "samples")):
        mean, std, n = (_numbers(frame, c) for c in ("mean_ms", "std_ms", "samples"))
        with np.errstate(divide="ignore", invalid="ignore"):
            half = 1.96 * std / np.sqrt(n)
        have = np.isfinite(mean) & np.isfinite(half) & (mean != 0) & (n > 1)
        mean_figures = np.where(have, significant_figures(np.where(have, mean, 1), np.where(have, mean - half, 0),
                                                          np.where(have, mean + half, 2)), figures)
    return figures, mean_figures


def _decimals(values: np.ndarray, figures: np.ndarray) -> np.ndarray:
    """Decimals that show each value with its row's significant figures (0 at least; -1 where a row has none)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        lead = np.floor(np.log10(np.abs(values)))
    lead = np.where(np.isfinite(lead), lead, 0)
    return np.where(figures > 0, np.maximum(0, figures - 1 - lead), -1).astype(int)


def spread_decimals(frame: pd.DataFrame) -> dict[str, np.ndarray]:
    """Per column and row, the decimals the measured spread supports: the latency statistics
    (:data:`SPREAD_COLUMNS`) at the figures of their row's median CI, placed at the median's leading digit (so
    p90, p99 and the CI's ends read to the same place as the median), and the throughput at its own figures;
    -1 for a row without a CI (the column's default precision applies). Empty when the frame holds no median
    with its CI. Each row gets its own: a 0.5 ms row and a 50 ms row are measured to different places."""
    found = _figures(frame)
    if found is None:
        return {}
    figures, mean_figures = found
    at_median = _decimals(_numbers(frame, "median_ms"), figures)
    out = {c: at_median for c in SPREAD_COLUMNS if c in frame.columns}
    for c in RATE_COLUMNS:
        if c in frame.columns:
            out[c] = _decimals(_numbers(frame, c), mean_figures)
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
        header = header or f"{base} ({unit})"
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


def format_frame(frame: pd.DataFrame, key: Sequence[str] | None = None, columns: Sequence[str] | None = None,
                 max_text: int = 48) -> pd.DataFrame:
    """``frame`` as strings: headers with units, numbers with one precision per column, key columns first.

    ``columns``: only these (in this order after the key columns). Text (not one word: paths, hashes and ids stay
    whole) longer than ``max_text`` characters
    is shortened with an ellipsis. ``.attrs["keys"]``: the headers of the key columns; ``attrs["note"]`` kept.
    """
    names = [c for c in (columns if columns is not None else frame.columns) if c in frame.columns]
    names = order_columns(names + [c for c in key_columns(frame.columns, key) if c not in names], key)
    out = {}
    keys = []
    spread = spread_decimals(frame)
    for name in names:
        values = frame[name]
        col = describe_column(name, values)
        if name in spread and col.decimals is not None and col.scale == 1.0:
            text = [format_number(v, col.decimals if d < 0 else int(d)) for v, d in zip(values, spread[name])]
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

