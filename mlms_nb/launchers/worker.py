"""The worker process of the ``process`` launcher: ``python -m mlms_nb.launchers.worker FD CLOCK_FD PARENT_PID
MEMORY_LIMIT_BYTES CALL_TIMEOUT_S LOG_LEVEL SPELLING``.

It dies with its parent (``PR_SET_PDEATHSIG``, and a check of its parent's pid), caps its memory first (before
any framework is imported), receives one :class:`~mlms_nb.launchers.base.Work` on the socket ``FD``, runs it under
the same stop-signal rules as the parent (the parent passes the user's Ctrl-C or SIGTERM on), sends each record as
it is made and then how the work ended, and leaves with ``os._exit`` (a framework's exit handlers cannot hang it).
"""
from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from multiprocessing.connection import Connection


def _follow_parent(parent_pid: int) -> None:
    """Die when the parent does, even by SIGKILL: the kernel's parent-death signal, and a check of our parent."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # pragma: no cover - not Linux: poll instead
        def watch() -> None:
            while os.getppid() == parent_pid:
                time.sleep(0.5)
            os._exit(1)

        threading.Thread(target=watch, daemon=True).start()
    if os.getppid() != parent_pid:  # the parent died before the signal was set up
        os._exit(1)


def _limit_memory(limit_bytes: int) -> None:
    if limit_bytes <= 0:
        return
    import resource

    _, hard = resource.getrlimit(resource.RLIMIT_DATA)
    if hard != resource.RLIM_INFINITY:
        limit_bytes = min(limit_bytes, hard)
    resource.setrlimit(resource.RLIMIT_DATA, (limit_bytes, hard))


def _out_of_memory(err: BaseException) -> bool:
    """An allocation that failed under the memory limit: a MemoryError, a library (an extension module and its
    shared objects) that could not be loaded, or an extension module whose allocation failed without setting an
    exception (Python's SystemError "error return without exception set") -- which is how a too-low limit shows
    while importing."""
    from mlms_nb.errors import FrameworkNotInstalledError

    return isinstance(err, (MemoryError, ImportError, FrameworkNotInstalledError, SystemError))


def main(argv: list[str]) -> None:
    fd, clock_fd, parent_pid, memory_limit = (int(a) for a in argv[:4])
    call_timeout_s, log_level, spelled = float(argv[4]) or None, int(argv[5]), argv[6]
    _follow_parent(parent_pid)
    # numpy before the cap: its BLAS sizes per-thread buffers at import and, refused them, exits the process without
    # a Python error (no outcome could say why). What the work loads after this counts against the limit.
    import numpy  # noqa: F401

    _limit_memory(memory_limit)
    # the parent's level of mlms-nb's own lines; the libraries' only from WARNING up (as the mlms command does)
    logging.basicConfig(level=max(log_level, logging.WARNING), format="%(message)s", stream=sys.stderr)
    logging.getLogger("mlms_nb").setLevel(log_level)

    from mlms_nb._quiet import quiet
    from mlms_nb._translate import heard_since, mark
    from mlms_nb.launchers import stopping
    from mlms_nb.launchers.base import Outcome, outcome_of
    from mlms_nb.launchers.watch import CallClock, CallWatch
    from mlms_nb.options import spell, spelling

    conn = Connection(fd)
    clock = CallClock.attach(clock_fd)
    label = "the worker"

    def emit(record) -> None:
        with stopping.deferred():  # a stop signal never cuts a message in half
            conn.send(("record", record))

    with stopping.stop_signals(), spelling(spelled):
        try:
            work = conn.recv()
            label = work.label
            watch = CallWatch(label, call_timeout_s, clock)
            heard_from = mark()
            try:  # the frameworks' chatter kept in this process too; the warnings that matter go back as sentences
                with quiet(label=f"{label} (worker)"):
                    work.function(*work.args, emit=emit, watch=watch)
            finally:
                heard = heard_since(heard_from)
                if heard:
                    with stopping.deferred():
                        conn.send(("heard", heard))
            end = Outcome()
        except BaseException as err:  # noqa: BLE001 - everything goes back to the parent as an outcome
            end = outcome_of(err, label, clock.phase)
            if memory_limit > 0 and _out_of_memory(err):
                size = (f"{memory_limit / 2**30:.3g}GiB" if memory_limit >= 2**30 else f"{memory_limit / 2**20:.3g}MiB")
                limit = spell("memory_limit_bytes", size)
                end.status = "error"
                end.message = (f"{label} ran out of memory within {limit} ({err or 'an allocation failed'}): raise "
                               "the limit or use smaller batch sizes")
        try:
            with stopping.deferred():
                try:
                    conn.send(("end", end))
                except Exception:  # noqa: BLE001 - an exception that does not pickle: its sentence is enough
                    conn.send(("end", Outcome(end.status, end.message, None, end.detail)))
        except BaseException:  # noqa: BLE001 - a late stop signal: the end was sent or the parent is gone
            pass
    try:
        conn.close()
    finally:
        sys.stdout.flush(), sys.stderr.flush()
        os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1:])
