"""``mlms scheduler`` and ``mlms agent``: a Dask scheduler, and a Dask worker that is an mlms agent, in this
process, until stopped (Ctrl-C or SIGTERM).

An agent is a real ``distributed.Worker`` (one task at a time, so two evaluations never share its CPUs) carrying
the :class:`~mlms_nb.launchers.dask_agent.AgentPlugin`, which advertises its stack and serves only the frameworks
it has (or those named). Any Dask scheduler will do (``dask scheduler``); ``mlms scheduler`` is one with no
dashboard. Both print one line, ``mlms scheduler at tcp://...`` / ``mlms agent NAME at tcp://... -> SCHEDULER``, on
stdout when ready, so a script (or a test) can read the address.

Without TLS, whoever can reach a scheduler's or an agent's port can run any code on every agent (Dask runs the
functions its clients send, and sends results back as pickles), so both refuse to listen on an address other than
loopback without TLS unless told ``insecure`` (:func:`check_boundary`); ``--tls-setup DIR`` makes the certificates.
"""
from __future__ import annotations

import asyncio
import ipaddress
import logging
import os
import socket
import sys

from pathlib import Path

from mlms_nb._optional import require
from mlms_nb.fleet.connect import require_tls_files, security_for
from mlms_nb.errors import MlmsError

log = logging.getLogger(__name__)


BOUNDARY = ("anyone who can reach its port can run any code on every agent (Dask runs the functions its clients "
            "send)")


def is_loopback(host: str | None) -> bool:
    """Whether ``host`` (a name or an address) is this machine's loopback only; None and unresolvable names are not."""
    if not host:
        return False
    try:
        infos = socket.getaddrinfo(host.strip("[]"), None)
    except (OSError, UnicodeError):
        return False
    return bool(infos) and all(ipaddress.ip_address(info[4][0].split("%")[0]).is_loopback for info in infos)


def check_boundary(role: str, host: str | None, tls: dict, insecure: bool) -> None:
    """Refuse (`MlmsError`) to listen on ``host`` beyond loopback without TLS, unless ``insecure`` (then say why it
    is dangerous, on stderr). ``host`` None: the interface that reaches the scheduler, which is not loopback."""
    if any(tls.values()) or is_loopback(host):
        return
    where = host or "the interface that reaches the scheduler"
    if not insecure:
        raise MlmsError(f"mlms {role}: refusing to listen on {where} without TLS, since {BOUNDARY}: make certificates "
                        "with `mlms scheduler --tls-setup DIR` and pass them to every side (docs/agents.md), listen on "
                        "127.0.0.1, or pass --insecure on a machine and network you trust")
    print(f"mlms {role}: listening on {where} without TLS (--insecure): {BOUNDARY}; use it only on a network "
          "where you trust everyone", file=sys.stderr, flush=True)


def run_scheduler(host: str = "127.0.0.1", port: int = 8786, tls: dict | None = None, insecure: bool = False,
                  tls_setup: str | None = None) -> None:
    """Run a Dask scheduler here until stopped; prints its address when it listens. ``tls_setup``: a folder where
    the CA and certificate are made (or reused) and used."""
    require("distributed", "mlms scheduler")
    tls = {k: v for k, v in (tls or {}).items() if v}
    if tls_setup:
        if tls:
            raise MlmsError("mlms scheduler: --tls-setup makes the TLS files, so give either it or --tls-ca-file/"
                            "--tls-cert/--tls-key, not both")
        from mlms_nb.fleet.tls_setup import make_certificates

        tls = make_certificates(tls_setup, host)
        flags = " ".join(f"--{k.replace('_', '-')} {v}" for k, v in tls.items())
        print(f"mlms scheduler: TLS certificates in {Path(tls['tls_cert']).parent}; copy ca.pem, node.pem and node.key "
              f"(not ca.key) to every agent and notebook machine and pass: {flags}", file=sys.stderr, flush=True)
    check_boundary("scheduler", host, tls, insecure)
    asyncio.run(_scheduler(host, port, security_for(tls, "scheduler")))


async def _scheduler(host: str, port: int, security) -> None:  # noqa: ANN001
    from distributed import Scheduler

    protocol = "tls" if security.require_encryption else "tcp"
    # its HTTP server (health checks, metrics) on any free port, so several schedulers can run on one machine
    async with Scheduler(host=host, port=port, protocol=protocol, security=security, dashboard=False,
                         dashboard_address=f"{host}:0") as scheduler:
        announce(f"mlms scheduler at {scheduler.address}")
        await until_stopped(scheduler.finished())


