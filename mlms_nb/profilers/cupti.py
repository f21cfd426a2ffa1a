"""CUDA kernels, memory copies/sets and CUDA runtime/driver API calls through CUPTI's activity API.

The SYSTEM_LIBRARY level of a trace: every kernel a model launches, with its grid and block, stream and
device; every memcpy/memset with its size; every runtime (``cudaLaunchKernel``) or driver
(``cuLaunchKernel``) API call with the OS thread that made it. ``cupti-python`` (module ``cupti.cupti``) is
imported lazily, here and nowhere else; without it -- or without an NVIDIA driver -- :meth:`CuptiActivity.
available` says why, as a sentence.

How it works (the live path, which needs a GPU):

- :meth:`CuptiActivity.start` registers CUPTI's two buffer callbacks (``activity_register_callbacks``: one
  hands CUPTI an empty buffer, the other receives a completed buffer as a list of activity objects) and
  enables the activity kinds (``ActivityKind.CONCURRENT_KERNEL``, ``MEMCPY``, ``MEMSET``, ``RUNTIME``,
  ``DRIVER``). CUPTI fills buffers from the CUDA driver and hands them back on its own thread; the
  callback copies the few fields kept into plain tuples (the activity objects view CUPTI's buffer, which is
  reused once the callback returns).
- :meth:`CuptiActivity.stop` synchronises the current CUDA context (if any), forces a flush
  (``activity_flush_all``) and disables the kinds.
- Times: CUPTI stamps records in ns on its own clock (the one ``cupti.get_timestamp()`` reads). An anchor pair
  ``(perf_counter_ns, get_timestamp)`` taken at start (the tightest of a few brackets) gives the offset to
  :func:`time.perf_counter_ns`, the tracer's clock; a second pair at stop is kept as ``metadata["drift_ns"]``.

Everything after the recording is pure and works on plain records (dicts), so it is tested on recorded
activity where there is no GPU:

- :meth:`CuptiActivity.records` -> list of dicts (:data:`RECORD_FIELDS`);
- :func:`records_frame` -> a pandas DataFrame of them;
- :func:`attribute_records` assigns each kernel/memcpy/memset to a layer span: first by correlation id (the
  runtime/driver API call that launched it ran inside a layer's CPU span), else by time containment;
- :func:`add_to_tracer` records them in a :class:`~mlms_nb.tracing.Tracer` as SYSTEM_LIBRARY spans of kind
  ``kernel`` / ``memcpy`` / ``memset`` / ``runtime``.
"""
from __future__ import annotations

import re
import shutil
import subprocess
import threading
import time
from dataclasses import dataclass
from typing import Any, ClassVar, Iterable, Mapping, Sequence

from mlms_nb.errors import FrameworkNotInstalledError, MlmsError
from mlms_nb.profilers._base import Profiler, Row, first_line

INSTALL_HINT = "pip install 'mlms-nb[gpu]'"

ACTIVITY_KINDS: tuple[str, ...] = ("kernel", "memcpy", "memset", "runtime", "driver")
"""What :class:`CuptiConfig` ``kinds`` may name; each maps to a CUPTI ``ActivityKind``."""

_CUPTI_KIND = {"kernel": "CONCURRENT_KERNEL", "memcpy": "MEMCPY", "memset": "MEMSET", "runtime": "RUNTIME",
               "driver": "DRIVER"}

GPU_KINDS = frozenset({"kernel", "memcpy", "memset"})
API_KINDS = frozenset({"runtime", "driver"})

RECORD_FIELDS: tuple[str, ...] = (
    "kind", "name", "start_ns", "end_ns", "correlation_id", "device", "device_id", "context_id", "stream",
    "thread", "bytes", "grid", "block", "registers_per_thread", "shared_memory", "copy_kind", "cbid",
)
"""Keys of one record (:meth:`CuptiActivity.records`). ``kind``: ``kernel | memcpy | memset | runtime |
driver``; ``start_ns``/``end_ns``: :func:`time.perf_counter_ns` clock; ``device``: ``"cuda:N"`` (``"cpu"`` for
API calls); ``stream``: CUDA stream id (-1 for API calls); ``thread``: OS thread id of an API call (0 for
device activity); ``bytes``: memcpy/memset size (None otherwise); ``grid``/``block``: ``(x, y, z)`` of a
kernel (None otherwise); ``shared_memory``: static + dynamic bytes of a kernel; ``copy_kind``: ``"HtoD"``...;
``cbid``: the runtime/driver callback id of an API call."""

