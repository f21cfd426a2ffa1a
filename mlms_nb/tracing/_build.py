"""The tracer's record tuples (:mod:`mlms_nb.tracing.records`) -> the spans frame, built column by column."""
from __future__ import annotations


import numpy as np
import orjson
import pandas as pd

from mlms_nb._gc import collector_off
from mlms_nb.schema.spans import (DEFAULT_KIND, FIELD_COLUMNS, ID_COLUMNS, NO_ID, canonical_categorical, empty_spans,
                                  level_categorical, spans_frame)
from mlms_nb.tracing.records import FIXED

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
    """Tracer record tuples (:mod:`mlms_nb.tracing.records`) -> spans frame (sorted by ``(start_ns, span_id)``)."""
    n = len(records)
    if not n:
        return empty_spans()
    with collector_off():
        return _spans_from_records(records, trace_id, n)


def _spans_from_records(records: list[tuple], trace_id: str, n: int) -> pd.DataFrame:
    # the fixed fields, in records.py's order (zip stops at the shortest record; range(FIXED) after the last fixed one)
    sid, parent, names, levels, kinds, start, end, tid = (col for col, _ in zip(zip(*records), range(FIXED)))
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
        if len(r) == FIXED:
            continue
        k = (len(r) - FIXED) >> 1
        rest = None
        for key, value in zip(r[FIXED:FIXED + k], r[FIXED + k:]):
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
