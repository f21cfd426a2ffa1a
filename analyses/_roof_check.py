"""The roofline's honesty check: a point above its roof is a measurement problem, flagged with its likely cause.

A roof measured with the framework's own best kernels holds for its layers; a point above it says that the
FLOPs or bytes counted, or the time measured, do not describe what ran. Each row gets

- ``roof_check``: ``"below roof"``; ``"at roof, within spread"`` (above 100% of attainable, but the low end of
  its own measured spread -- the achieved rate at the slower quartile of its time -- is under the roof raised by
  the ceilings' spread); or ``"above roof"`` (above even so: a measurement problem);
- ``roof_check_why``: empty below the roof; otherwise one sentence with the likely causes that apply
  (:func:`causes`). It starts ``"machine busy: "`` instead of ``"measurement problem: "`` when the ceilings were
  measured on a busy machine (``RoofContext.ceilings_busy``): the roof itself is then too low, which puts points
  above it whatever else holds.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

import numpy as np
import pandas as pd

BELOW, WITHIN, ABOVE = "below roof", "at roof, within spread", "above roof"
SHORT_SPAN_MS = 0.05  # a layer timed under 50 us is at the tracer's resolution and overhead


@dataclass(frozen=True)
class RoofContext:
    """What the check knows beyond the roof itself: the ceilings' spread (same units as peak and bandwidth), the
    last-level cache size in bytes, the threads the ceilings were measured with and the run used (None: the
    framework's default), whether the ceilings' repetitions spread widely, per layer name a sentence saying
    why its span may not hold its work (e.g. ``"fused work timed under one node: ..."``), and sentences true of
    the whole run that can put a point above its roof."""
    peak_iqr: float = 0.0
    bandwidth_iqr: float = 0.0
    cache_bytes: int | None = None
    ceiling_threads: int | None = None
    run_threads: int | None = None
    ceilings_noisy: bool = False
    hints: Mapping[str, str] = field(default_factory=dict)
    run_notes: tuple[str, ...] = ()  # causes true of the whole run (e.g. TF32 math against a float32 roof)
    ceilings_busy: str = ""  # the machine's load while the ceilings were measured, when it was busy


def _mib(n: float) -> str:
    return f"{n / 2**20:.3g} MiB"


def causes(row: Mapping, framework: str, ridge: float, ctx: RoofContext) -> list[str]:
    """The likely causes of one point above its roof, the machine's load first (it lowers every roof), then the most
    specific; never empty."""
    out = []
    if ctx.ceilings_busy:
        out.append(f"the ceilings were measured while the machine was busy ({ctx.ceilings_busy}), so the roof is too "
                   "low: measure them again on a quiet machine (machine_ceilings(..., refresh=True))")
    hint = ctx.hints.get(str(row.get("layer_name", "")))
    if hint:
        out.append(hint)
    intensity, nbytes = float(row["intensity_flop_per_byte"]), float(row["bytes"])
    if intensity < ridge and ctx.cache_bytes and nbytes <= ctx.cache_bytes:
        out.append(f"its {_mib(nbytes)} fit in the {_mib(ctx.cache_bytes)} last-level cache, so they are read "
                   "from cache, faster than the DRAM bandwidth the roof uses")
    median_ms = float(row.get("median_ms", np.nan))
    if median_ms < SHORT_SPAN_MS:
        out.append(f"its span lasts {median_ms * 1e3:.3g} us, at the tracer's resolution and overhead")
    if (ctx.ceiling_threads or ctx.run_threads) and ctx.ceiling_threads != ctx.run_threads:
        out.append(f"the ceilings were measured with {ctx.ceiling_threads or 'the default'} threads, the run used "
                   f"{ctx.run_threads or 'the default'}")
    out.extend(ctx.run_notes)
    if ctx.ceilings_noisy:
        out.append("the ceilings' repetitions spread widely: other work ran while they were measured (measure "
                   "them again on a quiet machine: machine_ceilings(..., refresh=True))")
    if not out:
        out.append(f"faster than {framework}'s best measured kernel: the FLOPs or bytes counted for it may not be "
                   "what its kernel does, or part of its work is timed under another span")
    return out


def check(out: pd.DataFrame, peak: float, bw: float, ridge: float, ctx: RoofContext | None,
          low_col: str = "achieved_low_flops_per_s") -> None:
    """Add ``ceiling_peak_flops_per_s, ceiling_bandwidth_bytes_per_s, roof_check, roof_check_why`` to ``out`` (a
    roofline frame with ``framework, flops, bytes, intensity_flop_per_byte, achieved_flops_per_s, low_col,
    attainable_flops_per_s``)."""
    ctx = ctx or RoofContext()
    out["ceiling_peak_flops_per_s"] = float(peak)
    out["ceiling_bandwidth_bytes_per_s"] = float(bw)
    intensity = out["intensity_flop_per_byte"].to_numpy(float)
    high_roof = np.minimum(peak + ctx.peak_iqr, intensity * (bw + ctx.bandwidth_iqr))
    achieved = out["achieved_flops_per_s"].to_numpy(float)
    low = out[low_col].to_numpy(float)
    low = np.where(np.isnan(low), achieved, low)
    over = (out["flops"].to_numpy(float) > 0) & (achieved > out["attainable_flops_per_s"].to_numpy(float))
    beyond = over & (low > high_roof)
    out["roof_check"] = np.where(beyond, ABOVE, np.where(over, WITHIN, BELOW))
    whys = []
    for row, is_over, is_beyond in zip(out.to_dict("records"), over, beyond):
        if not is_over:
            whys.append("")
        elif not is_beyond:
            whys.append(f"{row['pct_of_attainable']:.0f}% of attainable, within the spread of its measured time "
                        "and of the ceilings")
        else:
            what = "machine busy" if ctx.ceilings_busy else "measurement problem"
            whys.append(f"{what}: {row['pct_of_attainable']:.0f}% of attainable beyond its spread; "
                        "likely: " + "; ".join(causes(row, str(row.get("framework", "")), ridge, ctx)))
    out["roof_check_why"] = whys


def summary(df: pd.DataFrame) -> str:
    """One clause for a note: how many points are above their roof, and that they are flagged."""
    if "roof_check" not in df:
        return ""
    above, within = int((df["roof_check"] == ABOVE).sum()), int((df["roof_check"] == WITHIN).sum())
    busy = int(((df["roof_check"] == ABOVE) & df["roof_check_why"].astype(str).str.startswith("machine busy")).sum()) \
        if "roof_check_why" in df else 0
    parts = []
    if busy:
        parts.append(f"{busy} point(s) above a roof measured while the machine was busy: the roof is too low, not the "
                     "measurement wrong (roof_check_why says so; measure the ceilings again on a quiet machine)")
    if above - busy:
        parts.append(f"{above - busy} point(s) above their roof beyond the measured spread: measurement problems, "
                     "flagged 'above roof' with their likely cause in roof_check_why")
    if within:
        parts.append(f"{within} point(s) above 100% of attainable within the measured spread ('{WITHIN}')")
    return "; ".join(parts)
