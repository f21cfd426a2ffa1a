"""Chrome trace JSON (Perfetto / chrome://tracing) export and import.

Export (:func:`write_chrome`): a JSON object ``{"otherData": {...}, "displayTimeUnit": "ns", "traceEvents":
[...]}``. Every span is an ``"X"`` (complete) event: ``cat`` = kind, ``ts``/``dur`` in µs as floats with up to 3
decimals (ns precision; ``ts`` relative to ``otherData.mlms_nb.origin_ns``), ``pid`` = one per device
(``"M"`` process_name events name them), ``tid`` = the thread (the stream for device spans), ``args`` = the
span's other columns (defaults left out; id columns under their column names) with ``attrs`` inlined as an
object. Counters are ``"C"`` events
(``cat`` = source, ``name`` = metric, ``args`` = ``{unit: value}``). ``otherData`` holds the trace's metadata
plus ``otherData.mlms_nb`` (format, version, origin_ns, trace_id, pid -> device), so our own export imports
back without loss.

Import (:func:`read_chrome`), three dialects, detected from the file:

* our own export (``otherData.mlms_nb``): lossless;
* PyTorch Kineto (``torch.profiler`` ``export_chrome_trace``): ``cpu_op`` -> ML_LIBRARY / ``op`` (``flops`` -> ``flops``, ``Input Dims``
  -> ``shape``), ``user_annotation`` -> FRAMEWORK / ``annotation``, ``python_function`` -> FRAMEWORK /
  ``python``, ``cuda_runtime`` / ``cuda_driver`` -> SYSTEM_LIBRARY / ``runtime``, ``kernel`` / ``gpu_memcpy`` /
  ``gpu_memset`` -> SYSTEM_LIBRARY / ``kernel`` / ``memcpy`` / ``memset`` (device ``cuda:N``, ``stream``),
  ``gpu_user_annotation`` -> SYSTEM_LIBRARY / ``annotation``, ``Trace`` (the profiling window) ->
  APPLICATION; ``[memory]`` instant events -> counters ``memory.allocated`` / ``memory.reserved`` (bytes) and
  each span's ``memory`` (net bytes allocated on its thread while it ran); times relative to
  ``baseTimeNanoseconds`` (``metadata["clock"]["wall_offset_ns"]``); integer ids (``External id``,
  ``correlation``, ``Ev Idx``... see :data:`~mlms_nb.schema.trace.ID_COLUMNS`) -> id columns, the other args
  -> ``attrs``;
* ONNX Runtime profile (a top-level array; ``cat`` ``"Session"`` -> MODEL / ``model``, ``"Node"`` -> FRAMEWORK
  / ``layer`` with ``op_name`` -> ``layer_type``, ``node_index`` -> ``layer_index``, ``input_type_shape`` ->
  ``shape``, ``activation_size + parameter_size + output_size`` -> ``bytes``, ``mem_in_use_delta`` (else
  ``output_size``) -> ``memory``, provider -> ``device``; the ``_kernel_time`` suffix is dropped from names);
* any other Chrome trace: known categories as above, other ``X`` events -> FRAMEWORK / ``other`` with the
  category in ``attrs["cat"]``, ``B``/``E`` pairs matched per thread, ``C`` events -> counters.

Parents of imported spans come from time containment on each (pid, tid) -- a vectorised sort + pointer
jump, see :func:`mlms_nb.tracing._build.containment_parents`; a GPU activity with no enclosing span on its
stream gets the runtime call with the same ``correlation`` as parent.

The importer streams the file (:class:`~mlms_nb.tracing._jsonscan.EventStream`), parses runs of events
with orjson with the garbage collector off, and builds columns (lists of codes and numbers per chunk ->
numpy / Arrow), never a dict or a pandas op per event.
"""
from __future__ import annotations

import gc
import os
import uuid
from array import array
from typing import Any

import numpy as np
import orjson
import pandas as pd

from mlms_nb.tracing._build import containment_parents
from mlms_nb.tracing._jsonscan import EventStream
from mlms_nb.errors import TraceFormatError
from mlms_nb.schema.levels import TraceLevel
from mlms_nb.schema.trace import (ID_COLUMNS, NO_ID, canonical_categorical, counters_frame, level_categorical, spans_frame)

FORMAT = "mlms-nb/chrome-trace"
FORMAT_VERSION = 1

# ------------------------------------------------------------------------------------------------ categories

