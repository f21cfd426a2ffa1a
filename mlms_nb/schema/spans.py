"""The spans frame: its columns, dtypes and units, written down once, and the functions that build and check it.

A trace (:class:`mlms_nb.tracing.Trace`) is a spans frame and a counters frame (:mod:`mlms_nb.schema.counters`).

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
(spans of one op signature share one ``attrs`` text once their ids are out: ``benchmarks/trace_ingest.py`` prints
how many texts a real Kineto trace's spans share), and let a user join host ops, runtime calls and kernels in
pandas. :data:`ID_COLUMNS` maps each to the Kineto arg it comes from:
``external_id`` ("External id": a host op and the device work it launched), ``correlation`` (a runtime call and
its kernel), ``ev_idx``, ``record_function_id``, ``sequence_number``, ``fwd_thread_id``, ``python_id``,
``python_parent_id``. A non-integer or negative value stays in ``attrs``.

**clock**: spans recorded by :class:`~mlms_nb.tracing.Tracer` use :func:`time.perf_counter_ns` (one monotonic
clock per machine). Imported traces keep their source's clock converted to ns. ``trace.metadata["clock"]``
says which clock and, when known, ``wall_offset_ns`` such that ``wall-clock ns since the epoch = start_ns +
wall_offset_ns``.
"""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np
import pandas as pd

from mlms_nb.errors import TraceSchemaError
from mlms_nb.schema.columns import (Column, canonical_categorical, check_columns, frame_columns,
                                    level_categorical)
from mlms_nb.schema.levels import TraceLevel

ROOT = 0
"""``parent_id`` of a span that has no parent."""

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

SPAN_COLUMNS: tuple[str, ...] = tuple(c.name for c in SPANS)
SPAN_UNITS: dict[str, str] = {c.name: c.unit for c in SPANS if c.unit}

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


def empty_spans() -> pd.DataFrame:
    """A spans frame with no rows and every column typed."""
    return spans_frame({})


def spans_frame(columns: Mapping[str, Any], *, sort: bool = True) -> pd.DataFrame:
    """Build a spans frame from column arrays (any subset holding at least the required columns:
    ``span_id, name, level, kind, start_ns, end_ns``; others get their defaults; ``duration_ns`` is computed
    when missing; :data:`ID_COLUMNS` are kept when given). Values are coerced to the schema's dtypes; rows are
    sorted by ``(start_ns, span_id)``."""
    data, n = frame_columns(SPANS, columns, ("span_id", "name", "level", "kind", "start_ns", "end_ns"), "spans",
                            derived={"duration_ns": _duration})
    for name in ID_COLUMNS:
        if name in columns:
            data[name] = np.asarray(columns[name].array if isinstance(columns[name], pd.Series) else columns[name],
                                    dtype=np.int64)
    df = pd.DataFrame(data, copy=False)
    if sort and n:
        df = sort_spans(df)
    return df


def _duration(data: dict):
    """``duration_ns`` when not given: ``end_ns - start_ns`` (None before both are built: it follows them)."""
    if "start_ns" in data and "end_ns" in data:
        return data["end_ns"] - data["start_ns"]
    return None


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


def validate_spans(df: pd.DataFrame) -> pd.DataFrame:
    """Check ``df`` against the spans schema; returns it, or raises :class:`TraceSchemaError` naming every
    missing column / wrong dtype, or the first inconsistent row (``duration_ns != end_ns - start_ns``,
    ``end_ns < start_ns``). Extra columns are allowed; :data:`ID_COLUMNS` must be int64."""
    check_columns(df, SPANS, "spans")
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


def attrs_dict(text: str) -> dict:
    """One ``attrs`` cell -> dict."""
    import orjson

    return orjson.loads(text) if text else {}
