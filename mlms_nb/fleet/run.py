"""An evaluation on agents: the registry picks the agents that satisfy the constraints, the runner runs there
through the ``dask`` launcher, and the results come back as the same `Evaluation` objects, written to the caller's
history store as they are measured.

- One agent (the default): the least busy matching agent. When it leaves the cluster mid-run (killed, its machine
  gone), what it measured is kept in the history as a partial evaluation (reason ``crash``) and the evaluation runs
  again, whole, on another matching agent; the result says so among its warnings.
- Every matching agent (``all_agents=True``): one evaluation per agent, in parallel, each recording the agent's
  stack (``Evaluation.stack["agent"]``: name, address, host, labels, threads), comparable side by side
  (:func:`mlms_nb.api.across`).
"""
from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor

from mlms_nb.fleet.connect import AgentsError, connect
from mlms_nb.fleet.constraints import evaluation_constraints, parse_where
from mlms_nb.fleet.registry import choose, list_agents, matching
from mlms_nb.evaluation.result import Evaluation
from mlms_nb.evaluation.runner import EvaluationRunner
from mlms_nb.launchers import Limits
from mlms_nb.launchers.dask_agent import DaskLauncher
from mlms_nb.manifest import Manifest
from mlms_nb.options import EvaluateOptions
from mlms_nb.store.keeping import HistoryKeeper

log = logging.getLogger(__name__)


def tls_of(options) -> dict:  # noqa: ANN001 - any options model with the TLS fields
    return {k: getattr(options, k, None) for k in ("tls_ca_file", "tls_cert", "tls_key")}


def matching_agents(manifests: list[Manifest], options: EvaluateOptions) -> tuple[object, list[dict]]:
    """The client and the agents that satisfy ``where`` plus what the evaluation itself needs."""
    remote = options.remote
    client = connect(remote.on, tls_of(remote))
    constraints = parse_where(remote.where) + evaluation_constraints(
        [m.framework.name for m in manifests], {m.framework.name: m.framework.version for m in manifests})
    return client, matching(list_agents(client), constraints, remote.where or "", remote.on)


def evaluate_on_agents(manifests: list[Manifest], options: EvaluateOptions,
                       metrics=None) -> Evaluation | list[Evaluation]:  # noqa: ANN001 - as evaluate's
    """Run on one matching agent (retrying on another when it dies), or on every one (``all_agents``); ``metrics``
    (output metrics) are computed here, as for a run in this process."""
    client, found = matching_agents(manifests, options)
    if options.remote.all_agents:
        launchers = [_launcher(client, agent, options) for agent in found]
        with ThreadPoolExecutor(len(found), thread_name_prefix="mlms-agent-run") as pool:
            runs = [pool.submit(_run_on, client, agent, manifests, options, launcher, metrics)
                    for agent, launcher in zip(found, launchers)]
            try:
                return [r.result()[0] for r in runs]
            except KeyboardInterrupt:  # Ctrl-C here: every run stops, each keeping what arrived
                for launcher in launchers:
                    launcher.cancel()
                return [r.result()[0] for r in runs]
    tried: set[str] = set()
    lost: list[str] = []
    agent = choose(found)
    while True:
        tried.add(agent["address"])
        evaluation, launcher = _run_on(client, agent, manifests, options, metrics=metrics)
        if not launcher.lost:
            break
        lost.append(f"agent {agent['name']} at {agent['address']} left the cluster during evaluation {evaluation.id} "
                    "(kept in the history as partial, reason crash)")
        try:  # the agents there are now, the lost one no longer among them
            _, found = matching_agents(manifests, options)
        except AgentsError:
            found = []
        agent = choose(found, exclude=tried)
        if agent is None:
            evaluation.warnings.append(lost[-1] + "; no other matching agent was left to run it on")
            return evaluation
        log.warning("%s; running it again on agent %s", lost[-1], agent["name"])
    for sentence in lost:
        evaluation.warnings.append(f"{sentence}; this evaluation ran it again, whole, on agent "
                                   f"{evaluation.stack['agent']['name']}")
    return evaluation


def _launcher(client, agent: dict, options: EvaluateOptions) -> DaskLauncher:  # noqa: ANN001
    return DaskLauncher(Limits(options.isolation.call_timeout_s), client=client, agent=agent)


def _run_on(client, agent: dict, manifests: list[Manifest], options: EvaluateOptions,  # noqa: ANN001
            launcher: DaskLauncher | None = None, metrics=None):
    """One evaluation on ``agent``: kept in the caller's history as it is measured; returns it and its launcher."""
    opts = options if options.threads is not None else options.model_copy(
        update={"threads": int(agent.get("threads") or 1)})
    launcher = launcher or _launcher(client, agent, opts)
    keeper = HistoryKeeper(None if opts.history is True else str(opts.history)) if opts.history else None
    evaluation = EvaluationRunner(manifests, opts, sink=keeper, launcher=launcher, metrics=metrics).run()
    if keeper is not None:
        keeper.finish(evaluation)
        evaluation.saved = keeper.kept(evaluation)
    else:
        evaluation.saved = False  # history=False: nothing is in the store
    return evaluation, launcher