_M_PLAIN, _M_CPUOP, _M_RUNTIME, _M_GPU, _M_ORTNODE, _M_OTHER = range(6)
_NAN = float("nan")
_INT64_MAX = 2**63 - 1
_MEM_KEYS = ("ts", "bytes", "alloc", "reserved", "devtype", "devid", "pid", "tid")
_L = TraceLevel
CATEGORIES: dict[str, tuple[TraceLevel, str, int]] = {
    "cpu_op": (_L.ML_LIBRARY, "op", _M_CPUOP),
    "operator": (_L.ML_LIBRARY, "op", _M_CPUOP),  # older Kineto
    "user_annotation": (_L.FRAMEWORK, "annotation", _M_PLAIN),
    "python_function": (_L.FRAMEWORK, "python", _M_PLAIN),
    "cuda_runtime": (_L.SYSTEM_LIBRARY, "runtime", _M_RUNTIME),
    "cuda_driver": (_L.SYSTEM_LIBRARY, "runtime", _M_RUNTIME),
    "runtime": (_L.SYSTEM_LIBRARY, "runtime", _M_RUNTIME),
    "kernel": (_L.SYSTEM_LIBRARY, "kernel", _M_GPU),
    "gpu_memcpy": (_L.SYSTEM_LIBRARY, "memcpy", _M_GPU),
    "gpu_memset": (_L.SYSTEM_LIBRARY, "memset", _M_GPU),
    "gpu_user_annotation": (_L.SYSTEM_LIBRARY, "annotation", _M_GPU),
    "Trace": (_L.APPLICATION, "application", _M_PLAIN),
    "Session": (_L.MODEL, "model", _M_PLAIN),
    "Node": (_L.FRAMEWORK, "layer", _M_ORTNODE),
}
"""Chrome/Kineto/ONNX Runtime event category -> (level, kind, how its args are read)."""


def _category(cat) -> tuple[TraceLevel, str, int]:
    spec = CATEGORIES.get(cat)
    if spec is not None:
        return spec
    if isinstance(cat, str) and (cat.endswith("_runtime") or cat.endswith("_driver")):
        return (_L.SYSTEM_LIBRARY, "runtime", _M_RUNTIME)
    return (_L.FRAMEWORK, "other", _M_OTHER)


def _ns(us: np.ndarray) -> np.ndarray:
    """µs floats (as parsed from JSON, 3 decimals) -> int64 ns, exact while |us| < 2**43 (~100 days)."""
    us = np.asarray(us, dtype=np.float64)
    whole = np.floor(us)
    return whole.astype(np.int64) * 1000 + np.rint((us - whole) * 1000.0).astype(np.int64)


def _int_ids(values: list, table: dict) -> np.ndarray:
    """pid / tid values (ints, or strings such as Kineto's "Spans") -> int64; strings get ids -1, -2, ..."""
    try:
        return np.array(values, dtype=np.int64)
    except (TypeError, ValueError, OverflowError):
        out = np.empty(len(values), np.int64)
        for i, v in enumerate(values):
            if isinstance(v, (int, np.integer)) and not isinstance(v, bool):
                out[i] = v
                continue
            try:
                out[i] = int(v)
            except (TypeError, ValueError, OverflowError):
                key = str(v)
                code = table.get(key)
                if code is None:
                    code = table[key] = -(len(table) + 1)
                out[i] = code
        return out


def _id_rows() -> dict:
    """Per id column, the (rows, ids) of the spans that have one, as compact int64 arrays."""
    return {col: (array("q"), array("q")) for col in ID_COLUMNS}


def _dense(n: int, rows, vals, default, dtype) -> np.ndarray:
    """A column of ``n`` values: ``default`` except ``vals`` at ``rows`` (sparse -> dense)."""
    out = np.full(n, default, dtype=dtype)
    if len(rows):
        out[np.asarray(rows, np.int64)] = np.asarray(vals, dtype=dtype)
    return out


def _to_int(v, default=-1) -> int:
    try:
        return int(v)
    except (TypeError, ValueError):
        return default


def _device_of_provider(provider) -> str:
    if not provider:
        return "cpu"
    p = str(provider)
    if p.endswith("ExecutionProvider"):
        p = p[: -len("ExecutionProvider")]
    p = p.lower()
    return "cpu" if p in ("cpu", "") else p


# ------------------------------------------------------------------------------------------------ importer

