"""CUDA activity records -> which layer launched each, -> SYSTEM_LIBRARY spans in a tracer.

The records are plain dicts (:data:`RECORD_FIELDS`), as :meth:`mlms_nb.profilers.cupti.CuptiActivity.records`
gives them after a live recording, or as recorded ones are replayed where there is no GPU; nothing here needs
CUPTI or a GPU:

- :func:`records_frame` -> a pandas DataFrame of them;
- :func:`attribute_records` assigns each kernel/memcpy/memset to a layer span: first by correlation id (the
  runtime/driver API call that launched it ran inside a layer's CPU span), else by time containment
  (:mod:`mlms_nb.tracing.attribution`);
- :func:`add_to_tracer` records them in a :class:`~mlms_nb.tracing.Tracer` as SYSTEM_LIBRARY spans of kind
  ``kernel`` / ``memcpy`` / ``memset`` / ``runtime``.
"""
from __future__ import annotations

from typing import Any, Iterable, Mapping, Sequence

import numpy as np
import pandas as pd

from mlms_nb.errors import MlmsError
from mlms_nb.schema.levels import TraceLevel
from mlms_nb.tracing.attribution import innermost_enclosing, launching_calls

GPU_KINDS = frozenset({"kernel", "memcpy", "memset"})
API_KINDS = frozenset({"runtime", "driver"})

RECORD_FIELDS: tuple[str, ...] = (
    "kind", "name", "start_ns", "end_ns", "correlation_id", "device", "device_id", "context_id", "stream",
    "thread", "bytes", "grid", "block", "registers_per_thread", "shared_memory", "copy_kind", "cbid",
)
"""Keys of one record. ``kind``: ``kernel | memcpy | memset | runtime | driver``; ``start_ns``/``end_ns``:
:func:`time.perf_counter_ns` clock; ``correlation_id``: ties an API call to the activity it launched (0: none);
``device``: ``"cuda:N"`` (``"cpu"`` for API calls); ``stream``: CUDA stream id (-1 for API calls); ``thread``: OS
thread id of an API call (0 for device activity); ``bytes``: memcpy/memset size (None otherwise);
``grid``/``block``: ``(x, y, z)`` of a kernel (None otherwise); ``shared_memory``: static + dynamic bytes of a
kernel; ``copy_kind``: ``"HtoD"``...; ``cbid``: the runtime/driver callback id of an API call."""

_API_RANK = {"runtime": 0, "driver": 1}  # a runtime call and the driver call beneath it share a correlation id


def records_frame(records: Iterable[Mapping] | Any) -> pd.DataFrame:
    """Records (dicts) -> a DataFrame with one column per :data:`RECORD_FIELDS` key (plus any extra keys),
    typed: times/ids int64, ``bytes`` float64 (NaN where none). A DataFrame is returned as it is."""
    if isinstance(records, pd.DataFrame):
        return records
    recs = list(records)
    df = pd.DataFrame.from_records(recs) if recs else pd.DataFrame(columns=list(RECORD_FIELDS))
    for col in RECORD_FIELDS:
        if col not in df.columns:
            df[col] = None
    n = len(df)
    for col, default in (("start_ns", 0), ("end_ns", 0), ("correlation_id", 0), ("device_id", -1),
                         ("context_id", -1), ("stream", -1), ("thread", 0)):
        df[col] = pd.to_numeric(df[col], errors="coerce").fillna(default).astype(np.int64) if n else \
            pd.Series([], dtype=np.int64)
    df["bytes"] = pd.to_numeric(df["bytes"], errors="coerce").astype(np.float64) if n else \
        pd.Series([], dtype=np.float64)
    df["device"] = df["device"].fillna("cpu").astype(object)
    df["kind"] = df["kind"].astype(object)
    df["name"] = df["name"].astype(object)
    return df


def _layer_columns(layers: pd.DataFrame):
    sid = layers["span_id"].to_numpy(np.int64)
    start = layers["start_ns"].to_numpy(np.int64)
    end = layers["end_ns"].to_numpy(np.int64)
    thread = layers["thread"].to_numpy(np.int64) if "thread" in layers.columns else np.zeros(len(sid), np.int64)
    names = layers["name"].astype(str).to_numpy(object) if "name" in layers.columns else \
        np.full(len(sid), "", object)
    return sid, start, end, thread, names


