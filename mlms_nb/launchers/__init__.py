"""Where the runner's work executes (issue 15): ``inline`` in this process (the default), ``process`` in a worker
process per framework (``isolate=True``: timeouts, a memory limit, crashes reported), ``dask`` on an mlms agent
(:class:`~mlms_nb.launchers.dask_agent.DaskLauncher`, made by :mod:`mlms_nb.fleet` for the agent it picked, with its
Dask client); all behind one seam (:class:`Launcher`: ``launch(work, on_record) -> Outcome``, ``stack(frameworks)``)."""
from __future__ import annotations

from mlms_nb.launchers.base import (
    REASONS, CallTimeout, Launcher, Limits, Outcome, StopRequested, Work, outcome_of, stop_reason,
)
from mlms_nb.launchers.dask_agent import DaskLauncher
from mlms_nb.launchers.inline import InlineLauncher
from mlms_nb.launchers.process import ProcessLauncher

LAUNCHERS: dict[str, type[Launcher]] = {"inline": InlineLauncher, "process": ProcessLauncher}

__all__ = ["LAUNCHERS", "REASONS", "CallTimeout", "DaskLauncher", "InlineLauncher", "Launcher", "Limits", "Outcome",
           "ProcessLauncher", "StopRequested", "Work", "get_launcher", "outcome_of", "stop_reason"]


def get_launcher(name: str, limits: Limits | None = None) -> Launcher:
    """The launcher called ``name`` (inline | process) with these limits (a ``dask`` one needs a client and an agent:
    :func:`mlms_nb.fleet.run.evaluate_on_agents` makes it)."""
    from mlms_nb.errors import MlmsError

    if name not in LAUNCHERS:
        raise MlmsError(f"unknown launcher {name!r}; expected one of {', '.join(LAUNCHERS)}")
    return LAUNCHERS[name](limits)
