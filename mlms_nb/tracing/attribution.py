"""Who caused a span: the innermost interval enclosing it, and the call that launched a device activity.

Three questions every importer and recorder of nested activity asks, answered here once, vectorised (numpy
sorts, searches and pointer jumping; no Python loop per span):

- :func:`containment_parents`: in one set of intervals, each one's innermost enclosing interval (the span
  tree of a Chrome/Kineto trace, of a torch layer's calls);
- :func:`innermost_enclosing`: for query intervals, the innermost of *other* intervals enclosing each (a
  CUDA kernel's or runtime call's layer);
- :func:`launching_calls`: for device activity, the runtime/driver API call with the same correlation id
  (the call that launched a kernel, in a Kineto trace as in CUPTI's records).

Used by :mod:`mlms_nb.tracing.chrome` (Kineto parents) and :mod:`mlms_nb.tracing.cuda_activity` (CUPTI).
"""
from __future__ import annotations

import numpy as np


def containment_parents(group: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """For spans given by ``(group, start, end)`` (group: thread / stream key), the index of each span's
    innermost enclosing span in the same group, or -1. Properly nested spans give the exact tree; partial
    overlaps attach to the nearest earlier span that still covers the end.

    Sort by (group, start, -end); a span's parent is the nearest earlier span in sort order whose end is >= its
    end -- found by pointer jumping from the previous span (O(n log n) in numpy, no Python loop per span).
    Spans with the same start and end nest in input order.
    """
    group, start, end = (np.asarray(a, np.int64) for a in (group, start, end))
    n = len(start)
    if n == 0:
        return np.zeros(0, np.int64)
    order = np.lexsort((-end, start, group))
    g = group[order]
    e = end[order]
    p = np.arange(-1, n - 1, dtype=np.int64)
    if n > 1:
        p[1:][g[1:] != g[:-1]] = -1
    # a span that no earlier span of its group outlasts has no parent: settled before any jumping (spans that run
    # one after another, the most common case, never enter the loop)
    first = np.flatnonzero(np.r_[True, g[1:] != g[:-1]])
    for lo, hi in zip(first, np.r_[first[1:], n]):
        if hi - lo > 1:
            outlasted = np.maximum.accumulate(e[lo:hi - 1]) >= e[lo + 1:hi]
            p[lo + 1:hi][~outlasted] = -1
    active = np.flatnonzero(p >= 0)
    # a candidate is wrong when it ends before the span does; jump to the candidate's own candidate (every span
    # skipped on the way ends before the span too, so the first candidate that covers the end is the nearest)
    while len(active):
        cand = p[active]
        bad = e[cand] < e[active]
        active = active[bad]
        if not len(active):
            break
        nxt = p[p[active]]
        p[active] = nxt
        active = active[nxt >= 0]
    parent_sorted = np.where(p >= 0, order[np.maximum(p, 0)], -1)
    out = np.empty(n, np.int64)
    out[order] = parent_sorted
    return out


def innermost_enclosing(group: np.ndarray, start: np.ndarray, end: np.ndarray, q_group: np.ndarray,
                        q_start: np.ndarray, q_end: np.ndarray) -> np.ndarray:
    """For each query interval, the index of the innermost interval of the same group containing it
    (``start <= q_start`` and ``q_end <= end``), or -1.

    Intervals are sorted by ``(start, -end)``; a query's candidate is the last interval starting at or before it
    (the deepest one open at that instant, or one that ended before it, whose enclosing intervals are its
    ancestors); the answer is the first of the candidate and its ancestors (:func:`containment_parents`) that
    still covers the query's end. Per group: one searchsorted and a climb as deep as the interval tree.
    """
    group, start, end = (np.asarray(a, np.int64) for a in (group, start, end))
    q_group, q_start, q_end = (np.asarray(a, np.int64) for a in (q_group, q_start, q_end))
    out = np.full(len(q_start), -1, np.int64)
    if len(q_start) == 0 or len(start) == 0:
        return out
    parent = containment_parents(group, start, end)
    for g in np.unique(q_group):
        rows = np.flatnonzero(group == g)
        if not len(rows):
            continue
        qrows = np.flatnonzero(q_group == g)
        order = rows[np.lexsort((-end[rows], start[rows]))]
        pos = np.searchsorted(start[order], q_start[qrows], side="right") - 1
        cand = np.where(pos >= 0, order[np.maximum(pos, 0)], -1)
        active = np.flatnonzero(cand >= 0)
        while len(active):
            short = end[cand[active]] < q_end[qrows[active]]
            active = active[short]
            if not len(active):
                break
            cand[active] = parent[cand[active]]
            active = active[cand[active] >= 0]
        out[qrows] = cand
    return out


def launching_calls(call_ids: np.ndarray, activity_ids: np.ndarray, call_rank: np.ndarray | None = None
                    ) -> np.ndarray:
    """For each device activity's correlation id, the index of the API call with the same id, or -1.

    ``call_ids``: the correlation ids of the runtime/driver calls; pass only calls that carry one (CUPTI's 0
    and Kineto's missing id mean none). When several calls share an id (a runtime call and the driver call
    beneath it), the lowest ``call_rank`` wins (default: all equal), then the first in ``call_ids`` order.
    """
    call_ids = np.asarray(call_ids, np.int64)
    activity_ids = np.asarray(activity_ids, np.int64)
    out = np.full(len(activity_ids), -1, np.int64)
    if not len(call_ids) or not len(activity_ids):
        return out
    rank = np.zeros(len(call_ids), np.int64) if call_rank is None else np.asarray(call_rank, np.int64)
    order = np.lexsort((np.arange(len(call_ids)), rank, call_ids))
    ids = call_ids[order]
    pos = np.minimum(np.searchsorted(ids, activity_ids, side="left"), len(ids) - 1)
    hit = ids[pos] == activity_ids
    out[hit] = order[pos[hit]]
    return out
