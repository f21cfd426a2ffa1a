"""Every launcher x every framework, each in a fresh MLMS_HOME, on a built-in model whose ONNX Runtime and
TensorFlow copies are conversions (``artifact://``): the path a new user takes (issue 37). ``mlms eval`` runs as a
user runs it, a new process each time, so nothing the test process imported can stand in for what the launcher's
own process must find itself: inline (the framework in the ``mlms`` process), ``--isolate`` (a worker process per
framework) and a Dask agent (``--on``: a real scheduler and agent on loopback, the agent with a fresh home of its
own). The conversions are built where the framework runs, in that fresh home, and reported apart from the cold
start; EfficientNet-Lite0 on the 20 labelled photos gives top-1 85% and top-5 95% in all three."""
from __future__ import annotations

import json

import pytest

from tests.faults.models import Server, fault_env, run_mlms

FRAMEWORKS = ("torch", "onnxruntime", "tensorflow")
for _module in ("torch", "onnxruntime", "onnx", "tensorflow"):
    pytest.importorskip(_module)

QUICK = ["--dataset", "imagenet-samples", "--batch-sizes", "1", "--warmup", "1", "--min-repeats", "3",
         "--min-time", "0", "--json"]


def evaluate_everywhere(launcher: str, tmp_path) -> dict:
    """``mlms eval efficientnet_lite0`` in every framework through ``launcher``, from a fresh home: its JSON."""
    env = fault_env(tmp_path / "home")
    args = ["eval", "efficientnet_lite0", "--framework", ",".join(FRAMEWORKS), *QUICK]
    servers: list[Server] = []
    try:
        if launcher == "isolate":
            args.append("--isolate")
        elif launcher == "agent":
            pytest.importorskip("distributed")
            servers.append(Server(["scheduler", "--port", "0"], fault_env(tmp_path / "scheduler")))
            address = servers[0].wait_for("mlms scheduler at").split(" at ")[-1].strip()
            servers.append(Server(["agent", "--scheduler", address, "--name", "fresh"],
                                  fault_env(tmp_path / "agent-home")))
            servers[1].wait_for("mlms agent fresh at")
            args += ["--on", address]
        rc, out, err = run_mlms(args, env, timeout_s=600)
    finally:
        for server in servers:
            server.stop(wait=False)
        for server in servers:
            server.stop()
    assert rc == 0, err[-3000:]
    return json.loads(out)


@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["inline", "isolate", "agent"])
def test_every_framework_evaluates_a_converted_builtin_from_a_fresh_home(launcher, tmp_path):
    run = evaluate_everywhere(launcher, tmp_path)
    assert run["complete"] and run["missing"] == [], run["outcomes"]
    accuracy = {r["framework"]: r["accuracy"] for r in run["results"]}
    assert sorted(accuracy) == sorted(FRAMEWORKS)
    for framework, acc in accuracy.items():
        assert (acc["n"], round(acc["top1"], 2), round(acc["top5"], 2)) == (20, 0.85, 0.95), framework
    built = {r["framework"]: r["cold_start"]["conversion_ms"] for r in run["results"]}
    assert built["torch"] == 0 and built["onnxruntime"] > 0 and built["tensorflow"] > 0  # apart from the load
    if launcher == "agent":
        assert {r["framework"] for r in run["results"]} == set(FRAMEWORKS)
        assert run["stack"]["agent"]["name"] == "fresh"
        assert (tmp_path / "agent-home" / "artifacts" / "efficientnet_lite0").is_dir()  # built where it ran
    else:
        assert (tmp_path / "home" / "artifacts" / "efficientnet_lite0").is_dir()