class _Columns:
    """Columns of the Kineto / ONNX Runtime / generic dialects, filled one chunk of events at a time.

    Per chunk: one pass over the parsed events appending to lists of numbers and interned codes (names,
    shapes, and ``attrs`` text once the per-span ids are out of it). Columns only some events have (shape,
    stream, layer type, the id columns...) are kept sparse as (row, value) lists.
    """

    def __init__(self, path: str):
        self.path = path
        self.n = 0
        self.n_events = 0
        self.cats: dict = {}
        self.cat_specs: list = []
        self.cat_modes: list[int] = []
        self.names: dict = {}
        self.shapes: dict = {"": 0}
        self.layer_types: dict = {"": 0}
        self.devices: dict = {"cpu": 0}
        self.str_ids: dict = {}
        self.p_ts: list[np.ndarray] = []
        self.p_dur: list[np.ndarray] = []
        self.p_cat: list[np.ndarray] = []
        self.p_name: list[np.ndarray] = []
        self.p_shape: list[np.ndarray] = []
        self.p_pid: list[np.ndarray] = []
        self.p_tid: list[np.ndarray] = []
        self.p_attrs: list[np.ndarray] = []
        self.attrs_table: dict = {b"{}": 0}
        self.id_rows = _id_rows()
        # sparse (row, value) columns
        self.shape_rows, self.shape_codes = [], []
        self.dev_rows, self.dev_codes = [], []
        self.stream_rows, self.stream_vals = [], []
        self.corr_rows, self.corr_vals = [], []
        self.lt_rows, self.lt_codes = [], []
        self.li_rows, self.li_vals = [], []
        self.bytes_rows, self.bytes_vals = [], []
        self.mem_rows, self.mem_vals = [], []
        self.flops_rows, self.flops_vals = [], []
        # Kineto [memory] instant events
        self.mem_parts: dict[str, list[np.ndarray]] = {k: [] for k in _MEM_KEYS}
        # generic counters ("C" events), B/E pairs, metadata
        self.counter_rows: list[tuple] = []
        self.open_be: dict = {}
        self.be_spans: list[dict] = []
        self.process_names: dict = {}
        self.thread_names: dict = {}

    def _cat_code(self, cat) -> int:
        code = self.cats[cat] = len(self.cats)
        spec = _category(cat)
        self.cat_specs.append(spec)
        self.cat_modes.append(spec[2])
        return code

    def feed(self, events: list) -> None:
        ts_l, dur_l, cat_l, name_l, pid_l, tid_l, attrs_l, shape_l = [], [], [], [], [], [], [], []
        ts_a, dur_a, cat_a, name_a, shape_a = ts_l.append, dur_l.append, cat_l.append, name_l.append, shape_l.append
        pid_a, tid_a, attrs_a = pid_l.append, tid_l.append, attrs_l.append
        cats, names, shapes = self.cats, self.names, self.shapes
        cat_get, name_get, shape_get = cats.get, names.get, shapes.get
        modes = self.cat_modes
        dumps = orjson.dumps
        row = self.n
        corr_rows_a, corr_vals_a = self.corr_rows.append, self.corr_vals.append
        flops_rows_a, flops_vals_a = self.flops_rows.append, self.flops_vals.append
        attrs_table = self.attrs_table
        attrs_get = attrs_table.get
        id_sinks = tuple((key, self.id_rows[col][0].append, self.id_rows[col][1].append)
                         for col, key in ID_COLUMNS.items())
        mem = {k: [] for k in _MEM_KEYS}
        mts_a, mbytes_a, malloc_a, mres_a, mdt_a, mdi_a, mpid_a, mtid_a = (mem[k].append for k in _MEM_KEYS)
        ev = None
        try:
            for ev in events:
                try:
                    ph = ev["ph"]
                    if ph == "X":
                        # the common shape first: every key present (a missing one drops to _complete_slow)
                        cat = ev["cat"]
                        name = ev["name"]
                        ts = ev["ts"]
                        dur = ev["dur"]
                        pid = ev["pid"]
                        tid = ev["tid"]
                        args = ev["args"]
                    elif ph == "i" or ph == "I":
                        if ev["name"] == "[memory]":
                            a = ev["args"]
                            mts_a(ev["ts"])
                            mbytes_a(a["Bytes"])
                            malloc_a(a["Total Allocated"])
                            mres_a(a["Total Reserved"])
                            mdt_a(a["Device Type"])
                            mdi_a(a["Device Id"])
                            mpid_a(ev["pid"])
                            mtid_a(ev["tid"])
                        continue
                    else:
                        self._other(ph, ev)
                        continue
                except KeyError:
                    ph = ev.get("ph")
                    if ph == "i" or ph == "I":
                        self._memory_slow(ev, mem)
                        continue
                    if ph != "X":
                        raise
                    cat, name, ts, dur, pid, tid, args = self._complete_slow(ev)
                cc = cat_get(cat)
                if cc is None:
                    cc = self._cat_code(cat)
                mode = modes[cc]
                sc = 0
                if mode == _M_CPUOP:
                    if args:
                        dims = args.pop("Input Dims", None)
                        if dims is not None:
                            key = dumps(dims)
                            sc = shape_get(key)
                            if sc is None:
                                sc = shapes[key] = len(shapes)
                        fl = args.pop("flops", None)  # torch.profiler(with_flops=True)
                        if fl is not None:
                            flops_rows_a(row)
                            flops_vals_a(fl)
                elif mode == _M_PLAIN:
                    pass
                elif mode == _M_RUNTIME:
                    if args:
                        corr = args.get("correlation")
                        if corr is not None:
                            corr_rows_a(row)
                            corr_vals_a(corr)
                elif mode == _M_GPU:
                    self._gpu(row, ev, args or {})
                elif mode == _M_ORTNODE:
                    name = self._ort_node(row, name, args)
                else:
                    args = dict(args) if args else {}
                    args["cat"] = cat
                nc = name_get(name)
                if nc is None:
                    nc = names[name] = len(names)
                ts_a(ts)
                dur_a(dur)
                pid_a(pid)
                tid_a(tid)
                cat_a(cc)
                name_a(nc)
                shape_a(sc)
                if args:
                    for key, rows_add, vals_add in id_sinks:
                        v = args.get(key)
                        if v is not None and type(v) is int and 0 <= v <= _INT64_MAX:
                            del args[key]
                            rows_add(row)
                            vals_add(v)
                    text = dumps(args) if args else b"{}"
                    code = attrs_get(text)
                    if code is None:
                        code = attrs_table[text] = len(attrs_table)
                    attrs_a(code)
                else:
                    attrs_a(0)
                row += 1
        except (KeyError, TypeError, AttributeError, ValueError, OverflowError) as exc:
            k = next((i for i, e in enumerate(events) if e is ev), 0)
            what = "is not a JSON object" if not isinstance(ev, dict) else (
                f"lacks {exc.args[0]!r}" if isinstance(exc, KeyError) else f"has a malformed field ({exc})")
            raise TraceFormatError(f"trace file {self.path!r} is not a valid trace: event #{self.n_events + k} "
                                   f"{what}") from None
        self.n_events += len(events)
        if mem["ts"]:
            self._add_memory(mem)
        if row == self.n:
            return
        try:
            self.p_ts.append(np.array(ts_l, dtype=np.float64))
            self.p_dur.append(np.array(dur_l, dtype=np.float64))
        except (TypeError, ValueError):
            raise TraceFormatError(f"trace file {self.path!r} is not a valid trace: an event's \"ts\" or \"dur\" "
                                   f"is not a number") from None
        self.p_cat.append(np.array(cat_l, dtype=np.int32))
        self.p_name.append(np.array(name_l, dtype=np.int32))
        self.p_shape.append(np.array(shape_l, dtype=np.int32))
        self.p_pid.append(_int_ids(pid_l, self.str_ids))
        self.p_tid.append(_int_ids(tid_l, self.str_ids))
        self.p_attrs.append(np.array(attrs_l, dtype=np.int32))
        self.n = row

    @staticmethod
    def _memory_slow(ev: dict, mem: dict) -> None:
        """A ``[memory]`` instant event missing some field (defaults fill in); other instant events are
        ignored."""
        if ev.get("name") != "[memory]":
            return
        a = ev.get("args") or {}
        for key, value in (("ts", ev["ts"]), ("bytes", a.get("Bytes", 0)), ("alloc", a.get("Total Allocated", _NAN)),
                           ("reserved", a.get("Total Reserved", _NAN)), ("devtype", a.get("Device Type", 0)),
                           ("devid", a.get("Device Id", -1)), ("pid", ev.get("pid", 0)), ("tid", ev.get("tid", 0))):
            mem[key].append(value)

    def _add_memory(self, mem: dict) -> None:
        parts = self.mem_parts
        try:
            for key in ("ts", "bytes", "alloc", "reserved"):
                parts[key].append(np.array(mem[key], dtype=np.float64))
            for key in ("devtype", "devid"):
                parts[key].append(np.array(mem[key], dtype=np.int64))
        except (TypeError, ValueError):
            raise TraceFormatError(f"trace file {self.path!r} is not a valid trace: a [memory] event has a "
                                   f"non-numeric field") from None
        parts["pid"].append(_int_ids(mem["pid"], self.str_ids))
        parts["tid"].append(_int_ids(mem["tid"], self.str_ids))

    @staticmethod
    def _complete_slow(ev: dict):
        """An "X" event without some optional key (cat, dur, pid, tid, args); "ts" is required."""
        return (ev.get("cat"), ev.get("name", ""), ev["ts"], ev.get("dur", 0), ev.get("pid", 0),
                ev.get("tid", 0), ev.get("args"))

    def _other(self, ph, ev: dict) -> None:
        if ph == "M":
            self._meta(ev)
        elif ph == "C":
            self._counter(ev)
        elif ph == "B" or ph == "E":
            self._begin_end(ph, ev)

    def _gpu(self, row: int, ev: dict, args: dict) -> None:
        dev = args.get("device", ev.get("pid", 0))
        dname = f"cuda:{dev}"
        code = self.devices.get(dname)
        if code is None:
            code = self.devices[dname] = len(self.devices)
        self.dev_rows.append(row)
        self.dev_codes.append(code)
        self.stream_rows.append(row)
        self.stream_vals.append(_to_int(args.get("stream", ev.get("tid", -1))))
        corr = args.get("correlation")
        if corr is not None:
            self.corr_rows.append(row)
            self.corr_vals.append(corr)

    def _ort_node(self, row: int, name: str, args) -> str:
        if isinstance(name, str) and name.endswith("_kernel_time"):
            name = name[: -len("_kernel_time")]
        if not args:
            return name
        op = args.pop("op_name", None)
        if op is not None:
            code = self.layer_types.get(op)
            if code is None:
                code = self.layer_types[op] = len(self.layer_types)
            self.lt_rows.append(row)
            self.lt_codes.append(code)
        idx = args.pop("node_index", None)
        if idx is not None:
            self.li_rows.append(row)
            self.li_vals.append(_to_int(idx))
        shape = args.pop("input_type_shape", None)
        if shape is not None:
            key = orjson.dumps(shape)
            sc = self.shapes.get(key)
            if sc is None:
                sc = self.shapes[key] = len(self.shapes)
            self.shape_rows.append(row)
            self.shape_codes.append(sc)
        sizes = [args.get(k) for k in ("activation_size", "parameter_size", "output_size")]
        if any(s is not None for s in sizes):
            self.bytes_rows.append(row)
            self.bytes_vals.append(float(sum(_to_int(s, 0) for s in sizes)))
        mem = args.get("mem_in_use_delta", args.get("output_size"))
        if mem is not None:
            self.mem_rows.append(row)
            self.mem_vals.append(float(_to_int(mem, 0)))
        dev = _device_of_provider(args.get("provider"))
        if dev != "cpu":
            code = self.devices.get(dev)
            if code is None:
                code = self.devices[dev] = len(self.devices)
            self.dev_rows.append(row)
            self.dev_codes.append(code)
        return name

    def _meta(self, ev: dict) -> None:
        name = ev.get("name")
        a = ev.get("args") or {}
        if name == "process_name":
            self.process_names[str(ev.get("pid"))] = a.get("name")
        elif name == "thread_name":
            self.thread_names[f"{ev.get('pid')}/{ev.get('tid')}"] = a.get("name")

    def _counter(self, ev: dict) -> None:
        name = str(ev.get("name", ""))
        args = ev.get("args") or {}
        src = str(ev.get("cat") or "chrome")
        for key, value in args.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                metric = name if len(args) == 1 else f"{name}.{key}"
                self.counter_rows.append((ev["ts"], src, metric, float(value), "", ""))

    def _begin_end(self, ph: str, ev: dict) -> None:
        key = (ev.get("pid", 0), ev.get("tid", 0))
        if ph == "B":
            self.open_be.setdefault(key, []).append(ev)
            return
        stack = self.open_be.get(key)
        if not stack:
            return
        b = stack.pop()
        args = dict(b.get("args") or {})
        args.update(ev.get("args") or {})
        self.be_spans.append({"ph": "X", "name": b.get("name", ""), "cat": b.get("cat"), "ts": b["ts"],
                              "dur": ev["ts"] - b["ts"], "pid": key[0], "tid": key[1], "args": args})

    # -------------------------------------------------------------------------------------------- build

    def build(self, skeleton, dialect: str):
        if self.be_spans:
            spans, self.be_spans = self.be_spans, []
            self.feed(spans)
        n = self.n

        def cat(parts, dtype):
            out = np.concatenate(parts) if parts else np.zeros(0, dtype)
            parts.clear()
            return out

        start = _ns(cat(self.p_ts, np.float64))
        duration = np.maximum(_ns(cat(self.p_dur, np.float64)), 0)
        end = start + duration
        cat_codes = cat(self.p_cat, np.int32)
        name_codes = cat(self.p_name, np.int32)
        pid = cat(self.p_pid, np.int64)
        tid = cat(self.p_tid, np.int64)
        mem = {k: (np.concatenate(v) if v else np.zeros(0)) for k, v in self.mem_parts.items()}
        self.mem_parts = {k: [] for k in _MEM_KEYS}

        spec_level = np.array([int(s[0]) for s in self.cat_specs] or [0], np.int8)
        kind_names = sorted({s[1] for s in self.cat_specs} or {"other"})
        spec_kind = np.array([kind_names.index(s[1]) for s in self.cat_specs] or [0], np.int64)
        spec_mode = np.array([s[2] for s in self.cat_specs] or [0], np.int64)

        def sparse(rows, vals, default, dtype):
            return _dense(n, rows, vals, default, dtype)

        device = sparse(self.dev_rows, self.dev_codes, 0, np.int64)
        stream = sparse(self.stream_rows, self.stream_vals, -1, np.int64)
        shape = cat(self.p_shape, np.int32).astype(np.int64)
        if self.shape_rows:
            shape[np.asarray(self.shape_rows, np.int64)] = np.asarray(self.shape_codes, np.int64)
        layer_type = sparse(self.lt_rows, self.lt_codes, 0, np.int64)
        layer_index = sparse(self.li_rows, self.li_vals, -1, np.int64)
        nbytes = sparse(self.bytes_rows, self.bytes_vals, np.nan, np.float64)
        memory = sparse(self.mem_rows, self.mem_vals, np.nan, np.float64)
        flops = sparse(self.flops_rows, self.flops_vals, np.nan, np.float64)

        # parents: containment per (pid, tid), then GPU activities -> their runtime call by correlation
        tid_codes, tid_uniques = pd.factorize(tid)
        group = pd.factorize(pid)[0].astype(np.int64) * max(len(tid_uniques), 1) + tid_codes
        del tid_codes
        parent_idx = containment_parents(group, start, end)
        del group
        if self.corr_rows:
            parent_idx = self._link_correlations(parent_idx, cat_codes, spec_mode)
        if len(mem["ts"]):
            memory = self._span_memory(mem, memory, pid, tid, start, end, cat_codes, spec_mode)

        # canonical row order (start_ns, span_id); span ids are file order
        span_id = np.arange(1, n + 1, dtype=np.int64)
        parent_id = np.where(parent_idx >= 0, parent_idx + 1, 0)
        del parent_idx
        attrs = cat(self.p_attrs, np.int32)
        ids = {col: sparse(rows, vals, NO_ID, np.int64) for col, (rows, vals) in self.id_rows.items() if rows}
        self.id_rows = _id_rows()
        order = None
        if n > 1:
            d = np.diff(start)
            if not (d >= 0).all():
                order = np.argsort(start, kind="stable")
            del d
        if order is not None:
            span_id, parent_id, start, end, duration = (a[order] for a in (span_id, parent_id, start, end,
                                                                            duration))
            cat_codes, name_codes, tid, device, stream, shape, layer_type, layer_index, nbytes, memory, flops = (
                a[order] for a in (cat_codes, name_codes, tid, device, stream, shape, layer_type, layer_index,
                                   nbytes, memory, flops))
            attrs = attrs[order]
            ids = {col: a[order] for col, a in ids.items()}
            del order

        trace_id = str((skeleton or {}).get("trace_id") or uuid.uuid4().hex) if isinstance(skeleton, dict) else (
            uuid.uuid4().hex)
        cols = {
            "trace_id": canonical_categorical(np.zeros(n, np.int64), [trace_id]),
            "span_id": span_id,
            "parent_id": parent_id,
            "name": canonical_categorical(name_codes, [str(k) for k in self.names]),
            "level": level_categorical(spec_level[cat_codes]),
            "kind": canonical_categorical(spec_kind[cat_codes], kind_names),
            "start_ns": start,
            "end_ns": end,
            "duration_ns": duration,
            "thread": tid,
            "device": canonical_categorical(device, list(self.devices)),
            "stream": stream,
            "layer_index": layer_index,
            "layer_type": canonical_categorical(layer_type, [str(k) for k in self.layer_types]),
            "shape": canonical_categorical(shape, [k.decode() if isinstance(k, bytes) else k for k in self.shapes]),
            "flops": flops,
            "bytes": nbytes,
            "memory": memory,
            "attrs": canonical_categorical(attrs, [k.decode() for k in self.attrs_table]),
            **ids,
        }
        del attrs, ids
        spans = spans_frame(cols, sort=False)
        counters = self._counters(mem)
        return trace_id, spans, counters

    def _link_correlations(self, parent_idx, cat_codes, spec_mode):
        rows = np.asarray(self.corr_rows, np.int64)
        corr = _int_ids(self.corr_vals, {})
        mode = spec_mode[cat_codes[rows]]
        rt = mode == _M_RUNTIME
        gpu = mode == _M_GPU
        if not rt.any() or not gpu.any():
            return parent_idx
        rt_rows, rt_corr = rows[rt], corr[rt]
        order = np.argsort(rt_corr, kind="stable")
        rt_rows, rt_corr = rt_rows[order], rt_corr[order]
        g_rows, g_corr = rows[gpu], corr[gpu]
        pos = np.searchsorted(rt_corr, g_corr)
        pos_c = np.minimum(pos, len(rt_corr) - 1)
        hit = (rt_corr[pos_c] == g_corr) & (parent_idx[g_rows] < 0)
        parent_idx = parent_idx.copy()
        parent_idx[g_rows[hit]] = rt_rows[pos_c[hit]]
        return parent_idx

    @staticmethod
    def _span_memory(mem, memory, pid, tid, start, end, cat_codes, spec_mode):
        """Net bytes allocated on each host span's thread between its start and end (Kineto ``[memory]``
        events); 0 for host spans on a process that reported memory events but none inside them."""
        mts = _ns(mem["ts"])
        mpid, mtid, mbytes = mem["pid"], mem["tid"], mem["bytes"]
        memory = memory.copy()
        host = np.isnan(memory) & (spec_mode[cat_codes] != _M_GPU) & np.isin(pid, np.unique(mpid))
        memory[host] = 0.0
        key_m = pd.MultiIndex.from_arrays([mpid, mtid])
        for (p, t) in key_m.unique():
            sel = (mpid == p) & (mtid == t)
            ts_g = mts[sel]
            order = np.argsort(ts_g, kind="stable")
            ts_g = ts_g[order]
            csum = np.concatenate([[0.0], np.cumsum(mbytes[sel][order])])
            spans = np.flatnonzero(host & (pid == p) & (tid == t))
            if not len(spans):
                continue
            lo = np.searchsorted(ts_g, start[spans], side="left")
            hi = np.searchsorted(ts_g, end[spans], side="right")
            memory[spans] = csum[hi] - csum[lo]
        return memory

    def _counters(self, mem) -> pd.DataFrame:
        parts = []
        k = len(mem["ts"])
        if k:
            ts = _ns(mem["ts"])
            devtype = mem["devtype"].astype(np.int64)
            devid = np.maximum(mem["devid"].astype(np.int64), 0)
            dev_codes, dev_uniques = pd.factorize(pd.MultiIndex.from_arrays([devtype, devid]))
            dev_names = ["cpu" if t == 0 else f"cuda:{i}" for t, i in dev_uniques]
            for metric, values in (("memory.allocated", mem["alloc"]), ("memory.reserved", mem["reserved"])):
                parts.append({"ts_ns": ts, "source": (np.zeros(k, np.int64), ["torch.profiler"]),
                              "metric": (np.zeros(k, np.int64), [metric]),
                              "value": values,
                              "unit": (np.zeros(k, np.int64), ["bytes"]), "device": (dev_codes, dev_names)})
        if self.counter_rows:
            rows = self.counter_rows
            part = {"ts_ns": _ns(np.array([r[0] for r in rows], np.float64)),
                    "value": np.array([r[3] for r in rows], np.float64)}
            for j, key in ((1, "source"), (2, "metric"), (4, "unit"), (5, "device")):
                codes, uniques = pd.factorize(np.array([r[j] for r in rows], dtype=object))
                part[key] = (codes, list(uniques))
            parts.append(part)
        if not parts:
            return counters_frame({})
        cols = {"ts_ns": np.concatenate([p["ts_ns"] for p in parts]),
                "value": np.concatenate([p["value"] for p in parts])}
        for key in ("source", "metric", "unit", "device"):
            table: dict = {}
            codes = []
            for p in parts:
                c, cats = p[key]
                remap = np.array([table.setdefault(str(x), len(table)) for x in cats], np.int64)
                codes.append(remap[c] if len(remap) else np.asarray(c, np.int64))
            cols[key] = canonical_categorical(np.concatenate(codes), list(table))
        return counters_frame(cols)