_COPY_KIND = {0: "Unknown", 1: "HtoD", 2: "DtoH", 3: "HtoA", 4: "AtoH", 5: "AtoA", 6: "AtoD", 7: "DtoA",
              8: "DtoD", 9: "HtoH", 10: "PtoP"}
_MEMORY_KIND = {0: "Unknown", 1: "Pageable", 2: "Pinned", 3: "Device", 4: "Array", 5: "Managed",
                6: "Device Static", 7: "Managed Static"}
_VERSION_SUFFIX = re.compile(r"_v\d+$")


def import_cupti():
    """The ``cupti.cupti`` module of cupti-python; raises FrameworkNotInstalledError naming the extra."""
    try:
        from cupti import cupti  # noqa: PLC0415 - the one place cupti-python is imported
    except ImportError as exc:
        raise FrameworkNotInstalledError(
            f"CUDA kernel tracing needs cupti-python, which is not installed ({first_line(exc)}): {INSTALL_HINT}"
        ) from None
    return cupti


# --------------------------------------------------------------------------------------------- config


@dataclass
class CuptiConfig:
    """kinds: what to record (:data:`ACTIVITY_KINDS`; "driver" adds the driver API calls beneath the runtime
    ones). buffer_size: bytes per activity buffer handed to CUPTI. flush_period_ms: ask CUPTI to deliver
    buffers at least this often (0: when full and at stop). demangle: turn C++ kernel names into readable
    ones with ``c++filt`` when it is on PATH. sync_on_stop: synchronise the current CUDA context before the
    final flush, so kernels still running are recorded."""

    kinds: tuple[str, ...] = ("kernel", "memcpy", "memset", "runtime")
    buffer_size: int = 8 << 20
    flush_period_ms: int = 0
    demangle: bool = True
    sync_on_stop: bool = True

    def __post_init__(self) -> None:
        kinds = (self.kinds,) if isinstance(self.kinds, str) else tuple(self.kinds)
        bad = [k for k in kinds if k not in _CUPTI_KIND]
        if bad:
            raise MlmsError(f"unknown CUPTI activity kind(s) {', '.join(map(repr, bad))}; "
                            f"expected some of {', '.join(ACTIVITY_KINDS)}")
        self.kinds = tuple(dict.fromkeys(kinds))


# --------------------------------------------------------------------------------------------- conversion


@dataclass
class _KindMap:
    """Integer ``ActivityKind`` values -> our kind names, and callback id -> API name, from a cupti module."""

    kinds: dict[int, str]
    runtime_names: dict[int, str]
    driver_names: dict[int, str]

    @classmethod
    def of(cls, cupti) -> "_KindMap":
        ak = cupti.ActivityKind
        kinds = {int(getattr(ak, cname)): ours for ours, cname in _CUPTI_KIND.items()}
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


def convert_activity(activity, kind_map: _KindMap) -> tuple | None:
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


