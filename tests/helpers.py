"""Test-only helpers shared by several test files: plain reference implementations that the library's fast ones
are checked against, and small utilities. Each helper says which tests use it."""
from __future__ import annotations

import time

import numpy as np


# --------------------------------------------------------------------------------------------- tracing references


def containment_parents_reference(group, start, end) -> np.ndarray:
    """A plain stack sweep giving what :func:`mlms_nb.tracing.attribution.containment_parents` must give: per span,
    the nearest earlier span in (group, start, -end) order whose end is >= its end (test_tracing)."""
    n = len(start)
    order = sorted(range(n), key=lambda i: (group[i], start[i], -end[i]))
    out = np.full(n, -1, np.int64)
    stack: list[int] = []
    last_group = None
    for i in order:
        if group[i] != last_group:
            stack = []
            last_group = group[i]
        while stack and end[stack[-1]] < end[i]:
            stack.pop()
        out[i] = stack[-1] if stack else -1
        stack.append(i)
    return out


def innermost_enclosing_reference(start, end, q_start, q_end) -> list[int]:
    """Per query interval, by brute force, the innermost of the (properly nested) intervals containing it: one that
    contains no other containing interval -- of two siblings touching at the query, the later -- or -1. What
    :func:`mlms_nb.tracing.attribution.innermost_enclosing` must give (test_cupti)."""
    out = []
    for qs, qe in zip(q_start, q_end):
        cont = [i for i in range(len(start)) if start[i] <= qs and qe <= end[i]]
        minimal = [i for i in cont if not any(j != i and start[i] <= start[j] and end[j] <= end[i] and
                                              (start[j], end[j]) != (start[i], end[i]) for j in cont)]
        out.append(max(minimal, key=lambda i: (start[i], -end[i])) if minimal else -1)
    return out


# --------------------------------------------------------------------------------------------- profilers


def spin_cpu(ms: float) -> int:
    """Keep this thread busy until it has used ``ms`` of CPU time (not wall time: on a loaded machine a wall-time
    loop may get little CPU); returns the CPU ns it used (test_profilers)."""
    t0 = time.thread_time_ns()
    end = t0 + int(ms * 1e6)
    x = 0
    while time.thread_time_ns() < end:
        x += 1
    return time.thread_time_ns() - t0
