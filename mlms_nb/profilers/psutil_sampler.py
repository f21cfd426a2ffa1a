"""Process and system CPU and memory, sampled on a background thread through psutil (imported lazily here).

Every ``interval_ms`` (default 50): process CPU (% of one core, so 250 means two and a half cores busy),
system CPU (% of all cores), RSS (bytes), USS (bytes; from /proc/<pid>/smaps_rollup, only where one read is
cheap) and the process's thread count. CPU percentages are computed from CPU-time deltas between this
sampler's own samples, so other psutil users do not disturb them; the first sample has none.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import ClassVar

from mlms_nb.errors import FrameworkNotInstalledError
from mlms_nb.profilers._base import BackgroundSampler, Row, first_line

INSTALL_HINT = "pip install psutil"


def import_psutil():
    try:
        import psutil  # noqa: PLC0415 - the one place psutil is imported by the profilers
    except ImportError as exc:
        raise FrameworkNotInstalledError(
            f"process sampling needs psutil, a dependency of mlms-nb that is missing ({first_line(exc)}): "
            f"{INSTALL_HINT}") from None
    return psutil


USS_BUDGET_NS = 2_000_000
""""Cheap": one smaps_rollup read under 2 ms. The kernel walks the page tables under the mmap lock for it, so
it grows with the resident size (about 3 ms for 120 MB) and can stall the observed process's page faults."""


def read_uss(pid: int) -> int | None:
    """Unique set size in bytes (Private_Clean + Private_Dirty + Private_Hugetlb of smaps_rollup), or None."""
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as f:
            data = f.read()
    except OSError:
        return None
    total = 0
    for line in data.splitlines():
        if line.startswith(b"Private_"):
            parts = line.split()
            if len(parts) >= 2:
                total += int(parts[1]) * 1024  # kB
    return total


@dataclass
class PsutilConfig:
    """interval_ms: sampling period. uss: None = sample USS when one read is cheap; True/False forces it.
    pid: the process to watch (None = this one)."""

    interval_ms: float = 50.0
    uss: bool | None = None
    pid: int | None = None


class PsutilSampler(BackgroundSampler):
    """Samples CPU %, RSS, USS and threads of a process (this one by default) and the system CPU %."""

    name: ClassVar[str] = "psutil"
    source: ClassVar[str] = "psutil"
    config_class: ClassVar[type] = PsutilConfig
    device: ClassVar[str] = "cpu"

    def __init__(self, config: PsutilConfig | None = None):
        super().__init__(config)
        self.uss_enabled = False
        self.uss_cost_ns: int | None = None  # what one USS read cost at start(), when tried
        self._proc = None
        self._psutil = None
        self._prev: tuple[int, float, float, float] | None = None  # (ts_ns, process cpu s, system busy, total)

    @classmethod
    def available(cls, config: PsutilConfig | None = None) -> tuple[bool, str]:
        try:
            psutil = import_psutil()
        except FrameworkNotInstalledError as exc:
            return False, str(exc)
        pid = (config.pid if config and config.pid else None) or os.getpid()
        try:
            proc = psutil.Process(pid)
            with proc.oneshot():
                proc.memory_info()
                proc.cpu_times()
                proc.num_threads()
            psutil.cpu_times()
        except Exception as exc:  # noqa: BLE001 - NoSuchProcess, AccessDenied
            return False, f"psutil cannot read process {pid} ({type(exc).__name__}: {first_line(exc)})"
        t = time.perf_counter_ns()
        ok = read_uss(pid) is not None
        cost = time.perf_counter_ns() - t
        if not ok:
            uss = "no USS (no /proc/<pid>/smaps_rollup)"
        elif cost < USS_BUDGET_NS:
            uss = f"USS ({cost / 1e6:.2f} ms a read)"
        else:
            uss = (f"no USS by default (one smaps_rollup read takes {cost / 1e6:.1f} ms, over the "
                   f"{USS_BUDGET_NS / 1e6:.0f} ms budget; PsutilConfig(uss=True) forces it)")
        return True, f"psutil {psutil.__version__} samples CPU %, RSS, {uss} and threads of process {pid}"

    def _open(self) -> None:
        psutil = import_psutil()
        self._psutil = psutil
        pid = self.config.pid or os.getpid()
        self._proc = psutil.Process(pid)
        self._prev = None
        if self.config.uss is False:
            self.uss_enabled = False
        else:
            t = time.perf_counter_ns()
            ok = read_uss(pid) is not None
            self.uss_cost_ns = time.perf_counter_ns() - t
            cheap = self.uss_cost_ns < USS_BUDGET_NS
            self.uss_enabled = ok and (cheap or bool(self.config.uss))

    def _sample(self, ts_ns: int) -> list[Row]:
        proc, psutil = self._proc, self._psutil
        with proc.oneshot():
            ct = proc.cpu_times()
            mem = proc.memory_info()
            threads = proc.num_threads()
        st = psutil.cpu_times()
        total = sum(st)
        idle = st.idle + getattr(st, "iowait", 0.0)
        # guest time is already counted in user time on Linux
        total -= getattr(st, "guest", 0.0) + getattr(st, "guest_nice", 0.0)
        busy = total - idle
        pcpu = ct.user + ct.system
        src, dev = self.source, self.device
        rows: list[Row] = [
            (ts_ns, src, "rss", float(mem.rss), "bytes", dev),
            (ts_ns, src, "threads", float(threads), "count", dev),
        ]
        if self.uss_enabled:
            uss = read_uss(proc.pid)
            if uss is not None:
                rows.append((ts_ns, src, "uss", float(uss), "bytes", dev))
        prev = self._prev
        if prev is not None:
            dt = (ts_ns - prev[0]) / 1e9
            if dt > 0:
                rows.append((ts_ns, src, "process_cpu", 100.0 * (pcpu - prev[1]) / dt, "%", dev))
            d_total = total - prev[3]
            if d_total > 0:
                share = min(max((busy - prev[2]) / d_total, 0.0), 1.0)  # iowait can step back
                rows.append((ts_ns, src, "system_cpu", 100.0 * share, "%", dev))
        self._prev = (ts_ns, pcpu, busy, total)
        return rows
