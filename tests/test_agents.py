"""Agents on Dask (issue 15): a real scheduler and three real agents on loopback, each an ``mlms`` subprocess
started here (one module-scoped cluster): ``a1`` (1 thread, team=vision, every framework), ``b2`` (2 threads,
team=speech, writing its traces to a shared folder) and ``torch-only`` (``--frameworks torch``, team=vision). Every
connection uses Dask's TLS with certificates made here by the openssl command (a CA and one certificate for
127.0.0.1). A tiny ONNX classifier (milliseconds a call) keeps each evaluation cheap. Constraint selection picks the right agents and says what each lacks when none fits;
``all_agents`` runs on every match, comparable side by side; SIGKILL of the agent running an evaluation mid-run
retries on the other and the result is complete. The constraint parser is checked on its own first (no cluster)."""
from __future__ import annotations

import os
import platform
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pandas as pd
import pytest

from mlms_nb.fleet.constraints import ConstraintError, evaluation_constraints, parse_where, unmet
from tests.faults.models import Server, fault_env, manifest, tiny_onnx

QUICK = dict(dataset="synthetic:2", batch_sizes=[1], warmup=1, min_repeats=3, min_time_s=0, progress=False)
AGENT = {"name": "x", "address": "tcp://127.0.0.1:1", "threads": 2, "labels": {"team": "vision"},
         "frameworks": {"torch": "2.13.0", "onnxruntime": "1.23.2"},
         "stack": {"hostname": "box", "hardware": {"cpu_arch": "x86_64", "logical_cores": 8, "memory_bytes": 2**34,
                                                   "gpus": []}}}


# ---------------------------------------------------------------------------------------------- constraints alone

@pytest.mark.parametrize("where, lacks", [
    ("torch>=2.0 device=cpu arch=x86_64 team=vision", []),
    ("pytorch~=2.13 onnxruntime threads>=2 cores>=8 memory>=16GiB host=box name=x", []),
    ("torch>=3", ["torch>=3: has torch 2.13.0, not >=3"]),
    ("tensorflow", ["tensorflow: does not serve tensorflow"]),
    ("device=cuda threads>2 team=speech site=lab", ["device=cuda: has no CUDA GPU", "threads>2: has threads 2",
                                                    "team=speech: has label team vision", "site=lab: has no label site"]),
])
def test_constraints_say_what_an_agent_lacks(where, lacks):
    assert unmet(AGENT, parse_where(where)) == lacks


def test_the_manifests_own_framework_range_counts():
    assert unmet(AGENT, evaluation_constraints(["torch"], {"torch": ">=2.0"})) == []
    assert unmet(AGENT, evaluation_constraints(["torch"], {"torch": "^3.0"})) == [
        "torch ^3.0 (manifest): has torch 2.13.0, outside the manifest's range ^3.0"]


@pytest.mark.parametrize("where, says", [("torch>=two", "not a version range"), ("device=tpu", "device=cpu or"),
                                         ("threads=many", "expected a number"), ("memory>=lots", "16GiB"),
                                         ("team", "cannot read 'team'")])
def test_an_unreadable_constraint_is_one_sentence(where, says):
    with pytest.raises(ConstraintError, match=says):
        parse_where(where)


# ---------------------------------------------------------------------------------------------- a real cluster

pytest.importorskip("distributed", reason="agents need Dask distributed: pip install -e '.[distributed]'")
pytest.importorskip("onnxruntime")


