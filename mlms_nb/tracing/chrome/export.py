"""Write a trace as Chrome trace JSON (opens in Perfetto and chrome://tracing); see :mod:`mlms_nb.tracing.chrome`
for the layout. Streamed: spans are turned into events 50,000 at a time."""
from __future__ import annotations

import numpy as np
import orjson
import pandas as pd

from mlms_nb._fs import atomic_write
from mlms_nb.schema.spans import ID_COLUMNS, NO_ID
from mlms_nb.tracing.chrome._common import FORMAT, FORMAT_VERSION, json_safe


def write_chrome(spans: pd.DataFrame, counters: pd.DataFrame, metadata: dict, path, *,
                 chunk: int = 50_000) -> None:
    """Write spans + counters + metadata as Chrome trace JSON (layout: :mod:`mlms_nb.tracing.chrome`), ``chunk``
    spans at a time, atomically."""
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
    other = json_safe(metadata)
    other["mlms_nb"] = info
    dumps = orjson.dumps
    with atomic_write(path) as f:
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
