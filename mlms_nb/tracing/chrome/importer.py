"""Read a Chrome trace JSON file: detect its dialect, stream its events into columns, build the frames.

Our own export (``otherData.mlms_nb``, :class:`OwnColumns`) comes back without loss; a Kineto trace, an ONNX
Runtime profile or any other Chrome trace goes through :class:`~mlms_nb.tracing.chrome.columns.EventColumns`
(their dialects: :mod:`.kineto`, :mod:`.ort`, :mod:`.generic`). The file is streamed
(:class:`~mlms_nb.tracing._jsonscan.EventStream`) with the garbage collector off, each run of events typed by
msgspec and read in whole-run operations where it can be (:mod:`.rawfeed`), else by the per-event loop.
"""
from __future__ import annotations

import os
from typing import Any

import numpy as np
import orjson
import pandas as pd

from mlms_nb._gc import collector_off
from mlms_nb.errors import TraceFormatError
from mlms_nb.schema.counters import counters_frame
from mlms_nb.schema.spans import NO_ID, spans_frame
from mlms_nb.tracing._jsonscan import EventStream
from mlms_nb.tracing.chrome import generic, kineto, ort, rawfeed
from mlms_nb.tracing.chrome._common import FORMAT, MAX_ORIGIN_NS, dense, id_rows, us_to_ns
from mlms_nb.tracing.chrome.columns import EventColumns


BLOCK_BYTES = 8 << 20
"""How much of the file the importer reads at a time (one run of events is parsed per block)."""


class OwnColumns:
    """Columns of a file :func:`~mlms_nb.tracing.chrome.write_chrome` wrote (``otherData.mlms_nb``): every
    column comes back as it was."""

    def __init__(self, path: str, info: dict):
        self.path = path
        origin = info.get("origin_ns", 0)
        devices = info.get("devices") or {}
        if type(origin) is not int or not 0 <= origin <= MAX_ORIGIN_NS or not isinstance(devices, dict):
            field = "devices is not an object" if not isinstance(devices, dict) else (
                f"origin_ns is {origin!r}, not a time in ns")
            raise TraceFormatError(f"trace file {path!r} is not a valid mlms-nb Chrome trace: otherData.mlms_nb."
                                   f"{field}")
        self.origin = origin
        self.trace_id = str(info.get("trace_id", ""))
        self.devices = {str(k): v for k, v in devices.items()}
        self.rows: dict[str, list] = {k: [] for k in (
            "trace_id", "span_id", "parent_id", "name", "level", "kind", "ts", "dur", "thread", "device",
            "stream", "layer_index", "layer_type", "shape", "flops", "bytes", "memory", "attrs")}
        self.counters: dict[str, list] = {k: [] for k in ("ts", "source", "metric", "value", "unit", "device")}
        self.id_rows = id_rows()
        self.n_events = 0

    def feed(self, events: list) -> None:
        r = self.rows
        a = {k: v.append for k, v in r.items()}
        c = {k: v.append for k, v in self.counters.items()}
        devices = self.devices
        dumps = orjson.dumps
        k = -1
        nan = float("nan")
        row = len(r["span_id"])
        id_sinks = tuple((col, rows.append, vals.append) for col, (rows, vals) in self.id_rows.items())
        try:
            for k, ev in enumerate(events):
                ph = ev.get("ph")
                if ph == "X":
                    args = ev["args"]
                    tid = ev.get("tid", 0)
                    a["trace_id"](args.get("trace_id", self.trace_id))
                    a["span_id"](args["span_id"])
                    a["parent_id"](args.get("parent_id", 0))
                    a["name"](ev["name"])
                    a["level"](args["level"])
                    a["kind"](ev.get("cat", "other"))
                    a["ts"](ev["ts"])
                    a["dur"](ev.get("dur", 0))
                    a["thread"](args.get("thread", tid))
                    a["device"](devices.get(str(ev.get("pid")), "cpu"))
                    a["stream"](args.get("stream", -1))
                    a["layer_index"](args.get("layer_index", -1))
                    a["layer_type"](args.get("layer_type", ""))
                    a["shape"](args.get("shape", ""))
                    a["flops"](args.get("flops", nan))
                    a["bytes"](args.get("bytes", nan))
                    a["memory"](args.get("memory", nan))
                    at = args.get("attrs")
                    a["attrs"](at if isinstance(at, str) else (dumps(at).decode() if at else "{}"))
                    for col, rows_add, vals_add in id_sinks:
                        v = args.get(col)
                        if v is not None:
                            rows_add(row)
                            vals_add(v)
                    row += 1
                elif ph == "C":
                    (unit, value), = ev["args"].items()
                    c["ts"](ev["ts"])
                    c["source"](ev.get("cat", ""))
                    c["metric"](ev.get("name", ""))
                    c["value"](value)
                    c["unit"]("" if unit == "value" else unit)
                    c["device"](devices.get(str(ev.get("pid")), ""))
        except (KeyError, TypeError, AttributeError, ValueError, OverflowError) as exc:
            raise TraceFormatError(f"trace file {self.path!r} is not a valid mlms-nb Chrome trace: event "
                                   f"#{self.n_events + k} is malformed ({type(exc).__name__}: {exc})") from None
        self.n_events += len(events)

    def build(self):
        r = self.rows
        try:
            start = us_to_ns(np.array(r["ts"], np.float64)) + self.origin
            dur = us_to_ns(np.array(r["dur"], np.float64))
            cols = {
                "trace_id": r["trace_id"], "span_id": np.array(r["span_id"], np.int64),
                "parent_id": np.array(r["parent_id"], np.int64), "name": r["name"], "level": r["level"],
                "kind": r["kind"], "start_ns": start, "end_ns": start + dur, "duration_ns": dur,
                "thread": np.array(r["thread"], np.int64), "device": r["device"],
                "stream": np.array(r["stream"], np.int64), "layer_index": np.array(r["layer_index"], np.int64),
                "layer_type": r["layer_type"], "shape": r["shape"],
                "flops": np.array(r["flops"], np.float64), "bytes": np.array(r["bytes"], np.float64),
                "memory": np.array(r["memory"], np.float64), "attrs": r["attrs"],
            }
            n = len(r["span_id"])
            cols.update({col: dense(n, rows, vals, NO_ID, np.int64) for col, (rows, vals) in self.id_rows.items()
                         if rows})
            spans = spans_frame(cols)
            c = self.counters
            counters = counters_frame({"ts_ns": us_to_ns(np.array(c["ts"], np.float64)) + self.origin,
                                       "source": c["source"], "metric": c["metric"],
                                       "value": np.array(c["value"], np.float64), "unit": c["unit"],
                                       "device": c["device"]})
        except (TypeError, ValueError, OverflowError) as exc:
            raise TraceFormatError(f"trace file {self.path!r} is not a valid mlms-nb Chrome trace: {exc}") from None
        return spans, counters