def raw_to_record(raw: tuple, offset_ns: int) -> dict:
    """A tuple from :func:`convert_activity` -> a record dict (:data:`RECORD_FIELDS`), times moved onto the
    :func:`time.perf_counter_ns` clock by adding ``offset_ns``."""
    (kind, name, start, end, corr, dev, ctx, stream, thread, nbytes, grid, block, regs, shmem, ck, cbid) = raw
    return {
        "kind": kind, "name": name, "start_ns": start + offset_ns, "end_ns": end + offset_ns,
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


# --------------------------------------------------------------------------------------------- clock


def clock_anchor(cupti_timestamp, tries: int = 5) -> tuple[int, int, int]:
    """``(perf_counter_ns, cupti_ns, uncertainty_ns)``: the tightest of ``tries`` brackets
    ``perf -> cupti -> perf``, perf taken at the bracket's midpoint. ``cupti_timestamp``: a callable returning
    CUPTI's clock (``cupti.get_timestamp``)."""
    best = None
    for _ in range(max(1, tries)):
        p0 = time.perf_counter_ns()
        c = int(cupti_timestamp())
        p1 = time.perf_counter_ns()
        if best is None or p1 - p0 < best[2]:
            best = ((p0 + p1) // 2, c, p1 - p0)
    return best


# --------------------------------------------------------------------------------------------- the profiler

# CUPTI takes one pair of buffer callbacks per process (the last registered wins): ours are registered at every
# start and route buffers to the CuptiActivity currently recording.
_lock = threading.Lock()
_active: "CuptiActivity | None" = None
_buffer_size = 8 << 20


def _buffer_requested():
    return _buffer_size, 0


def _buffer_completed(activities) -> None:
    prof = _active
    if prof is not None:
        prof._ingest(activities)


class CuptiActivity(Profiler):
    """Records CUDA kernels, memcpy/memset and runtime/driver API calls through CUPTI's activity API.

    >>> prof = CuptiActivity(CuptiConfig(kinds=("kernel", "memcpy", "runtime")))
    >>> prof.start(); model(x); prof.stop()
    >>> recs = prof.records()                       # list of dicts, perf_counter_ns clock
    >>> att = attribute_records(recs, layer_spans)  # which layer launched each kernel
    >>> add_to_tracer(tracer, att)                  # SYSTEM_LIBRARY spans

    Only one CuptiActivity records at a time in a process (CUPTI's activity buffers are process-wide).
    """

    name: ClassVar[str] = "cupti"
    source: ClassVar[str] = "cupti"
    kind: ClassVar[str] = "activity"
    config_class: ClassVar[type] = CuptiConfig

    def __init__(self, config: CuptiConfig | None = None):
        super().__init__(config)
        self._raw: list[tuple] = []
        self._raw_lock = threading.Lock()
        self._kind_map: _KindMap | None = None
        self._enabled: list[int] = []
        self.anchor: tuple[int, int, int] | None = None
        self.stop_anchor: tuple[int, int, int] | None = None
        self.dropped = 0  # records CUPTI delivered incomplete (no end time)
        self.errors: list[str] = []

    # ----------------------------------------------------------------------------------------- probing

    @classmethod
    def available(cls, config: CuptiConfig | None = None) -> tuple[bool, str]:
        try:
            cupti = import_cupti()
        except FrameworkNotInstalledError as exc:
            return False, str(exc)
        try:
            cupti.get_timestamp()  # loads libcupti and the driver
        except Exception as exc:  # noqa: BLE001 - NotSupportedError (no libcuda), cuptiError...
            return False, f"CUPTI cannot run here: {first_line(exc)}"
        count, why = _device_count()
        if count == 0:
            return False, f"CUPTI loaded, but no CUDA device is visible{f' ({why})' if why else ''}"
        kinds = ", ".join((config or CuptiConfig()).kinds)
        where = f"{count} CUDA device(s)" if count else "the CUDA driver"
        return True, f"CUPTI {_cupti_version(cupti)} records {kinds} activity on {where}"

    # ----------------------------------------------------------------------------------------- recording

    def start(self) -> "CuptiActivity":
        global _active, _buffer_size
        if self.running:
            return self
        cupti = import_cupti()
        with _lock:
            if _active is not None and _active is not self:
                raise MlmsError("another CuptiActivity is already recording in this process; stop it first "
                                "(CUPTI's activity buffers are process-wide)")
            self._kind_map = _KindMap.of(cupti)
            _buffer_size = int(self.config.buffer_size)
            # Every start, not once per process: another CUPTI client (Kineto, whenever torch.profiler starts) may
            # have registered its own callbacks since, and CUPTI delivers buffers to the last one registered.
            cupti.activity_register_callbacks(_buffer_requested, _buffer_completed)
            try:  # API records then carry gettid() ids, the ones threading.get_native_id() gives
                cupti.set_thread_id_type(cupti.ActivityThreadIdType.SYSTEM)
            except Exception as exc:  # noqa: BLE001
                self.errors.append(f"set_thread_id_type: {first_line(exc)}")
            self.anchor = clock_anchor(cupti.get_timestamp)
            _active = self
            try:
                for k in self.config.kinds:
                    value = int(getattr(cupti.ActivityKind, _CUPTI_KIND[k]))
                    cupti.activity_enable(value)
                    self._enabled.append(value)
                if self.config.flush_period_ms:
                    cupti.activity_flush_period(int(self.config.flush_period_ms))
            except Exception:
                self._disable(cupti)
                _active = None
                raise
        self.running = True
        return self

    def stop(self) -> "CuptiActivity":
        global _active
        if not self.running:
            return self
        cupti = import_cupti()
        if self.config.sync_on_stop:
            _sync_current_context()
        try:
            cupti.activity_flush_all(int(getattr(cupti.ActivityFlag, "FLUSH_FORCED", 1)))
        finally:
            with _lock:
                self._disable(cupti)
                if self.config.flush_period_ms:
                    try:
                        cupti.activity_flush_period(0)
                    except Exception:  # noqa: BLE001
                        pass
                self.stop_anchor = clock_anchor(cupti.get_timestamp)
                _active = None
            self.running = False
        return self

    def _disable(self, cupti) -> None:
        for value in reversed(self._enabled):
            try:
                cupti.activity_disable(value)
            except Exception as exc:  # noqa: BLE001
                self.errors.append(f"activity_disable({value}): {first_line(exc)}")
        self._enabled = []

    def _ingest(self, activities) -> None:
        """CUPTI's buffer-completed callback (its own thread): copy the fields kept out of the buffer."""
        km = self._kind_map
        out = []
        dropped = 0
        for a in activities:
            try:
                raw = convert_activity(a, km)
            except Exception as exc:  # noqa: BLE001 - one odd record must not lose the buffer
                if len(self.errors) < 10:
                    self.errors.append(f"{type(exc).__name__}: {exc}")
                continue
            if raw is None:
                continue
            if raw[2] == 0 or raw[3] == 0 or raw[3] < raw[2]:
                dropped += 1  # incomplete: CUPTI had no timestamp for it
                continue
            out.append(raw)
        with self._raw_lock:
            self._raw.extend(out)
            self.dropped += dropped

    # ----------------------------------------------------------------------------------------- results

    @property
    def offset_ns(self) -> int:
        """perf_counter_ns - CUPTI ns, from the start anchor."""
        if self.anchor is None:
            raise MlmsError("CuptiActivity has not been started: no clock anchor yet")
        return self.anchor[0] - self.anchor[1]

    def records(self) -> list[dict]:
        """The activity recorded so far, as dicts (:data:`RECORD_FIELDS`), sorted by start time, on the
        :func:`time.perf_counter_ns` clock."""
        with self._raw_lock:
            raw = list(self._raw)
        if not raw:
            return []
        offset = self.offset_ns
        recs = [raw_to_record(r, offset) for r in raw]
        if self.config.demangle:
            names = demangle(r["name"] for r in recs if r["kind"] == "kernel")
            for r in recs:
                if r["kind"] == "kernel":
                    r["name"] = names.get(r["name"], r["name"])
        recs.sort(key=lambda r: (r["start_ns"], r["kind"] not in API_KINDS))
        return recs

    def records_frame(self):
        """:meth:`records` as a DataFrame (:func:`records_frame`)."""
        return records_frame(self.records())

    def counters(self) -> list[Row]:
        """CUPTI records spans, not counters: always empty (kept for the profiler interface)."""
        return []

    @property
    def metadata(self) -> dict[str, Any]:
        """What a trace should keep about this recording: kinds, clock anchors and drift, dropped records."""
        meta: dict[str, Any] = {"kinds": list(self.config.kinds), "records": len(self._raw),
                                "dropped": self.dropped}
        if self.anchor is not None:
            meta["clock"] = {"name": "cupti.get_timestamp", "offset_to_perf_ns": self.offset_ns,
                             "anchor_uncertainty_ns": self.anchor[2]}
            if self.stop_anchor is not None:
                meta["drift_ns"] = (self.stop_anchor[0] - self.stop_anchor[1]) - self.offset_ns
        if self.errors:
            meta["errors"] = list(self.errors)
        return meta

    def clear(self) -> None:
        with self._raw_lock:
            self._raw = []
            self.dropped = 0


def _device_count() -> tuple[int | None, str]:
    """CUDA devices visible through cuda-bindings' driver API (a cupti-python dependency); (None, why) when
    it cannot say."""
    try:
        from cuda.bindings import driver  # noqa: PLC0415
    except ImportError:
        try:
            from cuda import cuda as driver  # noqa: PLC0415 - cuda-python < 12.6
        except ImportError as exc:
            return None, first_line(exc)
    try:
        (err,) = driver.cuInit(0)
        if int(err) != 0:
            return 0, f"cuInit failed: {getattr(err, 'name', err)}"
        err, count = driver.cuDeviceGetCount()
        if int(err) != 0:
            return 0, f"cuDeviceGetCount failed: {getattr(err, 'name', err)}"
        return int(count), ""
    except Exception as exc:  # noqa: BLE001
        return None, first_line(exc)


def _sync_current_context() -> None:
    """cuCtxSynchronize on this thread's current context, if there is one (errors ignored)."""
    try:
        from cuda.bindings import driver  # noqa: PLC0415
        err, ctx = driver.cuCtxGetCurrent()
        if int(err) == 0 and int(ctx) != 0:
            driver.cuCtxSynchronize()
    except Exception:  # noqa: BLE001
        pass


def _cupti_version(cupti) -> str:
    try:
        from importlib.metadata import version  # noqa: PLC0415

        return version("cupti-python")
    except Exception:  # noqa: BLE001
        return ""


# --------------------------------------------------------------------------------------------- pure analysis


def records_frame(records: Iterable[Mapping] | Any):
    """Records (dicts) -> a DataFrame with one column per :data:`RECORD_FIELDS` key (plus any extra keys),
    typed: times/ids int64, ``bytes`` float64 (NaN where none)."""
    import numpy as np
    import pandas as pd

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


def _layer_columns(layers):
    import numpy as np

    sid = layers["span_id"].to_numpy(np.int64)
    start = layers["start_ns"].to_numpy(np.int64)
    end = layers["end_ns"].to_numpy(np.int64)
    thread = layers["thread"].to_numpy(np.int64) if "thread" in layers.columns else np.zeros(len(sid), np.int64)
    names = layers["name"].astype(str).to_numpy(object) if "name" in layers.columns else \
        np.full(len(sid), "", object)
    return sid, start, end, thread, names


def _innermost(l_group, l_start, l_end, q_group, q_start, q_end):
    """For each query interval, the index of the innermost layer interval of the same group containing it
    (``start <= q.start`` and ``q.end <= end``), or -1.

    Layers are sorted by ``(start, -end)``; a query's candidate is the last layer starting at or before it (the
    deepest one open at that instant, or one that ended before it, whose enclosing layers are its ancestors);
    the answer is the first of the candidate and its ancestors (:func:`containment_parents`) that still covers
    the query's end. Vectorised per group: one searchsorted and a climb as deep as the layer tree.
    """
    import numpy as np

    from mlms_nb.tracing._build import containment_parents

    out = np.full(len(q_start), -1, np.int64)
    if len(q_start) == 0 or len(l_start) == 0:
        return out
    parent = containment_parents(l_group, l_start, l_end)
    for g in np.unique(q_group):
        lrows = np.flatnonzero(l_group == g)
        if not len(lrows):
            continue
        qrows = np.flatnonzero(q_group == g)
        order = lrows[np.lexsort((-l_end[lrows], l_start[lrows]))]
        pos = np.searchsorted(l_start[order], q_start[qrows], side="right") - 1
        cand = np.where(pos >= 0, order[np.maximum(pos, 0)], -1)
        active = np.flatnonzero(cand >= 0)
        while len(active):
            short = l_end[cand[active]] < q_end[qrows[active]]
            active = active[short]
            if not len(active):
                break
            cand[active] = parent[cand[active]]
            active = active[cand[active] >= 0]
        out[qrows] = cand
    return out


def attribute_records(records, layer_spans_frame):
    """Assign each record to the layer span that caused it.

    ``records``: dicts from :meth:`CuptiActivity.records` (or their :func:`records_frame`).
    ``layer_spans_frame``: the spans to attribute to -- typically a trace's FRAMEWORK-level ``layer`` spans
    (columns ``span_id, start_ns, end_ns`` and, when present, ``thread`` and ``name``), on the same clock.
    The innermost containing span wins, so pass only the spans that should receive kernels.

    - API calls (runtime/driver): the innermost layer span containing the call on the same OS thread (on any
      thread when the call's thread is not among the layers'); ``attribution = "cpu"``.
    - Kernels, memcpy, memset: the layer of the API call with the same ``correlation_id``
      (``"correlation"``), else the innermost layer span containing the activity's own device interval
      (``"time"``: right when execution is synchronous, e.g. layers bracketed by synchronisation), else none.

    Returns the records frame with ``layer_span_id`` (0: none), ``layer_name`` ("" for none) and
    ``attribution`` (``cpu | correlation | time | none``) added; rows in the order given.
    """
    import numpy as np

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

    # 1. API calls: CPU containment, by thread where the thread is known to the layers
    is_api = np.isin(kind, list(API_KINDS))
    known = is_api & np.isin(thread, l_thread)
    rows = np.flatnonzero(known)
    if len(rows):
        layer_idx[rows] = _innermost(l_thread, l_start, l_end, thread[rows], start[rows], end[rows])
    rows = np.flatnonzero(is_api & ~known)
    if len(rows):
        z = np.zeros(len(sid), np.int64)
        layer_idx[rows] = _innermost(z, l_start, l_end, np.zeros(len(rows), np.int64), start[rows], end[rows])
    method = np.full(n, "none", object)
    method[is_api & (layer_idx >= 0)] = "cpu"

    # 2. device activity: by correlation id (runtime calls preferred over driver calls with the same id)
    is_gpu = np.isin(kind, list(GPU_KINDS))
    by_corr: dict[int, int] = {}
    for i in np.flatnonzero(is_api & (layer_idx >= 0) & (corr != 0)):
        c = int(corr[i])
        if c not in by_corr or kind[i] == "runtime":
            by_corr[c] = int(layer_idx[i])
    if by_corr:
        for i in np.flatnonzero(is_gpu):
            j = by_corr.get(int(corr[i]))
            if j is not None:
                layer_idx[i] = j
                method[i] = "correlation"

    # 3. the rest: time containment of the device interval (threads do not apply)
    rows = np.flatnonzero(is_gpu & (layer_idx < 0))
    if len(rows):
        z = np.zeros(len(sid), np.int64)
        got = _innermost(z, l_start, l_end, np.zeros(len(rows), np.int64), start[rows], end[rows])
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


def _span_kind(kind: str) -> str:
    return "runtime" if kind in API_KINDS else kind


def add_to_tracer(tracer, records, layer_span_ids: Sequence[int] | Any = None, *, link: str = "runtime",
                  metadata: Mapping[str, Any] | None = None) -> list[int]:
    """Record CUPTI activity in ``tracer`` as SYSTEM_LIBRARY spans; returns the new span ids (0 for a record
    the tracer's level drops), in the order of ``records``.

    ``records``: dicts from :meth:`CuptiActivity.records`, or the frame :func:`attribute_records` returns
    (then its ``layer_span_id`` column is used when ``layer_span_ids`` is None).
    ``layer_span_ids``: one parent span id per record (0: none), or the :func:`attribute_records` frame;
    None: every record is a root unless ``records`` is that frame.
    ``link``: ``"runtime"`` (default) makes a kernel/memcpy/memset the child of the API call that launched it
    (same ``correlation_id``) when that call is recorded too -- the layer is then its grandparent, as in a
    PyTorch Kineto trace; ``"layer"`` makes it the layer span's child directly.

    Spans: kind ``kernel | memcpy | memset | runtime`` (driver calls are ``runtime`` with ``attrs.api =
    "driver"``); ``device`` (``cuda:N`` / ``cpu``), ``stream``, ``bytes`` (memcpy/memset), ``thread`` (the OS
    thread of an API call; the stream of device activity, as Chrome/Kineto traces file it); ``correlation``
    (the id column; -1 for CUPTI's 0, no correlation); ``attrs``: ``grid``, ``block``, ``registers_per_thread``, ``shared_memory``, ``copy_kind``,
    ``cbid``, ``layer_span_id``. ``metadata`` (e.g. :attr:`CuptiActivity.metadata`) is stored as
    ``tracer.metadata["cupti"]``.
    """
    import numpy as np
    import pandas as pd

    from mlms_nb.schema.levels import TraceLevel

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
    ids = [0] * n
    if n == 0:
        return ids
    cols = {c: df[c].tolist() for c in df.columns}
    api_by_corr: dict[int, int] = {}

    def fields(i: int) -> dict:
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

    kinds = cols["kind"]
    order = sorted(range(n), key=lambda i: kinds[i] not in API_KINDS)  # API calls first: kernels link to them
    for i in order:
        kind = kinds[i]
        f = fields(i)
        parent = int(parents[i])
        if kind in API_KINDS:
            if kind == "driver":
                f["api"] = "driver"
            sid = tracer.add_span(cols["name"][i], level, "runtime", cols["start_ns"][i], cols["end_ns"][i],
                                  parent_id=parent, thread=int(cols["thread"][i]), **f)
            c = int(cols["correlation_id"][i])
            if sid and c and (c not in api_by_corr or kind == "runtime"):
                api_by_corr[c] = sid
        else:
            if parent:
                f["layer_span_id"] = parent
            if link == "runtime":
                parent = api_by_corr.get(int(cols["correlation_id"][i]), parent)
            sid = tracer.add_span(cols["name"][i], level, _span_kind(kind), cols["start_ns"][i],
                                  cols["end_ns"][i], parent_id=parent, thread=int(cols["stream"][i]), **f)
        ids[i] = sid
    return ids


__all__ = [
    "ACTIVITY_KINDS", "CuptiActivity", "CuptiConfig", "RECORD_FIELDS", "add_to_tracer", "attribute_records",
    "clock_anchor", "convert_activity", "demangle", "import_cupti", "raw_to_record", "records_frame",
]