# ------------------------------------------------------------------------------------------------ own dialect

class _OwnColumns:
    """Columns of a file this module wrote (``otherData.mlms_nb``): every column comes back as it was."""

    def __init__(self, path: str, info: dict):
        self.path = path
        self.origin = int(info.get("origin_ns", 0))
        self.trace_id = str(info.get("trace_id", ""))
        self.devices = {str(k): v for k, v in (info.get("devices") or {}).items()}
        self.rows: dict[str, list] = {k: [] for k in (
            "trace_id", "span_id", "parent_id", "name", "level", "kind", "ts", "dur", "thread", "device",
            "stream", "layer_index", "layer_type", "shape", "flops", "bytes", "memory", "attrs")}
        self.counters: dict[str, list] = {k: [] for k in ("ts", "source", "metric", "value", "unit", "device")}
        self.id_rows = _id_rows()
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
            start = _ns(np.array(r["ts"], np.float64)) + self.origin
            dur = _ns(np.array(r["dur"], np.float64))
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
            cols.update({col: _dense(n, rows, vals, NO_ID, np.int64) for col, (rows, vals) in self.id_rows.items()
                         if rows})
            spans = spans_frame(cols)
            c = self.counters
            counters = counters_frame({"ts_ns": _ns(np.array(c["ts"], np.float64)) + self.origin,
                                       "source": c["source"], "metric": c["metric"],
                                       "value": np.array(c["value"], np.float64), "unit": c["unit"],
                                       "device": c["device"]})
        except (TypeError, ValueError) as exc:
            raise TraceFormatError(f"trace file {self.path!r} is not a valid mlms-nb Chrome trace: {exc}") from None
        return spans, counters


