"""The PyTorch Kineto dialect (``torch.profiler`` ``export_chrome_trace``): its categories, its device activity,
and its ``[memory]`` events.

- ``cpu_op`` -> ML_LIBRARY / ``op`` (``Input Dims`` -> ``shape``, ``flops`` -> ``flops``); ``user_annotation``
  -> FRAMEWORK / ``annotation``; ``python_function`` -> FRAMEWORK / ``python``; ``cuda_runtime`` /
  ``cuda_driver`` -> SYSTEM_LIBRARY / ``runtime``; ``kernel`` / ``gpu_memcpy`` / ``gpu_memset`` ->
  SYSTEM_LIBRARY / ``kernel`` / ``memcpy`` / ``memset`` (device ``cuda:N``, ``stream``);
  ``gpu_user_annotation`` -> SYSTEM_LIBRARY / ``annotation``; ``Trace`` (the profiling window) -> APPLICATION.
- A GPU activity with no enclosing span on its stream gets the runtime call with the same ``correlation`` as
  parent (:func:`mlms_nb.tracing.attribution.launching_calls`).
- ``[memory]`` instant events -> counters ``memory.allocated`` / ``memory.reserved`` (bytes) and each host span's
  ``memory``: the net bytes allocated on its thread while it ran.
- Times are relative to ``baseTimeNanoseconds`` (``metadata["clock"]["wall_offset_ns"]``).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from mlms_nb.errors import TraceFormatError
from mlms_nb.schema.levels import TraceLevel as _L
from mlms_nb.tracing.chrome._common import (ARGS_AS_ATTRS, ARGS_OF_DEVICE_ACTIVITY, ARGS_OF_HOST_OP,
                                            ARGS_OF_RUNTIME_CALL, NAN, int_ids, json_safe, to_int, us_to_ns)

CATEGORIES: dict[str, tuple[_L, str, int]] = {
    "cpu_op": (_L.ML_LIBRARY, "op", ARGS_OF_HOST_OP),
    "operator": (_L.ML_LIBRARY, "op", ARGS_OF_HOST_OP),  # older Kineto
    "user_annotation": (_L.FRAMEWORK, "annotation", ARGS_AS_ATTRS),
    "python_function": (_L.FRAMEWORK, "python", ARGS_AS_ATTRS),
    "cuda_runtime": (_L.SYSTEM_LIBRARY, "runtime", ARGS_OF_RUNTIME_CALL),
    "cuda_driver": (_L.SYSTEM_LIBRARY, "runtime", ARGS_OF_RUNTIME_CALL),
    "runtime": (_L.SYSTEM_LIBRARY, "runtime", ARGS_OF_RUNTIME_CALL),
    "kernel": (_L.SYSTEM_LIBRARY, "kernel", ARGS_OF_DEVICE_ACTIVITY),
    "gpu_memcpy": (_L.SYSTEM_LIBRARY, "memcpy", ARGS_OF_DEVICE_ACTIVITY),
    "gpu_memset": (_L.SYSTEM_LIBRARY, "memset", ARGS_OF_DEVICE_ACTIVITY),
    "gpu_user_annotation": (_L.SYSTEM_LIBRARY, "annotation", ARGS_OF_DEVICE_ACTIVITY),
    "Trace": (_L.APPLICATION, "application", ARGS_AS_ATTRS),
}
"""Kineto event category -> (level, kind, how its args are read)."""

RUNTIME_CATEGORY = (_L.SYSTEM_LIBRARY, "runtime", ARGS_OF_RUNTIME_CALL)
"""What another vendor's ``*_runtime`` / ``*_driver`` category is read as."""

MARKER_CATEGORIES = frozenset({"cpu_op", "kernel", "cuda_runtime", "user_annotation"})
"""Categories that make a top-level object a Kineto trace even without ``schemaVersion``/``baseTimeNanoseconds``."""

MEMORY_KEYS = ("ts", "bytes", "alloc", "reserved", "devtype", "devid", "pid", "tid")
"""The fields of a ``[memory]`` instant event kept (in the order the importer's loop appends them)."""


def is_kineto(skeleton: dict, categories) -> bool:
    """Whether a top-level object (less its events) and the categories seen make a Kineto trace."""
    return "schemaVersion" in skeleton or "baseTimeNanoseconds" in skeleton or bool(MARKER_CATEGORIES & set(categories))


