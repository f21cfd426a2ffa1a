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

:meth:`CuptiActivity.records` gives the recording as plain dicts
(:data:`~mlms_nb.tracing.cuda_activity.RECORD_FIELDS`; the activity objects are converted by
:mod:`mlms_nb.profilers.cupti_convert`). Everything after that is pure trace processing in
:mod:`mlms_nb.tracing.cuda_activity` -- which layer launched each record, spans in a tracer -- tested on recorded
activity where there is no GPU.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any, ClassVar

from mlms_nb.errors import FrameworkNotInstalledError, MlmsError
from mlms_nb.profilers._base import Profiler, Row, first_line
from mlms_nb.profilers.cupti_convert import CUPTI_KIND, KindMap, convert_activity, demangle, raw_to_record
from mlms_nb.tracing.cuda_activity import API_KINDS, records_frame

INSTALL_HINT = "pip install 'mlms-nb[gpu]'"

ACTIVITY_KINDS: tuple[str, ...] = ("kernel", "memcpy", "memset", "runtime", "driver")
"""What :class:`CuptiConfig` ``kinds`` may name; each maps to a CUPTI ``ActivityKind``."""

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
        bad = [k for k in kinds if k not in CUPTI_KIND]
        if bad:
            raise MlmsError(f"unknown CUPTI activity kind(s) {', '.join(map(repr, bad))}; "
                            f"expected some of {', '.join(ACTIVITY_KINDS)}")
        self.kinds = tuple(dict.fromkeys(kinds))


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
    >>> from mlms_nb.tracing.cuda_activity import add_to_tracer, attribute_records
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
        self._kind_map: KindMap | None = None
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
            self._kind_map = KindMap.of(cupti)
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
                    value = int(getattr(cupti.ActivityKind, CUPTI_KIND[k]))
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
        """The activity recorded so far, as dicts (:data:`~mlms_nb.tracing.cuda_activity.RECORD_FIELDS`), sorted
        by start time, on the :func:`time.perf_counter_ns` clock."""
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
        """:meth:`records` as a DataFrame (:func:`mlms_nb.tracing.cuda_activity.records_frame`)."""
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


__all__ = ["ACTIVITY_KINDS", "CuptiActivity", "CuptiConfig", "clock_anchor", "import_cupti"]
