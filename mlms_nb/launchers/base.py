"""The launcher seam: where one framework's work runs (this process, a worker process, later a Dask agent).

A :class:`Work` names a module-level function (so a worker process can import it by name) and its arguments; the
function is called as ``function(*args, emit=emit, watch=watch)``: ``emit(record)`` hands each measurement to the
caller as soon as it is made, ``watch`` (:class:`~mlms_nb.launchers.watch.CallWatch`) guards each model call
against the per-call timeout. A :class:`Launcher` runs it: every record reaches ``on_record`` in the caller's
process, in order, while the work goes on, whatever the launcher; the records are the caller's own objects
(pickled across a process boundary), so what comes back is the same whichever launcher ran it.

``launch`` returns an :class:`Outcome`: complete, or why not (an error, a timeout, a crash), as one sentence.
A stop asked for by the user (Ctrl-C: ``KeyboardInterrupt``; SIGTERM or SIGHUP: :class:`StopRequested`) is
raised to the caller after the records measured before it have been delivered.
"""
from __future__ import annotations

import signal
import traceback
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar

from mlms_nb.errors import MlmsError

REASONS = ("error", "interrupt", "signal", "timeout", "crash")
"""Why a framework's results are partial: an error in the work, the user's Ctrl-C, a stop signal (SIGTERM,
SIGHUP), a timeout, or a crash of the process that ran it."""


class StopRequested(BaseException):
    """SIGTERM or SIGHUP arrived: stop measuring, keep what was measured (like ``KeyboardInterrupt`` for Ctrl-C)."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = int(signum)

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name

    def __str__(self) -> str:
        return f"stopped by {self.name}"


class CallTimeout(MlmsError, TimeoutError):
    """A model call ran longer than the per-call timeout and was stopped."""


@dataclass(frozen=True)
class Limits:
    """What bounds one framework's work: ``call_timeout_s`` per model call, ``run_timeout_s`` for the whole work
    and ``memory_limit_bytes`` (the last two need a worker process)."""
    call_timeout_s: float | None = None
    run_timeout_s: float | None = None
    memory_limit_bytes: int | None = None


@dataclass(frozen=True)
class Work:
    """``function(*args, emit=..., watch=...)``, a module-level function; ``label`` names it in messages."""
    function: Callable[..., None]
    args: tuple = ()
    label: str = "work"


@dataclass
class Outcome:
    """How a piece of work ended: ``status`` "complete" or one of :data:`REASONS`; ``message`` one sentence saying
    what happened and what to do; ``error`` the exception where it could be brought back; ``detail`` a traceback."""
    status: str = "complete"
    message: str = ""
    error: BaseException | None = field(default=None, repr=False)
    detail: str = field(default="", repr=False)

    @property
    def ok(self) -> bool:
        return self.status == "complete"


def stop_reason(stop: BaseException) -> str:
    """Why a timed loop was cut short, one of :data:`REASONS`: interrupt, signal, timeout, or error."""
    if isinstance(stop, KeyboardInterrupt):
        return "interrupt"
    if isinstance(stop, StopRequested):
        return "signal"
    return "timeout" if isinstance(stop, CallTimeout) else "error"


def outcome_of(err: BaseException, label: str, phase: str = "") -> Outcome:
    """The outcome of work that raised ``err`` (one sentence for the user, the traceback kept aside); ``phase``
    says what the work was doing (``timing batch size 8``)."""
    detail = "".join(traceback.format_exception(err))
    during = f" while {phase}" if phase else ""
    if isinstance(err, KeyboardInterrupt):
        return Outcome("interrupt", "interrupted (Ctrl-C)", None, detail)
    if isinstance(err, StopRequested):
        return Outcome("signal", str(err), None, detail)
    if isinstance(err, CallTimeout):
        return Outcome("timeout", str(err), err, detail)
    if isinstance(err, MemoryError):
        text = str(err) or "an allocation failed"
        return Outcome("error", f"{label} ran out of memory ({text}): use smaller batch sizes, or run it where more "
                                "memory is free", err, detail)
    if isinstance(err, MlmsError):
        return Outcome("error", str(err), err, detail)
    text = " ".join(str(err).split())  # a framework's multi-line message, as one sentence
    return Outcome("error", f"{label} failed{during} with {type(err).__name__}: {text}", err, detail)


class Launcher(ABC):
    """Runs one framework's :class:`Work` somewhere, within :class:`Limits`."""

    name: ClassVar[str]

    def __init__(self, limits: Limits | None = None):
        self.limits = limits or Limits()

    @abstractmethod
    def launch(self, work: Work, on_record: Callable[[Any], None]) -> Outcome:
        """Run ``work``; each record it emits reaches ``on_record`` (here, in order) as soon as it is made.
        Returns how it ended; raises ``KeyboardInterrupt`` / :class:`StopRequested` when the user stopped it, after
        every record measured before the stop has reached ``on_record``."""

    def stack(self, frameworks: list[str]) -> dict:
        """The stack the work runs on (:func:`mlms_nb.stack.detect_stack`): this machine's, unless the launcher
        runs it elsewhere (an agent's)."""
        from mlms_nb.stack import detect_stack

        return detect_stack(frameworks)

    @abstractmethod
    def describe(self) -> str:
        """Where the work runs, in words (``Evaluation.options["isolation"]``)."""
