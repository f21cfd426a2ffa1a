"""The ``dask`` launcher: one framework's work on an mlms agent, a Dask distributed worker (``mlms agent``).

An agent is a real ``distributed.Worker`` carrying the ``mlms-agent`` plugin (:func:`make_plugin`): the stack it advertises (frameworks and
versions, CPU, cores, GPUs and driver, memory, host; :func:`mlms_nb.stack.detect_stack`), its labels, the
frameworks it serves and the threads it gives a model. :func:`advertised` is what ``client.run`` asks every worker
(a plain Dask worker answers None). The registry (:mod:`mlms_nb.fleet`) picks the agent; this launcher runs the
:class:`~mlms_nb.launchers.base.Work` there, pinned to that worker (``workers=[address]``, no other worker allowed).

Records stream back as they are made: the work's ``emit`` pickles each record into a ``distributed.Queue`` named
for this run (through the scheduler; the records are the caller's own objects, as with the ``process`` launcher),
and :meth:`DaskLauncher.launch` hands them to ``on_record`` here, in order, while the work goes on; the last item
is how the work ended. An agent that leaves the cluster mid-run (killed, its machine gone) is seen within
``LIVENESS_S`` (the scheduler's list of workers): the outcome is a ``crash`` and :attr:`DaskLauncher.lost` is set, so the caller can run the evaluation on
another agent. Ctrl-C here cancels the task and sets the run's stop event: Dask cannot stop a task that is running,
so the agent drops the run at the work's next record.
"""
from __future__ import annotations

import copy
import logging
import pickle
import time
from typing import Any, Callable

from mlms_nb.launchers.base import Launcher, Limits, Outcome, StopRequested, Work, outcome_of
from mlms_nb.launchers.watch import CallWatch, Watchdog

log = logging.getLogger(__name__)

PLUGIN = "mlms-agent"
LIVENESS_S = 0.5
"""When no record came for this long (s), the launcher asks the scheduler whether the agent is still there."""


class AgentDescription:
    """What makes a Dask worker an mlms agent: its description, completed at the worker's setup (see
    :func:`make_plugin`, which wraps it in a ``distributed.WorkerPlugin``).

    ``frameworks``: the frameworks it serves (None: every installed one); ``threads``: the intra-op threads a model
    gets when the evaluation does not say; ``traces``: a folder every agent and the notebook share, where the agent
    writes the traces it records (None: they travel back with the records)."""

    def __init__(self, name: str, labels: dict[str, str] | None = None, frameworks: list[str] | None = None,
                 threads: int = 1, traces: str | None = None):
        from mlms_nb.manifest import FRAMEWORKS, canonical_framework
        from mlms_nb.stack import framework_version

        installed = {fw: framework_version(fw) for fw in FRAMEWORKS}
        installed = {fw: v for fw, v in installed.items() if v is not None}
        served = list(installed) if not frameworks else [canonical_framework(fw) for fw in frameworks]
        missing = [fw for fw in served if fw not in installed]
        if missing:
            from mlms_nb.errors import MlmsError

            raise MlmsError(f"this agent cannot serve {', '.join(missing)}: not installed here (installed: "
                            f"{', '.join(installed) or 'none'}); install it or leave it out of --frameworks")
        self.description: dict[str, Any] = {
            "name": name, "labels": dict(labels or {}), "frameworks": {fw: installed[fw] for fw in served},
            "threads": int(threads), "traces": traces}

    def complete(self, worker) -> None:  # noqa: ANN001 - distributed's Worker
        import os

        from mlms_nb.stack import detect_stack

        stack = detect_stack(self.description["frameworks"])
        self.description.update(address=worker.address, host=stack.get("hostname"), pid=os.getpid(), stack=stack)


def make_plugin(name: str, labels: dict[str, str] | None = None, frameworks: list[str] | None = None,
                threads: int = 1, traces: str | None = None):  # noqa: ANN201 - a distributed.WorkerPlugin
    """The ``distributed.WorkerPlugin`` (named ``mlms-agent``) that makes a worker an agent (see
    :class:`AgentDescription`); ``.description`` is what it advertises."""
    from distributed import WorkerPlugin

    agent = AgentDescription(name, labels, frameworks, threads, traces)

    class AgentPlugin(WorkerPlugin):
        def __init__(self) -> None:
            self.name = PLUGIN
            self.description = agent.description

        def setup(self, worker) -> None:  # noqa: ANN001
            agent.complete(worker)

    return AgentPlugin()


def advertised(dask_worker=None) -> dict | None:  # noqa: ANN001 - client.run passes the worker by this name
    """This worker's agent description (None when it is a plain Dask worker), with the tasks it is running."""
    plugin = (getattr(dask_worker, "plugins", None) or {}).get(PLUGIN)
    if plugin is None:
        return None
    description = copy.deepcopy(plugin.description)
    description["running"] = len(getattr(dask_worker.state, "executing", ()) or ())
    return description