def certificates(folder: Path) -> dict[str, str]:
    """A CA and a certificate it signed for 127.0.0.1 (openssl, RSA 2048, valid 2 days): the TLS options."""
    if not shutil.which("openssl"):
        pytest.skip("the openssl command makes the test's certificates: apt-get install openssl")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    for args in (["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
                  "-subj", "/CN=mlms test CA"],
                 ["req", "-newkey", "rsa:2048", "-nodes", "-keyout", "node.key", "-out", "node.csr", "-subj",
                  "/CN=127.0.0.1"],
                 ["x509", "-req", "-in", "node.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial", "-out",
                  "node.pem", "-days", "2", "-extfile", "san.ext"]):
        subprocess.run(["openssl", *args], cwd=folder, check=True, capture_output=True)
    return {"tls_ca_file": str(folder / "ca.pem"), "tls_cert": str(folder / "node.pem"),
            "tls_key": str(folder / "node.key")}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A scheduler and three agents on loopback, over TLS; yields (address, {name: Server}, a tiny ONNX manifest
    path, the TLS options, the shared traces folder)."""
    root = tmp_path_factory.mktemp("agents")
    tiny_onnx(root / "tiny.onnx")
    path = manifest(root, "tiny", "tiny.onnx")
    tls = certificates(root / "tls")
    flags = [word for key, value in tls.items() for word in ("--" + key.replace("_", "-"), value)]
    shared = root / "shared-traces"
    scheduler = Server(["scheduler", "--port", "0", *flags], fault_env(root / "scheduler"))
    servers = {"scheduler": scheduler}
    try:
        address = scheduler.wait_for("mlms scheduler at").split(" at ")[-1].strip()
        assert address.startswith("tls://")
        for name, args in (("a1", ["--nthreads", "1", "--labels", "team=vision"]),
                           ("b2", ["--nthreads", "2", "--labels", "team=speech", "--traces", str(shared)]),
                           ("torch-only", ["--frameworks", "torch", "--labels", "team=vision"])):
            servers[name] = Server(["agent", "--scheduler", address, "--name", name, *args, *flags],
                                   fault_env(root / name))
        for name in ("a1", "b2", "torch-only"):
            servers[name].wait_for(f"mlms agent {name} at")
        yield address, servers, path, tls, shared
    finally:
        from mlms_nb.fleet.connect import close_all

        close_all()
        for server in reversed(list(servers.values())):  # all asked at once, then waited for
            server.stop(wait=False)
        for server in servers.values():
            server.stop()


# The cluster tests are slow together: starting the scheduler and three agents (each a fresh interpreter importing
# mlms_nb and distributed) costs ~10 s of CPU once per module; each test after that takes about a second (the kill
# test: two 2 s timed loops).
slow = pytest.mark.slow


@pytest.fixture
def history(tmp_path) -> str:
    return f"sqlite:///{tmp_path / 'history.sqlite'}"


@slow
def test_agents_lists_each_agent_and_its_stack(cluster):
    import mlms_nb

    address, _, _, tls, shared = cluster
    frame = mlms_nb.agents(on=address, **tls).set_index("agent")
    assert sorted(frame.index) == ["a1", "b2", "torch-only"]
    assert frame.loc["b2", "threads"] == 2 and frame.loc["a1", "labels"] == "team=vision"
    assert frame.loc["torch-only", "torch"] and pd.isna(frame.loc["torch-only", "onnxruntime"])
    assert frame.loc["a1", "onnxruntime"] and set(frame["cpu_arch"]) == {platform.machine()}
    assert (frame["memory_bytes"] > 0).all() and set(frame["host"]) == {platform.node()}
    assert frame.loc["b2", "traces"] == str(shared) and frame["address"].str.startswith("tls://").all()
    assert list(mlms_nb.agents(on=address, where="team=vision", **tls)["agent"]) == ["a1", "torch-only"]


@slow
def test_constraints_pick_the_agent_that_fits(cluster, history):
    import mlms_nb
    from mlms_nb.fleet.connect import AgentsError

    address, _, path, tls, _ = cluster
    quick = {**QUICK, **tls}
    # team=vision: a1 and torch-only have the label, but only a1 serves onnxruntime, which the manifest needs
    ev = mlms_nb.evaluate(str(path), on=address, where="team=vision", history=history, **quick)
    assert ev.complete and ev.stack["agent"]["name"] == "a1" and ev.options["threads"] == 1
    assert "agent a1" in ev.options["isolation"] and ev.stack["hardware"]["logical_cores"]
    ev = mlms_nb.evaluate(str(path), on=address, where="onnxruntime>=1.0 threads>=2", history=history, **quick)
    assert ev.complete and ev.stack["agent"]["name"] == "b2" and ev.options["threads"] == 2
    stored = mlms_nb.load_evaluation(ev.id, url=history)
    assert stored.stack["agent"]["name"] == "b2" and stored.latency.equals(ev.latency)
    with pytest.raises(AgentsError, match=r"no agent .* satisfies 'team=speech threads>=4'.*b2 .*threads>=4: has "
                                          r"threads 2.*torch-only .*does not serve onnxruntime"):
        mlms_nb.evaluate(str(path), on=address, where="team=speech threads>=4", history=history, **quick)


@slow
def test_all_agents_run_in_parallel_and_compare_side_by_side(cluster, history):
    import mlms_nb

    address, _, path, tls, _ = cluster
    runs = mlms_nb.evaluate(str(path), on=address, all_agents=True, history=history, **QUICK, **tls)
    assert sorted(ev.stack["agent"]["name"] for ev in runs) == ["a1", "b2"]  # torch-only lacks onnxruntime
    assert all(ev.complete and ev.saved for ev in runs) and len({ev.id for ev in runs}) == 2
    rows = mlms_nb.history(url=history).set_index("evaluation_id")
    assert {rows.loc[ev.id, "agent"] for ev in runs} == {f"{ev.stack['agent']['name']} at {ev.stack['agent']['address']}"
                                                         for ev in runs}
    across = mlms_nb.across(runs, baseline="a1")
    assert list(across.table["agent"]) == ["a1", "b2"] and across.table["latency_ratio"].iloc[0] == 1.0
    ab = mlms_nb.compare(runs[0], runs[1], labels=("a1", "b2"))
    assert len(ab.table) == 1 and 0 <= ab.table["p_value"].iloc[0] <= 1


@slow
def test_the_cli_evaluates_on_every_matching_agent(cluster, history, capsys):
    import json

    from mlms_nb import cli

    address, _, path, tls, _ = cluster
    flags = [word for key, value in tls.items() for word in ("--" + key.replace("_", "-"), value)]
    assert cli.main(["agents", "--on", address, *flags, "--json"]) == 0
    assert sorted(a["agent"] for a in json.loads(capsys.readouterr().out)) == ["a1", "b2", "torch-only"]
    assert cli.main(["eval", str(path), "--on", address, "--where", "onnxruntime team=speech", "--all", *flags,
                     "--dataset", "synthetic:2", "--batch-sizes", "1", "--warmup", "1", "--min-repeats", "3",
                     "--min-time", "0", "--no-history", "--json"]) == 0
    runs = json.loads(capsys.readouterr().out)
    assert [r["stack"]["agent"]["name"] for r in runs] == ["b2"]


@slow
def test_a_trace_an_agent_writes_to_the_shared_folder_is_recorded_there(cluster, history):
    import mlms_nb
    from mlms_nb.store.history import HistoryStore

    address, _, path, tls, shared = cluster
    ev = mlms_nb.evaluate(str(path), on=address, where="name=b2", trace_level="MODEL", trace_repeats=1,
                          history=history, **QUICK, **tls)
    assert ev.complete and not ev.trace.spans.empty
    paths = HistoryStore(history).traces(ev.id)["path"].tolist()
    assert len(paths) == 1 and Path(paths[0]).is_relative_to(shared) and Path(paths[0]).exists()
    assert mlms_nb.load_evaluation(ev.id, url=history).traces["onnxruntime"].spans.equals(ev.trace.spans)


@slow
def test_an_agent_killed_mid_run_is_replaced_and_the_result_is_complete(cluster, history):
    """Last in the module: it kills one of the fixture's agents."""
    import mlms_nb

    from mlms_nb.fleet.connect import connect

    address, servers, path, tls, _ = cluster
    client = connect(address, tls)
    names = {a["address"]: a["agent"] for a in mlms_nb.agents(on=address, **tls).to_dict("records")}
    result: dict = {}
    runner = threading.Thread(target=lambda: result.update(ev=mlms_nb.evaluate(
        str(path), on=address, where="onnxruntime", history=history, **{**QUICK, **tls, "min_time_s": 2.0})))
    runner.start()
    # Which agent runs it, from the scheduler (an agent's log lines can arrive late, and earlier tests' lines with
    # them, which once made this test kill an idle agent).
    deadline = time.monotonic() + 60
    while not (victims := [names[worker] for worker, keys in client.processing().items()
                           if any(str(key).startswith("mlms-onnxruntime-") for key in keys)]):
        assert time.monotonic() < deadline and runner.is_alive(), "no agent started the evaluation"
        time.sleep(0.05)
    time.sleep(0.5)  # inside the 2 s timed loop
    os.kill(servers[victims[0]].proc.pid, signal.SIGKILL)
    runner.join(timeout=120)
    ev = result["ev"]
    survivor = ({"a1", "b2"} - {victims[0]}).pop()
    assert ev.complete and ev.stack["agent"]["name"] == survivor
    assert ev.latency["samples"].iloc[0] >= 3 and not ev.missing()
    assert any(f"agent {victims[0]}" in w and "left the cluster" in w for w in ev.warnings)
    rows = mlms_nb.history(url=history).set_index("evaluation_id")
    assert rows.loc[ev.id, "status"] == "complete"
    lost = rows.drop(index=ev.id)
    assert list(lost["reason"]) == ["crash"] and list(lost["status"]) in (["partial"], ["failed"])


