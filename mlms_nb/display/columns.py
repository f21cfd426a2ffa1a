"""How one table column reads for people: its header with the unit, one scale and one precision per column
(:func:`describe_column`), a number as the report prints it (:func:`format_number`), the columns that tell a
frame's rows apart (:func:`key_columns`) and a whole frame as strings (:func:`format_frame`).

Units come from the column names, as the house spells them (``median_ms``, ``memory_bytes``,
``throughput_per_s``, ``flops``, ``share_pct``, ``intensity_flop_per_byte``). Bytes, FLOPs and rates are scaled
to one prefix per column (MiB, GFLOP, GFLOP/s, ...) named in the header; every number in a column gets the
same number of decimals, chosen for about three significant digits of the column's typical value -- except the
latency statistics and the throughput of a frame that holds the 95% CI of the median: each row shows the digits
its own CI supports (torch.utils.benchmark's rule: ``floor(log10(median / half-width))`` significant figures,
1 to 4, shown with 2 at least; :mod:`mlms_nb.display.spread`) -- and a column the user rounded (``.round(3)``),
which shows their decimals. Integers show as integers with thousands separators (no e-notation), times as
``YYYY-MM-DD HH:MM:SS``.

Imports nothing from mlms_nb outside this package.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np
import pandas as pd

from mlms_nb.display.spread import scale_units, spread_decimals
from mlms_nb.display.units import BINARY, DECIMAL, prefix_for

#: Columns that identify a row, shown first (in this order) and repeated in every part of a split table; with the
#: leading text columns of a frame (:func:`key_columns`), so a table's ``phase`` or ``layer`` is never cut off.
KEY_COLUMNS = ("run", "framework", "scenario", "batch_size", "kv_cache", "phase", "layer_index", "layer_name", "layer",
               "name", "layer_type", "metric", "option", "what")
#: Most leading text columns taken as keys when a frame does not name its own (a wider key leaves no room)
MAX_LEADING_KEYS = 4

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

#: Columns holding fractions 0..1 shown as percentages (and any ``*_fraction``: ``goodput_fraction``).
FRACTIONS = ("top1", "top5", "iqr_over_median")


def _is_fraction(name: str) -> bool:
    return name in FRACTIONS or name.endswith("_fraction")

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


def decimals_for(typical: float, significant: int = 3) -> int:
    """Decimals that show ``typical`` with about ``significant`` significant digits (0 to 4)."""
    if not typical or not math.isfinite(typical):
        return 0
    return int(min(4, max(0, significant - 1 - math.floor(math.log10(abs(typical))))))


def _percent_decimals(typical: float) -> int:
    """Percentages: one decimal, more only for shares below 0.1%."""
    return 1 if typical >= 0.1 or not typical else decimals_for(typical, 2)


def _rounded_header(name: str, header: str) -> str:
    """The header of a column the user rounded: its unit without a prefix (their decimals are in it)."""
    return f"{_words(_strip(name, '_fraction'))} (fraction)" if _is_fraction(name) else header


def describe_column(name: str, values: pd.Series, rounded: int | None = None) -> Column:
    """The header (with unit), scale and decimals of column ``name``; ``rounded``: the decimals the user rounded a
    float column to (``frame.round(3)``), shown as they are, in the column's own unit."""
    numeric = pd.api.types.is_numeric_dtype(values) and not pd.api.types.is_bool_dtype(values)
    header = HEADERS.get(name)
    if not numeric:
        return Column(name, header or _words(name))
    if rounded is not None and not pd.api.types.is_integer_dtype(values):
        unscaled = describe_column(name, values.iloc[:0])  # no values: no prefix (bytes, FLOP/s)
        return Column(name, _rounded_header(name, unscaled.header), 1.0, max(0, int(rounded)))
    floats = pd.to_numeric(values, errors="coerce").to_numpy(dtype=float)
    finite = floats[np.isfinite(floats)]
    whole = finite.size > 0 and bool(np.all(finite == np.round(finite)))
    integer = pd.api.types.is_integer_dtype(values) or (whole and _large(floats) >= 10)
    already_pct = name in ("top1", "top5") and np.nanmax(np.abs(floats), initial=0) > 1  # a manifest's 75.1 (%)
    if _is_fraction(name) and not already_pct:
        return Column(name, header or f"{_words(_strip(name, '_fraction'))} (%)", 0.01,
                      _percent_decimals(_typical(floats) * 100))
    scale, unit = 1.0, None
    if name.endswith("_bytes") or name in ("bytes", "memory"):  # a span's memory: net bytes held (schema/spans.py)
        scale, unit = prefix_for(_large(floats), BINARY)
        base = _words(_strip(name, "_bytes")) or "bytes"
        header = header or (base if base == unit else f"{base} ({unit})")
    elif name.endswith("flops_per_s"):
        scale, p = prefix_for(_large(floats), DECIMAL)
        header = header or f"{_words(_strip(name, 'flops_per_s')) or 'rate'} ({p}FLOP/s)"
    elif name.endswith("_bytes_per_s"):
        scale, p = prefix_for(_large(floats), DECIMAL)
        header = header or f"{_words(_strip(name, '_bytes_per_s'))} ({p}B/s)"
    elif "_bytes_per_" in name:  # kv_cache_bytes_per_token_per_layer: KiB/token/layer
        scale, unit = prefix_for(_large(floats), BINARY)
        base, per = name.split("_bytes_per_", 1)
        header = header or f"{_words(base)} ({unit}/{'/'.join(per.split('_per_'))})"
    elif name == "flops" or name.endswith("_flops"):
        scale, p = prefix_for(_large(floats), DECIMAL)
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
            if whole and _large(floats) >= 2:  # a count held as floats (calls per predict 8.0), not a 0..1 share
                return Column(name, header or _words(name), 1.0, 0)
    scaled = floats / scale
    if name.endswith("_pct") or name == "percent":
        return Column(name, header or _words(name), 1.0, _percent_decimals(_typical(scaled)))
    decimals = 0 if (integer and scale == 1.0) else decimals_for(_typical(scaled))
    return Column(name, header or _words(name), scale, decimals)