def run_on_agent(work: Work, queue_name: str, call_timeout_s: float | None, spelled: str) -> Outcome:
    """On the agent: run ``work``, putting each record (pickled) on the queue; returns how it ended. A caller that
    stopped waiting (Ctrl-C) sets the run's stop event, and the work stops at its next record."""
    from distributed import Event, Queue, get_worker

    from mlms_nb.options import spelling

    plugin = get_worker().plugins.get(PLUGIN)
    if plugin is None:
        return Outcome("error", f"{work.label}: this Dask worker is not an mlms agent; start one with `mlms agent`")
    me = plugin.description
    if work.label not in me["frameworks"]:
        return Outcome("error", f"{work.label}: agent {me['name']} serves only {', '.join(me['frameworks'])}")
    queue, stop = Queue(queue_name), Event(f"{queue_name}-stop")
    traces = me.get("traces")
    log.info("agent %s: running %s", me["name"], work.label)

    def emit(record) -> None:
        if stop.is_set():
            raise KeyboardInterrupt()  # the caller is gone: what follows would reach no one
        trace = getattr(record, "trace", None)
        if traces and trace is not None and hasattr(trace, "save"):  # written where every reader can find it
            trace.metadata["saved_to"] = str(trace.save(_join(traces, trace.trace_id or queue_name)))
        queue.put(pickle.dumps(record, protocol=pickle.HIGHEST_PROTOCOL))

    watch = CallWatch(work.label, call_timeout_s)
    try:
        with spelling(spelled), Watchdog(watch):
            try:
                work.function(*work.args, emit=emit, watch=watch)
                end = Outcome()
            except BaseException as err:  # noqa: BLE001 - everything goes back as an outcome
                end = outcome_of(err, work.label, watch.phase)
                end = Outcome(end.status, end.message, _picklable(end.error), end.detail)
        log.info("agent %s: %s %s", me["name"], work.label, "finished" if end.ok else f"ended: {end.message}")
        queue.put(pickle.dumps(_End(end), protocol=pickle.HIGHEST_PROTOCOL))  # after every record: how it ended
        return end
    finally:
        queue.close()


class _End:
    """The last item on a run's queue: its outcome (so the caller needs no second channel to learn it ended)."""

    def __init__(self, outcome: Outcome):
        self.outcome = outcome


class DaskLauncher(Launcher):
    """Runs each framework's work on ``agent`` (a description from :func:`advertised`) through ``client``."""

    name = "dask"

    def __init__(self, limits: Limits | None = None, *, client, agent: dict):  # noqa: ANN001 - a distributed.Client
        super().__init__(limits)
        self.client = client
        self.agent = agent
        self.lost = False  # the agent left the cluster during a launch
        self.cancelled = False  # the caller asked (from another thread) to stop: see cancel()

    def describe(self) -> str:
        a = self.agent
        return f"on mlms agent {a['name']} at {a['address']} ({a.get('threads')} threads per model)"

    def stack(self, frameworks: list[str]) -> dict:
        """The agent's stack (where the numbers were measured), with who the agent is."""
        stack = copy.deepcopy(self.agent.get("stack") or {})
        software = stack.setdefault("software", {})
        for fw in frameworks:
            software.setdefault(fw, (self.agent.get("frameworks") or {}).get(fw))
        stack["agent"] = {k: self.agent.get(k) for k in ("name", "address", "host", "labels", "threads")}
        return stack

    def launch(self, work: Work, on_record: Callable[[Any], None]) -> Outcome:
        from distributed import Queue

        from mlms_nb._clock import new_id
        from mlms_nb.options import current_spelling

        queue = Queue(f"mlms-records-{new_id()}", client=self.client)
        future = self.client.submit(run_on_agent, work, queue.name, self.limits.call_timeout_s, current_spelling(),
                                    key=f"mlms-{work.label}-{new_id()}", workers=[self.agent["address"]],
                                    allow_other_workers=False, pure=False)
        try:
            while True:
                if self.cancelled:
                    raise KeyboardInterrupt()
                try:
                    item = pickle.loads(queue.get(timeout=LIVENESS_S))
                except TimeoutError:  # nothing for a while: is the agent still there, the task still running?
                    if self._gone():  # first: a killed agent's task may also read as errored or finished
                        return self._lost_outcome(work.label)
                    if future.status == "finished":  # it ended before running the work (see run_on_agent)
                        return future.result()
                    if future.status == "error":
                        return outcome_of(future.exception(), work.label)
                    continue
                if isinstance(item, _End):
                    return item.outcome
                on_record(item)
        except (KeyboardInterrupt, StopRequested):
            self._stop(queue.name)
            future.cancel()
            raise
        except Exception as err:  # noqa: BLE001 - Dask itself failed (the scheduler went away, ...)
            if self._gone():  # the queue or the task failed because the agent died: run it again elsewhere
                return self._lost_outcome(work.label)
            return outcome_of(err, work.label)
        finally:
            if not future.done():
                future.cancel()
            try:
                queue.close()
            except Exception:  # noqa: BLE001 - the scheduler may be gone; nothing to keep
                pass

    def _gone(self) -> bool:
        """Whether the agent has left the cluster (the scheduler no longer lists it)."""
        try:
            return self.agent["address"] not in self.client.nthreads()
        except Exception:  # noqa: BLE001 - the scheduler itself is unreachable: that is not the agent's loss
            return False

    def _lost_outcome(self, label: str) -> Outcome:
        self.lost = True
        return Outcome("crash", f"{label}: agent {self.agent['name']} at {self.agent['address']} left the cluster "
                                "before it finished (killed, or its machine went away); what it measured before is "
                                "kept")

    def cancel(self) -> None:
        """Stop the run in progress as Ctrl-C would (from another thread; within ``LIVENESS_S``): what arrived is
        kept, and the agent drops the run at its next record."""
        self.cancelled = True

    def _stop(self, queue_name: str) -> None:
        """Tell the agent to drop the run at its next record (Dask cannot stop a task that is running)."""
        from distributed import Event

        try:
            Event(f"{queue_name}-stop", client=self.client).set()
        except Exception:  # noqa: BLE001 - the scheduler is gone: so is the run
            pass


def _join(base: str, name: str) -> str:
    return f"{base.rstrip('/')}/{name}"


def _picklable(error: BaseException | None) -> BaseException | None:
    try:
        pickle.dumps(error)
        return error
    except Exception:  # noqa: BLE001 - its sentence is in the outcome's message
        return None
