"""The importer's column store for the Kineto, ONNX Runtime and generic dialects: events in, span and counter
frames out, one chunk of events at a time.

Per chunk, :meth:`EventColumns.feed` makes one pass over parsed events (dicts), appending to lists of numbers and
interned codes (names, shapes, and the ``attrs`` text once the per-span ids are out of it); columns only some
events have (shape, stream, layer type, the id columns...) are kept sparse as (row, value) lists. Each chunk's
lists become numpy arrays before the next chunk is parsed. :meth:`EventColumns.build` concatenates them, finds
parents (:mod:`mlms_nb.tracing.attribution`) and builds the frames with the schema's builders. Most runs of a
Kineto trace are appended by :mod:`.rawfeed` instead (typed by msgspec, whole-run operations); this loop is its
reference and reads whatever it hands back. Feeding and building share these columns: one algorithm, one module.

Why the loop looks the way it does (``benchmarks/trace_ingest.py`` measures it as the per-event candidate):

- bound methods aliased to locals (``ts_a = ts_l.append``), and dict ``get`` instead of ``in`` + index: a
  Python attribute lookup per event per column is a third of the loop's time;
- the common event shape read first with plain indexing inside one ``try`` (a missing key drops the event to a
  slower path), dispatch on the category's args rule (an int, see ``_common.ARGS_*``) with the most frequent
  rule (a Kineto host op) tested first, Kineto's ``[memory]`` instant events read inline;
- interning: names, shapes and attrs texts become int codes at once, so a 1M-event trace holds a few thousand
  strings, not a million;
- no dict or pandas call per event, and the garbage collector off while reading (the caller turns it off:
  millions of new containers would trigger collections that find nothing);
- every chunk's lists converted to numpy before the next chunk arrives, so the peak holds one chunk of Python
  objects and compact arrays for the rest.
"""
from __future__ import annotations

import uuid

import numpy as np
import orjson
import pandas as pd

from mlms_nb.errors import TraceFormatError
from mlms_nb.schema.columns import canonical_categorical, level_categorical
from mlms_nb.schema.counters import counters_frame
from mlms_nb.schema.spans import ID_COLUMNS, NO_ID, spans_frame
from mlms_nb.tracing.attribution import containment_parents, launching_calls
from mlms_nb.tracing.chrome import generic, kineto, ort
from mlms_nb.tracing.chrome._common import (ARGS_AS_ATTRS, ARGS_OF_DEVICE_ACTIVITY, ARGS_OF_HOST_OP,
                                            ARGS_OF_ORT_NODE, ARGS_OF_RUNTIME_CALL, INT64_MAX, dense, id_rows,
                                            int_ids, us_to_ns)
from mlms_nb.schema.levels import TraceLevel

CATEGORIES: dict[str, tuple[TraceLevel, str, int]] = {**kineto.CATEGORIES, **ort.CATEGORIES}
"""Chrome/Kineto/ONNX Runtime event category -> (level, kind, how its args are read)."""


def category(cat) -> tuple[TraceLevel, str, int]:
    """(level, kind, args rule) of an event category; unknown ``*_runtime`` / ``*_driver`` ones are runtime calls."""
    spec = CATEGORIES.get(cat)
    if spec is not None:
        return spec
    if isinstance(cat, str) and (cat.endswith("_runtime") or cat.endswith("_driver")):
        return kineto.RUNTIME_CATEGORY
    return generic.UNKNOWN_CATEGORY


