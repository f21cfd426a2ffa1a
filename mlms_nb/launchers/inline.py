"""The ``inline`` launcher: the work runs here, in the caller's process and thread (the default).

Fastest to start and what a debugger sees; a crash of the framework takes this process with it, and a model call
past ``call_timeout_s`` can be stopped only where the predictor can cancel it (ONNX Runtime); the runner refuses
the timeout for the others before anything runs.
"""
from __future__ import annotations

from typing import Any, Callable

from mlms_nb.launchers.base import Launcher, Outcome, StopRequested, Work, outcome_of
from mlms_nb.launchers.watch import CallWatch, Watchdog


class InlineLauncher(Launcher):
    name = "inline"

    def launch(self, work: Work, on_record: Callable[[Any], None]) -> Outcome:
        watch = CallWatch(work.label, self.limits.call_timeout_s)
        with Watchdog(watch):
            try:
                work.function(*work.args, emit=on_record, watch=watch)
            except (KeyboardInterrupt, StopRequested):
                raise
            except Exception as err:  # MemoryError included: the work's outcome, never the caller's crash
                return outcome_of(err, work.label, watch.phase)
        return Outcome()

    def describe(self) -> str:
        return "in-process (frameworks run one after another)"
