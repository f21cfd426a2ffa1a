"""The facade's agent verbs: :func:`scheduler` and :func:`agent` (serve in this process), :func:`agents` (who is
there). Import them from :mod:`mlms_nb.api` (or ``mlms_nb``)."""
from __future__ import annotations

import pandas as pd

from mlms_nb.display import for_people
from mlms_nb.errors import MlmsError
from mlms_nb.fleet.registry import agents_frame, list_agents
from mlms_nb.fleet.run import tls_of
from mlms_nb.options import AgentOptions, AgentsOptions, SchedulerOptions, spell, takes


@takes(SchedulerOptions)
def scheduler(options: SchedulerOptions) -> None:
    """Run a Dask scheduler for mlms agents in this process until Ctrl-C or SIGTERM (any Dask scheduler will do);
    prints ``mlms scheduler at ADDRESS`` when it listens."""
    from mlms_nb.fleet.serve import main_guard, run_scheduler

    main_guard(run_scheduler, options.host or "127.0.0.1", options.port, tls_of(options), options.insecure,
               options.tls_setup)


@takes(AgentOptions)
def agent(options: AgentOptions) -> None:
    """Run an mlms agent in this process until Ctrl-C or SIGTERM: a Dask worker of the scheduler that advertises
    this machine's stack (frameworks and versions, CPU, cores, GPUs and driver, memory, host, labels) and serves
    only the frameworks it has (or those named); prints ``mlms agent NAME at ADDRESS`` when it is ready."""
    from mlms_nb.fleet.serve import main_guard, run_agent

    if not options.scheduler:
        raise MlmsError(f"an agent joins a scheduler: give its address, {spell('scheduler', 'tcp://host:8786')} "
                        "(start one with `mlms scheduler`)")
    main_guard(run_agent, options.scheduler, options.name, options.labels, options.nthreads, options.serves,
               options.traces, options.host, tls_of(options), options.insecure)


@takes(AgentsOptions)
def agents(options: AgentsOptions) -> pd.DataFrame:
    """The mlms agents of the scheduler at ``on`` (those satisfying ``where``, when given), one row per agent: address,
    host, threads, labels, the version of each framework it serves, CPU, cores, memory, GPUs and driver, and whether
    it is busy."""
    from mlms_nb.fleet.connect import connect
    from mlms_nb.fleet.constraints import parse_where
    from mlms_nb.fleet.registry import matching

    if not options.on:
        raise MlmsError(f"which scheduler? give its address: {spell('on', 'tcp://host:8786')}")
    found = list_agents(connect(options.on, tls_of(options)))
    if options.where:
        found = matching(found, parse_where(options.where), options.where, options.on)
    return for_people(agents_frame(found))  # memory in GiB, not 25276063744
