"""The counters frame: its columns, dtypes and units, written down once, and the functions that build and check it.

Every recorder of counters (:mod:`mlms_nb.profilers`, the Chrome/Kineto importer, the tracer) emits into
:func:`counters_frame`, so the frame has one definition.

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

``ts_ns`` is on the spans' clock (see :mod:`mlms_nb.schema.spans`).
"""
from __future__ import annotations

from typing import Any, Iterable, Mapping

import numpy as np
import pandas as pd

from mlms_nb.schema.columns import Column, check_columns, frame_columns

COUNTERS: tuple[Column, ...] = (
    Column("ts_ns", "int64", "ns", None, "when the value was read, on the spans' clock"),
    Column("source", "category", "", None, "who measured it"),
    Column("metric", "category", "", None, "what was measured"),
    Column("value", "float64", "", None, "the reading, in `unit`"),
    Column("unit", "category", "", "", "unit of value"),
    Column("device", "category", "", "", "device the reading is about; '' if none"),
)

COUNTER_COLUMNS: tuple[str, ...] = tuple(c.name for c in COUNTERS)
COUNTER_UNITS: dict[str, str] = {c.name: c.unit for c in COUNTERS if c.unit}

CounterRow = tuple
"""One counter sample as recorders emit it: ``(ts_ns: int, source: str, metric: str, value: float, unit: str,
device: str)``, the columns of :data:`COUNTERS` in order."""


def empty_counters() -> pd.DataFrame:
    """A counters frame with no rows and every column typed."""
    return counters_frame({})


def counters_frame(columns: Mapping[str, Any] | Iterable[tuple] | pd.DataFrame) -> pd.DataFrame:
    """A counters frame from column arrays, from rows :data:`CounterRow` (what profilers record), or from a frame
    with those columns in any dtypes (object columns are made categorical); sorted by ``ts_ns``."""
    if isinstance(columns, pd.DataFrame):
        columns = {c: columns[c] for c in columns.columns}
    elif not isinstance(columns, Mapping):
        rows = list(columns)
        cols = list(zip(*rows)) if rows else [()] * len(COUNTERS)
        columns = {c.name: list(v) for c, v in zip(COUNTERS, cols)}
    data, n = frame_columns(COUNTERS, columns, ("ts_ns", "source", "metric", "value"), "counters")
    df = pd.DataFrame(data, copy=False)
    if n > 1:
        ts = df["ts_ns"].to_numpy()
        if not (np.diff(ts) >= 0).all():
            df = df.take(np.argsort(ts, kind="stable")).reset_index(drop=True)
    return df


def validate_counters(df: pd.DataFrame) -> pd.DataFrame:
    """Check ``df`` against the counters schema; returns it or raises :class:`TraceSchemaError`."""
    check_columns(df, COUNTERS, "counters")
    return df
