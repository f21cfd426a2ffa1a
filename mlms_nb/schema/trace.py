"""The one place where the trace frames' columns, dtypes and units are written down.

Two pandas frames make a trace (:class:`mlms_nb.tracing.Trace`):

**spans** -- one row per timed region (a model run, a layer, a framework op, a kernel...), sorted by
``(start_ns, span_id)``. Units: nanoseconds for times, bytes for sizes, FLOPs for arithmetic.

===============  =====================  ======  ==================================================================
column           dtype                  unit    meaning
===============  =====================  ======  ==================================================================
trace_id         category (str)         --      id of the trace the span belongs to (one value per recorded trace)
span_id          int64                  --      id of the span, unique within its trace, > 0
parent_id        int64                  --      span_id of the enclosing span; ``0`` (:data:`ROOT`) for a root span
name             category (str)         --      what ran: ``"predict"``, ``"features.0"``, ``"aten::conv2d"``, a kernel
level            ordered category       --      :class:`~mlms_nb.schema.levels.TraceLevel` *name*
                                                (``"MODEL"``, ``"FRAMEWORK"``...); ordered, so ``level >= "FRAMEWORK"``
kind             category (str)         --      one of :data:`KINDS`: what sort of region the span is
start_ns         int64                  ns      start time on the trace's clock (see *clock* below)
end_ns           int64                  ns      end time, same clock; ``end_ns >= start_ns``
duration_ns      int64                  ns      ``end_ns - start_ns``
thread           int64                  --      OS thread id (``threading.get_native_id()``) or the source's tid
device           category (str)         --      where it ran: ``"cpu"`` (host threads), ``"cuda:0"``...
stream           int64                  --      device stream / queue id; ``-1`` when none (host spans)
layer_index      int64                  --      position of the layer in the model (execution order); ``-1`` if none
layer_type       category (str)         --      layer / operator type (``"Conv2d"``, ONNX ``"Conv"``); ``""`` if none
shape            category (str)         --      input shapes as JSON text (``"[[1,3,224,224],[64,3,7,7]]"``); ``""``
flops            float64                FLOPs   floating-point operations the span performs; NaN when unknown
bytes            float64                bytes   bytes the span reads + writes (inputs, weights, outputs; memcpy size);
                                                NaN when unknown
memory           float64                bytes   net memory allocated during the span and still held at its end
                                                (allocations - frees); NaN when unknown
attrs            category (str)         --      everything else, as JSON object text (``"{}"`` when empty);
                                                :func:`attrs_dict` turns one into a dict. A category: spans of
                                                one op signature share their text, because per-span ids live
                                                in the id columns below
===============  =====================  ======  ==================================================================

**id columns** -- optional int64 columns holding the per-span integer ids a source recorded, present only
when it recorded them; ``-1`` (:data:`NO_ID`) where a span has none. They keep ``attrs`` shared across spans
(the 672,337 spans of a 1M-event Kineto trace share 68 ``attrs`` texts once the ids are out), and let a user
join host ops, runtime calls and kernels in pandas. :data:`ID_COLUMNS` maps each to the Kineto arg it comes from:
``external_id`` ("External id": a host op and the device work it launched), ``correlation`` (a runtime call and
its kernel), ``ev_idx``, ``record_function_id``, ``sequence_number``, ``fwd_thread_id``, ``python_id``,
``python_parent_id``. A non-integer or negative value stays in ``attrs``.

**counters** -- one row per sample of a metric, sorted by ``ts_ns``:

=======  ===============  ======  ===========================================================================
column   dtype            unit    meaning
=======  ===============  ======  ===========================================================================
ts_ns    int64            ns      when the value was read, on the same clock as the spans
source   category (str)   --      who measured it: ``"psutil"``, ``"perf"``, ``"nvml"``, ``"torch.profiler"``...
metric   category (str)   --      what was measured: ``"cpu.percent"``, ``"memory.allocated"``...
value    float64          (unit)  the reading, in ``unit``
unit     category (str)   --      unit of ``value``: ``"ns"``, ``"bytes"``, ``"%"``, ``"count"``, ``"W"``...
device   category (str)   --      which device the reading is about (``"cpu"``, ``"cuda:0"``); ``""`` if none
=======  ===============  ======  ===========================================================================

**clock**: spans recorded by :class:`~mlms_nb.tracing.Tracer` use :func:`time.perf_counter_ns` (one monotonic
clock per machine). Imported traces keep their source's clock converted to ns. ``trace.metadata["clock"]``
says which clock and, when known, ``wall_offset_ns`` such that ``wall-clock ns since the epoch = start_ns +
wall_offset_ns``.

Categorical columns hold their categories sorted, without unused values (:func:`canonical_categorical`), so
two frames with the same rows compare equal however they were built.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
import pandas as pd

from mlms_nb.errors import TraceSchemaError
from mlms_nb.schema.levels import TraceLevel

ROOT = 0
"""``parent_id`` of a span that has no parent."""

LEVEL_NAMES: tuple[str, ...] = tuple(level.name for level in TraceLevel)
LEVEL_DTYPE = pd.CategoricalDtype(categories=list(LEVEL_NAMES), ordered=True)
"""The ``level`` column's dtype: TraceLevel names in level order; code ``i`` is ``TraceLevel(i)``."""