def metadata(skeleton: dict) -> dict:
    """The trace metadata a Kineto file gives: its clock and its top-level fields."""
    base = skeleton.get("baseTimeNanoseconds")
    return {"clock": {"name": "kineto (torch.profiler)", "wall_offset_ns": int(base) if base is not None else None},
            "kineto": json_safe({k: v for k, v in skeleton.items() if k != "traceEvents"})}


# --------------------------------------------------------------------------------------------- while reading


def device_activity(cols, row: int, ev: dict, args: dict) -> None:
    """A kernel / memcpy / memset (or a GPU annotation): device ``cuda:N``, its stream, its correlation id."""
    dev = args.get("device", ev.get("pid", 0))
    dname = f"cuda:{dev}"
    code = cols.devices.get(dname)
    if code is None:
        code = cols.devices[dname] = len(cols.devices)
    cols.dev_rows.append(row)
    cols.dev_codes.append(code)
    cols.stream_rows.append(row)
    cols.stream_vals.append(to_int(args.get("stream", ev.get("tid", -1))))
    corr = args.get("correlation")
    if corr is not None:
        cols.corr_rows.append(row)
        cols.corr_vals.append(corr)


def memory_event_with_defaults(ev: dict, mem: dict) -> None:
    """A ``[memory]`` instant event missing some field (defaults fill in); other instant events are ignored.
    The importer's loop reads complete ones itself."""
    if ev.get("name") != "[memory]":
        return
    a = ev.get("args") or {}
    for key, value in (("ts", ev["ts"]), ("bytes", a.get("Bytes", 0)), ("alloc", a.get("Total Allocated", NAN)),
                       ("reserved", a.get("Total Reserved", NAN)), ("devtype", a.get("Device Type", 0)),
                       ("devid", a.get("Device Id", -1)), ("pid", ev.get("pid", 0)), ("tid", ev.get("tid", 0))):
        mem[key].append(value)


def add_memory_chunk(parts: dict, mem: dict, path: str, str_ids: dict) -> None:
    """One chunk's ``[memory]`` fields (lists) -> numpy arrays appended to ``parts``."""
    try:
        for key in ("ts", "bytes", "alloc", "reserved"):
            parts[key].append(np.array(mem[key], dtype=np.float64))
        for key in ("devtype", "devid"):
            parts[key].append(np.array(mem[key], dtype=np.int64))
    except (TypeError, ValueError):
        raise TraceFormatError(f"trace file {path!r} is not a valid trace: a [memory] event has a "
                               f"non-numeric field") from None
    parts["pid"].append(int_ids(mem["pid"], str_ids))
    parts["tid"].append(int_ids(mem["tid"], str_ids))


# --------------------------------------------------------------------------------------------- when building


def span_memory(mem: dict, memory: np.ndarray, pid, tid, start, end, is_device) -> np.ndarray:
    """Net bytes allocated on each host span's thread between its start and end (``mem``: the ``[memory]``
    events); 0 for host spans on a process that reported memory events but none inside them. ``is_device``:
    which spans are device activity (they get none)."""
    mts = us_to_ns(mem["ts"])
    mpid, mtid, mbytes = mem["pid"], mem["tid"], mem["bytes"]
    memory = memory.copy()
    host = np.isnan(memory) & ~is_device & np.isin(pid, np.unique(mpid))
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


def memory_counter_parts(mem: dict) -> list[dict]:
    """The ``[memory]`` events as counter columns (codes + categories per text column), one part per metric."""
    k = len(mem["ts"])
    if not k:
        return []
    ts = us_to_ns(mem["ts"])
    devtype = mem["devtype"].astype(np.int64)
    devid = np.maximum(mem["devid"].astype(np.int64), 0)
    dev_codes, dev_uniques = pd.factorize(pd.MultiIndex.from_arrays([devtype, devid]))
    dev_names = ["cpu" if t == 0 else f"cuda:{i}" for t, i in dev_uniques]
    zeros = np.zeros(k, np.int64)
    return [{"ts_ns": ts, "source": (zeros, ["torch.profiler"]), "metric": (zeros, [metric]), "value": values,
             "unit": (zeros, ["bytes"]), "device": (dev_codes, dev_names)}
            for metric, values in (("memory.allocated", mem["alloc"]), ("memory.reserved", mem["reserved"]))]
