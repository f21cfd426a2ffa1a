"""Stop signals, turned into one orderly stop: keep what was measured, then stop.

Inside :func:`stop_signals` (the runner's evaluation, a worker process's work) the first SIGINT raises
``KeyboardInterrupt`` and the first SIGTERM or SIGHUP raises :class:`~mlms_nb.launchers.base.StopRequested`, where
the code is; inside :func:`deferred` (storing a record, waiting on a worker) it is noted and raised when the block
ends, so a record is never half kept. Later signals are noted and ignored while what was measured is kept (an
impatient second Ctrl-C 0.02 s after the first must not lose it); a third Ctrl-C abandons the clean-up.
Handlers are installed only in the main thread (elsewhere Python's own handling stays).
"""
from __future__ import annotations

import contextlib
import logging
import signal
import threading
from typing import Iterator

from mlms_nb.launchers.base import StopRequested

log = logging.getLogger(__name__)

STOP_SIGNALS = tuple(s for s in (signal.SIGINT, signal.SIGTERM, getattr(signal, "SIGHUP", None)) if s is not None)
ABANDON_AFTER = 3  # the third Ctrl-C raises even while what was measured is being kept


class _State:
    def __init__(self) -> None:
        self.reset()
        self.installed = 0          # nesting of stop_signals()
        self.saved: dict[int, object] = {}

    def reset(self) -> None:
        self.signum: int | None = None   # the first stop signal
        self.raised = False              # whether it was raised as an exception
        self.interrupts = 0              # SIGINTs seen
        self.depth = 0                   # nesting of deferred()


_state = _State()


def requested() -> int | None:
    """The stop signal received inside :func:`stop_signals`, if any (None outside it)."""
    return _state.signum if _state.installed else None


def exception_for(signum: int) -> BaseException:
    return KeyboardInterrupt() if signum == signal.SIGINT else StopRequested(signum)


def _handler(signum: int, frame) -> None:  # noqa: ANN001
    st = _state
    if signum == signal.SIGINT:
        st.interrupts += 1
    if st.signum is None:
        st.signum = signum
        if st.depth == 0:
            st.raised = True
            raise exception_for(signum)
        return
    if signum == signal.SIGINT and st.interrupts >= ABANDON_AFTER:
        raise KeyboardInterrupt()
    log.warning("mlms: stopping already, keeping what was measured (press Ctrl-C %d more time(s) to abandon it)",
                max(ABANDON_AFTER - st.interrupts, 1))


@contextlib.contextmanager
def stop_signals() -> Iterator[_State]:
    """Within the block, stop signals stop the work in order (see the module docstring); the previous handlers
    come back after it. Re-entrant; a no-op outside the main thread."""
    st = _state
    main = threading.current_thread() is threading.main_thread()
    if main and st.installed == 0:
        st.reset()
        for sig in STOP_SIGNALS:
            st.saved[sig] = signal.signal(sig, _handler)
    st.installed += main
    try:
        yield st
    finally:
        if main:
            st.installed -= 1
            if st.installed == 0:
                for sig, previous in st.saved.items():
                    signal.signal(sig, previous)
                st.saved.clear()


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """A stop signal arriving inside the block is raised when it ends (unless the block raised already)."""
    st = _state
    st.depth += 1
    try:
        yield
    except BaseException:
        st.depth -= 1
        raise
    st.depth -= 1
    if st.depth == 0 and st.signum is not None and not st.raised and st.installed:
        st.raised = True
        raise exception_for(st.signum)


def mark_raised() -> None:
    """The pending stop was delivered another way (a launcher raised it itself)."""
    _state.raised = True
