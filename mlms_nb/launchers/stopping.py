"""Stop signals, turned into one orderly stop: keep what was measured, then stop.

Inside :func:`stop_signals` (the runner's evaluation, a worker process's work) the first SIGINT raises
``KeyboardInterrupt`` and the first SIGTERM or SIGHUP raises :class:`~mlms_nb.launchers.base.StopRequested`, where
the code is; inside :func:`deferred` (storing a record, waiting on a worker) it is noted and raised when the block
ends, so a record is never half kept. Later signals are noted and ignored while what was measured is kept (an
impatient second Ctrl-C 0.02 s after the first must not lose it); a third Ctrl-C abandons the clean-up.
Handlers are installed only in the main thread (elsewhere Python's own handling stays).

Python runs a signal handler only between bytecodes: while the main thread is inside one long native call (a model
call) the handler waits for it to return. So within :func:`stop_signals` the signal also wakes a thread
(``signal.set_wakeup_fd``): when the handler has not run :data:`STUCK_S` after the signal, the main thread is stuck
in native code, and the callbacks registered with :func:`when_stuck` are told (the inline launcher cancels an ONNX
Runtime call in place, or says how to stop a call that cannot be cancelled). A stop such a callback made happen is
raised by the code that notices it (:func:`deliver`), and Python's handler, when it runs at last, counts it as given.

A handler that raises runs wherever the main thread is, a weakref callback or a finalizer the garbage collector runs
included, where Python reports the exception as "ignored" and goes on: the stop would be lost (and a traceback
printed). Within :func:`stop_signals` such a stop is caught on its way to ``sys.unraisablehook`` and signalled again,
so it is raised where the code runs next.
"""
from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
import time
from typing import Callable, Iterator

from mlms_nb._quiet import restore_stderr
from mlms_nb.launchers.base import StopRequested

log = logging.getLogger(__name__)

STOP_SIGNALS = tuple(s for s in (signal.SIGINT, signal.SIGTERM, getattr(signal, "SIGHUP", None)) if s is not None)
ABANDON_AFTER = 3  # the third Ctrl-C raises even while what was measured is being kept
STUCK_S = 0.25
"""How long after a stop signal Python's handler may take before the main thread counts as stuck in native code."""


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
        self.handled_at = 0.0            # when Python's handler last ran (time.monotonic)
        self.early = 0                   # stops delivered before the handler ran (it then only counts them)
        self.exception: BaseException | None = None  # the stop the handler raised last
        self.again = 0                   # stops signalled again after a callback swallowed them


_state = _State()


def requested() -> int | None:
    """The stop signal received inside :func:`stop_signals`, if any (None outside it)."""
    return _state.signum if _state.installed else None


def exception_for(signum: int) -> BaseException:
    return KeyboardInterrupt() if signum == signal.SIGINT else StopRequested(signum)


def _handler(signum: int, frame) -> None:  # noqa: ANN001
    st = _state
    st.handled_at = time.monotonic()
    if st.again:  # a stop a callback swallowed, signalled again: raise it here, or where deferred() ends
        if _in_hook(frame):  # it came while the hook that asked for it still runs: once more, after it
            _Waker.signal_again()
            return
        st.again -= 1
        if st.depth == 0:
            _raise_stop(st)
        return
    if st.early:  # this signal's stop was delivered already, where the model call it cancelled returned
        st.early -= 1
        return
    if signum == signal.SIGINT:
        st.interrupts += 1
    if st.signum is None:
        st.signum = signum
        if st.depth == 0:
            _raise_stop(st)
        return
    if signum == signal.SIGINT and st.interrupts >= ABANDON_AFTER:
        raise KeyboardInterrupt()
    log.warning("mlms: stopping already, keeping what was measured (press Ctrl-C %d more time(s) to abandon it)",
                max(ABANDON_AFTER - st.interrupts, 1))


def _raise_stop(st: _State) -> None:
    st.raised = True
    st.exception = exception_for(st.signum)
    raise st.exception


def _swallowed(hook):
    """``sys.unraisablehook`` within :func:`stop_signals`: the stop the handler raised inside a callback that cannot
    raise is signalled again (see the module docstring); anything else goes to ``hook``."""
    def unraisable(report) -> None:
        st = _state
        if st.installed and st.exception is not None and report.exc_value is st.exception:
            st.exception, st.raised = None, False
            st.again += 1
            _Waker.signal_again()  # the waker thread sends it; the handler raises it once this hook has returned
            return
        hook(report)
    return unraisable


_HOOK_CODE = _swallowed(None).__code__


def _in_hook(frame) -> bool:  # noqa: ANN001
    """Whether ``frame`` runs inside the unraisable hook of :func:`_swallowed` (an exception raised there would be
    reported as ignored, like the one the hook caught)."""
    while frame is not None:
        if frame.f_code is _HOOK_CODE:
            return True
        frame = frame.f_back
    return False