def _json_safe(obj):
    return orjson.loads(orjson.dumps(obj, default=str, option=orjson.OPT_NON_STR_KEYS | orjson.OPT_SERIALIZE_NUMPY))


def read_chrome(path) -> "tuple[pd.DataFrame, pd.DataFrame, dict]":
    """Import a Chrome trace JSON file (``.json`` or gzip) -> (spans, counters, metadata). See the module doc."""
    path_s = os.fspath(path)
    stream = EventStream(path_s)
    gc_was = gc.isenabled()
    gc.disable()
    try:
        cols = None
        own = None
        for events in stream:
            if cols is None:
                info = (stream.header.get("otherData") or {}).get("mlms_nb") if isinstance(
                    stream.header.get("otherData"), dict) else None
                if isinstance(info, dict) and info.get("format") == FORMAT:
                    own = cols = _OwnColumns(path_s, info)
                else:
                    cols = _Columns(path_s)
            cols.feed(events)
            del events
        skeleton = stream.skeleton
        if cols is None:
            cols = _Columns(path_s)
        if own is None and isinstance(skeleton, dict):
            info = (skeleton.get("otherData") or {}).get("mlms_nb") if isinstance(skeleton.get("otherData"),
                                                                                   dict) else None
            if isinstance(info, dict) and info.get("format") == FORMAT:
                own = _OwnColumns(path_s, info)  # otherData came after the events: read again in our dialect
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
            dialect = "onnxruntime" if {"Session", "Node"} & set(cols.cats) else "chrome"
        elif isinstance(skeleton, dict):
            dialect = "kineto" if ("schemaVersion" in skeleton or "baseTimeNanoseconds" in skeleton or
                                   {"cpu_op", "kernel", "cuda_runtime", "user_annotation"} & set(cols.cats)) else "chrome"
        else:
            raise TraceFormatError(f"trace file {path_s!r} is not a valid trace: its top level is neither a JSON "
                                   f"object nor an array")
        trace_id, spans, counters = cols.build(skeleton, dialect)
        meta = _import_metadata(path_s, dialect, skeleton, cols, trace_id)
        return spans, counters, meta
    finally:
        if gc_was:
            gc.enable()