# ---------------------------------------------------------------------------------------------- the boundary (issue 23)

def test_a_scheduler_beyond_loopback_without_tls_is_refused_in_one_sentence(tmp_path):
    done = subprocess.run([sys.executable, "-m", "mlms_nb.cli", "scheduler", "--host", "0.0.0.0", "--port", "0"],
                          capture_output=True, text=True, env=fault_env(tmp_path / "home"), timeout=120)
    assert done.returncode != 0 and "mlms scheduler at" not in done.stdout
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "without TLS" in lines[0] and "--tls-setup" in lines[0] and "--insecure" in lines[0]
    assert "Traceback" not in done.stderr


def test_insecure_says_why_and_listens(tmp_path):
    server = Server(["scheduler", "--host", "0.0.0.0", "--port", "0", "--insecure"], fault_env(tmp_path / "home"))
    try:
        assert server.wait_for("mlms scheduler at").split(" at ")[-1].startswith("tcp://")
        assert "run any code on every agent" in server.wait_for("without TLS (--insecure)")
    finally:
        server.stop()


def test_tls_setup_is_one_step_and_a_tls_address_without_files_is_one_sentence(tmp_path):
    import mlms_nb
    from mlms_nb.fleet.connect import AgentsError
    from mlms_nb.fleet.tls_setup import tls_files

    if not shutil.which("openssl"):
        pytest.skip("--tls-setup makes certificates with the openssl command")
    folder = tmp_path / "tls"
    server = Server(["scheduler", "--port", "0", "--tls-setup", str(folder)], fault_env(tmp_path / "home"))
    try:
        address = server.wait_for("mlms scheduler at").split(" at ")[-1].strip()
        assert address.startswith("tls://") and "--tls-ca-file" in server.wait_for("TLS certificates in")
        assert oct((folder / "ca.key").stat().st_mode & 0o777) == "0o600"
        assert mlms_nb.agents(on=address, **tls_files(folder)).empty  # a client with the files gets in
        started = time.monotonic()
        with pytest.raises(AgentsError) as refused:  # at once, not a 20 s timeout and a traceback
            mlms_nb.agents(on=address)
        assert time.monotonic() - started < 2 and "no certificate files" in str(refused.value)
        assert "\n" not in str(refused.value)
    finally:
        from mlms_nb.fleet.connect import close_all

        close_all()
        server.stop()


