"""The ``process`` launcher (``isolate=True``): each framework's work in a worker process of its own.

The worker is a fresh interpreter (``python -m mlms_nb.launchers.worker``, in a session of its own, so the
terminal's Ctrl-C reaches only this process, which passes it on): it imports nothing of the parent's state, sets
its memory limit (``RLIMIT_DATA``: heap and private mappings, so an allocation past it fails there), runs the work
and sends each record back over a socket as soon as it is made. The parent waits on that socket (never a busy
loop) and watches the call clock in shared memory: a call past ``call_timeout_s`` or a run past ``run_timeout_s``
stops the worker (SIGKILL to its process group); a worker that dies (segfault, abort, the OOM killer) is reported
in one sentence. Every record that arrived before is kept, and this process -- the CLI, a notebook's kernel -- goes
on with the next framework.
"""
from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Callable

from mlms_nb._translate import hear_sentences
from mlms_nb.launchers import stopping
from mlms_nb.launchers.base import Launcher, Outcome, Work
from mlms_nb.launchers.watch import CallClock, timeout_sentence
from mlms_nb.options import current_spelling, spell

log = logging.getLogger(__name__)

POLL_S = 0.05
STOP_GRACE_S = 15.0
"""After passing on a stop signal, how long the worker may take to send what it measured before it is killed."""

_CRASHES = {"SIGSEGV": "crashed with a segmentation fault (SIGSEGV)", "SIGABRT": "aborted (SIGABRT)",
            "SIGBUS": "crashed with a bus error (SIGBUS)", "SIGFPE": "crashed with an arithmetic fault (SIGFPE)",
            "SIGILL": "crashed on an illegal instruction (SIGILL)",
            "SIGKILL": "was killed (SIGKILL), most likely by the system's out-of-memory killer"}


class ProcessLauncher(Launcher):
    name = "process"

    def describe(self) -> str:
        return "a worker process per framework, one after another"

    def launch(self, work: Work, on_record: Callable[[Any], None]) -> Outcome:
        clock = CallClock.shared()
        ours, theirs = socket.socketpair()
        try:
            proc = subprocess.Popen(self._argv(theirs.fileno(), clock.fd), pass_fds=(theirs.fileno(), clock.fd),
                                    start_new_session=True, stdin=subprocess.DEVNULL, stdout=_stdout(),
                                    env=_environment())
        except OSError as err:
            theirs.close(), ours.close(), clock.close()
            return Outcome("error", f"{work.label}: could not start a worker process ({err}); run without "
                                    f"{spell('isolate')}")
        theirs.close()
        conn = Connection(ours.detach())
        try:
            conn.send(work)
            return _Supervisor(self, work, proc, conn, clock, on_record).run()
        finally:
            if proc.poll() is None:
                _kill(proc)
            proc.wait()
            conn.close()
            clock.close()

    def _argv(self, fd: int, clock_fd: int) -> list[str]:
        limits = self.limits
        return [sys.executable, "-m", "mlms_nb.launchers.worker", str(fd), str(clock_fd), str(os.getpid()),
                str(limits.memory_limit_bytes or 0), str(limits.call_timeout_s or 0),
                str(logging.getLogger("mlms_nb").getEffectiveLevel()), current_spelling()]


