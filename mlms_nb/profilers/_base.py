"""What every profiler shares: the counters-frame row, the base class, and the background sampler thread.

A profiler is a small class with a config dataclass beside it:

- ``available() -> (bool, reason)`` (a classmethod) says whether it can run here; the reason is a sentence a
  user can act on (and, when it is available, says what it will measure);
- ``start()`` / ``stop()``;
- ``counters()`` returns rows ``(ts_ns, source, metric, value, unit, device)`` of the counters frame
  (:data:`mlms_nb.schema.counters.CounterRow`), with ``ts_ns`` from :func:`time.perf_counter_ns` -- the tracer's
  clock -- so they line up with spans; ``counters_frame()`` gives them as that frame.

Counters (perf events, PAPI) also have ``read()``: the values accumulated since ``start()``, cheap enough to
call around every layer or batch. Samplers (psutil, NVML) record on a background thread every
``interval_ms`` and once at ``start()`` and at ``stop()``.
"""
from __future__ import annotations

import threading
import time
from typing import Any, ClassVar

from mlms_nb.schema.counters import COUNTER_COLUMNS, counters_frame
from mlms_nb.schema.counters import CounterRow as Row

__all__ = ["COUNTER_COLUMNS", "BackgroundSampler", "Profiler", "Row", "counters_frame", "first_line"]


class Profiler:
    """Base of the system profilers. Subclasses set ``name``, ``source``, ``config_class`` and ``kind``."""

    name: ClassVar[str] = ""
    source: ClassVar[str] = ""
    kind: ClassVar[str] = "sampler"  # "sampler" (background thread) or "counter" (read() around code)
    config_class: ClassVar[type] = object

    def __init__(self, config: Any = None):
        self.config = config if config is not None else self.config_class()
        self.running = False

    @classmethod
    def available(cls) -> tuple[bool, str]:  # pragma: no cover - every subclass overrides it
        raise NotImplementedError

    def start(self) -> "Profiler":
        raise NotImplementedError

    def stop(self) -> "Profiler":
        raise NotImplementedError

    def counters(self) -> list[Row]:
        raise NotImplementedError

    def counters_frame(self):
        """This profiler's rows as the counters frame (:func:`mlms_nb.schema.counters.counters_frame`)."""
        return counters_frame(self.counters())

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
        return False


class BackgroundSampler(Profiler):
    """A profiler that calls ``_sample(ts_ns)`` on its own thread every ``config.interval_ms``.

    ``_sample`` returns rows; one sample is also taken synchronously at ``start()`` and at ``stop()`` so even
    a run shorter than the interval has a first and a last value. An exception in ``_sample`` is kept in
    ``errors`` (the first few) and sampling goes on.
    """

    kind = "sampler"

    def __init__(self, config: Any = None):
        super().__init__(config)
        self._rows: list[Row] = []
        self._lock = threading.Lock()
        self._stop_event = threading.Event()
        self._thread: threading.Thread | None = None
        self.errors: list[str] = []
        self.samples = 0

    # subclasses implement these
    def _open(self) -> None:
        """Acquire what sampling needs (handles, baselines); called once by start()."""

    def _close(self) -> None:
        """Release what _open acquired; called once by stop()."""

    def _sample(self, ts_ns: int) -> list[Row]:
        raise NotImplementedError

    def _take(self) -> None:
        ts = time.perf_counter_ns()
        try:
            rows = self._sample(ts)
        except Exception as exc:  # noqa: BLE001 - a sampler must not kill the run it observes
            if len(self.errors) < 10:
                self.errors.append(f"{type(exc).__name__}: {exc}")
            return
        with self._lock:
            self._rows.extend(rows)
            self.samples += 1

    def _loop(self) -> None:
        interval = max(float(self.config.interval_ms), 0.1) / 1000.0
        next_t = time.perf_counter() + interval
        while not self._stop_event.wait(max(0.0, next_t - time.perf_counter())):
            self._take()
            next_t += interval
            now = time.perf_counter()
            if next_t < now:  # fell behind (a slow read, a paused process): skip, do not burst
                next_t = now + interval

    def start(self) -> "BackgroundSampler":
        if self.running:
            return self
        self._open()
        self._stop_event.clear()
        self._take()
        self._thread = threading.Thread(target=self._loop, name=f"mlms-{self.name}-sampler", daemon=True)
        self._thread.start()
        self.running = True
        return self

    def stop(self) -> "BackgroundSampler":
        if not self.running:
            return self
        self._stop_event.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self._take()
        self._close()
        self.running = False
        return self

    def counters(self) -> list[Row]:
        with self._lock:
            return list(self._rows)


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message, or its class name when it has none."""
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__