def read_chrome(path) -> "tuple[pd.DataFrame, pd.DataFrame, dict]":
    """Import a Chrome trace JSON file (``.json`` or gzip) -> (spans, counters, metadata). See the module doc."""
    path_s = os.fspath(path)
    stream = EventStream(path_s, block_bytes=BLOCK_BYTES, parse=rawfeed.decode)
    with collector_off():  # columns of tens of thousands of values, none of them garbage
        cols = None
        own = None
        for events in stream:
            if cols is None:
                info = (stream.header.get("otherData") or {}).get("mlms_nb") if isinstance(
                    stream.header.get("otherData"), dict) else None
                if isinstance(info, dict) and info.get("format") == FORMAT:
                    own = cols = OwnColumns(path_s, info)
                else:
                    cols = EventColumns(path_s)
            if isinstance(events, rawfeed.Run):
                if own is not None or not rawfeed.feed_raw(cols, events):
                    cols.feed(_dicts(events, path_s))
            else:
                cols.feed(events)
            del events
        skeleton = stream.skeleton
        if cols is None:
            cols = EventColumns(path_s)
        if own is None and isinstance(skeleton, dict):
            info = (skeleton.get("otherData") or {}).get("mlms_nb") if isinstance(skeleton.get("otherData"),
                                                                                   dict) else None
            if isinstance(info, dict) and info.get("format") == FORMAT:
                own = OwnColumns(path_s, info)  # otherData came after the events: read again in our dialect
                cols = None
                for events in EventStream(path_s):
                    own.feed(events)
        if own is not None:
            spans, counters = own.build()
            other = dict(skeleton.get("otherData") or {})
            info = other.pop("mlms_nb", {})
            meta = other
            meta.setdefault("trace_id", info.get("trace_id"))
            return spans, counters, meta
        if isinstance(skeleton, list):
            dialect = "onnxruntime" if ort.is_ort(cols.cats) else "chrome"
        elif isinstance(skeleton, dict):
            dialect = "kineto" if kineto.is_kineto(skeleton, cols.cats) else "chrome"
        else:
            raise TraceFormatError(f"trace file {path_s!r} is not a valid trace: its top level is neither a JSON "
                                   f"object nor an array")
        try:
            trace_id, spans, counters = cols.build(skeleton)
        except (TypeError, ValueError, OverflowError) as exc:  # a field's value, found when columns are built
            raise TraceFormatError(f"trace file {path_s!r} is not a valid trace: {exc}") from None
        meta = _import_metadata(path_s, dialect, skeleton, cols, trace_id)
        return spans, counters, meta


def _dicts(run: "rawfeed.Run", path: str) -> list:
    """A run msgspec read, parsed again into dicts: orjson is stricter about what it skips (bytes in strings)."""
    try:
        return run.dicts()
    except orjson.JSONDecodeError as exc:
        raise TraceFormatError(f"trace file {path!r} is not a valid trace: malformed JSON in the event array "
                               f"({exc.msg})") from None


def _import_metadata(path: str, dialect: str, skeleton, cols: EventColumns, trace_id: str) -> dict:
    meta: dict[str, Any] = {"trace_id": trace_id, "source": dialect, "path": os.path.abspath(path)}
    if dialect == "kineto":
        meta.update(kineto.metadata(skeleton))
    elif dialect == "onnxruntime":
        meta["clock"] = dict(ort.CLOCK)
    else:
        meta.update(generic.metadata(skeleton))
    if cols.process_names:
        meta["process_names"] = cols.process_names
    if cols.thread_names:
        meta["thread_names"] = cols.thread_names
    if cols.str_ids:
        meta["string_ids"] = {str(v): k for k, v in cols.str_ids.items()}
    return meta
