"""Energy per inference (issue 26 item 3): RAPL through powercap for CPUs, NVML for GPUs, and "why not" where
neither is readable; ``energy_j`` is a column of every evaluation's latency rows."""
from __future__ import annotations

import math
import time
from pathlib import Path

from mlms_nb.profilers.energy import POWERCAP, RaplMeter, energy_meter, integrate_power


def _zone(root: Path, name: str, label: str, energy_uj: int, range_uj: int = 262_143_328_850) -> Path:
    zone = root / name
    zone.mkdir(parents=True)
    (zone / "name").write_text(label + "\n")
    (zone / "energy_uj").write_text(f"{energy_uj}\n")
    (zone / "max_energy_range_uj").write_text(f"{range_uj}\n")
    return zone


def test_rapl_counts_packages_and_dram_once_and_undoes_a_wrap(tmp_path):
    """A powercap tree laid out as the kernel lays it out (two packages, a dram sub-zone, a core sub-zone that the
    package already holds, and psys, which holds everything): the meter reads the counters before and after."""
    p0 = _zone(tmp_path, "intel-rapl:0", "package-0", 1_000_000)
    _zone(p0, "intel-rapl:0:0", "core", 500)
    dram = _zone(p0, "intel-rapl:0:1", "dram", 2_000_000)
    p1 = _zone(tmp_path, "intel-rapl:1", "package-1", 999_000, range_uj=1_000_000)  # about to wrap
    _zone(tmp_path, "intel-rapl:2", "psys", 7)
    meter = RaplMeter(tmp_path)
    assert meter.available()[0] and "package-0" in meter.method and "dram" in meter.method
    assert [z.name for z in meter.zones] == ["package-0", "intel-rapl:0/dram", "package-1"]
    meter.start()
    (p0 / "energy_uj").write_text("3500000\n")        # +2.5 J
    (dram / "energy_uj").write_text("2250000\n")      # +0.25 J
    (p1 / "energy_uj").write_text("4000\n")           # wrapped: +5,000 µJ
    (tmp_path / "intel-rapl:2" / "energy_uj").write_text("9999999999\n")  # psys: not counted
    reading = meter.stop()
    assert math.isclose(reading.joules, 2.5 + 0.25 + 0.005) and reading.why_not is None
    assert math.isclose(reading.per(10), reading.joules / 10)
    columns = reading.as_columns(inputs=5)
    assert math.isclose(columns["energy_j_per_input"], reading.joules / 5) and "RAPL" in columns["energy_method"]


def test_without_rapl_or_a_gpu_energy_is_nan_with_why(tmp_path):
    for meter in (energy_meter("cpu", root=tmp_path / "absent"), energy_meter("cpu", root=tmp_path)):
        ok, why = meter.available()
        assert not ok and why
        meter.start()
        reading = meter.stop()
        assert math.isnan(reading.joules) and reading.why_not == why
        assert reading.as_columns(4)["energy_method"] == f"unavailable: {why}"
    if not POWERCAP.is_dir():  # this machine: the reason names the missing interface
        assert "powercap" in energy_meter("cpu").available()[1]
    gpu = energy_meter("cuda:7")
    if not gpu.available()[0]:
        assert "GPU 7" in gpu.available()[1]


def test_power_samples_integrate_by_trapezoids():
    t0 = time.perf_counter()
    assert math.isclose(integrate_power([(t0, 100.0), (t0 + 0.5, 200.0), (t0 + 1.5, 200.0)]), 75.0 + 200.0)
    assert integrate_power([(t0, 50.0)]) == 0.0


def test_every_timed_loop_carries_its_energy_columns(real_evaluation):
    latency = real_evaluation.latency
    assert {"energy_j", "energy_j_per_input", "energy_method"} <= set(latency.columns)
    text = str(real_evaluation)
    assert "Energy" in text
    if latency["energy_j"].isna().all():
        assert all(m.startswith("unavailable: ") for m in latency["energy_method"])
    else:
        assert (latency["energy_j_per_input"] > 0).all() and "J per input" in text