def format_number(value, decimals: int | None, scale: float = 1.0, exact: bool = False) -> str:
    """One number as the report shows it: thousands separators, ``decimals`` decimals, ``-`` when missing;
    a value too small for the column's decimals keeps two significant digits (e-notation only below 1e-4: a
    divergence's 1.3e-12, never a count) unless ``exact`` (the user rounded the column: their decimals, as they
    asked)."""
    if value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value)):
        return MISSING
    if isinstance(value, (bool, np.bool_)):
        return "yes" if value else "no"
    if isinstance(value, (int, np.integer)) and scale == 1.0 and not decimals:
        return f"{int(value):,}"  # exact: an int64 past 2**53 (a clock's ns) would lose digits as a float
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
    if not exact and v != 0 and abs(v) < 0.5 * 10 ** -decimals:  # two significant digits
        return f"{v:.2g}" if abs(v) < 1e-4 else f"{v:.{1 - math.floor(math.log10(abs(v)))}f}"  # 1.3e-12, 0.00042
    return f"{v:,.{decimals}f}"


def _text_like(values: pd.Series) -> bool:
    """A column of names or labels (text, categories), not of numbers, flags or times."""
    return not (pd.api.types.is_numeric_dtype(values) or pd.api.types.is_bool_dtype(values)
                or pd.api.types.is_datetime64_any_dtype(values))


def key_columns(frame: pd.DataFrame, key: Sequence[str] | None = None) -> list[str]:
    """The columns that tell ``frame``'s rows apart, shown first and repeated in every part of a split table:
    ``key`` when given, else those the frame's maker named (``attrs["keys"]``, raw column names), else the leading
    text columns (up to :data:`MAX_LEADING_KEYS`: a table's ``phase``, a divergence's ``layer``) with every
    :data:`KEY_COLUMNS` present. Inferred here, once, for every table: the key a user's selection keeps is kept."""
    columns = list(frame.columns)
    named = [c for c in (key if key is not None else frame.attrs.get("keys") or ()) if c in columns]
    if named or key is not None:
        return named
    leading = []
    for c in columns:
        if c in KEY_COLUMNS or (_text_like(frame[c]) and len(leading) < MAX_LEADING_KEYS):
            leading.append(c)
        else:
            break
    return leading + [c for c in KEY_COLUMNS if c in columns and c not in leading]