def attribute_records(records, layer_spans_frame: pd.DataFrame) -> pd.DataFrame:
    """Assign each record to the layer span that caused it.

    ``records``: dicts (:data:`RECORD_FIELDS`) or their :func:`records_frame`.
    ``layer_spans_frame``: the spans to attribute to -- typically a trace's FRAMEWORK-level ``layer`` spans
    (columns ``span_id, start_ns, end_ns`` and, when present, ``thread`` and ``name``), on the same clock.
    The innermost containing span wins, so pass only the spans that should receive kernels.

    - API calls (runtime/driver): the innermost layer span containing the call on the same OS thread (on any
      thread when the call's thread is not among the layers'); ``attribution = "cpu"``.
    - Kernels, memcpy, memset: the layer of the API call with the same ``correlation_id``
      (``"correlation"``; a runtime call before the driver call beneath it), else the innermost layer span
      containing the activity's own device interval (``"time"``: right when execution is synchronous, e.g.
      layers bracketed by synchronisation), else none.

    Returns the records frame with ``layer_span_id`` (0: none), ``layer_name`` ("" for none) and
    ``attribution`` (``cpu | correlation | time | none``) added; rows in the order given.
    """
    df = records_frame(records).copy()
    n = len(df)
    df["layer_span_id"] = np.zeros(n, np.int64)
    df["layer_name"] = np.full(n, "", object)
    df["attribution"] = np.full(n, "none", object)
    if n == 0:
        return df
    sid, l_start, l_end, l_thread, l_names = _layer_columns(layer_spans_frame)
    kind = df["kind"].to_numpy(object)
    start = df["start_ns"].to_numpy(np.int64)
    end = df["end_ns"].to_numpy(np.int64)
    thread = df["thread"].to_numpy(np.int64)
    corr = df["correlation_id"].to_numpy(np.int64)
    layer_idx = np.full(n, -1, np.int64)
    anywhere = np.zeros(len(sid), np.int64)  # one group: every layer, whatever its thread

    # 1. API calls: CPU containment, by thread where the thread is known to the layers
    is_api = np.isin(kind, list(API_KINDS))
    known = is_api & np.isin(thread, l_thread)
    rows = np.flatnonzero(known)
    if len(rows):
        layer_idx[rows] = innermost_enclosing(l_thread, l_start, l_end, thread[rows], start[rows], end[rows])
    rows = np.flatnonzero(is_api & ~known)
    if len(rows):
        layer_idx[rows] = innermost_enclosing(anywhere, l_start, l_end, np.zeros(len(rows), np.int64),
                                              start[rows], end[rows])
    method = np.full(n, "none", object)
    method[is_api & (layer_idx >= 0)] = "cpu"

    # 2. device activity: the layer of its launching call (calls in no layer or without an id launch nothing)
    is_gpu = np.isin(kind, list(GPU_KINDS))
    calls = np.flatnonzero(is_api & (layer_idx >= 0) & (corr != 0))
    gpu = np.flatnonzero(is_gpu & (corr != 0))
    if len(calls) and len(gpu):
        rank = np.array([_API_RANK[k] for k in kind[calls]], np.int64)
        launch = launching_calls(corr[calls], corr[gpu], rank)
        hit = launch >= 0
        layer_idx[gpu[hit]] = layer_idx[calls[launch[hit]]]
        method[gpu[hit]] = "correlation"

    # 3. the rest: time containment of the device interval (threads do not apply)
    rows = np.flatnonzero(is_gpu & (layer_idx < 0))
    if len(rows):
        got = innermost_enclosing(anywhere, l_start, l_end, np.zeros(len(rows), np.int64), start[rows], end[rows])
        layer_idx[rows] = got
        method[rows[got >= 0]] = "time"

    has = layer_idx >= 0
    out_sid = np.zeros(n, np.int64)
    out_sid[has] = sid[layer_idx[has]]
    names = np.full(n, "", object)
    names[has] = l_names[layer_idx[has]]
    df["layer_span_id"] = out_sid
    df["layer_name"] = names
    df["attribution"] = method
    return df


def _span_fields(cols: dict, i: int) -> dict:
    """The span fields of record ``i``: columns (device, stream, bytes, the correlation id) and attrs."""
    f: dict[str, Any] = {"device": cols["device"][i], "stream": int(cols["stream"][i]),
                         # the correlation id column; CUPTI's 0 means the record has none
                         "correlation": int(cols["correlation_id"][i]) or -1}
    b = cols["bytes"][i]
    if b == b and b is not None:  # not NaN
        f["bytes"] = float(b)
    for key in ("grid", "block", "registers_per_thread", "shared_memory", "copy_kind", "cbid"):
        v = cols[key][i] if key in cols else None
        if v is not None and v == v:
            f[key] = list(v) if isinstance(v, tuple) else (int(v) if isinstance(v, (float, np.integer)) else v)
    return f