KINDS: tuple[str, ...] = (
    "application",  # the whole run / profiling session
    "model",        # one model-level step: open, predict(batch), an ONNX Runtime session run
    "layer",        # one layer of the model (a torch module, an ONNX graph node)
    "op",           # one framework operator call (aten::conv2d)
    "kernel",       # a device kernel (CUDA kernel, ...)
    "memcpy",       # a device memory copy
    "memset",       # a device memory set
    "runtime",      # a runtime / driver API call (cudaLaunchKernel, cudaMemcpyAsync)
    "annotation",   # a user-marked region (torch.profiler.record_function, ProfilerStep#n)
    "python",       # a Python function (torch.profiler with_stack)
    "other",        # anything an importer could not classify (its category is kept in attrs["cat"])
)
"""Values of the ``kind`` column."""

DEFAULT_KIND: dict[int, str] = {
    int(TraceLevel.NONE): "other",
    int(TraceLevel.APPLICATION): "application",
    int(TraceLevel.MODEL): "model",
    int(TraceLevel.FRAMEWORK): "layer",
    int(TraceLevel.ML_LIBRARY): "op",
    int(TraceLevel.SYSTEM_LIBRARY): "kernel",
    int(TraceLevel.HARDWARE): "kernel",
    int(TraceLevel.FULL): "other",
}
"""Kind given to a span recorded without one, by level."""


@dataclass(frozen=True)
class Column:
    name: str
    dtype: str  # "int64" | "float64" | "category" | "level"
    unit: str
    default: Any
    doc: str


SPANS: tuple[Column, ...] = (
    Column("trace_id", "category", "", "", "id of the trace the span belongs to"),
    Column("span_id", "int64", "", None, "id of the span, unique within its trace, > 0"),
    Column("parent_id", "int64", "", ROOT, "span_id of the enclosing span; 0 for a root span"),
    Column("name", "category", "", None, "what ran"),
    Column("level", "level", "", None, "TraceLevel name (ordered categorical)"),
    Column("kind", "category", "", None, "one of KINDS"),
    Column("start_ns", "int64", "ns", None, "start time on the trace's clock"),
    Column("end_ns", "int64", "ns", None, "end time on the trace's clock"),
    Column("duration_ns", "int64", "ns", None, "end_ns - start_ns"),
    Column("thread", "int64", "", 0, "OS thread id (native) or the source's tid"),
    Column("device", "category", "", "cpu", "where it ran: cpu, cuda:0, ..."),
    Column("stream", "int64", "", -1, "device stream id; -1 when none"),
    Column("layer_index", "int64", "", -1, "position of the layer in execution order; -1 when none"),
    Column("layer_type", "category", "", "", "layer / operator type; '' when none"),
    Column("shape", "category", "", "", "input shapes as JSON text; '' when unknown"),
    Column("flops", "float64", "FLOPs", np.nan, "floating-point operations; NaN when unknown"),
    Column("bytes", "float64", "bytes", np.nan, "bytes read + written; NaN when unknown"),
    Column("memory", "float64", "bytes", np.nan, "net bytes allocated and held at the end; NaN when unknown"),
    Column("attrs", "category", "", "{}", "other attributes as JSON object text"),
)
COUNTERS: tuple[Column, ...] = (
    Column("ts_ns", "int64", "ns", None, "when the value was read, on the spans' clock"),
    Column("source", "category", "", None, "who measured it"),
    Column("metric", "category", "", None, "what was measured"),
    Column("value", "float64", "", None, "the reading, in `unit`"),
    Column("unit", "category", "", "", "unit of value"),
    Column("device", "category", "", "", "device the reading is about; '' if none"),
)

