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
- Times: CUPTI stamps records on its own ns clock (the one ``cupti.get_timestamp()`` reads), or on another
  client's: PyTorch's profiler registers a timestamp callback (the CPU's tick counter) whenever it starts on a GPU
  machine. So the mapping to :func:`time.perf_counter_ns`, the tracer's clock, is measured from calibration calls
  recorded at start and at stop (:mod:`mlms_nb.profilers.cupti_clock`); an anchor pair ``(perf_counter_ns,
  get_timestamp)`` is the fallback when CUPTI recorded none. ``metadata["clock"]`` says which was used, and
  ``metadata["clock_check"]`` counts the API calls (of any thread) that the mapping puts outside the recording
  (0 when the mapping holds).

:meth:`CuptiActivity.records` gives the recording as plain dicts
(:data:`~mlms_nb.tracing.cuda_activity.RECORD_FIELDS`; the activity objects are converted by
:mod:`mlms_nb.profilers.cupti_convert`). Everything after that is pure trace processing in
:mod:`mlms_nb.tracing.cuda_activity` -- which layer launched each record, spans in a tracer -- tested on recorded
activity where there is no GPU.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, ClassVar

from mlms_nb.errors import FrameworkNotInstalledError, MlmsError
from mlms_nb.profilers._base import Profiler, Row, first_line
from mlms_nb.profilers.cupti_clock import ClockMap, bracket_calls, clock_anchor, fit_clock
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
        # calibration calls (cupti_clock): perf brackets at start and at stop, the threads that made them, the
        # callback id CUPTI records them under
        self._calibration: dict[str, list] = {"start": [], "stop": []}
        self._calibration_threads: set[int] = set()
        self._calibration_cbid: int | None = None
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
            # have registered its own callbacks since, and CUPTI delivers buffers to the last one registered. First
            # a forced flush, so that every buffer that client was handed goes back to it: delivered to ours,
            # cupti-python frees memory it did not allocate (on an H200: a SIGSEGV or "double free or corruption"
            # at exit of every process that ran torch.profiler before this recorder).
            cupti.activity_flush_all(int(getattr(cupti.ActivityFlag, "FLUSH_FORCED", 1)))
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
            self._calibrate(cupti, "start")
        self.running = True
        return self

    def stop(self) -> "CuptiActivity":
        global _active
        if not self.running:
            return self
        cupti = import_cupti()
        if self.config.sync_on_stop:
            _sync_current_context()
        self._calibrate(cupti, "stop")
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

    def _calibrate(self, cupti, when: str) -> None:
        """Make the calibration calls (:mod:`mlms_nb.profilers.cupti_clock`), with CUPTI's driver API records on
        for them; errors are kept in :attr:`errors` (the anchor is the fallback)."""
        driver = _driver_module()
        names = self._kind_map.driver_names if self._kind_map else {}
        cbid = next((k for k, v in names.items() if v == "cuDriverGetVersion"), None)
        if driver is None or cbid is None:
            self.errors.append("no clock calibration: cuda-bindings' driver API or cuDriverGetVersion's callback id "
                               "is missing")
            return
        kind = int(getattr(cupti.ActivityKind, CUPTI_KIND["driver"]))
        own = kind not in self._enabled
        try:
            if own:
                cupti.activity_enable(kind)
            try:
                self._calibration[when] = bracket_calls(driver.cuDriverGetVersion)
            finally:
                if own:
                    cupti.activity_disable(kind)
        except Exception as exc:  # noqa: BLE001
            self.errors.append(f"clock calibration at {when}: {first_line(exc)}")
            return
        self._calibration_cbid = cbid
        self._calibration_threads.add(threading.get_native_id())

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

    def _split_calibration(self, raw: list[tuple]) -> tuple[list[tuple], ClockMap]:
        """The records without the calibration calls (and without driver calls when "driver" was not asked
        for), and the clock mapping: fitted from the calibration calls' records, else the start anchor."""
        if self.anchor is None:
            raise MlmsError("CuptiActivity has not been started: no clock anchor yet")
        cbid, threads = self._calibration_cbid, self._calibration_threads
        mine = sorted((r for r in raw if r[0] == "driver" and r[15] == cbid and r[8] in threads),
                      key=lambda r: r[2]) if cbid is not None else []
        n_start, n_stop = len(self._calibration["start"]), len(self._calibration["stop"])
        clock = None
        if n_start and len(mine) >= n_start + n_stop:
            first, last = mine[:n_start], mine[len(mine) - n_stop:] if n_stop else []
            clock = fit_clock(self._calibration["start"], [(r[2], r[3]) for r in first],
                              self._calibration["stop"], [(r[2], r[3]) for r in last])
            drop = {id(r) for r in first + last}
            raw = [r for r in raw if id(r) not in drop]
        if "driver" not in self.config.kinds:
            raw = [r for r in raw if r[0] != "driver"]
        return raw, clock or ClockMap.from_anchor(self.anchor)

    def clock(self) -> ClockMap:
        """How record times are moved onto perf_counter_ns (see :mod:`mlms_nb.profilers.cupti_clock`)."""
        with self._raw_lock:
            raw = list(self._raw)
        return self._split_calibration(raw)[1]

    def records(self) -> list[dict]:
        """The activity recorded so far, as dicts (:data:`~mlms_nb.tracing.cuda_activity.RECORD_FIELDS`), sorted
        by start time, on the :func:`time.perf_counter_ns` clock."""
        with self._raw_lock:
            raw = list(self._raw)
        if not raw:
            return []
        raw, clock = self._split_calibration(raw)
        recs = [raw_to_record(r, clock.to_perf) for r in raw]
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
            with self._raw_lock:
                raw = list(self._raw)
            raw, clock = self._split_calibration(raw)
            meta["records"] = len(raw)
            meta["clock"] = {"name": "cupti.get_timestamp" if clock.how == "anchor" else "cuDriverGetVersion calls",
                             **clock.describe(), "anchor_offset_to_perf_ns": self.offset_ns,
                             "anchor_uncertainty_ns": self.anchor[2]}
            if self.stop_anchor is not None:
                meta["drift_ns"] = (self.stop_anchor[0] - self.stop_anchor[1]) - self.offset_ns
            check = self._clock_check(raw, clock)
            if check is not None:
                meta["clock_check"] = check
            if self._calibration["stop"] and clock.how == "anchor" and not raw:
                meta["warning"] = ("CUPTI delivered no records, not even this recorder's own calibration calls: "
                                   "another CUPTI client took its activity buffers (torch.profiler started after "
                                   "this recorder?), so the kernels of this run are missing")
        if self.errors:
            meta["errors"] = list(self.errors)
        return meta

    def _clock_check(self, raw: list[tuple], clock: ClockMap) -> dict | None:
        """The API calls the mapping puts outside the recording (CUPTI records calls only while recording, on every
        thread, so each must lie between the first calibration call and the last): none when the mapping holds."""
        start, stop = self._calibration["start"], self._calibration["stop"]
        if not start or not stop:
            return None
        lo, hi = start[0][0] - clock.uncertainty_ns, stop[-1][1] + clock.uncertainty_ns
        calls = [r for r in raw if r[0] in API_KINDS]
        outside = sum(1 for r in calls if clock.to_perf(r[2]) < lo or clock.to_perf(r[3]) > hi)
        return {"api_calls": len(calls), "outside_recording": outside, "holds": outside == 0,
                "how": "API calls mapped between the first calibration call (at start) and the last (at stop)"}

    def clear(self) -> None:
        with self._raw_lock:
            self._raw = []
            self.dropped = 0


def _device_count() -> tuple[int | None, str]:
    """CUDA devices visible through cuda-bindings' driver API (a cupti-python dependency); (None, why) when
    it cannot say."""
    driver = _driver_module()
    if driver is None:
        return None, "cuda-bindings' driver API cannot be imported"
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


def _driver_module():
    """cuda-bindings' driver API module (a cupti-python dependency), or None."""
    try:
        from cuda.bindings import driver  # noqa: PLC0415
    except ImportError:
        try:
            from cuda import cuda as driver  # noqa: PLC0415 - cuda-python < 12.6
        except ImportError:
            return None
    return driver


def _sync_current_context() -> None:
    """cuCtxSynchronize on this thread's current context, if there is one (errors ignored)."""
    driver = _driver_module()
    if driver is None:
        return
    try:
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