@contextlib.contextmanager
def stop_signals() -> Iterator[_State]:
    """Within the block, stop signals stop the work in order (see the module docstring); the previous handlers
    come back after it. Re-entrant; a no-op outside the main thread."""
    st = _state
    main = threading.current_thread() is threading.main_thread()
    waker = None
    hook = None
    if main and st.installed == 0:
        st.reset()
        for sig in STOP_SIGNALS:
            st.saved[sig] = signal.signal(sig, _handler)
        waker = _Waker.start()
        hook, sys.unraisablehook = sys.unraisablehook, _swallowed(sys.unraisablehook)
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
            if waker is not None:
                waker.stop()
            if hook is not None:
                sys.unraisablehook = hook


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
        _raise_stop(st)


def mark_raised() -> None:
    """The pending stop was delivered another way (a launcher raised it itself)."""
    _state.raised = True


def deliver(signum: int) -> BaseException:
    """The stop ``signum`` asks for, to raise now where a model call it cancelled returned (before Python's handler
    ran); the handler, when it runs, then only counts the signal."""
    st = _state
    if st.signum is None:
        st.signum = signum
        st.early += 1
        if signum == signal.SIGINT:
            st.interrupts += 1
    st.raised = True
    return exception_for(st.signum)


_stuck: list[Callable[[int, int], None]] = []
_abandon: list[Callable[[], None]] = []


@contextlib.contextmanager
def when_abandoned(callback: Callable[[], None]) -> Iterator[None]:
    """Within the block, ``callback()`` keeps what was measured before :func:`abandon` ends the process."""
    _abandon.append(callback)
    try:
        yield
    finally:
        _abandon.remove(callback)


def abandon(signum: int, why: str) -> None:
    """End the process now, from the waker thread, while the main thread is stuck in a call that cannot be stopped:
    the :func:`when_abandoned` callbacks keep what was measured first. Exit status 128 + the signal (130: Ctrl-C)."""
    for callback in list(_abandon):
        try:
            callback()
        except Exception as err:  # noqa: BLE001 - ending anyway; say what could not be kept
            log.warning("mlms: keeping what was measured failed: %s", err)
    restore_stderr()  # a framework-chatter filter may hold fd 2: the last sentence goes to the real stderr
    log.warning("%s", why)
    for handler in logging.getLogger().handlers:
        handler.flush()
    os._exit(128 + signum)


@contextlib.contextmanager
def when_stuck(callback: Callable[[int, int], None]) -> Iterator[None]:
    """Within the block, ``callback(signum, count)`` runs (in the waker thread) when a stop signal finds the main
    thread stuck in native code; ``count`` is how many signals found it stuck since it last ran Python."""
    _stuck.append(callback)
    try:
        yield
    finally:
        _stuck.remove(callback)


class _Waker:
    """The thread the signal's wakeup fd wakes (see the module docstring). It also sends a swallowed stop again
    (:data:`AGAIN` on its pipe): a real signal to the main thread, so a sleep or a wait there is woken too."""

    AGAIN = b"\0"  # never a signal's number
    running: "_Waker | None" = None

    def __init__(self, read_fd: int, write_fd: int, previous: int):
        self.read_fd, self.write_fd, self.previous = read_fd, write_fd, previous
        self.thread = threading.Thread(target=self._run, name="mlms-signal-waker", daemon=True)

    @classmethod
    def start(cls) -> "_Waker | None":
        read_fd, write_fd = os.pipe()
        os.set_blocking(write_fd, False)
        try:
            previous = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
        except (ValueError, OSError):  # not the main thread of the main interpreter
            os.close(read_fd)
            os.close(write_fd)
            return None
        waker = cls(read_fd, write_fd, previous)
        try:
            waker.thread.start()
        except RuntimeError:  # no thread to be had (a worker under a tight memory limit): signals as before
            signal.set_wakeup_fd(previous)
            os.close(read_fd)
            os.close(write_fd)
            return None
        cls.running = waker
        return waker

    @classmethod
    def signal_again(cls) -> None:
        """Ask the running waker to send the pending stop again (see the class)."""
        if cls.running is not None:
            try:
                os.write(cls.running.write_fd, cls.AGAIN)
            except OSError:
                pass

    def stop(self) -> None:
        _Waker.running = None
        try:
            signal.set_wakeup_fd(self.previous)
        except (ValueError, OSError):
            signal.set_wakeup_fd(-1)
        os.close(self.write_fd)  # the thread reads end-of-file and ends
        self.thread.join(timeout=2)
        os.close(self.read_fd)

    def _run(self) -> None:
        stuck = 0
        while True:
            try:
                data = os.read(self.read_fd, 64)
            except OSError:
                return
            if not data:
                return
            for signum in data:
                if signum == self.AGAIN[0] and _state.signum is not None:
                    signal.pthread_kill(threading.main_thread().ident, _state.signum)
                    continue
                if signum not in STOP_SIGNALS:
                    continue
                sent = time.monotonic() - 0.05  # the byte is read within moments of the signal
                deadline = sent + 0.05 + STUCK_S
                while _state.handled_at < sent and time.monotonic() < deadline:
                    time.sleep(0.01)
                if _state.handled_at >= sent:
                    stuck = 0  # Python's handler ran for it: the main thread runs Python
                    continue
                stuck += 1
                for callback in list(_stuck):
                    try:
                        callback(signum, stuck)
                    except Exception as err:  # noqa: BLE001 - a callback's failure must not end the waker
                        log.warning("mlms: acting on the stop signal failed: %s", err)