SPAN_COLUMNS: tuple[str, ...] = tuple(c.name for c in SPANS)
COUNTER_COLUMNS: tuple[str, ...] = tuple(c.name for c in COUNTERS)
SPAN_UNITS: dict[str, str] = {c.name: c.unit for c in SPANS if c.unit}
COUNTER_UNITS: dict[str, str] = {c.name: c.unit for c in COUNTERS if c.unit}

FIELD_COLUMNS: tuple[str, ...] = ("device", "stream", "layer_index", "layer_type", "shape", "flops", "bytes", "memory")
"""Span columns a recorder may pass as keyword fields (``tracer.span(..., layer_index=3, flops=1e9)``);
any other keyword goes to ``attrs``."""

NO_ID = -1
"""Value of an id column for a span that has no such id."""

ID_COLUMNS: dict[str, str] = {
    "external_id": "External id",
    "correlation": "correlation",
    "ev_idx": "Ev Idx",
    "record_function_id": "Record function id",
    "sequence_number": "Sequence number",
    "fwd_thread_id": "Fwd thread id",
    "python_id": "Python id",
    "python_parent_id": "Python parent id",
}
"""Optional int64 span columns -> the Kineto (torch.profiler) arg each holds; in this order after the schema's
columns."""

_SPAN_BY_NAME = {c.name: c for c in SPANS}
_COUNTER_BY_NAME = {c.name: c for c in COUNTERS}


# --------------------------------------------------------------------------------------------- building blocks

def canonical_categorical(codes: np.ndarray, categories: Sequence[str]) -> pd.Categorical:
    """A categorical from integer ``codes`` into ``categories`` (any order, may hold unused values), with its
    categories sorted and unused ones dropped -- the canonical form every builder here uses."""
    codes = np.asarray(codes, dtype=np.int64)
    cats = np.asarray(list(categories), dtype=object)
    if len(cats) == 0:
        return pd.Categorical.from_codes(np.full(len(codes), -1, np.int8) if len(codes) else codes.astype(np.int8),
                                         categories=pd.Index([], dtype="str"))
    used = np.bincount(codes, minlength=len(cats)) > 0 if len(codes) else np.zeros(len(cats), bool)
    keep = np.flatnonzero(used)
    kept = cats[keep]
    order = np.argsort(kept.astype(str), kind="stable")
    remap = np.full(len(cats), -1, dtype=np.int64)
    remap[keep[order]] = np.arange(len(keep))
    new_codes = remap[codes] if len(codes) else codes
    dtype = np.int8 if len(keep) < 127 else (np.int16 if len(keep) < 32767 else np.int32)
    return pd.Categorical.from_codes(new_codes.astype(dtype, copy=False),
                                     categories=pd.Index(list(kept[order]), dtype="str"), validate=False)


def categorical_of(values: Iterable[str]) -> pd.Categorical:
    """Strings -> canonical categorical."""
    codes, uniques = pd.factorize(np.asarray(list(values) if not isinstance(values, (np.ndarray, pd.Series,
                                                                                    pd.Index)) else values,
                                             dtype=object))
    return canonical_categorical(codes, [str(u) for u in uniques])


def canonicalize(series: pd.Series, *, drop_unused: bool = True) -> pd.Series:
    """A categorical series in canonical form (sorted ``str`` categories, none unused); returned unchanged
    when already so. ``drop_unused=False`` skips the (O(rows)) check for unused categories."""
    cat = series.array
    cats = cat.categories
    ok = cats.dtype == "str" and cats.is_monotonic_increasing and cats.is_unique
    if ok and drop_unused and len(cats):
        codes = cat.codes
        ok = bool((np.bincount(codes[codes >= 0], minlength=len(cats)) > 0).all())
    if ok:
        return series
    return pd.Series(canonical_categorical(cat.codes, [str(c) for c in cats]), index=series.index,
                     name=series.name)


def level_categorical(level_codes: np.ndarray) -> pd.Categorical:
    """TraceLevel integer values -> the ``level`` column."""
    return pd.Categorical.from_codes(np.asarray(level_codes, dtype=np.int8), dtype=LEVEL_DTYPE, validate=False)


# --------------------------------------------------------------------------------------------- frames

def empty_spans() -> pd.DataFrame:
    """A spans frame with no rows and every column typed."""
    return spans_frame({})


def empty_counters() -> pd.DataFrame:
    """A counters frame with no rows and every column typed."""
    return counters_frame({})


