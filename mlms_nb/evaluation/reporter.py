"""Progress reported where the work runs (in this process or a worker process): :class:`Reporter` emits
:class:`~mlms_nb.evaluation.records.PassProgress` records, which cross a process boundary like any record, for
:class:`~mlms_nb.evaluation.progress.ProgressDisplay` to show where the user is; :class:`LoopProgress` is one timed
loop's phases, :class:`Phases` the work's steps. Low in the evaluation's layers, so that every workload's work
(predict, generate) reports the same way.
"""
from __future__ import annotations

import math
import time
from typing import Callable

from mlms_nb.evaluation.records import PassProgress
from mlms_nb.options import Timing


class Reporter:
    """Emits `PassProgress` for one framework: ``start(name, total)``, ``advance(inputs)``, ``finish()``."""

    def __init__(self, emit: Callable, framework: str, interval_s: float = 0.2):
        self.emit = emit
        self.framework = framework
        self.interval_ns = int(interval_s * 1e9)
        self.name = ""
        self.done = 0
        self.total: int | None = None
        self._last = 0
        self.started_ns = 0  # when the current pass started (time.perf_counter_ns)

    def start(self, name: str, total: int | None) -> None:
        self.name, self.done, self.total = name, 0, total
        self.started_ns = self._last = time.perf_counter_ns()
        self.emit(PassProgress(self.framework, name, 0, total))

    def advance(self, inputs: int) -> None:
        self.done += inputs
        now = time.perf_counter_ns()
        if now - self._last >= self.interval_ns:
            self._last = now
            self.emit(PassProgress(self.framework, self.name, self.done, self.total))

    def finish(self) -> None:
        self.emit(PassProgress(self.framework, self.name, self.done, self.done, finished=True))

    def step(self, name: str) -> None:
        """The work moved on to ``name``, a step with no inputs to count (see `PassProgress.step`)."""
        self.name, self.done, self.total = name, 0, None
        self.started_ns = self._last = time.perf_counter_ns()
        self.emit(PassProgress(self.framework, name, 0, None, step=True))

    def loop(self, batch_size: int, timing: Timing) -> "LoopProgress":
        """The progress of one timed loop at ``batch_size`` (warm-up, then the timed calls), for
        :func:`mlms_nb.evaluation.scenarios.run_scenario`."""
        return LoopProgress(self, batch_size, timing)


class Phases:
    """Where one framework's work is, said once per phase: to the launcher's call watch (its timeout sentence names
    the phase) and, with a reporter, to the progress display as a step."""

    def __init__(self, watch, reporter: Reporter | None):
        self.watch, self.reporter = watch, reporter

    def __call__(self, name: str) -> None:
        self.watch.phase = name
        if self.reporter is not None:
            self.reporter.step(name)


class LoopProgress:
    """A timed loop's phases for `run_scenario`: the warm-up (its length known only when a count), then the timed
    loop, whose total is estimated from the stopping rule (``min_repeats`` calls and ``min_time_s`` seconds, at
    most ``max_repeats`` calls or ``max_time_s``) and the calls' mean so far."""

    def __init__(self, reporter: Reporter, batch_size: int, timing: Timing):
        self.reporter, self.batch_size, self.timing = reporter, batch_size, timing

    def warm_up(self) -> Callable[[], None]:
        calls = None if self.timing.warmup == "auto" else int(self.timing.warmup)
        self.reporter.start(f"warm-up, batch {self.batch_size}", None if calls is None else calls * self.batch_size)
        return self._tick

    def timed(self, scenario: str) -> Callable[[], None]:
        self.reporter.finish()
        t = self.timing
        calls = t.min_repeats if scenario != "server" else min(
            t.max_repeats, max(t.min_repeats, math.ceil((t.target_qps or 1) * t.min_time_s)))
        self.reporter.start(f"timed loop, batch {self.batch_size}", calls * self.batch_size)
        self._estimate = scenario != "server"
        return self._timed_tick

    def done(self) -> None:
        self.reporter.finish()

    def _tick(self) -> None:
        self.reporter.advance(self.batch_size)

    def _timed_tick(self) -> None:
        r = self.reporter
        r.advance(self.batch_size)
        if self._estimate and r.total is not None and r.done >= self.batch_size * 3:
            calls = r.done // self.batch_size
            per_call_s = (time.perf_counter_ns() - r.started_ns) / 1e9 / calls
            t = self.timing
            need = max(t.min_repeats, math.ceil(t.min_time_s / per_call_s)) if per_call_s > 0 else t.min_repeats
            need = min(need, t.max_repeats, max(calls, math.ceil(t.max_time_s / per_call_s) if per_call_s > 0 else need))
            r.total = max(need, calls) * self.batch_size
