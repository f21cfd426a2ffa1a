"""``mlms scheduler`` and ``mlms agent``: a Dask scheduler, and a Dask worker that is an mlms agent, in this
process, until stopped (Ctrl-C or SIGTERM).

An agent is a real ``distributed.Worker`` (one task at a time, so two evaluations never share its CPUs) carrying
the :class:`~mlms_nb.launchers.dask_agent.AgentPlugin`, which advertises its stack and serves only the frameworks
it has (or those named). Any Dask scheduler will do (``dask scheduler``); ``mlms scheduler`` is one with no
dashboard. Both print one line, ``mlms scheduler at tcp://...`` / ``mlms agent NAME at tcp://... -> SCHEDULER``, on
stdout when ready, so a script (or a test) can read the address.
"""
from __future__ import annotations

import asyncio
import logging
import socket
import sys

from mlms_nb._optional import require
from mlms_nb.fleet.connect import security_for
from mlms_nb.errors import MlmsError

log = logging.getLogger(__name__)


def run_scheduler(host: str = "127.0.0.1", port: int = 8786, tls: dict | None = None) -> None:
    """Run a Dask scheduler here until stopped; prints its address when it listens."""
    require("distributed", "mlms scheduler")
    asyncio.run(_scheduler(host, port, security_for(tls or {}, "scheduler")))


async def _scheduler(host: str, port: int, security) -> None:  # noqa: ANN001
    from distributed import Scheduler

    protocol = "tls" if security.require_encryption else "tcp"
    # its HTTP server (health checks, metrics) on any free port, so several schedulers can run on one machine
    async with Scheduler(host=host, port=port, protocol=protocol, security=security, dashboard=False,
                         dashboard_address=f"{host}:0") as scheduler:
        print(f"mlms scheduler at {scheduler.address}", flush=True)
        await scheduler.finished()


def run_agent(scheduler: str, name: str | None = None, labels: dict[str, str] | None = None, threads: int = 1,
              frameworks: list[str] | None = None, traces: str | None = None, host: str | None = None,
              tls: dict | None = None) -> None:
    """Run an mlms agent here until stopped: a Dask worker of ``scheduler`` advertising this machine's stack."""
    require("distributed", "mlms agent")
    from mlms_nb.launchers.dask_agent import make_plugin

    name = name or f"{socket.gethostname()}-{threads}t"
    plugin = make_plugin(name, labels, frameworks, threads, traces)
    if host is None:
        host = "127.0.0.1" if scheduler.split("://")[-1].startswith(("127.", "localhost")) else None
    asyncio.run(_agent(scheduler, name, plugin, host, security_for(tls or {}, "worker")))


QUIET_WORKER = {"distributed.worker.profile.enabled": False, "distributed.admin.system-monitor.gil.enabled": False,
                "distributed.admin.system-monitor.interval": "5s"}
"""Dask's statistical profiler samples every thread's stack each 10 ms, and its system monitor polls each 0.5 s: both
would share the CPU with the model being timed, so an agent turns the profiler and the GIL monitor off and polls less."""


async def _agent(scheduler: str, name: str, plugin, host: str | None, security) -> None:  # noqa: ANN001
    import dask
    from distributed import Worker

    dask.config.set(QUIET_WORKER)

    try:
        worker = Worker(scheduler, nthreads=1, name=name, host=host, security=security, plugins=(plugin,),
                        dashboard=False, resources={f"mlms-{fw}": 1 for fw in plugin.description["frameworks"]},
                        memory_limit=0)
        async with worker:
            served = ", ".join(f"{fw} {v}" for fw, v in plugin.description["frameworks"].items())
            print(f"mlms agent {name} at {worker.address} -> {scheduler} (serves {served})", flush=True)
            await worker.finished()
    except OSError as err:
        raise MlmsError(f"mlms agent: cannot reach the scheduler at {scheduler} ({err}); start one with "
                        "`mlms scheduler`, or check the address") from None


def main_guard(run, *args, **kwargs) -> None:  # noqa: ANN001
    """Run a server until Ctrl-C or SIGTERM, which end it quietly."""
    import signal

    signal.signal(signal.SIGTERM, signal.default_int_handler)  # raises KeyboardInterrupt, as Ctrl-C does
    try:
        run(*args, **kwargs)
    except KeyboardInterrupt:
        print("stopped", file=sys.stderr, flush=True)