def _default_array(col: Column, n: int):
    if col.dtype == "int64":
        return np.full(n, col.default, dtype=np.int64)
    if col.dtype == "float64":
        return np.full(n, col.default, dtype=np.float64)
    if col.dtype == "category":
        return canonical_categorical(np.zeros(n, np.int64), [col.default])
    raise TraceSchemaError(f"span column {col.name!r} has no default; it must be given")


def _coerce(col: Column, values, n: int):
    if isinstance(values, pd.Series):
        values = values.array
    if col.dtype == "int64":
        return np.asarray(values, dtype=np.int64)
    if col.dtype == "float64":
        return np.asarray(values, dtype=np.float64)
    if col.dtype == "level":
        if isinstance(values, pd.Categorical) and values.dtype == LEVEL_DTYPE:
            return values
        if isinstance(values, pd.Categorical):
            return values.set_categories(list(LEVEL_NAMES)).astype(LEVEL_DTYPE)
        arr = np.asarray(values)
        if arr.dtype.kind in "iu":
            return level_categorical(arr)
        codes, uniques = pd.factorize(arr)
        try:
            values_of = np.array([TraceLevel.parse(v).value for v in uniques], dtype=np.int8)
        except Exception as exc:  # an unknown level name
            raise TraceSchemaError(f"column 'level': {exc}") from None
        if (codes < 0).any():
            raise TraceSchemaError("column 'level' has missing values")
        return level_categorical(values_of[codes] if len(values_of) else np.zeros(0, np.int8))
    if col.dtype == "category":
        if isinstance(values, pd.Categorical):
            return canonicalize(pd.Series(values)).array
        missing = "{}" if col.name == "attrs" else ""
        return categorical_of([missing if v is None or v != v else str(v) for v in values])
    raise AssertionError(col.dtype)


def spans_frame(columns: Mapping[str, Any], *, sort: bool = True) -> pd.DataFrame:
    """Build a spans frame from column arrays (any subset holding at least the required columns:
    ``span_id, name, level, kind, start_ns, end_ns``; others get their defaults; ``duration_ns`` is computed
    when missing; :data:`ID_COLUMNS` are kept when given). Values are coerced to the schema's dtypes; rows are
    sorted by ``(start_ns, span_id)``."""
    n = None
    for v in columns.values():
        n = len(v)
        break
    n = n or 0
    missing = [c for c in ("span_id", "name", "level", "kind", "start_ns", "end_ns") if c not in columns]
    if n and missing:
        raise TraceSchemaError(f"cannot build a spans frame: missing column(s) {', '.join(missing)}")
    data = {}
    for col in SPANS:
        if col.name in columns:
            data[col.name] = _coerce(col, columns[col.name], n)
        elif col.name == "duration_ns" and "start_ns" in data and "end_ns" in data:
            data[col.name] = data["end_ns"] - data["start_ns"]
        elif col.name in ("span_id", "start_ns", "end_ns", "duration_ns"):
            data[col.name] = np.zeros(n, np.int64)
        elif col.name in ("name", "kind"):
            data[col.name] = canonical_categorical(np.zeros(n, np.int64), [""])
        elif col.name == "level":
            data[col.name] = level_categorical(np.zeros(n, np.int8))
        else:
            data[col.name] = _default_array(col, n)
    for name in ID_COLUMNS:
        if name in columns:
            data[name] = np.asarray(columns[name].array if isinstance(columns[name], pd.Series) else columns[name],
                                    dtype=np.int64)
    df = pd.DataFrame(data, copy=False)
    if sort and n:
        df = sort_spans(df)
    return df


def sort_spans(df: pd.DataFrame) -> pd.DataFrame:
    """Rows in canonical order, ``(start_ns, span_id)``; returns ``df`` itself when already so."""
    start = df["start_ns"].to_numpy()
    sid = df["span_id"].to_numpy()
    if len(df) < 2:
        return df.reset_index(drop=True) if not isinstance(df.index, pd.RangeIndex) else df
    ds = np.diff(start)
    if (ds > 0).all() or ((ds >= 0).all() and ((ds > 0) | (np.diff(sid) > 0)).all()):
        return df if isinstance(df.index, pd.RangeIndex) and df.index.start == 0 else df.reset_index(drop=True)
    order = np.lexsort((sid, start))
    return df.take(order).reset_index(drop=True)