class EventColumns:
    """Columns of the Kineto / ONNX Runtime / generic dialects, filled by :meth:`feed`, turned into frames by
    :meth:`build`."""

    def __init__(self, path: str):
        self.path = path
        self.n = 0
        self.n_events = 0
        self.cats: dict = {}
        self.cat_specs: list = []
        self.cat_rules: list[int] = []
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
        self.raw_args_tables: dict = {}  # rawfeed: (args rule, args text, ids blanked) -> what it read there
        self.raw_id_keys: set | None = None  # rawfeed: the id columns it blanks (None: not decided yet)
        self.id_rows = id_rows()
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
        self.mem_parts: dict[str, list[np.ndarray]] = {k: [] for k in kineto.MEMORY_KEYS}
        # generic counters ("C" events), B/E pairs, metadata
        self.counter_rows: list[tuple] = []
        self.open_be: dict = {}
        self.be_spans: list[dict] = []
        self.process_names: dict = {}
        self.thread_names: dict = {}

    def cat_code(self, cat) -> int:
        code = self.cats[cat] = len(self.cats)
        spec = category(cat)
        self.cat_specs.append(spec)
        self.cat_rules.append(spec[2])
        return code

    def feed(self, events: list) -> None:
        """One chunk of parsed events (see the module doc for why it is written this way)."""
        ts_l, dur_l, cat_l, name_l, pid_l, tid_l, attrs_l, shape_l = [], [], [], [], [], [], [], []
        ts_a, dur_a, cat_a, name_a, shape_a = ts_l.append, dur_l.append, cat_l.append, name_l.append, shape_l.append
        pid_a, tid_a, attrs_a = pid_l.append, tid_l.append, attrs_l.append
        cats, names, shapes = self.cats, self.names, self.shapes
        cat_get, name_get, shape_get = cats.get, names.get, shapes.get
        rules = self.cat_rules
        dumps = orjson.dumps
        row = self.n
        corr_rows_a, corr_vals_a = self.corr_rows.append, self.corr_vals.append
        flops_rows_a, flops_vals_a = self.flops_rows.append, self.flops_vals.append
        attrs_table = self.attrs_table
        attrs_get = attrs_table.get
        id_sinks = tuple((key, self.id_rows[col][0].append, self.id_rows[col][1].append)
                         for col, key in ID_COLUMNS.items())
        mem = {k: [] for k in kineto.MEMORY_KEYS}
        mts_a, mbytes_a, malloc_a, mres_a, mdt_a, mdi_a, mpid_a, mtid_a = (mem[k].append for k in kineto.MEMORY_KEYS)
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
                        if ev["name"] == "[memory]":  # Kineto's allocator events (profile_memory=True)
                            a = ev["args"]  # all read before any is appended: a missing one leaves none
                            m_ts, m_bytes, m_alloc, m_res, m_dt, m_di, m_pid, m_tid = (ev["ts"], a["Bytes"], a[
                                "Total Allocated"], a["Total Reserved"], a["Device Type"], a["Device Id"], ev["pid"],
                                ev["tid"])
                            mts_a(m_ts)
                            mbytes_a(m_bytes)
                            malloc_a(m_alloc)
                            mres_a(m_res)
                            mdt_a(m_dt)
                            mdi_a(m_di)
                            mpid_a(m_pid)
                            mtid_a(m_tid)
                        continue
                    else:
                        generic.other_event(self, ph, ev)
                        continue
                except KeyError:
                    ph = ev.get("ph")
                    if ph == "i" or ph == "I":
                        kineto.memory_event_with_defaults(ev, mem)
                        continue
                    if ph != "X":
                        raise
                    cat, name, ts, dur, pid, tid, args = self._complete_slow(ev)
                cc = cat_get(cat)
                if cc is None:
                    cc = self.cat_code(cat)
                rule = rules[cc]
                sc = 0
                if rule == ARGS_OF_HOST_OP:
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
                elif rule == ARGS_AS_ATTRS:
                    pass
                elif rule == ARGS_OF_RUNTIME_CALL:
                    if args:
                        corr = args.get("correlation")
                        if corr is not None:
                            corr_rows_a(row)
                            corr_vals_a(corr)
                elif rule == ARGS_OF_DEVICE_ACTIVITY:
                    kineto.device_activity(self, row, ev, args or {})
                elif rule == ARGS_OF_ORT_NODE:
                    name = ort.node(self, row, name, args)
                else:  # ARGS_OF_UNKNOWN_CATEGORY
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
                        if v is not None and type(v) is int and 0 <= v <= INT64_MAX:
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
            kineto.add_memory_chunk(self.mem_parts, mem, self.path, self.str_ids)
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
        self.p_pid.append(int_ids(pid_l, self.str_ids))
        self.p_tid.append(int_ids(tid_l, self.str_ids))
        self.p_attrs.append(np.array(attrs_l, dtype=np.int32))
        self.n = row

    @staticmethod
    def _complete_slow(ev: dict):
        """An "X" event without some optional key (cat, dur, pid, tid, args); "ts" is required."""
        return (ev.get("cat"), ev.get("name", ""), ev["ts"], ev.get("dur", 0), ev.get("pid", 0),
                ev.get("tid", 0), ev.get("args"))

    # -------------------------------------------------------------------------------------------- build

    def build(self, skeleton) -> tuple[str, pd.DataFrame, pd.DataFrame]:
        """``(trace_id, spans, counters)`` of everything fed; the column lists are released as they are used."""
        if self.be_spans:
            spans, self.be_spans = self.be_spans, []
            self.feed(spans)
        n = self.n

        def cat(parts, dtype):
            out = np.concatenate(parts) if parts else np.zeros(0, dtype)
            parts.clear()
            return out

        start = us_to_ns(cat(self.p_ts, np.float64))
        duration = np.maximum(us_to_ns(cat(self.p_dur, np.float64)), 0)
        end = start + duration
        cat_codes = cat(self.p_cat, np.int32)
        name_codes = cat(self.p_name, np.int32)
        pid = cat(self.p_pid, np.int64)
        tid = cat(self.p_tid, np.int64)
        mem = {k: (np.concatenate(v) if v else np.zeros(0)) for k, v in self.mem_parts.items()}
        self.mem_parts = {k: [] for k in kineto.MEMORY_KEYS}

        spec_level = np.array([int(s[0]) for s in self.cat_specs] or [0], np.int8)
        kind_names = sorted({s[1] for s in self.cat_specs} or {"other"})
        spec_kind = np.array([kind_names.index(s[1]) for s in self.cat_specs] or [0], np.int64)
        spec_rule = np.array([s[2] for s in self.cat_specs] or [0], np.int64)

        def sparse(rows, vals, default, dtype):
            return dense(n, rows, vals, default, dtype)

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
            parent_idx = self._link_launches(parent_idx, cat_codes, spec_rule)
        if len(mem["ts"]):
            is_device = spec_rule[cat_codes] == ARGS_OF_DEVICE_ACTIVITY
            memory = kineto.span_memory(mem, memory, pid, tid, start, end, is_device)

        # canonical row order (start_ns, span_id); span ids are file order
        span_id = np.arange(1, n + 1, dtype=np.int64)
        parent_id = np.where(parent_idx >= 0, parent_idx + 1, 0)
        del parent_idx
        attrs = cat(self.p_attrs, np.int32)
        ids = {col: sparse(rows, vals, NO_ID, np.int64) for col, (rows, vals) in self.id_rows.items() if rows}
        self.id_rows = id_rows()
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

    def _link_launches(self, parent_idx, cat_codes, spec_rule):
        """A device activity with no enclosing span on its stream gets the runtime call that launched it (the
        first with the same correlation id) as parent."""
        rows = np.asarray(self.corr_rows, np.int64)
        corr = int_ids(self.corr_vals, {})
        rule = spec_rule[cat_codes[rows]]
        calls = rule == ARGS_OF_RUNTIME_CALL
        activity = (rule == ARGS_OF_DEVICE_ACTIVITY) & (parent_idx[rows] < 0)
        if not calls.any() or not activity.any():
            return parent_idx
        call_rows, act_rows = rows[calls], rows[activity]
        launch = launching_calls(corr[calls], corr[activity])
        hit = launch >= 0
        parent_idx = parent_idx.copy()
        parent_idx[act_rows[hit]] = call_rows[launch[hit]]
        return parent_idx

    def _counters(self, mem) -> pd.DataFrame:
        """Kineto's memory counters and the generic ``C`` events, as one counters frame."""
        parts = kineto.memory_counter_parts(mem)
        if self.counter_rows:
            rows = self.counter_rows
            part = {"ts_ns": us_to_ns(np.array([r[0] for r in rows], np.float64)),
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
