"""System samplers and counters; each says whether it is available here and, if not, why.

>>> from mlms_nb.profilers import availability, start_profilers
>>> availability()                                   # profiler, available, reason
>>> ps = start_profilers(["perf", "psutil", "nvml"])  # starts the available ones
>>> ...                                              # the work to observe
>>> ps.stop(); ps.counters_frame(); ps.unavailable   # rows ts_ns, source, metric, value, unit, device

=========  ===========================  ==========================================================
name       class                        what
=========  ===========================  ==========================================================
perf       PerfEvents (counter)         perf_event_open: task-clock, page faults, ...; cycles,
                                        instructions, cache and branch misses where a PMU exists
papi       PapiCounters (counter)       PAPI presets (PAPI_TOT_INS, PAPI_TOT_CYC) via python-papi
nvml       NvmlSampler (sampler)        GPU power, utilisation, memory, clocks, temperature
psutil     PsutilSampler (sampler)      process/system CPU %, RSS, USS, threads
=========  ===========================  ==========================================================

Timestamps are ``time.perf_counter_ns()``, the tracer's clock. Counters report values accumulated since
``start()``; samplers report instantaneous values.
"""
from __future__ import annotations

from typing import Any, Iterable, Mapping

from mlms_nb.errors import MlmsError
from mlms_nb.profilers._base import COUNTER_COLUMNS, BackgroundSampler, Profiler, Row, counters_frame
from mlms_nb.profilers.nvml import NvmlConfig, NvmlSampler, PynvmlReader
from mlms_nb.profilers.papi import PapiConfig, PapiCounters
from mlms_nb.profilers.perf_events import PerfEvents, PerfEventsConfig
from mlms_nb.profilers.psutil_sampler import PsutilConfig, PsutilSampler

PROFILERS: dict[str, type[Profiler]] = {
    "perf": PerfEvents,
    "papi": PapiCounters,
    "nvml": NvmlSampler,
    "psutil": PsutilSampler,
}

__all__ = [
    "COUNTER_COLUMNS", "PROFILERS", "ProfilerSet", "availability", "start_profilers", "counters_frame",
    "Profiler", "BackgroundSampler", "Row",
    "PerfEvents", "PerfEventsConfig", "PapiCounters", "PapiConfig", "NvmlSampler", "NvmlConfig", "PynvmlReader",
    "PsutilSampler", "PsutilConfig",
]


def _resolve(names: Iterable[str] | str | None) -> list[str]:
    if names is None or names == "all":
        return list(PROFILERS)
    if isinstance(names, str):
        names = [n for n in names.replace(",", " ").split() if n]
    out = []
    for name in names:
        key = str(name).strip().lower()
        if key == "all":
            out.extend(n for n in PROFILERS if n not in out)
            continue
        if key not in PROFILERS:
            raise MlmsError(f"unknown profiler {name!r}; expected one of {', '.join(PROFILERS)}")
        if key not in out:
            out.append(key)
    return out


def availability(names: Iterable[str] | str | None = None):
    """A pandas DataFrame, one row per profiler: ``profiler, available, reason``."""
    import pandas as pd

    rows = []
    for name in _resolve(names):
        try:
            ok, reason = PROFILERS[name].available()
        except Exception as exc:  # noqa: BLE001 - a probe must never break the table
            ok, reason = False, f"checking failed unexpectedly ({type(exc).__name__}: {exc})"
        rows.append((name, bool(ok), reason))
    return pd.DataFrame(rows, columns=["profiler", "available", "reason"])


class ProfilerSet:
    """The profilers started together. ``unavailable`` maps each one that could not start to the reason."""

    def __init__(self, profilers: Mapping[str, Profiler] | None = None,
                 unavailable: Mapping[str, str] | None = None):
        self.profilers: dict[str, Profiler] = dict(profilers or {})
        self.unavailable: dict[str, str] = dict(unavailable or {})
        self.errors: dict[str, str] = {}  # profiler -> why stop() failed
        self.running = any(p.running for p in self.profilers.values())

    def __getitem__(self, name: str) -> Profiler:
        return self.profilers[name]

    def __contains__(self, name: str) -> bool:
        return name in self.profilers

    @property
    def names(self) -> list[str]:
        return list(self.profilers)

    def read(self, record: bool = False) -> dict[str, dict[str, float]]:
        """Counts since start of every counter profiler (perf, papi): ``{profiler: {metric: value}}``."""
        return {n: p.read(record=record) for n, p in self.profilers.items() if hasattr(p, "read")}

    def stop(self) -> "ProfilerSet":
        """Stop every profiler (in reverse start order); a failure is added to ``errors``, the rest still stop."""
        for name, prof in reversed(list(self.profilers.items())):
            try:
                prof.stop()
            except Exception as exc:  # noqa: BLE001
                self.errors[name] = f"{type(exc).__name__}: {exc}"
        self.running = False
        return self

    def counters(self) -> list[Row]:
        rows: list[Row] = []
        for prof in self.profilers.values():
            rows.extend(prof.counters())
        return rows

    def counters_frame(self):
        """The counters frame (:mod:`mlms_nb.schema.counters`: ``ts_ns, source, metric, value, unit, device``),
        sorted by ``ts_ns``."""
        return counters_frame(self.counters())

    def __enter__(self) -> "ProfilerSet":
        return self

    def __exit__(self, *exc) -> bool:
        self.stop()
        return False

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"ProfilerSet({', '.join(self.profilers) or 'none'}; {state}; unavailable: {', '.join(self.unavailable) or 'none'})"


def start_profilers(names: Iterable[str] | str | None = None,
                    configs: Mapping[str, Any] | None = None) -> ProfilerSet:
    """Start the named profilers (None or "all": every one) that are available here.

    ``configs`` maps a profiler name to its config object (``{"psutil": PsutilConfig(interval_ms=10)}``).
    The ones that are not available, or fail to start, are recorded with their reason in ``.unavailable``;
    this never raises for an unavailable profiler, only for an unknown name.
    """
    configs = dict(configs or {})
    started: dict[str, Profiler] = {}
    unavailable: dict[str, str] = {}
    for name in _resolve(names):
        cls = PROFILERS[name]
        cfg = configs.get(name)
        try:
            ok, reason = cls.available(cfg) if cfg is not None else cls.available()
        except Exception as exc:  # noqa: BLE001
            ok, reason = False, f"checking failed unexpectedly ({type(exc).__name__}: {exc})"
        if not ok:
            unavailable[name] = reason
            continue
        try:
            started[name] = cls(cfg).start()
        except Exception as exc:  # noqa: BLE001 - available, yet it would not start: say so, keep going
            unavailable[name] = f"{name} was available but failed to start ({type(exc).__name__}: {exc})"
    return ProfilerSet(started, unavailable)
