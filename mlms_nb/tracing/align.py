"""Placing a framework profiler's model runs on the tracer's clock, inside the ``predict`` calls they ran in.

A profiler (ONNX Runtime's, TensorFlow's) stamps events on the Unix clock (``CLOCK_REALTIME``); the tracer uses
:func:`time.perf_counter_ns`. :func:`wall_offset_ns` reads the difference between the two; each profiled run is
then moved by the shift closest to 0 that puts it inside the window (``perf_counter_ns`` read just before and
after the framework call) of the ``predict`` call it belongs to (:func:`run_shifts`). The shift absorbs the
read-out error of the offset and any step of the Unix clock (NTP) between calls; everything inside a run moves
with it, so spans keep their exact relative times.
"""
from __future__ import annotations

import time

import numpy as np


def wall_offset_ns(samples: int = 7) -> int:
    """``time.time_ns() - time.perf_counter_ns()`` (ns), from the tightest of ``samples`` bracketed reads."""
    best = None
    for _ in range(samples):
        p0 = time.perf_counter_ns()
        w = time.time_ns()
        p1 = time.perf_counter_ns()
        if best is None or p1 - p0 < best[0]:
            best = (p1 - p0, w - (p0 + p1) // 2)
    return best[1]


def match_windows(run_start: np.ndarray, run_end: np.ndarray, win_start: np.ndarray,
                  win_end: np.ndarray) -> np.ndarray:
    """Index of the window each run belongs to (-1: none), all on one clock. A run belongs to the window holding
    its midpoint, else to the nearest window within one run length; each window takes at most one run (the
    closest)."""
    run_start, run_end = np.asarray(run_start, np.int64), np.asarray(run_end, np.int64)
    win_start, win_end = np.asarray(win_start, np.int64), np.asarray(win_end, np.int64)
    out = np.full(len(run_start), -1, np.int64)
    if not len(run_start) or not len(win_start):
        return out
    order = np.argsort(win_start, kind="stable")
    ws, we = win_start[order], win_end[order]
    mid = (run_start + run_end) // 2
    k = np.clip(np.searchsorted(ws, mid, side="right") - 1, 0, len(ws) - 1)
    best = np.full(len(run_start), np.iinfo(np.int64).max, np.int64)
    for cand in (k - 1, k, k + 1):
        c = np.clip(cand, 0, len(ws) - 1)
        dist = np.maximum(ws[c] - mid, 0) + np.maximum(mid - we[c], 0)
        better = (cand >= 0) & (cand < len(ws)) & (dist < best)
        best[better] = dist[better]
        out[better] = c[better]
    out[best > np.maximum(run_end - run_start, 1)] = -1
    taken: dict[int, int] = {}
    for i in np.argsort(best, kind="stable"):  # one run per window: the closest keeps it
        w = int(out[i])
        if w < 0:
            continue
        if w in taken:
            out[i] = -1
        else:
            taken[w] = int(i)
    return np.where(out >= 0, order[np.maximum(out, 0)], -1)


def run_shifts(run_start: np.ndarray, run_end: np.ndarray, win_start: np.ndarray,
               win_end: np.ndarray) -> np.ndarray:
    """Per run, the shift (ns) closest to 0 that puts ``[run_start, run_end]`` inside ``[win_start, win_end]``;
    a run longer than its window is aligned on the window's start (its spans are clipped by the caller)."""
    run_start, run_end = np.asarray(run_start, np.int64), np.asarray(run_end, np.int64)
    win_start, win_end = np.asarray(win_start, np.int64), np.asarray(win_end, np.int64)
    lo = win_start - run_start
    hi = win_end - run_end
    return np.where(lo > hi, lo, np.clip(0, lo, hi))
