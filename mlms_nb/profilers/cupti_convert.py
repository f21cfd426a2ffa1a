"""CUPTI activity objects -> our record dicts (:data:`~mlms_nb.tracing.cuda_activity.RECORD_FIELDS`).

:func:`convert_activity` copies the fields kept out of one activity object (inside CUPTI's buffer callback, where
the object is valid) into a tuple, times still on CUPTI's clock; :func:`raw_to_record` moves it onto
:func:`time.perf_counter_ns` and names its fields; :func:`demangle` makes C++ kernel names readable.
:class:`KindMap` says which CUPTI ``ActivityKind`` is which of ours and names API calls by callback id.
These read attributes only, so they run on recorded stand-ins where there is no GPU.
"""
from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
from typing import Iterable

CUPTI_KIND = {"kernel": "CONCURRENT_KERNEL", "memcpy": "MEMCPY", "memset": "MEMSET", "runtime": "RUNTIME",
              "driver": "DRIVER"}
"""Our kind names -> the CUPTI ``ActivityKind`` member each is recorded as."""

_COPY_KIND = {0: "Unknown", 1: "HtoD", 2: "DtoH", 3: "HtoA", 4: "AtoH", 5: "AtoA", 6: "AtoD", 7: "DtoA",
              8: "DtoD", 9: "HtoH", 10: "PtoP"}
_MEMORY_KIND = {0: "Unknown", 1: "Pageable", 2: "Pinned", 3: "Device", 4: "Array", 5: "Managed",
                6: "Device Static", 7: "Managed Static"}
_VERSION_SUFFIX = re.compile(r"_v\d+$")


@dataclass
class KindMap:
    """Integer ``ActivityKind`` values -> our kind names, and callback id -> API name, from a cupti module."""

    kinds: dict[int, str]
    runtime_names: dict[int, str]
    driver_names: dict[int, str]

    @classmethod
    def of(cls, cupti) -> "KindMap":
        ak = cupti.ActivityKind
        kinds = {int(getattr(ak, cname)): ours for ours, cname in CUPTI_KIND.items()}
        if hasattr(ak, "KERNEL"):
            kinds[int(ak.KERNEL)] = "kernel"  # the serialised-kernel record, same layout
        return cls(kinds, _cbid_names(_first_attr(cupti, "RuntimeApiTraceCbid", "runtime_api_trace_cbid")),
                   _cbid_names(_first_attr(cupti, "DriverApiTraceCbid", "driver_api_trace_cbid")))


def _first_attr(module, *names):
    """The first of ``names`` the module has (cupti-python renamed its enums across releases), or None."""
    for name in names:
        value = getattr(module, name, None)
        if value is not None:
            return value
    return None


def _cbid_names(enum_cls) -> dict[int, str]:
    """``cudaLaunchKernel_v7000`` -> ``cudaLaunchKernel`` by callback id (first name wins for an id)."""
    out: dict[int, str] = {}
    if enum_cls is None:
        return out
    for name, member in enum_cls.__members__.items():
        if name in ("INVALID", "SIZE", "FORCE_INT") or name.endswith("_SIZE"):
            continue
        out.setdefault(int(member), _VERSION_SUFFIX.sub("", name))
    return out


def convert_activity(activity, kind_map: KindMap) -> tuple | None:
    """One CUPTI activity object -> a raw tuple ``(kind, name, start, end, correlation_id, device_id,
    context_id, stream, thread, bytes, grid, block, registers, shared_memory, copy_kind, cbid)`` with times
    still on CUPTI's clock; None for a kind not kept. Reads attributes only, so it runs inside CUPTI's
    buffer-completed callback (where the object is valid) and on recorded stand-ins in tests."""
    kind = kind_map.kinds.get(int(activity.kind))
    if kind is None:
        return None
    start, end, corr = int(activity.start), int(activity.end), int(activity.correlation_id)
    if kind == "kernel":
        return (kind, str(activity.name), start, end, corr, int(activity.device_id), int(activity.context_id),
                int(activity.stream_id), 0, None,
                (int(activity.grid_x), int(activity.grid_y), int(activity.grid_z)),
                (int(activity.block_x), int(activity.block_y), int(activity.block_z)),
                int(activity.registers_per_thread),
                int(activity.static_shared_memory) + int(activity.dynamic_shared_memory), None, None)
    if kind == "memcpy":
        ck = _COPY_KIND.get(int(activity.copy_kind), "Unknown")
        src = _MEMORY_KIND.get(int(activity.src_kind), "Unknown")
        dst = _MEMORY_KIND.get(int(activity.dst_kind), "Unknown")
        return (kind, f"Memcpy {ck} ({src} -> {dst})", start, end, corr, int(activity.device_id),
                int(activity.context_id), int(activity.stream_id), 0, int(activity.bytes), None, None, None,
                None, ck, None)
    if kind == "memset":
        mk = _MEMORY_KIND.get(int(getattr(activity, "memory_kind", 0)), "Unknown")
        return (kind, f"Memset ({mk})", start, end, corr, int(activity.device_id), int(activity.context_id),
                int(activity.stream_id), 0, int(activity.bytes), None, None, None, None, None, None)
    # runtime / driver API call
    cbid = int(activity.cbid)
    names = kind_map.runtime_names if kind == "runtime" else kind_map.driver_names
    name = names.get(cbid) or f"{'cuda' if kind == 'runtime' else 'cu'}Api#{cbid}"
    return (kind, name, start, end, corr, -1, -1, -1, int(activity.thread_id), None, None, None, None, None,
            None, cbid)


def raw_to_record(raw: tuple, to_perf) -> dict:
    """A tuple from :func:`convert_activity` -> a record dict (:data:`RECORD_FIELDS`), times moved onto the
    :func:`time.perf_counter_ns` clock by ``to_perf`` (record time -> perf ns; an int adds that offset)."""
    (kind, name, start, end, corr, dev, ctx, stream, thread, nbytes, grid, block, regs, shmem, ck, cbid) = raw
    if isinstance(to_perf, int):
        start_ns, end_ns = start + to_perf, end + to_perf
    else:
        start_ns, end_ns = to_perf(start), to_perf(end)
    return {
        "kind": kind, "name": name, "start_ns": start_ns, "end_ns": end_ns,
        "correlation_id": corr, "device": f"cuda:{dev}" if dev >= 0 else "cpu", "device_id": dev,
        "context_id": ctx, "stream": stream, "thread": thread, "bytes": nbytes, "grid": grid, "block": block,
        "registers_per_thread": regs, "shared_memory": shmem, "copy_kind": ck, "cbid": cbid,
    }


_demangled: dict[str, str] = {}


def demangle(names: Iterable[str]) -> dict[str, str]:
    """Itanium C++ names (``_Z...``) -> readable ones, through one ``c++filt`` process; names it cannot
    read, or every name when ``c++filt`` is not on PATH, map to themselves."""
    names = list(dict.fromkeys(names))
    todo = [n for n in names if n.startswith("_Z") and n not in _demangled]
    exe = shutil.which("c++filt") if todo else None
    if exe:
        try:
            out = subprocess.run([exe], input="\n".join(todo) + "\n", capture_output=True, text=True,
                                 timeout=30, check=True).stdout.splitlines()
            if len(out) == len(todo):
                _demangled.update(zip(todo, out))
        except (OSError, subprocess.SubprocessError):
            pass
    return {n: _demangled.get(n, n) for n in names}