def add_to_tracer(tracer, records, layer_span_ids: Sequence[int] | Any = None, *, link: str = "runtime",
                  metadata: Mapping[str, Any] | None = None) -> list[int]:
    """Record CUDA activity in ``tracer`` as SYSTEM_LIBRARY spans; returns the new span ids (0 for a record
    the tracer's level drops), in the order of ``records``.

    ``records``: dicts (:data:`RECORD_FIELDS`), or the frame :func:`attribute_records` returns (then its
    ``layer_span_id`` column is used when ``layer_span_ids`` is None).
    ``layer_span_ids``: one parent span id per record (0: none), or the :func:`attribute_records` frame;
    None: every record is a root unless ``records`` is that frame.
    ``link``: ``"runtime"`` (default) makes a kernel/memcpy/memset the child of the API call that launched it
    (same ``correlation_id``; a runtime call before the driver call beneath it) when that call is recorded
    too -- the layer is then its grandparent, as in a PyTorch Kineto trace; ``"layer"`` makes it the layer
    span's child directly.

    Spans: kind ``kernel | memcpy | memset | runtime`` (driver calls are ``runtime`` with ``attrs.api =
    "driver"``); ``device`` (``cuda:N`` / ``cpu``), ``stream``, ``bytes`` (memcpy/memset), ``thread`` (the OS
    thread of an API call; the stream of device activity, as Chrome/Kineto traces file it); ``correlation``
    (the id column; -1 for CUPTI's 0, no correlation); ``attrs``: ``grid``, ``block``,
    ``registers_per_thread``, ``shared_memory``, ``copy_kind``, ``cbid``, ``layer_span_id``. ``metadata``
    (e.g. :attr:`~mlms_nb.profilers.cupti.CuptiActivity.metadata`) is stored as ``tracer.metadata["cupti"]``.
    """
    if link not in ("runtime", "layer"):
        raise MlmsError(f"link must be 'runtime' or 'layer', not {link!r}")
    df = records_frame(records)
    n = len(df)
    if layer_span_ids is None:
        parents = df["layer_span_id"].to_numpy(np.int64) if "layer_span_id" in df.columns else np.zeros(n, np.int64)
    elif isinstance(layer_span_ids, pd.DataFrame):
        parents = layer_span_ids["layer_span_id"].to_numpy(np.int64)
    else:
        parents = np.asarray(list(layer_span_ids), dtype=np.int64)
    if len(parents) != n:
        raise MlmsError(f"layer_span_ids has {len(parents)} entries for {n} records")
    if metadata is not None:
        tracer.metadata["cupti"] = dict(metadata)
    level = TraceLevel.SYSTEM_LIBRARY
    ids = np.zeros(n, np.int64)
    if n == 0:
        return []
    cols = {c: df[c].tolist() for c in df.columns}
    kinds, names, starts, ends = cols["kind"], cols["name"], cols["start_ns"], cols["end_ns"]
    is_api = np.isin(df["kind"].to_numpy(object), list(API_KINDS))

    # API calls first: the activity they launched links to their spans
    for i in np.flatnonzero(is_api).tolist():
        f = _span_fields(cols, i)
        if kinds[i] == "driver":
            f["api"] = "driver"
        ids[i] = tracer.add_span(names[i], level, "runtime", starts[i], ends[i], parent_id=int(parents[i]),
                                 thread=int(cols["thread"][i]), **f)
    launch = np.full(n, -1, np.int64)
    if link == "runtime":
        corr = df["correlation_id"].to_numpy(np.int64)
        calls = np.flatnonzero(is_api & (ids != 0) & (corr != 0))
        if len(calls):
            rank = np.array([_API_RANK[kinds[i]] for i in calls.tolist()], np.int64)
            launch = np.where(corr != 0, launching_calls(corr[calls], corr, rank), -1)
            launch = np.where(launch >= 0, calls[np.maximum(launch, 0)], -1)
    for i in np.flatnonzero(~is_api).tolist():
        f = _span_fields(cols, i)
        parent = int(parents[i])
        if parent:
            f["layer_span_id"] = parent
        if launch[i] >= 0:
            parent = int(ids[launch[i]])
        ids[i] = tracer.add_span(names[i], level, kinds[i], starts[i], ends[i], parent_id=parent,
                                 thread=int(cols["stream"][i]), **f)
    return ids.tolist()