@slow
def test_two_agents_without_names_do_not_collide_and_a_taken_name_is_one_sentence(tmp_path):
    import mlms_nb

    server = Server(["scheduler", "--port", "0"], fault_env(tmp_path / "s"))
    agents = []
    try:
        address = server.wait_for("mlms scheduler at").split(" at ")[-1].strip()
        agents = [Server(["agent", "--scheduler", address, "--frameworks", "onnxruntime"], fault_env(tmp_path / n))
                  for n in ("a", "b")]
        names = [a.wait_for("mlms agent ").split()[2] for a in agents]
        assert names[0] != names[1] and all(name.startswith(platform.node()) for name in names)
        assert sorted(mlms_nb.agents(on=address)["agent"]) == sorted(names)
        taken = subprocess.run([sys.executable, "-m", "mlms_nb.cli", "agent", "--scheduler", address, "--name",
                                names[0], "--frameworks", "onnxruntime"], capture_output=True, text=True,
                               env=fault_env(tmp_path / "c"), timeout=120)
        assert taken.returncode != 0 and "Traceback" not in taken.stderr, taken.stderr
        assert [line for line in taken.stderr.splitlines() if "already has an agent named" in line]
    finally:
        from mlms_nb.fleet.connect import close_all

        close_all()
        for a in agents:
            a.stop()
        server.stop()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_stop_signal_ends_a_scheduler_and_its_agent_cleanly(tmp_path, sig):
    """The event loop takes the stop signal (never a KeyboardInterrupt raised wherever the loop's thread is, which a
    callback could swallow and leave the server running): each server says "stopped" and exits 0, at once."""
    scheduler = Server(["scheduler", "--port", "0"], fault_env(tmp_path / "scheduler"))
    agent = None
    try:
        address = scheduler.wait_for("mlms scheduler at").split(" at ")[-1].strip()
        agent = Server(["agent", "--scheduler", address, "--name", "quits"], fault_env(tmp_path / "agent"))
        agent.wait_for("mlms agent quits at")
        for server in (agent, scheduler):
            started = time.monotonic()
            server.proc.send_signal(sig)
            assert server.proc.wait(timeout=30) == 0, "".join(server.lines)
            assert time.monotonic() - started < 15 and server.wait_for("stopped")
    finally:
        for server in filter(None, (agent, scheduler)):
            server.stop()
