"""Columnar builders shared by the tracer and the importers: records -> spans frame, time containment."""
from __future__ import annotations

import gc

import numpy as np
import orjson
import pandas as pd

from mlms_nb.schema.trace import (DEFAULT_KIND, FIELD_COLUMNS, ID_COLUMNS, NO_ID, canonical_categorical, level_categorical,
                     spans_frame)

_INT_FIELDS = {"stream": -1, "layer_index": -1}
_FLOAT_FIELDS = ("flops", "bytes", "memory")
_CAT_FIELDS = {"device": "cpu", "layer_type": "", "shape": ""}


def dumps_attrs(attrs: dict) -> str:
    """A dict -> JSON object text for the ``attrs`` column (non-JSON values via ``str``)."""
    try:
        return orjson.dumps(attrs, default=str, option=orjson.OPT_NON_STR_KEYS).decode()
    except TypeError:  # e.g. an int beyond 64 bits
        return orjson.dumps({str(k): v if isinstance(v, (str, float, bool)) or v is None else str(v)
                             for k, v in attrs.items()}).decode()


def _shape_text(value) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    try:
        return orjson.dumps(value, default=lambda o: list(o)).decode()
    except TypeError:
        return str(value)


def _intern(values: list, table: dict) -> list:
    get = table.get
    out = []
    append = out.append
    for v in values:
        c = get(v)
        if c is None:
            c = table[v] = len(table)
        append(c)
    return out


def spans_from_records(records: list[tuple], trace_id: str) -> pd.DataFrame:
    """Tracer records ``(span_id, parent_id, name, level, kind, start_ns, end_ns, thread, *field_names,
    *field_values)`` -> spans frame (sorted by ``(start_ns, span_id)``)."""
    n = len(records)
    if not n:
        from mlms_nb.schema.trace import empty_spans

        return empty_spans()
    gc_was = gc.isenabled()
    gc.disable()
    try:
        return _spans_from_records(records, trace_id, n)
    finally:
        if gc_was:
            gc.enable()


def _spans_from_records(records: list[tuple], trace_id: str, n: int) -> pd.DataFrame:
    # the 8 fixed fields (zip stops at the shortest record; range(8) stops after the 8th column)
    sid, parent, names, levels, kinds, start, end, tid = (col for col, _ in zip(zip(*records), range(8)))
    levels_arr = np.fromiter(levels, dtype=np.int8, count=n)
    kinds = [k if k is not None else DEFAULT_KIND[lv] for k, lv in zip(kinds, levels_arr.tolist())]
    name_table: dict = {}
    name_codes = _intern(names, name_table)
    kind_table: dict = {}
    kind_codes = _intern(kinds, kind_table)
    cols: dict = {
        "trace_id": canonical_categorical(np.zeros(n, np.int64), [trace_id]),
        "span_id": np.fromiter(sid, np.int64, n),
        "parent_id": np.fromiter(parent, np.int64, n),
        "name": canonical_categorical(np.asarray(name_codes), [str(k) for k in name_table]),
        "level": level_categorical(levels_arr),
        "kind": canonical_categorical(np.asarray(kind_codes), list(kind_table)),
        "start_ns": np.fromiter(start, np.int64, n),
        "end_ns": np.fromiter(end, np.int64, n),
        "thread": np.fromiter(tid, np.int64, n),
    }
    cols["duration_ns"] = cols["end_ns"] - cols["start_ns"]

    # fields: per known column a sparse (rows, values) pair; the rest -> attrs JSON
    sparse: dict[str, tuple[list, list]] = {k: ([], []) for k in (*FIELD_COLUMNS, *ID_COLUMNS)}
    attrs = ["{}"] * n
    get = sparse.get
    for i, r in enumerate(records):
        if len(r) == 8:
            continue
        k = (len(r) - 8) >> 1
        rest = None
        for key, value in zip(r[8:8 + k], r[8 + k:]):
            col = get(key)
            if col is not None:
                col[0].append(i)
                col[1].append(value)
            else:
                if rest is None:
                    rest = {}
                rest[key] = value
        if rest:
            attrs[i] = dumps_attrs(rest)
    for key, default in _INT_FIELDS.items():
        arr = np.full(n, default, np.int64)
        rows, vals = sparse[key]
        if rows:
            arr[np.asarray(rows)] = np.asarray([default if v is None else v for v in vals], np.int64)
        cols[key] = arr
    for key in ID_COLUMNS:  # present only when some span has the id
        rows, vals = sparse[key]
        keep = [(r, v) for r, v in zip(rows, vals) if v is not None and v != NO_ID]
        if keep:
            arr = np.full(n, NO_ID, np.int64)
            arr[np.fromiter((r for r, _ in keep), np.int64, len(keep))] = np.fromiter(
                (int(v) for _, v in keep), np.int64, len(keep))
            cols[key] = arr
    for key in _FLOAT_FIELDS:
        arr = np.full(n, np.nan)
        rows, vals = sparse[key]
        if rows:
            arr[np.asarray(rows)] = np.asarray([np.nan if v is None else v for v in vals], np.float64)
        cols[key] = arr
    for key, default in _CAT_FIELDS.items():
        rows, vals = sparse[key]
        codes = np.zeros(n, np.int64)
        table: dict = {default: 0}
        if rows:
            conv = _shape_text if key == "shape" else (lambda v: "" if v is None else str(v))
            texts = [conv(v) for v in vals]
            codes[np.asarray(rows)] = _intern(texts, table)
        cols[key] = canonical_categorical(codes, list(table))
    attrs_table: dict = {}
    cols["attrs"] = canonical_categorical(np.asarray(_intern(attrs, attrs_table)), list(attrs_table))
    return spans_frame(cols)


def containment_parents(group: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """For spans given by ``(group, start, end)`` (group: thread / stream key), the index of each span's
    innermost enclosing span in the same group, or -1. Properly nested spans give the exact tree; partial
    overlaps attach to the nearest earlier span that still covers the end.

    Vectorised: sort by (group, start, -end); a span's parent is the nearest earlier span in sort order whose
    end is >= its end -- found by pointer jumping from the previous span (O(n log n) in numpy, no Python loop
    per span).
    """
    n = len(start)
    if n == 0:
        return np.zeros(0, np.int64)
    order = np.lexsort((-end, start, group))
    g = group[order]
    e = end[order]
    p = np.arange(-1, n - 1, dtype=np.int64)
    if n > 1:
        p[1:][g[1:] != g[:-1]] = -1
    active = np.flatnonzero(p >= 0)
    # a candidate is wrong when it ends before the span does; jump to the candidate's own candidate
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


def containment_parents_reference(group, start, end) -> np.ndarray:
    """A plain stack sweep giving the same answer as :func:`containment_parents` (for tests)."""
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
