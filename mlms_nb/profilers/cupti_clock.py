"""CUPTI's record times -> the tracer's :func:`time.perf_counter_ns` clock, measured from the records themselves.

CUPTI stamps activity records on its own clock, which ``cupti.get_timestamp()`` reads -- unless another CUPTI
client in the process has registered a timestamp callback (``cuptiActivityRegisterTimestampCallback``), after
which records carry *that* clock. PyTorch's profiler (Kineto) does so whenever it starts on a machine with a GPU,
even for CPU-only activity: it stamps records with the CPU's time-stamp counter (ticks, not ns). An anchor pair
``(perf_counter_ns, get_timestamp())`` then maps nothing (on an H200, 18.6% of a traced model's GPU time landed
in a layer).

So the recorder measures the mapping instead of assuming it: at start and at stop it makes a few driver API calls
(``cuDriverGetVersion``, which frameworks do not call while running a model) bracketed by ``perf_counter_ns``;
CUPTI records them like any other call, on whatever clock it uses. :func:`fit_clock` fits
``perf = p_ref + slope * (record - c_ref)`` through the two groups: a slope within 1% of 1 is a ns clock (slope
1, offset from both groups), anything else a tick counter (the fitted slope). Pure functions on plain values, so
they are tested where there is no GPU.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from statistics import median

CALIBRATION_CALLS = 5
"""Calibration calls at start and again at stop."""

NS_CLOCK_TOLERANCE = 0.01
"""A fitted slope within this of 1 is taken to be a ns clock (slope 1): over a short recording the fit's own
noise is larger than any real drift."""


def clock_anchor(cupti_timestamp, tries: int = 5) -> tuple[int, int, int]:
    """``(perf_counter_ns, cupti_ns, uncertainty_ns)``: the tightest of ``tries`` brackets
    ``perf -> cupti -> perf``, perf taken at the bracket's midpoint. ``cupti_timestamp``: a callable returning
    CUPTI's clock (``cupti.get_timestamp``)."""
    best = None
    for _ in range(max(1, tries)):
        p0 = time.perf_counter_ns()
        c = int(cupti_timestamp())
        p1 = time.perf_counter_ns()
        if best is None or p1 - p0 < best[2]:
            best = ((p0 + p1) // 2, c, p1 - p0)
    return best


def bracket_calls(call, n: int = CALIBRATION_CALLS) -> list[tuple[int, int]]:
    """``n`` calls of ``call`` each bracketed by ``perf_counter_ns``: ``[(before, after), ...]``."""
    out = []
    perf = time.perf_counter_ns
    for _ in range(n):
        p0 = perf()
        call()
        out.append((p0, perf()))
    return out


@dataclass(frozen=True)
class ClockMap:
    """``perf_counter_ns = p_ref + slope * (record_time - c_ref)``.

    how: ``"calibrated, ns clock"`` / ``"calibrated, tick clock"`` (fitted from calibration calls) or
    ``"anchor"`` (``get_timestamp`` paired with perf_counter_ns; right only while CUPTI uses its own clock);
    uncertainty_ns: half the widest calibration bracket used (or the anchor's bracket)."""

    c_ref: int
    p_ref: int
    slope: float
    how: str
    uncertainty_ns: int

    def to_perf(self, t: int) -> int:
        if self.slope == 1.0:
            return t - self.c_ref + self.p_ref
        return self.p_ref + round(self.slope * (t - self.c_ref))

    @classmethod
    def from_anchor(cls, anchor: tuple[int, int, int]) -> "ClockMap":
        perf, cupti_ns, unc = anchor
        return cls(cupti_ns, perf, 1.0, "anchor", int(unc))

    def describe(self) -> dict:
        return {"mapping": self.how, "slope": self.slope, "uncertainty_ns": self.uncertainty_ns,
                "offset_to_perf_ns": self.p_ref - self.c_ref if self.slope == 1.0 else None}


def _midpoints(brackets: list[tuple[int, int]], records: list[tuple[int, int]]) -> list[tuple[float, float, int]]:
    """Each calibration call: (perf midpoint, record midpoint, perf bracket width)."""
    return [((p0 + p1) / 2, (s + e) / 2, p1 - p0) for (p0, p1), (s, e) in zip(brackets, records)]


def fit_clock(start_brackets: list[tuple[int, int]], start_records: list[tuple[int, int]],
              stop_brackets: list[tuple[int, int]], stop_records: list[tuple[int, int]]) -> ClockMap | None:
    """The mapping from the calibration calls: brackets ``(perf before, perf after)`` and the same calls' records
    ``(start, end)`` on the records' clock, in call order, at start and at stop. None when a group is missing or
    the two do not pair up (CUPTI recorded a different number of calls than were made)."""
    if not start_brackets or len(start_brackets) != len(start_records):
        return None
    first = _midpoints(start_brackets, start_records)
    last = _midpoints(stop_brackets, stop_records) if stop_brackets and len(stop_brackets) == len(stop_records) \
        else []
    p_a, c_a = median(p for p, _, _ in first), median(c for _, c, _ in first)
    widths = [w for _, _, w in first + last]
    unc = int(max(widths) // 2)
    if not last:
        return ClockMap(round(c_a), round(p_a), 1.0, "calibrated at start only, ns clock assumed", unc)
    p_b, c_b = median(p for p, _, _ in last), median(c for _, c, _ in last)
    if c_b <= c_a or p_b <= p_a:
        return None
    slope = (p_b - p_a) / (c_b - c_a)
    if abs(slope - 1.0) <= NS_CLOCK_TOLERANCE:
        offset = median(p - c for p, c, _ in first + last)
        return ClockMap(0, round(offset), 1.0, "calibrated, ns clock", unc)
    return ClockMap(round(c_a), round(p_a), slope, "calibrated, tick clock", unc)


__all__ = ["CALIBRATION_CALLS", "ClockMap", "bracket_calls", "clock_anchor", "fit_clock"]