def _import_metadata(path: str, dialect: str, skeleton, cols: _Columns, trace_id: str) -> dict:
    meta: dict[str, Any] = {"trace_id": trace_id, "source": dialect, "path": os.path.abspath(path)}
    if dialect == "kineto":
        base = skeleton.get("baseTimeNanoseconds")
        clock = {"name": "kineto (torch.profiler)", "wall_offset_ns": int(base) if base is not None else None}
        meta["clock"] = clock
        meta["kineto"] = _json_safe({k: v for k, v in skeleton.items() if k != "traceEvents"})
    elif dialect == "onnxruntime":
        meta["clock"] = {"name": "onnxruntime profiler (since profiling started; "
                                 "session.get_profiling_start_time_ns() gives the wall-clock start)",
                         "wall_offset_ns": None}
    else:
        meta["clock"] = {"name": "chrome trace", "wall_offset_ns": None}
        if isinstance(skeleton, dict):
            meta["chrome"] = _json_safe({k: v for k, v in skeleton.items() if k != "traceEvents"})
    if cols.process_names:
        meta["process_names"] = cols.process_names
    if cols.thread_names:
        meta["thread_names"] = cols.thread_names
    if cols.str_ids:
        meta["string_ids"] = {str(v): k for k, v in cols.str_ids.items()}
    return meta


