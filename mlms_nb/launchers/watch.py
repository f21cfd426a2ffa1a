"""The per-call timeout: a clock each model call stamps, and whoever watches it.

:class:`CallClock` is a few bytes (a ``bytearray`` in one process; shared memory, an anonymous ``memfd``, across a
worker process and its parent): the ``time.monotonic_ns`` at which the call in progress started (0 between calls)
and a short text saying what the work is doing (``timing batch size 8``), for messages. Stamping costs two
stores of an int64, and only when a timeout is set (:meth:`CallWatch.guard` returns the call itself otherwise).

In this process a :class:`Watchdog` thread stops a call past its timeout through the predictor's own cancel
(ONNX Runtime's run termination); across processes the parent reads the clock and stops the worker.
"""
from __future__ import annotations

import ctypes
import logging
import mmap
import os
import threading
import time
from typing import Any, Callable

from mlms_nb.launchers.base import CallTimeout
from mlms_nb.launchers.stopping import deliver
from mlms_nb.options import spell

log = logging.getLogger(__name__)

CLOCK_BYTES = 256
_PHASE_AT, _PHASE_BYTES = 16, CLOCK_BYTES - 16


class CallClock:
    """Slot 0: when the call in progress started (monotonic ns, 0 when none); slot 1: calls started; then the phase."""

    def __init__(self, buffer: Any = None, fd: int | None = None):
        self.fd = fd
        self.buffer = buffer if buffer is not None else bytearray(CLOCK_BYTES)
        self._slots = (ctypes.c_int64 * 2).from_buffer(self.buffer)

    @classmethod
    def shared(cls) -> "CallClock":
        """A clock in anonymous shared memory whose ``fd`` a child process can map (:meth:`attach`)."""
        if hasattr(os, "memfd_create"):
            fd = os.memfd_create("mlms-call-clock", 0)
        else:  # pragma: no cover - non-Linux: an unlinked temporary file
            import tempfile

            fd, name = tempfile.mkstemp(prefix="mlms-call-clock-")
            os.unlink(name)
        os.ftruncate(fd, CLOCK_BYTES)
        return cls(mmap.mmap(fd, CLOCK_BYTES), fd)

    @classmethod
    def attach(cls, fd: int) -> "CallClock":
        return cls(mmap.mmap(fd, CLOCK_BYTES), fd)

    def close(self) -> None:
        del self._slots
        if isinstance(self.buffer, mmap.mmap):
            self.buffer.close()
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def started(self) -> None:
        self._slots[1] += 1
        self._slots[0] = time.monotonic_ns()

    def finished(self) -> None:
        self._slots[0] = 0

    def running_for_s(self) -> float:
        """Seconds the call in progress has run (0.0 between calls)."""
        start = self._slots[0]
        return (time.monotonic_ns() - start) / 1e9 if start else 0.0

    @property
    def calls(self) -> int:
        return int(self._slots[1])

    @property
    def phase(self) -> str:
        raw = bytes(self.buffer[_PHASE_AT:_PHASE_AT + _PHASE_BYTES])
        return raw.split(b"\0", 1)[0].decode("utf-8", "replace")

    @phase.setter
    def phase(self, text: str) -> None:
        data = text.encode("utf-8")[:_PHASE_BYTES - 1]
        self.buffer[_PHASE_AT:_PHASE_AT + _PHASE_BYTES] = data + b"\0" * (_PHASE_BYTES - len(data))


def timeout_sentence(label: str, seconds: float, phase: str, how: str) -> str:
    during = f" ({phase})" if phase else ""
    return (f"{label}: a model call ran longer than {spell('call_timeout_s', seconds)}{during} and {how}; raise the "
            "timeout if the model is merely slow")


class CallWatch:
    """What the work uses to keep its model calls within ``call_timeout_s`` (None: no timeout, no cost)."""

    def __init__(self, label: str, call_timeout_s: float | None, clock: CallClock | None = None):
        self.label = label
        self.call_timeout_s = call_timeout_s
        self.clock = clock or CallClock()
        self.cancel: Callable[[], None] | None = None
        self.expired = False
        self.signalled: int | None = None  # the stop signal that cancelled the call in progress (Ctrl-C: SIGINT)

    @property
    def phase(self) -> str:
        return self.clock.phase

    @phase.setter
    def phase(self, text: str) -> None:
        self.clock.phase = text

    def on_timeout(self, cancel: Callable[[], None] | None) -> None:
        """How to stop a call in progress from another thread (the predictor's ``cancel``), if it can be."""
        self.cancel = cancel

    def guard(self, call: Callable) -> Callable:
        """``call`` stamping the clock around each run; a call the watchdog cancelled raises `CallTimeout`, one a
        stop signal cancelled the signal's stop (``KeyboardInterrupt`` for Ctrl-C). Without a timeout, a call that
        cannot be cancelled is returned as it is (no cost)."""
        watch = self
        if self.call_timeout_s is None:
            if self.cancel is None:
                return call

            def interruptible(*args: Any, **kwargs: Any) -> Any:
                try:
                    return call(*args, **kwargs)
                except Exception:
                    if watch.signalled is not None:
                        raise deliver(watch.signalled) from None
                    raise

            return interruptible
        clock = self.clock

        def guarded(*args: Any, **kwargs: Any) -> Any:
            clock.started()
            try:
                return call(*args, **kwargs)
            except Exception:
                if watch.signalled is not None:
                    raise deliver(watch.signalled) from None
                if watch.expired:
                    raise CallTimeout(timeout_sentence(watch.label, watch.call_timeout_s, clock.phase,
                                                       "was cancelled")) from None
                raise
            finally:
                clock.finished()

        return guarded


class Watchdog:
    """A thread that cancels, through ``watch.cancel``, a call running past ``watch.call_timeout_s``."""

    def __init__(self, watch: CallWatch):
        self.watch = watch
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="mlms-call-watchdog", daemon=True)

    def __enter__(self) -> "Watchdog":
        if self.watch.call_timeout_s is not None:
            self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def _run(self) -> None:
        watch = self.watch
        limit = watch.call_timeout_s
        interval = min(0.05, limit / 4)
        while not self._stop.wait(interval):
            if watch.expired or watch.clock.running_for_s() <= limit:
                continue
            cancel = watch.cancel
            if cancel is None:
                log.warning("%s", timeout_sentence(watch.label, limit, watch.clock.phase,
                                                   "cannot be stopped inside this process"))
                watch.expired = True
                continue
            watch.expired = True
            try:
                cancel()
            except Exception as err:  # noqa: BLE001 - the call goes on; say so
                log.warning("%s: cancelling the call failed: %s", watch.label, err)