def counters_frame(columns: Mapping[str, Any] | Iterable[tuple] | pd.DataFrame) -> pd.DataFrame:
    """A counters frame from column arrays, from rows ``(ts_ns, source, metric, value, unit, device)``, or from
    a frame with those columns (e.g. ``mlms_nb.profilers``' object-typed one); sorted by ``ts_ns``."""
    if isinstance(columns, pd.DataFrame):
        columns = {c: columns[c] for c in columns.columns}
    elif not isinstance(columns, Mapping):
        rows = list(columns)
        cols = list(zip(*rows)) if rows else [()] * len(COUNTERS)
        columns = {c.name: list(v) for c, v in zip(COUNTERS, cols)}
    n = 0
    for v in columns.values():
        n = len(v)
        break
    missing = [c for c in ("ts_ns", "source", "metric", "value") if c not in columns]
    if n and missing:
        raise TraceSchemaError(f"cannot build a counters frame: missing column(s) {', '.join(missing)}")
    data = {}
    for col in COUNTERS:
        if col.name in columns:
            data[col.name] = _coerce(col, columns[col.name], n)
        elif col.dtype == "int64":
            data[col.name] = np.zeros(n, np.int64)
        elif col.dtype == "float64":
            data[col.name] = np.zeros(n, np.float64)
        else:
            data[col.name] = canonical_categorical(np.zeros(n, np.int64), [col.default or ""])
    df = pd.DataFrame(data, copy=False)
    if n > 1:
        ts = df["ts_ns"].to_numpy()
        if not (np.diff(ts) >= 0).all():
            df = df.take(np.argsort(ts, kind="stable")).reset_index(drop=True)
    return df


# --------------------------------------------------------------------------------------------- validation

def _check(df: pd.DataFrame, columns: tuple[Column, ...], what: str) -> None:
    if not isinstance(df, pd.DataFrame):
        raise TraceSchemaError(f"{what} frame must be a pandas DataFrame, not {type(df).__name__}")
    missing = [c.name for c in columns if c.name not in df.columns]
    if missing:
        raise TraceSchemaError(f"{what} frame is missing column(s): {', '.join(missing)} "
                               f"(see mlms_nb.schema.trace)")
    wrong = []
    for col in columns:
        dtype = df[col.name].dtype
        if col.dtype in ("int64", "float64"):
            ok = dtype == np.dtype(col.dtype)
            want = col.dtype
        elif col.dtype == "level":
            ok = isinstance(dtype, pd.CategoricalDtype) and dtype == LEVEL_DTYPE
            want = "ordered category of TraceLevel names"
        elif col.dtype == "category":
            ok = isinstance(dtype, pd.CategoricalDtype)
            want = "category"
        else:
            raise AssertionError(col.dtype)
        if not ok:
            wrong.append(f"{col.name} is {dtype}, expected {want}")
    if wrong:
        raise TraceSchemaError(f"{what} frame has column(s) of the wrong dtype: {'; '.join(wrong)}")


def validate_spans(df: pd.DataFrame) -> pd.DataFrame:
    """Check ``df`` against the spans schema; returns it, or raises :class:`TraceSchemaError` naming every
    missing column / wrong dtype, or the first inconsistent row (``duration_ns != end_ns - start_ns``,
    ``end_ns < start_ns``). Extra columns are allowed; :data:`ID_COLUMNS` must be int64."""
    _check(df, SPANS, "spans")
    wrong = [f"{c} is {df[c].dtype}, expected int64" for c in ID_COLUMNS if c in df.columns and
             df[c].dtype != np.int64]
    if wrong:
        raise TraceSchemaError(f"spans frame has id column(s) of the wrong dtype: {'; '.join(wrong)}")
    if len(df):
        start, end, dur = (df[c].to_numpy() for c in ("start_ns", "end_ns", "duration_ns"))
        bad = np.flatnonzero(end < start)
        if len(bad):
            raise TraceSchemaError(f"spans frame row {bad[0]} ends before it starts "
                                   f"(start_ns={start[bad[0]]}, end_ns={end[bad[0]]})")
        bad = np.flatnonzero(dur != end - start)
        if len(bad):
            raise TraceSchemaError(f"spans frame row {bad[0]}: duration_ns={dur[bad[0]]} is not "
                                   f"end_ns - start_ns = {end[bad[0]] - start[bad[0]]}")
    return df


def validate_counters(df: pd.DataFrame) -> pd.DataFrame:
    """Check ``df`` against the counters schema; returns it or raises :class:`TraceSchemaError`."""
    _check(df, COUNTERS, "counters")
    return df


def attrs_dict(text: str) -> dict:
    """One ``attrs`` cell -> dict."""
    import orjson

    return orjson.loads(text) if text else {}