class _Supervisor:
    """Waits on one worker: delivers its records, enforces the timeouts, passes stop signals on."""

    def __init__(self, launcher: ProcessLauncher, work: Work, proc: subprocess.Popen, conn: Connection,
                 clock: CallClock, on_record: Callable[[Any], None]):
        self.limits, self.work, self.proc, self.conn, self.clock = launcher.limits, work, proc, conn, clock
        self.on_record = on_record
        self.stop: int | None = None      # the stop signal passed on to the worker
        self.stop_deadline = 0.0

    def run(self) -> Outcome:
        started = time.monotonic()
        end: Outcome | None = None
        killed: Outcome | None = None
        raise_stop = False
        with stopping.deferred():
            while end is None and killed is None:
                try:
                    signum = stopping.requested()
                    if signum is not None and self.stop is None:
                        self._pass_on(signum)
                    if self.conn.poll(POLL_S):
                        end = self._receive()
                        if end is False:
                            end = None
                            break  # the worker closed its end: it died
                    elif self.proc.poll() is not None and not self.conn.poll(0):
                        break
                    killed = self._past_a_limit(started)
                except KeyboardInterrupt:  # no stop_signals() here (not the main thread's evaluation)
                    raise_stop = True
                    if self.stop is None:
                        self._pass_on(signal.SIGINT)
            if killed is not None:
                _kill(self.proc)
            while end is None and self._readable():  # records sent before the worker stopped are kept
                end = self._receive()
                if end is False:
                    end = None
                    break
        if raise_stop:
            raise KeyboardInterrupt()
        if killed is not None:
            return killed
        if end is not None:
            return end
        return self._crash()

    def _readable(self) -> bool:
        try:
            return self.conn.poll(0)
        except (OSError, EOFError):
            return False

    def _receive(self) -> Outcome | None | bool:
        """One message: a record (delivered; None), the end (its Outcome) or False when the worker's end closed."""
        try:
            kind, payload = self.conn.recv()
        except (EOFError, OSError):
            return False
        if kind == "record":
            self.on_record(payload)
            return None
        if kind == "heard":  # the worker's framework warnings that matter, as our sentences: heard here too
            hear_sentences(payload)
            return None
        return payload

    def _pass_on(self, signum: int) -> None:
        self.stop, self.stop_deadline = signum, time.monotonic() + STOP_GRACE_S
        try:
            self.proc.send_signal(signum)
        except ProcessLookupError:
            pass

    def _past_a_limit(self, started: float) -> Outcome | None:
        limits, label = self.limits, self.work.label
        if limits.call_timeout_s is not None and self.clock.running_for_s() > limits.call_timeout_s:
            return Outcome("timeout", timeout_sentence(label, limits.call_timeout_s, self.clock.phase,
                                                       "its worker process was stopped"))
        if limits.run_timeout_s is not None and time.monotonic() - started > limits.run_timeout_s:
            phase = f" ({self.clock.phase})" if self.clock.phase else ""
            return Outcome("timeout", f"{label}: the run took longer than {spell('run_timeout_s', limits.run_timeout_s)}"
                                      f"{phase} and its worker process was stopped; raise the timeout for a slow model")
        if self.stop is not None and time.monotonic() > self.stop_deadline:
            return Outcome("signal", f"{label}: the worker process did not stop within {STOP_GRACE_S:g} s of "
                                     f"{signal.Signals(self.stop).name} and was killed")
        return None

    def _crash(self) -> Outcome:
        code = self.proc.wait()
        label, phase = self.work.label, self.clock.phase
        if code < 0:
            name = signal.Signals(-code).name if -code in signal.Signals._value2member_map_ else f"signal {-code}"
            how = _CRASHES.get(name, f"was ended by {name}")
        else:
            how = f"exited with status {code} before it finished"
        where = f" while {phase}" if phase else ""
        return Outcome("crash", f"{label}: its worker process {how}{where}; what it measured before is kept, and this "
                                f"process went on: the fault is in the model or in {label}, so try the model alone")


def _kill(proc: subprocess.Popen) -> None:
    """SIGKILL to the worker's process group (it leads a session of its own), then to itself."""
    for kill in (lambda: os.killpg(proc.pid, signal.SIGKILL), proc.kill):
        try:
            kill()
        except (ProcessLookupError, PermissionError, OSError):
            pass


def _stdout() -> int:
    """The worker writes nothing to our stdout (``--json`` stays clean): its stdout goes to our stderr."""
    try:
        os.fstat(2)
        return 2
    except OSError:
        return subprocess.DEVNULL


def _environment() -> dict[str, str]:
    """Ours, with the folder this mlms_nb was imported from first on PYTHONPATH (a notebook may have put it on
    sys.path by hand)."""
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[2])
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join([root] + [p for p in paths if p != root])
    return env
