"""PAPI hardware counters through python-papi (``pypapi``), imported lazily here and nowhere else.

PAPI counts the thread that called ``start()`` (PAPI event sets are per thread). ``available()`` does not
guess: it initialises the library and starts and stops a real event set with the configured presets, so the
reason it gives is PAPI's own (for instance, its perf_event component disabled because the CPU exposes no
PMU to this VM).
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import ClassVar

from mlms_nb.errors import FrameworkNotInstalledError
from mlms_nb.profilers._base import Profiler, Row, first_line

INSTALL_HINT = "pip install 'mlms-nb[papi]'"

_lock = threading.Lock()


def import_pypapi():
    """``(papi_low, events)`` from python-papi, initialised; raises FrameworkNotInstalledError naming the extra."""
    try:
        from pypapi import events, papi_low  # noqa: PLC0415 - the one place python-papi is imported
    except ImportError as exc:
        raise FrameworkNotInstalledError(
            f"PAPI counters need python-papi, which is not installed ({first_line(exc)}): {INSTALL_HINT}"
        ) from None
    except OSError as exc:  # the bundled libpapi could not be loaded
        raise FrameworkNotInstalledError(
            f"python-papi is installed but its PAPI library could not be loaded ({first_line(exc)}); "
            f"reinstall it: {INSTALL_HINT}") from None
    with _lock:
        if not papi_low.is_initialized():
            papi_low.library_init()
    return papi_low, events


def _papi_error(exc: BaseException) -> str:
    """``PapiMiscellaneousError('Unknown error code. (PAPI_EMISC)')`` -> ``PAPI_EMISC``."""
    name = getattr(exc, "c_name", None)
    return str(name) if name else first_line(exc)


def _disabled_components(papi_low) -> list[str]:
    """"perf_event: Unknown libpfm4 related error" for each CPU component PAPI disabled."""
    out = []
    try:
        for i in range(papi_low.num_components()):
            info = papi_low.get_component_info(i)
            if getattr(info, "disabled", 0) and getattr(info, "name", "") == "perf_event":
                out.append(f"{info.name}: {info.disabled_reason or 'disabled'}")
    except Exception:  # noqa: BLE001 - only a hint for the reason text
        pass
    return out


@dataclass
class PapiConfig:
    """PAPI preset (or native) event names; all must be countable together."""

    events: tuple[str, ...] = ("PAPI_TOT_INS", "PAPI_TOT_CYC")


class _EventSet:
    """A started PAPI event set; ``close()`` stops, cleans up and destroys it."""

    def __init__(self, papi_low, events_mod, names: tuple[str, ...]):
        self.papi_low = papi_low
        self.handle = papi_low.create_eventset()
        self.running = False
        try:
            for name in names:
                code = getattr(events_mod, name, None)
                try:
                    if code is not None:
                        papi_low.add_event(self.handle, code)
                    else:
                        papi_low.add_named_event(self.handle, name)
                except Exception as exc:
                    raise _AddFailed(name, exc) from exc
            papi_low.start(self.handle)
            self.running = True
        except BaseException:
            self.close()
            raise

    def read(self) -> list[int]:
        return self.papi_low.read(self.handle)

    def close(self) -> list[int] | None:
        values = None
        pl = self.papi_low
        if self.running:
            try:
                values = pl.stop(self.handle)
            except Exception:  # noqa: BLE001
                pass
            self.running = False
        for step in (pl.cleanup_eventset, pl.destroy_eventset):
            try:
                step(self.handle)
            except Exception:  # noqa: BLE001
                pass
        return values


class _AddFailed(Exception):
    def __init__(self, name: str, exc: BaseException):
        super().__init__(name)
        self.name, self.exc = name, exc


class PapiCounters(Profiler):
    """PAPI presets for the thread that calls ``start()``; ``read()`` returns the counts since ``start()``."""

    name: ClassVar[str] = "papi"
    source: ClassVar[str] = "papi"
    kind: ClassVar[str] = "counter"
    config_class: ClassVar[type] = PapiConfig
    device: ClassVar[str] = "cpu"

    def __init__(self, config: PapiConfig | None = None):
        super().__init__(config)
        self.events: list[str] = list(self.config.events)
        self._set: _EventSet | None = None
        self._samples: list[tuple[int, tuple[float, ...]]] = []
        self._final: dict[str, float] | None = None

    @classmethod
    def _try(cls, names: tuple[str, ...]) -> tuple[_EventSet | None, str]:
        """Start an event set with ``names``; (event set, "") or (None, why not)."""
        try:
            papi_low, events_mod = import_pypapi()
        except FrameworkNotInstalledError as exc:
            return None, str(exc)
        except Exception as exc:  # noqa: BLE001 - PAPI_library_init failed
            return None, f"PAPI could not be initialised ({_papi_error(exc)})"
        try:
            return _EventSet(papi_low, events_mod, names), ""
        except _AddFailed as exc:
            what = f"adding {exc.name} to a PAPI event set failed ({_papi_error(exc.exc)})"
        except Exception as exc:  # noqa: BLE001
            what = f"starting a PAPI event set with {', '.join(names)} failed ({_papi_error(exc)})"
        disabled = _disabled_components(papi_low)
        hint = ""
        if disabled:
            hint = (f"; PAPI disabled its CPU component -- {'; '.join(disabled)} -- which usually means the CPU "
                    f"exposes no hardware counters to this process (a VM without a virtual PMU, or "
                    f"/proc/sys/kernel/perf_event_paranoid too high)")
        return None, f"PAPI cannot count {', '.join(names)} here: {what}{hint}"

    @classmethod
    def available(cls, config: PapiConfig | None = None) -> tuple[bool, str]:
        names = tuple((config or PapiConfig()).events)
        es, reason = cls._try(names)
        if es is None:
            return False, reason
        es.close()
        return True, f"PAPI counts {', '.join(names)} for the thread that starts it"

    def start(self) -> "PapiCounters":
        if self.running:
            return self
        es, reason = self._try(tuple(self.events))
        if es is None:
            from mlms_nb.errors import MlmsError

            raise MlmsError(reason)
        self._set = es
        self._samples = [(time.perf_counter_ns(), (0.0,) * len(self.events))]
        self._final = None
        self.running = True
        return self

    def read(self, record: bool = False) -> dict[str, float]:
        """Counts since ``start()`` by event name (after ``stop()``, the final counts); ``record`` keeps a row."""
        if not self.running or self._set is None:
            return dict(self._final) if self._final is not None else {}
        values = tuple(float(v) for v in self._set.read())
        if record:
            self._samples.append((time.perf_counter_ns(), values))
        return dict(zip(self.events, values))

    def stop(self) -> "PapiCounters":
        if not self.running or self._set is None:
            return self
        ts = time.perf_counter_ns()
        values = self._set.close()
        if values is None:
            values = [float("nan")] * len(self.events)
        vals = tuple(float(v) for v in values)
        self._samples.append((ts, vals))
        self._final = dict(zip(self.events, vals))
        self._set = None
        self.running = False
        return self

    def counters(self) -> list[Row]:
        return [(ts, self.source, name, value, "count", self.device)
                for ts, values in self._samples for name, value in zip(self.events, values)]