def order_columns(frame: pd.DataFrame, key: Sequence[str] | None = None) -> list[str]:
    """Key columns first (:func:`key_columns`), then the rest in order."""
    keys = key_columns(frame, key)
    return keys + [c for c in frame.columns if c not in keys]


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

    ``columns``: only these (in this order after the key columns; the key columns the frame names or the house
    knows are added). A column the user rounded (``frame.round(3)`` of a :class:`~mlms_nb.display.PeopleFrame`:
    ``attrs["rounded"]``) shows their decimals. Text (not one word: paths, hashes and ids stay whole) longer than
    ``max_text`` characters is shortened at a space, with an ellipsis. ``.attrs["keys"]``: the headers of the key
    columns; ``attrs["note"]`` kept.
    """
    frame = scale_units(frame)
    selected = [c for c in (columns if columns is not None else frame.columns) if c in frame.columns]
    shown = frame[selected]
    shown.attrs = frame.attrs
    keys = key_columns(shown, key)
    if columns is not None:  # the key columns a caller's selection leaves out still identify its rows
        named = key if key is not None else (frame.attrs.get("keys") or KEY_COLUMNS)
        keys += [c for c in named if c in frame.columns and c not in keys and c not in selected]
    names = keys + [c for c in selected if c not in keys]
    rounded = {c: d for c, d in (frame.attrs.get("rounded") or {}).items() if c in names}
    described = {name: describe_column(name, frame[name], rounded.get(name)) for name in names}
    spread = spread_decimals(frame, {n: c.scale for n, c in described.items()})
    share_decimals([described[n] for n in names if n not in spread and n not in rounded])
    out = {}
    headers = []
    for name in names:
        values = frame[name]
        col = described[name]
        if is_identifier(name) and pd.api.types.is_numeric_dtype(values) and not pd.api.types.is_bool_dtype(values):
            text = [MISSING if _missing_number(v) else str(int(v)) for v in values]  # an id: no separators
        elif name in rounded and col.decimals is not None:  # the user's rounding wins over the spread
            text = [format_number(v, col.decimals, exact=True) for v in values]
        elif name in spread and col.decimals is not None:
            text = [format_number(v, col.decimals if d < 0 else int(d), col.scale)
                    for v, d in zip(values, spread[name])]
        elif col.decimals is not None or (pd.api.types.is_numeric_dtype(values) and
                                          not pd.api.types.is_bool_dtype(values)):
            text = [format_number(v, col.decimals, col.scale) for v in values]
        else:
            text = [_text(v, max_text) for v in values]
        header = col.header
        while header in out:
            header += " "
        out[header] = text
        headers.append(header)
    result = pd.DataFrame(out, index=range(len(frame)))
    result.attrs = {"keys": headers[:len(keys)], "note": str(frame.attrs.get("note", ""))}
    return result


_SIDE = re.compile(r"^[ab]_")
_BOUND = re.compile(r"^(?P<stat>.+?)_(?:ci_)?(?:low|high)(?P<unit>_[a-z]+)?$")
#: Columns that are one quantity written two ways
_SAME = {"speedup": "latency_ratio"}


def family(name: str) -> str:
    """The statistic a column is read with: ``a_x`` and ``b_x`` (two runs) -> ``x``; ``x_low``, ``x_high``,
    ``x_ci_low`` (an interval) -> ``x``; ``<stat>_ci_low_<unit>`` -> ``<stat>_<unit>``; a speedup (1 / latency
    ratio) -> ``latency_ratio``."""
    name = _SIDE.sub("", name)
    m = _BOUND.match(name)
    name = f"{m['stat']}{m['unit'] or ''}" if m else name
    return _SAME.get(name, name)


def share_decimals(columns: Sequence[Column]) -> None:
    """Columns read together (:func:`family`: a ratio and its interval, run A's and run B's figure) at the same
    scale get one precision, the finest of theirs: ``1.000`` beside ``0.568``, never ``1.00``."""
    groups: dict[tuple[str, float], list[Column]] = {}
    for col in columns:
        if col.decimals is not None:
            groups.setdefault((family(col.name), col.scale), []).append(col)
    for members in groups.values():
        finest = max(c.decimals for c in members)
        for c in members:
            c.decimals = finest


def _text(value, max_text: int) -> str:
    if value is None or value is pd.NA or value is pd.NaT or (isinstance(value, float) and math.isnan(value)):
        return MISSING
    if isinstance(value, (pd.Timestamp, np.datetime64)):
        stamp = pd.Timestamp(value)
        return stamp.strftime("%Y-%m-%d %H:%M:%S") + ("Z" if stamp.tzinfo is not None else "")
    if isinstance(value, (bool, np.bool_)):
        return "yes" if value else "no"
    if isinstance(value, (list, tuple, np.ndarray)) and type(value).__str__ in _PLAIN_STR:  # else it says how it reads
        value = "×".join(map(str, value)) if all(isinstance(v, (int, np.integer)) for v in value) else str(list(value))
    text = str(value)
    if _ISO_TIME.match(text):  # a stored timestamp: to the second, in UTC
        return text[:10] + " " + text[11:19] + ("Z" if text.endswith(("Z", "+00:00")) else "")
    if len(text) <= max_text or not any(c.isspace() for c in text):
        return text  # an identifier (a path, a sha256, an id, a URL) is whole or useless: never cut
    cut = text[: max_text - 1]
    return (cut[: cut.rindex(" ")] if " " in cut.strip() else cut).rstrip() + "…"  # at a space: no word cut


_PLAIN_STR = (list.__str__, tuple.__str__, np.ndarray.__str__)
"""A sequence whose type has one of these ``__str__`` is a plain one (a list of ints reads as a shape, 3×224×224);
a type of its own (the history's batch sizes) reads as its ``str``."""
_ISO_TIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:\d\d)?$")

