"""The tracer's record tuples and span blocks (:mod:`mlms_nb.tracing.records`) -> the spans frame, built column
by column."""
from __future__ import annotations

from typing import Sequence

import numpy as np
import orjson
import pandas as pd

from mlms_nb._gc import collector_off
from mlms_nb.schema.spans import (DEFAULT_KIND, FIELD_COLUMNS, ID_COLUMNS, NO_ID, canonical_categorical, empty_spans,
                                  level_categorical, spans_frame)
from mlms_nb.tracing.records import FIXED, SpanBlock

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


def _text_of(key: str):
    """How a value of the categorical field ``key`` becomes its text (shapes as JSON; None as "")."""
    return _shape_text if key == "shape" else (lambda v: "" if v is None else str(v))


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


_CATEGORICAL = ("name", "kind", *_CAT_FIELDS, "attrs")
"""Columns built as codes into one table per column, shared by every piece of a trace (tuples, blocks)."""


def spans_from_records(records: list[tuple], trace_id: str, blocks: Sequence[SpanBlock] = ()) -> pd.DataFrame:
    """Tracer record tuples (:mod:`mlms_nb.tracing.records`) and span blocks -> spans frame (sorted by
    ``(start_ns, span_id)``)."""
    n = len(records) + sum(len(b) for b in blocks)
    if not n:
        return empty_spans()
    tables: dict[str, dict] = {"name": {}, "kind": {}, **{k: {d: 0} for k, d in _CAT_FIELDS.items()}, "attrs": {}}
    with collector_off():
        pieces = ([_record_columns(records, tables)] if records else []) + [_block_columns(b, tables) for b in blocks]
        cols: dict = {"trace_id": canonical_categorical(np.zeros(n, np.int64), [trace_id])}
        for key in pieces[0]:
            if key in ID_COLUMNS:
                continue
            joined = np.concatenate([p[key] for p in pieces]) if len(pieces) > 1 else pieces[0][key]
            cols[key] = (canonical_categorical(joined, [str(k) for k in tables[key]]) if key in _CATEGORICAL
                         else level_categorical(joined) if key == "level" else joined)
        for key in ID_COLUMNS:  # present only when some span has the id
            if any(key in p for p in pieces):
                cols[key] = np.concatenate([p.get(key, np.full(len(p["span_id"]), NO_ID, np.int64)) for p in pieces])
        cols["duration_ns"] = cols["end_ns"] - cols["start_ns"]
        return spans_frame(cols)


def _record_columns(records: list[tuple], tables: dict[str, dict]) -> dict:
    """Record tuples -> their columns, categoricals as codes into ``tables``."""
    n = len(records)
    # the fixed fields, in records.py's order (zip stops at the shortest record; range(FIXED) after the last fixed one)
    sid, parent, names, levels, kinds, start, end, tid = (col for col, _ in zip(zip(*records), range(FIXED)))
    levels_arr = np.fromiter(levels, dtype=np.int8, count=n)
    kinds = [k if k is not None else DEFAULT_KIND[lv] for k, lv in zip(kinds, levels_arr.tolist())]
    cols: dict = {
        "span_id": np.fromiter(sid, np.int64, n),
        "parent_id": np.fromiter(parent, np.int64, n),
        "name": np.asarray(_intern(names, tables["name"]), np.int64),
        "level": levels_arr,
        "kind": np.asarray(_intern(kinds, tables["kind"]), np.int64),
        "start_ns": np.fromiter(start, np.int64, n),
        "end_ns": np.fromiter(end, np.int64, n),
        "thread": np.fromiter(tid, np.int64, n),
    }

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
    for key in ID_COLUMNS:
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
    for key in _CAT_FIELDS:
        rows, vals = sparse[key]
        codes = np.zeros(n, np.int64)
        if rows:
            conv = _text_of(key)
            codes[np.asarray(rows)] = _intern([conv(v) for v in vals], tables[key])
        cols[key] = codes
    cols["attrs"] = np.asarray(_intern(attrs, tables["attrs"]), np.int64)
    return cols


def _block_columns(block: SpanBlock, tables: dict[str, dict]) -> dict:
    """A span block -> its columns, categoricals as codes into ``tables``: each part's name and fields are
    converted once and spread over its spans by ``block.part``."""
    n = len(block)
    part = np.asarray(block.part, np.int64)
    cols: dict = {
        "span_id": np.asarray(block.span_id, np.int64),
        "parent_id": np.asarray(block.parent_id, np.int64),
        "name": np.asarray(_intern([name for name, _ in block.parts], tables["name"]), np.int64)[part],
        "level": np.full(n, block.level, np.int8),
        "kind": np.full(n, _intern([block.kind or DEFAULT_KIND[block.level]], tables["kind"])[0], np.int64),
        "start_ns": np.asarray(block.start_ns, np.int64),
        "end_ns": np.asarray(block.end_ns, np.int64),
        "thread": np.asarray(block.thread, np.int64),
    }
    fields = [f for _, f in block.parts]
    for key, default in _INT_FIELDS.items():
        values = block.row_fields.get(key)
        cols[key] = (np.asarray(values, np.int64) if values is not None else np.asarray(
            [default if f.get(key) is None else f[key] for f in fields], np.int64)[part])
    for key in ID_COLUMNS:
        if key in block.row_fields:  # NO_ID where a span has none, as the id columns spell it
            cols[key] = np.asarray(block.row_fields[key], np.int64)
    for key in _FLOAT_FIELDS:
        cols[key] = np.asarray([np.nan if f.get(key) is None else f[key] for f in fields], np.float64)[part]
    for key, default in _CAT_FIELDS.items():
        conv = _text_of(key)
        texts = [default if key not in f else conv(f[key]) for f in fields]
        cols[key] = np.asarray(_intern(texts, tables[key]), np.int64)[part]
    known = {*FIELD_COLUMNS, *ID_COLUMNS}
    attrs = [{k: v for k, v in f.items() if k not in known} for f in fields]
    cols["attrs"] = np.asarray(_intern([dumps_attrs(a) if a else "{}" for a in attrs], tables["attrs"]),
                               np.int64)[part]
    return cols
