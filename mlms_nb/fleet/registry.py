"""The registry: the agents a scheduler has now (each advertising its stack), and the ones that satisfy what an
evaluation asks (:mod:`mlms_nb.fleet.constraints`).

Agents are asked directly (``client.run`` on every worker: :func:`~mlms_nb.launchers.dask_agent.advertised`), so the
list is never stale: an agent that died is not in it. Plain Dask workers (no mlms agent plugin, or no mlms-nb) are
left out.
"""
from __future__ import annotations

import pandas as pd

from mlms_nb.fleet.connect import AgentsError
from mlms_nb.fleet.constraints import Constraint, unmet
from mlms_nb.launchers.dask_agent import advertised
from mlms_nb.manifest import FRAMEWORKS


def list_agents(client) -> list[dict]:  # noqa: ANN001 - a distributed.Client
    """Every agent of the client's scheduler, by name (the descriptions they advertise)."""
    answers = client.run(advertised, on_error="return")
    agents = [a for a in answers.values() if isinstance(a, dict)]
    return sorted(agents, key=lambda a: (a.get("name") or "", a.get("address") or ""))


def matching(agents: list[dict], constraints: list[Constraint], where_text: str, address: str) -> list[dict]:
    """The agents that satisfy every constraint; none is an `AgentsError` saying what each agent has and lacks."""
    found = [a for a in agents if not unmet(a, constraints)]
    if found:
        return found
    if not agents:
        raise AgentsError(f"the scheduler at {address} has no mlms agents: start one there with `mlms agent "
                          f"--scheduler {address}`")
    asked = " ".join(c.word for c in constraints)
    lines = [f"{a['name']} ({describe(a)}): " + "; ".join(unmet(a, constraints)) for a in agents]
    raise AgentsError(f"no agent at {address} satisfies {where_text or asked!r}: " + " | ".join(lines))


def choose(found: list[dict], exclude: set[str] = frozenset()) -> dict | None:
    """One agent to run on: the least busy, then the one giving a model most threads, then by name."""
    left = [a for a in found if a["address"] not in exclude]
    if not left:
        return None
    return min(left, key=lambda a: (a.get("running", 0), -int(a.get("threads") or 0), a.get("name") or ""))


def describe(agent: dict) -> str:
    """``torch 2.13.0, onnxruntime 1.23.2; x86_64, 8 CPUs, 31 GiB, no GPU; 2 threads; team=vision``."""
    hw = (agent.get("stack") or {}).get("hardware") or {}
    frameworks = ", ".join(f"{fw} {v}" for fw, v in (agent.get("frameworks") or {}).items()) or "no frameworks"
    gpus = ", ".join(g.get("name", "GPU") for g in hw.get("gpus") or []) or "no GPU"
    memory = f"{hw['memory_bytes'] / 2**30:.0f} GiB" if hw.get("memory_bytes") else "? GiB"
    labels = ",".join(f"{k}={v}" for k, v in (agent.get("labels") or {}).items())
    text = f"{frameworks}; {hw.get('cpu_arch', '?')}, {hw.get('logical_cores', '?')} CPUs, {memory}, {gpus}; " \
           f"{agent.get('threads')} threads"
    return f"{text}; {labels}" if labels else text


def agents_frame(agents: list[dict]) -> pd.DataFrame:
    """One row per agent: who and where, what it serves, its hardware, labels, and what it is doing."""
    rows = []
    for a in agents:
        stack = a.get("stack") or {}
        hw, sw = stack.get("hardware") or {}, stack.get("software") or {}
        gpus = hw.get("gpus") or []
        row = {"agent": a.get("name"), "address": a.get("address"), "host": a.get("host"),
               "threads": a.get("threads"), "labels": ",".join(f"{k}={v}" for k, v in (a.get("labels") or {}).items()),
               "running": a.get("running", 0)}
        row.update({fw: (a.get("frameworks") or {}).get(fw) for fw in FRAMEWORKS})
        row.update({"cpu_model": hw.get("cpu_model"), "cpu_arch": hw.get("cpu_arch"),
                    "logical_cores": hw.get("logical_cores"), "memory_bytes": hw.get("memory_bytes"),
                    "gpus": ", ".join(g.get("name", "") for g in gpus) or None,
                    "gpu_driver": gpus[0].get("driver") if gpus else None, "os": sw.get("os"),
                    "python": sw.get("python"), "mlms_nb": sw.get("mlms_nb"), "traces": a.get("traces")})
        rows.append(row)
    columns = ["agent", "address", "host", "threads", "labels", "running", *FRAMEWORKS, "cpu_model", "cpu_arch",
               "logical_cores", "memory_bytes", "gpus", "gpu_driver", "os", "python", "mlms_nb", "traces"]
    frame = pd.DataFrame(rows, columns=columns)
    frame.attrs["note"] = ("one row per agent; framework columns: the version it serves (empty: not served); "
                           "threads: intra-op threads a model gets there unless the evaluation sets them; running: "
                           "evaluations in progress (an agent runs one at a time); memory_bytes: the machine's")
    return frame