# ------------------------------------------------------------------------------------------------ exporter

def write_chrome(spans: pd.DataFrame, counters: pd.DataFrame, metadata: dict, path, *,
                 chunk: int = 50_000) -> None:
    """Write spans + counters + metadata as Chrome trace JSON (see the module doc); streamed in chunks."""
    n = len(spans)
    origin = int(spans["start_ns"].min()) if n else 0
    if len(counters):
        origin = min(origin, int(counters["ts_ns"].min())) if n else int(counters["ts_ns"].min())
    trace_id = str(metadata.get("trace_id") or (spans["trace_id"].iloc[0] if n else ""))
    main_pid = int(metadata.get("pid") or 1)
    dev_values = sorted(set(spans["device"].cat.categories.astype(str)) |
                        set(counters["device"].cat.categories.astype(str)))
    dev_pid: dict[str, int] = {}
    for d in dev_values:
        dev_pid[d] = main_pid if d == "cpu" else (main_pid + 1_000_000 + len(dev_pid))
    if "cpu" not in dev_pid:
        dev_pid["cpu"] = main_pid
    info = {"format": FORMAT, "version": FORMAT_VERSION, "origin_ns": origin, "trace_id": trace_id,
            "devices": {str(p): d for d, p in dev_pid.items()}, "units": {"ts": "us", "dur": "us"}}
    other = _json_safe(metadata)
    other["mlms_nb"] = info
    dumps = orjson.dumps
    tmp = os.fspath(path) + ".part"
    with open(tmp, "wb") as f:
        f.write(b'{"otherData":' + dumps(other) + b',"displayTimeUnit":"ns","traceEvents":[\n')
        first = True
        meta_events = [{"ph": "M", "name": "process_name", "pid": p, "tid": 0, "args": {"name": d or "host"}}
                       for d, p in dev_pid.items()]
        f.write(dumps(meta_events)[1:-1])
        first = not meta_events
        for lo in range(0, n, chunk):
            part = spans.iloc[lo:lo + chunk]
            blob = dumps(_span_events(part, origin, trace_id, dev_pid))
            if len(blob) > 2:
                f.write((b"\n" if first else b",\n") + blob[1:-1])
                first = False
        for lo in range(0, len(counters), chunk):
            part = counters.iloc[lo:lo + chunk]
            blob = dumps(_counter_events(part, origin, dev_pid))
            if len(blob) > 2:
                f.write((b"\n" if first else b",\n") + blob[1:-1])
                first = False
        f.write(b"\n]}\n")
    os.replace(tmp, path)


