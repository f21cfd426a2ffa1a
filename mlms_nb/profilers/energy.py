"""Energy of one measured window (a timed loop): RAPL through Linux powercap for CPUs, NVML for NVIDIA GPUs.

``meter = energy_meter("cpu")`` (or ``"cuda:0"``); ``meter.start()``; the work; ``reading = meter.stop()``:
an :class:`EnergyReading` with the joules spent in the window, how they were measured (``method``) and, when they
could not be, why (``why_not``; joules are then NaN, never 0).

- **CPU, RAPL** (``/sys/class/powercap/intel-rapl:*``, also AMD's RAPL on recent kernels): the ``package-*`` zones
  (cores, caches, uncore) plus their ``dram`` sub-zones where the CPU has them; ``psys`` is left out, as it
  already holds the others. Each zone's ``energy_uj`` counter wraps at ``max_energy_range_uj``: one wrap per zone
  and window is undone (a window long enough to wrap twice, hours at full power, is flagged). The whole machine's
  packages are counted: other processes' work is in the figure, so it is energy *during* the window, not *of*
  the model alone; ``method`` says so. Reading ``energy_uj`` needs root on kernels since 5.10 (CVE-2020-8694).
- **NVIDIA GPU, NVML**: ``nvmlDeviceGetTotalEnergyConsumption`` (mJ since the driver loaded; Volta and newer)
  updates only every 20-100 ms, so it is used for windows of at least ``COUNTER_MIN_S`` (1 s); shorter windows
  integrate power samples taken every ``POWER_INTERVAL_S`` (trapezoids, "power x time"). ``method`` names which.
"""
from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass
from pathlib import Path

POWERCAP = Path("/sys/class/powercap")
COUNTER_MIN_S = 1.0
POWER_INTERVAL_S = 0.01


@dataclass(frozen=True)
class EnergyReading:
    """Joules spent during one window (NaN when unavailable), how they were measured, and why not."""
    joules: float
    method: str
    seconds: float = float("nan")
    why_not: str | None = None

    def per(self, count: int) -> float:
        """Joules per item (per inference) over ``count`` items; NaN when unknown or ``count`` is 0."""
        return self.joules / count if count and math.isfinite(self.joules) else float("nan")

    def as_columns(self, inputs: int) -> dict:
        """The latency row's energy columns: ``energy_j`` (the window), ``energy_j_per_input``, ``energy_method``."""
        return {"energy_j": float(self.joules), "energy_j_per_input": self.per(inputs),
                "energy_method": self.method if self.why_not is None else f"unavailable: {self.why_not}"}


class EnergyMeter:
    """Base: ``available()`` says whether it can measure here and, if not, why; ``start()``/``stop()``."""

    method = ""

    def __init__(self):
        self._t0 = 0.0

    def available(self) -> tuple[bool, str]:
        raise NotImplementedError

    def start(self) -> None:
        self._t0 = time.perf_counter()

    def stop(self) -> EnergyReading:
        raise NotImplementedError


class Unavailable(EnergyMeter):
    """Says why no energy is measured; reads NaN."""

    def __init__(self, why: str):
        super().__init__()
        self.why = why

    def available(self) -> tuple[bool, str]:
        return False, self.why

    def stop(self) -> EnergyReading:
        return EnergyReading(float("nan"), "", time.perf_counter() - self._t0, self.why)


@dataclass(frozen=True)
class _Zone:
    name: str
    counter: Path
    range_uj: int


def rapl_zones(root: Path = POWERCAP) -> tuple[list[_Zone], str | None]:
    """The package zones (and their dram sub-zones) under ``root``, or why there are none to read."""
    if not root.is_dir():
        return [], f"the kernel exposes no power-capping interface ({root} does not exist: no RAPL driver, or a VM)"
    zones: list[_Zone] = []
    unreadable: list[str] = []
    for top in sorted(root.glob("intel-rapl:*")) + sorted(root.glob("amd-rapl:*")):
        if top.name.count(":") != 1:
            continue
        candidates = [top] + sorted(p for p in top.glob(f"{top.name}:*") if _name(p).startswith("dram"))
        for zone in candidates:
            name = _name(zone)
            if not (name.startswith("package") or name.startswith("dram")):
                continue  # psys holds the others
            counter = zone / "energy_uj"
            try:
                counter.read_text()
                span = int((zone / "max_energy_range_uj").read_text())
            except PermissionError:
                unreadable.append(str(counter))
                continue
            except (OSError, ValueError):
                continue
            zones.append(_Zone(f"{top.name}/{name}" if zone is not top else name, counter, span))
    if zones:
        return zones, None
    if unreadable:
        return [], (f"RAPL's counters are readable only by root on this kernel ({unreadable[0]}); run as root or "
                    "grant read access to energy_uj")
    return [], f"no RAPL package zone under {root} (a CPU or kernel without RAPL)"


