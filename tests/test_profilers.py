"""System profilers on this machine, for real: perf events, PAPI, NVML, psutil, and the ProfilerSet.

Where a counter cannot exist here (no PMU in a VM, no NVIDIA driver) the test checks the reason it gives
instead; where it can, it checks the counts.
"""
from __future__ import annotations

import mmap
import re
import sys
import threading
import time

import pytest

from mlms_nb.profilers import (
    COUNTER_COLUMNS, PROFILERS, NvmlConfig, NvmlSampler, PapiCounters, PerfEvents, PerfEventsConfig,
    ProfilerSet, PsutilConfig, PsutilSampler, PynvmlReader, availability, start_profilers,
)
from mlms_nb.profilers import nvml as nvml_mod
from mlms_nb.errors import MlmsError
from tests.helpers import spin_cpu

MB = 1 << 20
ERRNO_NAME = re.compile(r"failed with E[A-Z]+")


def wait_for(condition, timeout_s: float = 60.0) -> None:
    """Poll until ``condition()`` holds (a sampler thread has run enough); fails only if it never does."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "the sampler thread did not run within a minute"
        time.sleep(0.005)


def touch_anonymous(nbytes: int) -> mmap.mmap:
    """Map ``nbytes`` of fresh anonymous memory (no huge pages) and write one byte per page."""
    m = mmap.mmap(-1, nbytes)
    if hasattr(mmap, "MADV_NOHUGEPAGE"):
        try:
            m.madvise(mmap.MADV_NOHUGEPAGE)
        except OSError:
            pass
    for off in range(0, nbytes, mmap.PAGESIZE):
        m[off] = 1
    return m


perf_ok, perf_reason = PerfEvents.available()
needs_perf = pytest.mark.skipif(not perf_ok, reason=f"perf events unavailable: {perf_reason}")


# --- perf events ---------------------------------------------------------------------------------------------


def test_perf_availability_reason_is_a_sentence():
    ok, reason = PerfEvents.available()
    assert isinstance(ok, bool) and reason
    if not sys.platform.startswith("linux"):
        assert not ok and "Linux" in reason
        return
    probe = PerfEvents.probe()
    for name, why in probe.items():
        if why:  # each unavailable event names the syscall, the event and the errno
            assert "perf_event_open(PERF_COUNT_" in why and ERRNO_NAME.search(why), why
            assert name in reason
    if ok:
        assert reason.startswith("counting ") and "perf_event_paranoid=" in reason


@needs_perf
def test_perf_task_clock_counts_a_busy_loop():
    p = PerfEvents(PerfEventsConfig(events=("task-clock", "page-faults"))).start()
    try:
        assert "task-clock" in p.events, p.unavailable_events
        before, cpu0 = p.read(), time.process_time_ns()
        spin_cpu(50)
        after, cpu1 = p.read(), time.process_time_ns()
    finally:
        p.stop()
    tc = after["task-clock"] - before["task-clock"]
    cpu = cpu1 - cpu0
    assert cpu >= 50e6 and tc > 0
    assert abs(tc - cpu) < 0.15 * cpu + 3e6, (tc, cpu)  # what the kernel says the process used, in ns
    assert p.units["task-clock"] == "ns"


@needs_perf
def test_perf_page_faults_count_touched_memory():
    p = PerfEvents(PerfEventsConfig(events=("page-faults", "task-clock"))).start()
    try:
        assert "page-faults" in p.events, p.unavailable_events
        before = p.read()["page-faults"]
        m = touch_anonymous(50 * MB)
        after = p.read()["page-faults"]
        m.close()
    finally:
        p.stop()
    pages = 50 * MB // mmap.PAGESIZE
    assert after - before >= 0.9 * pages, (after - before, pages)


@needs_perf
def test_perf_counts_threads_started_before_and_after_start():
    go = threading.Event()
    early = threading.Thread(target=lambda: (go.wait(), spin_cpu(60)))
    early.start()
    p = PerfEvents(PerfEventsConfig(events=("task-clock",))).start()
    try:
        assert len(p.threads) >= 2  # this thread and the early one
        base = p.read()["task-clock"]
        go.set()
        early.join()
        after_early = p.read()["task-clock"]
        late = threading.Thread(target=spin_cpu, args=(60,))
        late.start()
        late.join()
        after_late = p.read()["task-clock"]
    finally:
        p.stop()
    assert after_early - base > 30e6, "a thread running before start() was not counted"
    assert after_late - after_early > 30e6, "a thread started after start() was not counted (inherit)"


@needs_perf
def test_perf_hardware_events_count_or_say_why_not():
    p = PerfEvents().start()
    try:
        spin_cpu(10)
        values = p.read()
    finally:
        p.stop()
    for name in ("cycles", "instructions"):
        if name in p.events:
            assert values[name] > 1e5 or values[name] != values[name]  # counted (NaN: never on the PMU)
        else:
            why = p.unavailable_events[name]
            assert "perf_event_open(PERF_COUNT_HW_" in why and ERRNO_NAME.search(why), why
            if "ENOENT" in why:
                assert "no PMU" in why


@needs_perf
def test_perf_rows_match_the_schema():
    """(What a read() costs is measured by benchmarks/recording_costs.py, not asserted here.)"""
    p = PerfEvents().start()
    try:
        p.read()
        p.read(record=True)
    finally:
        p.stop()
    rows = p.counters()
    assert len(rows) == 3 * len(p.events)   # start (zeros), the recorded read, stop
    ts = [r[0] for r in rows]
    assert ts == sorted(ts) and all(isinstance(t, int) for t in ts)
    assert {r[1] for r in rows} == {"perf"} and {r[5] for r in rows} == {"cpu"}
    assert all(r[3] == 0.0 for r in rows[: len(p.events)])
    assert p.read() == dict(zip(p.events, [r[3] for r in rows[-len(p.events):]]))  # final values


def test_perf_unknown_event_is_a_clear_error():
    with pytest.raises(MlmsError, match="unknown perf event"):
        PerfEvents(PerfEventsConfig(events=("cycles", "bogus")))


# --- PAPI ----------------------------------------------------------------------------------------------------


def test_papi_reports_its_real_status():
    ok, reason = PapiCounters.available()
    assert reason
    if not ok:
        assert "PAPI" in reason or "mlms-nb[papi]" in reason, reason
        if "pip install" not in reason:  # python-papi is here: the reason is PAPI's own error
            assert re.search(r"\(PAPI_E[A-Z]+\)", reason), reason
        with pytest.raises(MlmsError):
            PapiCounters().start()
        return
    p = PapiCounters().start()
    spin_cpu(10)
    mid = p.read()
    p.stop()
    assert mid["PAPI_TOT_INS"] > 0 and mid["PAPI_TOT_CYC"] > 0


def test_papi_missing_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "pypapi", None)  # import pypapi -> ImportError
    ok, reason = PapiCounters.available()
    assert not ok and "pip install 'mlms-nb[papi]'" in reason


# --- NVML ----------------------------------------------------------------------------------------------------

nvml_ok, nvml_reason = NvmlSampler.available()


def test_nvml_reports_status():
    assert nvml_reason
    if not nvml_ok:
        assert "NVML" in nvml_reason or "mlms-nb[gpu]" in nvml_reason, nvml_reason


def test_nvml_missing_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)
    ok, reason = NvmlSampler.available()
    assert not ok and "pip install 'mlms-nb[gpu]'" in reason


@pytest.mark.skipif(not nvml_ok, reason=f"no GPU here: {nvml_reason}")
def test_nvml_samples_a_real_gpu():
    s = NvmlSampler(NvmlConfig(interval_ms=10)).start()
    wait_for(lambda: s.samples >= 5)
    s.stop()
    df = s.counters_frame()
    assert not s.errors, s.errors
    assert s.samples >= 5
    units = dict(zip(df.metric, df.unit))
    for metric, unit in (("memory_used", "bytes"), ("temperature", "C"), ("sm_clock", "MHz")):
        assert units.get(metric) == unit, units
    assert (df[df.metric == "memory_used"].value > 0).all()
    if "power" in units:
        assert units["power"] == "W" and df[df.metric == "power"].value.between(1, 2000).all()
    assert set(df.device) >= {"cuda:0"}


class FakeReader:
    """Stands in for the GPUs where there are none: two devices, a counter that moves, a failure on call 3."""

    def __init__(self):
        self.calls = 0
        self.opened = self.closed = 0

    def open(self):
        self.opened += 1

    def close(self):
        self.closed += 1

    def __call__(self):
        self.calls += 1
        if self.calls == 3:
            raise RuntimeError("GPU fell off the bus")
        return [(f"cuda:{i}", m, v + self.calls, u) for i in (0, 1)
                for m, v, u in (("power", 50.0, "W"), ("gpu_utilization", 10.0, "%"),
                                ("memory_used", 1e9, "bytes"), ("temperature", 40.0, "C"))]


@pytest.mark.skipif(nvml_ok, reason="a GPU is here: the real sampler is tested instead")
def test_nvml_sampler_logic_with_an_injected_reader():
    reader = FakeReader()
    s = NvmlSampler(NvmlConfig(interval_ms=5), reader=reader)
    t0 = time.perf_counter_ns()
    s.start()
    wait_for(lambda: reader.calls >= 6)
    s.stop()
    t1 = time.perf_counter_ns()
    assert reader.opened == 1 and reader.closed == 1
    assert reader.calls >= 7                      # start, the ticks waited for, stop
    assert s.errors == ["RuntimeError: GPU fell off the bus"]  # kept, and sampling went on
    assert s.samples == reader.calls - 1
    df = s.counters_frame()
    assert list(df.columns) == list(COUNTER_COLUMNS)
    assert len(df) == 8 * s.samples
    assert df.ts_ns.between(t0, t1).all() and df.ts_ns.is_monotonic_increasing
    assert set(df.source) == {"nvml"} and set(df.device) == {"cuda:0", "cuda:1"}
    assert dict(zip(df.metric, df.unit)) == {"power": "W", "gpu_utilization": "%", "memory_used": "bytes",
                                             "temperature": "C"}
    power = df[(df.metric == "power") & (df.device == "cuda:0")].value
    assert power.is_monotonic_increasing and power.iloc[0] == 51.0
    assert not s.running and s.reader is reader


class FakeNVMLError(Exception):
    def __init__(self, value):
        super().__init__(value)
        self.value = value


class FakePynvml:
    """The slice of pynvml that PynvmlReader uses; GPU 1 does not support power readings."""

    NVMLError = FakeNVMLError
    NVML_ERROR_NOT_SUPPORTED = 3
    NVML_CLOCK_SM, NVML_CLOCK_MEM, NVML_TEMPERATURE_GPU = 1, 2, 0

    def __init__(self):
        self.inits = self.shutdowns = self.power_calls = 0

    def nvmlInit(self):
        self.inits += 1

    def nvmlShutdown(self):
        self.shutdowns += 1

    def nvmlDeviceGetCount(self):
        return 2

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetName(self, h):
        return b"Fake GPU"

    def nvmlDeviceGetPowerUsage(self, h):
        self.power_calls += 1
        if h == 1:
            raise FakeNVMLError(self.NVML_ERROR_NOT_SUPPORTED)
        return 123_456  # mW

    def nvmlDeviceGetUtilizationRates(self, h):
        return type("U", (), {"gpu": 97, "memory": 40})()

    def nvmlDeviceGetMemoryInfo(self, h):
        return type("M", (), {"used": 2 * 1024**3, "total": 80 * 1024**3})()

    def nvmlSystemGetDriverVersion(self):
        return b"550.54.15"

    def nvmlSystemGetCudaDriverVersion_v2(self):
        return 12040

    def nvmlDeviceGetCudaComputeCapability(self, h):
        if h == 1:
            raise FakeNVMLError(self.NVML_ERROR_NOT_SUPPORTED)
        return (9, 0)

    def nvmlDeviceGetClockInfo(self, h, kind):
        return 1980 if kind == self.NVML_CLOCK_SM else 2619

    def nvmlDeviceGetTemperature(self, h, kind):
        return 61


@pytest.mark.skipif(nvml_ok, reason="a GPU is here: the real sampler is tested instead")
def test_pynvml_reader_converts_units_and_drops_unsupported(monkeypatch):
    fake = FakePynvml()
    monkeypatch.setattr(nvml_mod, "import_pynvml", lambda: fake)
    reader = PynvmlReader().open()
    first, second = reader(), reader()
    reader.close()
    assert fake.inits == 1 and fake.shutdowns == 1
    got = {(d, m): (v, u) for d, m, v, u in first}
    assert got[("cuda:0", "power")] == (123.456, "W")
    assert ("cuda:1", "power") not in got and reader.unsupported["cuda:1"] == {"power"}
    assert got[("cuda:0", "gpu_utilization")] == (97.0, "%")
    assert got[("cuda:1", "memory_utilization")] == (40.0, "%")
    assert got[("cuda:0", "memory_used")] == (2.0 * 1024**3, "bytes")
    assert got[("cuda:0", "sm_clock")] == (1980.0, "MHz") and got[("cuda:0", "memory_clock")] == (2619.0, "MHz")
    assert got[("cuda:1", "temperature")] == (61.0, "C")
    assert len(first) == 7 + 6 and len(second) == 13
    assert fake.power_calls == 3  # GPU 1's unsupported power was tried once, then dropped


@pytest.mark.skipif(nvml_ok, reason="a GPU is here: the real sampler is tested instead")
def test_the_stack_lists_gpus_through_the_nvml_helpers(monkeypatch):
    from mlms_nb import stack

    fake = FakePynvml()
    monkeypatch.setattr(nvml_mod, "import_pynvml", lambda: fake)
    gpus, note = stack.detect_gpus()
    assert note is None and fake.inits == fake.shutdowns == 1
    assert gpus == [{"index": i, "name": "Fake GPU", "memory_bytes": 80 * 1024**3, "driver": "550.54.15",
                     "cuda_driver": "12.4", "cuda_capability": "9.0" if i == 0 else None} for i in (0, 1)]
    ok, reason = NvmlSampler.available()
    assert ok and reason == "NVML sees 2 GPU(s): cuda:0 Fake GPU, cuda:1 Fake GPU"
    monkeypatch.setattr(fake, "nvmlDeviceGetCount", lambda: 0)
    assert stack.detect_gpus() == ([], "NVML found no NVIDIA GPU (the driver is loaded but no device is visible)")


# --- psutil --------------------------------------------------------------------------------------------------


def test_psutil_sampler_sees_rss_grow():
    ok, reason = PsutilSampler.available()
    assert ok, reason
    s = PsutilSampler(PsutilConfig(interval_ms=10)).start()
    m = touch_anonymous(100 * MB)
    spin_cpu(60)
    s.stop()
    m.close()
    df = s.counters_frame()
    rss = df[df.metric == "rss"]
    assert (rss.unit == "bytes").all()
    assert rss.value.iloc[-1] - rss.value.iloc[0] > 90 * MB
    cpu = df[df.metric == "process_cpu"]
    assert (cpu.unit == "%").all() and cpu.value.max() > 0  # how much depends on the machine's load
    assert (df[df.metric == "threads"].value >= 2).all()  # this one and the sampler
    assert df[df.metric == "system_cpu"].value.between(0, 100.01).all()
    if s.uss_enabled:
        assert (df[df.metric == "uss"].unit == "bytes").all()
    assert set(df.source) == {"psutil"} and not s.errors


# --- the registry and ProfilerSet ----------------------------------------------------------------------------


def test_availability_table():
    df = availability()
    assert list(df.columns) == ["profiler", "available", "reason"]
    assert list(df.profiler) == list(PROFILERS) == ["perf", "papi", "nvml", "psutil"]
    assert df.reason.map(bool).all()
    assert bool(df.set_index("profiler").available["psutil"])


def test_start_profilers_collects_a_counters_frame():
    ps = start_profilers(["perf", "papi", "nvml", "psutil"],
                         configs={"psutil": PsutilConfig(interval_ms=10)})
    assert isinstance(ps, ProfilerSet)
    table = availability().set_index("profiler")
    for name in PROFILERS:
        if table.available[name]:
            assert name in ps.profilers, ps.unavailable.get(name)
        else:
            assert ps.unavailable[name] == table.reason[name]
    assert "psutil" in ps.profilers
    m = touch_anonymous(20 * MB)
    spin_cpu(40)
    mid = ps.read()
    ps.stop()
    m.close()
    assert not ps.errors
    df = ps.counters_frame()
    assert list(df.columns) == list(COUNTER_COLUMNS)
    assert str(df.ts_ns.dtype) == "int64" and str(df.value.dtype) == "float64"
    assert df.ts_ns.is_monotonic_increasing
    assert set(df.source) == set(ps.profilers)
    expected_units = {("psutil", "rss"): "bytes", ("psutil", "process_cpu"): "%", ("perf", "task-clock"): "ns",
                      ("perf", "page-faults"): "count", ("nvml", "power"): "W", ("nvml", "memory_used"): "bytes"}
    for (src, metric), unit in expected_units.items():
        sel = df[(df.source == src) & (df.metric == metric)]
        if src in ps.profilers and not sel.empty:
            assert set(sel.unit) == {unit}, (src, metric, set(sel.unit))
    if "perf" in ps.profilers and "task-clock" in ps["perf"].events:
        assert mid["perf"]["task-clock"] > 20e6
    # the unavailable ones are listed with reasons a user can act on
    for name, reason in ps.unavailable.items():
        assert reason and name in PROFILERS
    assert "unavailable" in repr(ps)


def test_start_profilers_rejects_unknown_names():
    with pytest.raises(MlmsError, match="unknown profiler 'cupti2'"):
        start_profilers(["psutil", "cupti2"])
    ps = start_profilers("psutil")
    ps.stop()
    assert ps.names == ["psutil"]


def test_perf_scales_multiplexed_groups_and_flags_unscheduled_ones():
    """The read arithmetic, driven with made-up group reads (a multiplexed PMU cannot be provoked here)."""
    from mlms_nb.profilers.perf_events import _Batch, _Group

    names = ["cycles", "instructions"]
    groups = [_Group(tid, -1, [], names) for tid in (1, 2, 3)]  # fd -1: read_raw falls back to .last
    for g in groups:
        g.last = (2, 0, 0, 0, 0)
    p = PerfEvents(PerfEventsConfig(events=tuple(names)))
    p.events, p.units, p._groups = names, {n: "count" for n in names}, groups
    p._batches = [_Batch(groups, [0, 1])]
    p._batches[0].set_baseline()
    p.running = True
    groups[0].last = (2, 100, 50, 1000, 2000)  # on the PMU half the time: counts double
    groups[1].last = (2, 100, 100, 10, 20)     # all the time
    groups[2].last = (2, 100, 0, 0, 0)         # never scheduled: ignored while others counted
    assert p.read() == {"cycles": 2010.0, "instructions": 4020.0}
    for g in groups:
        g.last = (2, 100, 0, 0, 0)
    values = p.read()
    assert all(v != v for v in values.values())  # enabled, never running: unknown (NaN), not 0
    p.running = False
    p._groups = p._batches = []