def _span_events(part: pd.DataFrame, origin: int, trace_id: str, dev_pid: dict) -> list:
    cols = {c: part[c].tolist() for c in ("trace_id", "span_id", "parent_id", "name", "level", "kind", "thread",
                                          "device", "stream", "layer_index", "layer_type", "shape", "attrs")}
    start = ((part["start_ns"].to_numpy() - origin) / 1000.0).tolist()
    dur = (part["duration_ns"].to_numpy() / 1000.0).tolist()
    fl = {c: part[c].to_numpy() for c in ("flops", "bytes", "memory")}
    fl_has = {c: ~np.isnan(v) for c, v in fl.items()}
    ids = [(c, part[c].tolist()) for c in ID_COLUMNS if c in part.columns]
    events = []
    append = events.append
    Fragment = orjson.Fragment
    loads, dumps = orjson.loads, orjson.dumps
    attrs_json: dict = {}  # attrs text -> what goes in args (text shared by many spans is checked once)
    for i in range(len(part)):
        stream = cols["stream"][i]
        thread = cols["thread"][i]
        tid = stream if stream >= 0 else thread
        args = {"span_id": cols["span_id"][i], "parent_id": cols["parent_id"][i], "level": cols["level"][i]}
        if tid != thread:
            args["thread"] = thread
        if stream >= 0:
            args["stream"] = stream
        li = cols["layer_index"][i]
        if li >= 0:
            args["layer_index"] = li
        for key in ("layer_type", "shape"):
            v = cols[key][i]
            if v:
                args[key] = v
        for key in ("flops", "bytes", "memory"):
            if fl_has[key][i]:
                args[key] = float(fl[key][i])
        for key, values in ids:
            if values[i] != NO_ID:
                args[key] = values[i]
        t = cols["trace_id"][i]
        if t != trace_id:
            args["trace_id"] = t
        at = cols["attrs"][i]
        if at and at != "{}":
            inline = attrs_json.get(at)
            if inline is None:
                try:
                    inline = Fragment(at) if at[0] == "{" and dumps(loads(at)).decode() == at else at
                except orjson.JSONDecodeError:
                    inline = at
                attrs_json[at] = inline
            args["attrs"] = inline
        append({"ph": "X", "cat": cols["kind"][i], "name": cols["name"][i], "pid": dev_pid[cols["device"][i]],
                "tid": tid, "ts": start[i], "dur": dur[i], "args": args})
    return events


def _counter_events(part: pd.DataFrame, origin: int, dev_pid: dict) -> list:
    ts = ((part["ts_ns"].to_numpy() - origin) / 1000.0).tolist()
    src, metric, value, unit, dev = (part[c].tolist() for c in ("source", "metric", "value", "unit", "device"))
    return [{"ph": "C", "cat": src[i], "name": metric[i], "pid": dev_pid[dev[i]], "tid": 0, "ts": ts[i],
             "args": {unit[i] or "value": value[i]}} for i in range(len(part))]
