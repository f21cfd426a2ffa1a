"""The ``inline`` launcher: the work runs here, in the caller's process and thread (the default).

Fastest to start and what a debugger sees; a crash of the framework takes this process with it, and a model call
past ``call_timeout_s`` can be stopped only where the predictor can cancel it (ONNX Runtime); the runner refuses
the timeout for the others before anything runs.

Ctrl-C (or SIGTERM) while the work is inside a native call that Python cannot interrupt: an ONNX Runtime call is
cancelled in place (``RunOptions.terminate``) and the stop goes on as usual; for the others (PyTorch, TensorFlow)
the first signal says that the call stops when it returns, and a second one ends the process, after what was
measured is kept (:func:`~mlms_nb.launchers.stopping.abandon`).
"""
from __future__ import annotations

import logging
import signal
from typing import Any, Callable

from mlms_nb.launchers.base import Launcher, Outcome, StopRequested, Work, outcome_of
from mlms_nb.launchers.stopping import abandon, when_stuck
from mlms_nb.launchers.watch import CallWatch, Watchdog

log = logging.getLogger(__name__)


class InlineLauncher(Launcher):
    name = "inline"

    def launch(self, work: Work, on_record: Callable[[Any], None]) -> Outcome:
        watch = CallWatch(work.label, self.limits.call_timeout_s)
        with Watchdog(watch), when_stuck(lambda signum, count: _stuck(watch, signum, count)):
            try:
                work.function(*work.args, emit=on_record, watch=watch)
            except (KeyboardInterrupt, StopRequested):
                raise
            except Exception as err:  # MemoryError included: the work's outcome, never the caller's crash
                return outcome_of(err, work.label, watch.phase)
        return Outcome()

    def describe(self) -> str:
        return "in-process (frameworks run one after another)"


def _stuck(watch: CallWatch, signum: int, count: int) -> None:
    """A stop signal found the work inside a native call (see the module docstring)."""
    if watch.cancel is not None:
        watch.signalled = signum
        watch.cancel()
        return
    what = "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name
    if count == 1:
        log.warning("%s: the call in progress (%s) cannot be interrupted inside this process; the run stops when it "
                    "returns, keeping what was measured; press Ctrl-C again to end the process now (what was measured "
                    "is kept first), or use --isolate (isolate=True), whose calls can be stopped", watch.label,
                    watch.phase or "a model call")
        return
    abandon(signum, f"{watch.label}: ending the process now ({what} again while {watch.phase or 'a model call'} "
                    "could not be interrupted); what was measured is kept")
