"""Single numbers in words: :func:`fmt_num` (about 3 significant digits, for a number without a measured spread),
:func:`fmt_int`, :func:`fmt_pct`, a tracing overhead against its noise (:func:`fmt_overhead`,
:func:`overhead_frame`) and :func:`is_missing`."""
from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

def is_missing(value: Any) -> bool:
    """None, NA, NaT or a float NaN."""
    if value is None or value is pd.NA or value is pd.NaT:
        return True
    return isinstance(value, (float, np.floating)) and math.isnan(value)


def is_set(value: Any) -> bool:
    """A flag column's cell as a truth value: True for ``True``, a numpy bool or 1 (a flag read back from a store as
    an integer); False for anything else, a missing value included."""
    return not is_missing(value) and isinstance(value, (bool, np.bool_, int, np.integer)) and bool(value)


def fmt_num(value: Any) -> str:
    """3 significant digits for small numbers, thousands separators for large ones; '-' when missing."""
    if is_missing(value):
        return "-"
    try:
        v = float(value)
    except (TypeError, ValueError):
        return str(value)
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    a = abs(v)
    if a == 0:
        return "0"
    for at_least, spec in ((100, ",.0f"), (10, ".1f"), (1, ".2f"), (0.001, ".3f")):
        if a >= at_least:
            return format(v, spec)
    return f"{v:.2e}"


def fmt_int(value: Any) -> str:
    if is_missing(value) or not isinstance(value, (int, float, np.number)) or not math.isfinite(value):
        return "-" if is_missing(value) else str(value)
    return str(int(value))


def fmt_overhead(pct: Any, noise: Any = None) -> str:
    """A tracing overhead (%) against its noise (%): "within noise (±x%)" when it lies inside it; the percentage
    with its noise when above it; never a bare negative percentage: tracing cannot speed a call up, so a traced
    pass faster than the untraced one beyond the noise says the two ran under different conditions (the
    machine's load changed between them), and reads as such."""
    if is_missing(pct):
        return "-"
    pct = float(pct)
    if is_missing(noise):
        return "within noise (spread not recorded)" if pct <= 0 else f"{pct:+.1f}% (spread not recorded)"
    noise = float(noise)
    if abs(pct) <= noise:
        return f"within noise (±{noise:.1f}%)"
    if pct < 0:
        return f"none: traced {-pct:.1f}% faster (noise ±{noise:.1f}%)"  # the note says why: CONDITIONS_CHANGED
    return f"+{pct:.1f}% (±{noise:.1f}%)"


CONDITIONS_CHANGED = ("A traced pass faster than the untraced one beyond their noise measures no overhead: tracing "
                      "cannot speed a call up, so the two passes ran under different conditions (the machine's load "
                      "or clock changed between them); rerun on a quiet machine to measure the overhead.")


def overhead_frame(frame: pd.DataFrame) -> pd.DataFrame:
    """A trace_overhead frame for reading: ``overhead_pct`` and ``noise_pct`` as one text column, "overhead", which
    says "machine busy" where the machine was (its ``busy`` column: the overhead is then not the tracer's alone)."""
    if frame.empty or "overhead_pct" not in frame:
        return frame
    out = frame.drop(columns=[c for c in ("overhead_pct", "noise_pct", "busy") if c in frame])
    noise = frame["noise_pct"] if "noise_pct" in frame else [None] * len(frame)
    busy = frame["busy"] if "busy" in frame else [False] * len(frame)
    out["overhead"] = [fmt_overhead(p, n) + ("; machine busy" if is_set(b) else "")
                       for p, n, b in zip(frame["overhead_pct"], noise, busy)]
    out.attrs.update(frame.attrs)
    if any(text.startswith("none: ") for text in out["overhead"]):
        out.attrs["note"] = " ".join(filter(None, [str(frame.attrs.get("note", "")), CONDITIONS_CHANGED]))
    figures = [_noise_figures(n) for n in noise]
    out.attrs["figures"] = {c: figures for c in ("untraced_median_ms", "traced_median_ms") if c in frame}
    return out


def _noise_figures(noise_pct: Any) -> int:
    """Significant figures of a median whose relative 95% CI half-width is at most ``noise_pct`` % (the overhead's
    noise sums both medians' half-widths, so it bounds each): torch.utils.benchmark's floor(log10(100 / noise)),
    1 to 4; -1 (the column's default precision) when it was not recorded."""
    if is_missing(noise_pct):
        return -1
    return 4 if float(noise_pct) <= 0 else int(min(4, max(1, math.floor(math.log10(100 / float(noise_pct))))))


def fmt_pct(fraction: Any) -> str:
    """A fraction 0..1 as a percentage with one decimal."""
    return "-" if is_missing(fraction) else f"{100 * float(fraction):.1f}"