def _name(zone: Path) -> str:
    try:
        return (zone / "name").read_text().strip()
    except OSError:
        return ""


class RaplMeter(EnergyMeter):
    """CPU packages (and DRAM) through RAPL's energy counters."""

    def __init__(self, root: Path = POWERCAP):
        super().__init__()
        self.zones, self.why = rapl_zones(root)
        names = "+".join(z.name for z in self.zones)
        self.method = (f"RAPL {names} (whole CPU packages: other processes' work in the window counts too)"
                       if self.zones else "")
        self._start: list[int] = []

    def available(self) -> tuple[bool, str]:
        return (True, self.method) if self.zones else (False, self.why or "no RAPL")

    def _read(self) -> list[int]:
        return [int(z.counter.read_text()) for z in self.zones]

    def start(self) -> None:
        self._start = self._read() if self.zones else []
        super().start()

    def stop(self) -> EnergyReading:
        seconds = time.perf_counter() - self._t0
        if not self.zones:
            return EnergyReading(float("nan"), "", seconds, self.why)
        total_uj = 0
        for zone, before, after in zip(self.zones, self._start, self._read()):
            total_uj += after - before if after >= before else after + zone.range_uj - before  # one wrap undone
        return EnergyReading(total_uj / 1e6, self.method, seconds)


class NvmlEnergyMeter(EnergyMeter):
    """One NVIDIA GPU: NVML's energy counter for windows of 1 s or more, else power samples integrated."""

    def __init__(self, index: int = 0):
        super().__init__()
        self.index = index
        self.why: str | None = None
        self._pynvml = self._handle = None
        self._samples: list[tuple[float, float]] = []
        self._stop_sampling = threading.Event()
        self._thread: threading.Thread | None = None
        self._start_mj: int | None = None
        try:
            from mlms_nb.profilers.nvml import import_pynvml, nvml_init

            pynvml = import_pynvml()
            nvml_init(pynvml)
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            self._pynvml = pynvml
        except Exception as err:  # noqa: BLE001 - no library, no driver, no such GPU: each says why
            self.why = f"NVML cannot read GPU {index} ({str(err).splitlines()[0] if str(err) else type(err).__name__})"

    def available(self) -> tuple[bool, str]:
        return (self.why is None, self.why or "NVML energy counter / power x time")

    def _energy_mj(self) -> int | None:
        try:
            return int(self._pynvml.nvmlDeviceGetTotalEnergyConsumption(self._handle))
        except Exception:  # noqa: BLE001 - pre-Volta GPUs have no counter
            return None

    def _power_w(self) -> float:
        return self._pynvml.nvmlDeviceGetPowerUsage(self._handle) / 1000.0

    def _sample(self) -> None:
        while not self._stop_sampling.wait(POWER_INTERVAL_S):
            self._samples.append((time.perf_counter(), self._power_w()))

    def start(self) -> None:
        if self.why is not None:
            return super().start()
        self._start_mj = self._energy_mj()
        self._samples = []
        self._stop_sampling.clear()
        super().start()
        self._samples.append((self._t0, self._power_w()))
        self._thread = threading.Thread(target=self._sample, name="mlms-nvml-energy", daemon=True)
        self._thread.start()

    def stop(self) -> EnergyReading:
        seconds = time.perf_counter() - self._t0
        if self.why is not None:
            return EnergyReading(float("nan"), "", seconds, self.why)
        self._stop_sampling.set()
        if self._thread is not None:
            self._thread.join()
        self._samples.append((time.perf_counter(), self._power_w()))
        end_mj = self._energy_mj()
        if seconds >= COUNTER_MIN_S and self._start_mj is not None and end_mj is not None:
            return EnergyReading((end_mj - self._start_mj) / 1e3,
                                 f"NVML energy counter, GPU {self.index} (updates every 20-100 ms; window "
                                 f"{seconds:.1f} s)", seconds)
        return EnergyReading(integrate_power(self._samples),
                             f"NVML power x time, GPU {self.index} ({len(self._samples)} samples every "
                             f"{POWER_INTERVAL_S * 1e3:.0f} ms; the window is too short for the energy counter)",
                             seconds)


def integrate_power(samples: list[tuple[float, float]]) -> float:
    """Joules from ``(seconds, watts)`` samples in time order (trapezoids)."""
    return float(sum((t1 - t0) * (p0 + p1) / 2 for (t0, p0), (t1, p1) in zip(samples, samples[1:])))


def energy_meter(device: str = "cpu", root: Path = POWERCAP) -> EnergyMeter:
    """The meter for ``device`` (``cpu``, ``cuda`` or ``cuda:N``): RAPL, NVML, or one that says why not."""
    if device.startswith("cuda"):
        index = int(device.split(":", 1)[1]) if ":" in device else 0
        meter: EnergyMeter = NvmlEnergyMeter(index)
    else:
        meter = RaplMeter(root)
    ok, why = meter.available()
    return meter if ok else Unavailable(why)