def run_agent(scheduler: str, name: str | None = None, labels: dict[str, str] | None = None, threads: int = 1,
              frameworks: list[str] | None = None, traces: str | None = None, host: str | None = None,
              tls: dict | None = None, insecure: bool = False) -> None:
    """Run an mlms agent here until stopped: a Dask worker of ``scheduler`` advertising this machine's stack. Its
    default name, ``HOST-Nt-PID``, is unique per process (two agents on one machine never collide)."""
    require("distributed", "mlms agent")
    from mlms_nb.launchers.dask_agent import make_plugin

    tls = {k: v for k, v in (tls or {}).items() if v}
    require_tls_files(scheduler, tls, "mlms agent")
    name = name or default_agent_name(threads)
    if host is None:
        host = "127.0.0.1" if is_loopback(scheduler.split("://")[-1].rsplit(":", 1)[0]) else None
    check_boundary("agent", host, tls, insecure)
    plugin = make_plugin(name, labels, frameworks, threads, traces)
    asyncio.run(_agent(scheduler, name, plugin, host, security_for(tls, "worker")))


def default_agent_name(threads: int) -> str:
    """``HOST-Nt-PID``: this machine, the agent's threads and its process (unique per process)."""
    return f"{socket.gethostname()}-{threads}t-{os.getpid()}"


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
            announce(f"mlms agent {name} at {worker.address} -> {scheduler} (serves {served})")
            await until_stopped(worker.finished())
    except OSError as err:
        raise MlmsError(f"mlms agent: cannot reach the scheduler at {scheduler} ({err}); start one with "
                        "`mlms scheduler`, or check the address") from None
    except (ValueError, RuntimeError) as err:  # the scheduler refused to register it (Dask wraps that error)
        if any("name taken" in str(e) for e in (err, err.__cause__, err.__context__) if e is not None):
            raise MlmsError(f"mlms agent: the scheduler at {scheduler} already has an agent named {name!r}; give "
                            "this one another --name (or none: the default name is unique per process)") from None
        raise


STOP_SIGNALS = ("SIGINT", "SIGTERM")


async def until_stopped(finished) -> None:  # noqa: ANN001
    """Wait until ``finished`` (the server's own end) or a stop signal (Ctrl-C, SIGTERM), then return, so the server
    closes as its ``async with`` ends. The event loop takes the signal and acts on it between its callbacks: a
    ``KeyboardInterrupt`` raised by a signal handler lands wherever the loop's thread is, and where that is a weakref
    callback or a finalizer Python reports it as ignored and goes on, so the server kept running (a SIGTERM lost
    now and then)."""
    import signal

    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    handled = []
    for name in STOP_SIGNALS:
        try:
            loop.add_signal_handler(getattr(signal, name), stop.set)
            handled.append(getattr(signal, name))
        except (NotImplementedError, RuntimeError, ValueError):  # no loop signal handlers here: Python's own stay
            pass
    ended, stopping = asyncio.ensure_future(finished), asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({ended, stopping}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (ended, stopping):
            task.cancel()
        for sig in handled:
            loop.remove_signal_handler(sig)
    if stop.is_set():
        print("stopped", file=sys.stderr, flush=True)


def announce(line: str) -> None:
    """The ready line on stdout in one write: ``print`` writes the text and its newline apart when stdout is
    unbuffered (PYTHONUNBUFFERED), and a log line from another thread (Dask's, forwarded to the same pipe when a
    script reads both streams) could land between them and glue itself to the address a script reads."""
    sys.stdout.flush()
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # a stream without a file (captured): one write call is all there is
        sys.stdout.write(line + "\n")
        sys.stdout.flush()
        return
    data = (line + "\n").encode()
    while data:
        data = data[os.write(fd, data):]


def main_guard(run, *args, **kwargs) -> None:  # noqa: ANN001
    """Run a server until Ctrl-C or SIGTERM, which end it quietly (:func:`until_stopped`, once it serves; before,
    as a ``KeyboardInterrupt``)."""
    import signal

    signal.signal(signal.SIGTERM, signal.default_int_handler)  # raises KeyboardInterrupt, as Ctrl-C does
    try:
        run(*args, **kwargs)
    except KeyboardInterrupt:
        print("stopped", file=sys.stderr, flush=True)
