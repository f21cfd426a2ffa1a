"""Ctrl-C stops every framework's call (issue 23 item 3). Python runs a signal handler only between bytecodes, so a
model call that never returns used to hold Ctrl-C off for good (two SIGINTs over 20 s did not stop an ONNX Runtime
``Loop``). Now the signal wakes a thread that cancels the ONNX Runtime call in place (``RunOptions.terminate``).

The model measures batch size 1 and spins forever at batch size 2 (a ``Loop`` of 10^12 iterations), so the tests
check both that the stuck call stops within 2 s of the signal and that batch size 1, measured before, is kept: in
``mlms eval`` and in a Jupyter kernel interrupted as JupyterLab's stop button does."""
from __future__ import annotations

import json
import signal
import sys
import textwrap
import time

import pytest

from tests.faults.models import Mlms, fault_env, manifest, tiny_onnx

pytest.importorskip("onnxruntime")

STOP_WITHIN_S = 2.0


@pytest.fixture()
def spinning(tmp_path):
    tiny_onnx(tmp_path / "spin.onnx", spins_from_batch=2)
    return manifest(tmp_path, "spin", "spin.onnx"), fault_env(tmp_path / "home")


def test_ctrl_c_cancels_a_never_ending_onnx_runtime_call_in_the_cli(spinning):
    path, env = spinning
    run = Mlms(["eval", str(path), "--dataset", "synthetic:2", "--batch-sizes", "1,2", "--min-time", "0.2",
                "--min-repeats", "3", "--warmup", "1", "--json"], env)
    run.wait_for("timing onnxruntime at batch size 2")
    time.sleep(0.5)  # inside the call that never returns
    sent = time.monotonic()
    run.proc.send_signal(signal.SIGINT)
    try:
        run.wait_for("onnxruntime: interrupted (Ctrl-C)", timeout_s=STOP_WITHIN_S + 3)  # the call stopped
        stopped_s = time.monotonic() - sent
        rc, out, err = run.finish(timeout_s=30)  # then the result is stored and printed
    finally:
        if run.proc.poll() is None:
            run.proc.kill()
    assert stopped_s < STOP_WITHIN_S, (stopped_s, err)
    assert rc == 130, err
    outcome = json.loads(out)["outcomes"]["onnxruntime"]
    assert (outcome["status"], outcome["reason"]) == ("partial", "interrupt")
    assert outcome["measured_batch_sizes"] == [1] and outcome["missing_batch_sizes"] == [2]
    assert "[E:onnxruntime" not in err and "Traceback" not in err
    from mlms_nb.store.history import HistoryStore

    [row] = HistoryStore(f"sqlite:///{env['MLMS_HOME']}/history.sqlite").query().to_dict("records")
    assert (row["status"], row["reason"]) == ("partial", "interrupt")


@pytest.mark.slow  # a kernel starting and importing mlms_nb: ~5 s on a quiet machine
def test_interrupting_the_kernel_cancels_a_never_ending_onnx_runtime_call(spinning):
    jupyter_client = pytest.importorskip("jupyter_client")
    pytest.importorskip("ipykernel")
    path, env = spinning
    km = jupyter_client.KernelManager(kernel_name="python3")
    km.kernel_spec.argv[0] = sys.executable  # this interpreter's kernel (the one with mlms_nb)
    km.start_kernel(env=env)
    kc = km.client()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=120)
        code = textwrap.dedent(f"""\
            import logging, sys
            logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(message)s", force=True)
            import mlms_nb
            ev = mlms_nb.evaluate({str(path)!r}, dataset="synthetic:2", batch_sizes=[1, 2], min_time_s=0.2,
                                  min_repeats=3, warmup=1, progress=False)
            """)
        msg_id = kc.execute(code)
        deadline = time.monotonic() + 120
        seen = ""
        while "timing onnxruntime at batch size 2" not in seen:
            assert time.monotonic() < deadline, seen
            msg = kc.get_iopub_msg(timeout=120)
            if msg["msg_type"] == "stream":
                seen += msg["content"]["text"]
            if msg["msg_type"] == "error":
                pytest.fail("\n".join(msg["content"]["traceback"]))
        time.sleep(0.5)  # inside the call that never returns
        sent = time.monotonic()
        km.interrupt_kernel()  # SIGINT to the kernel, as JupyterLab's stop button sends
        reply = kc.get_shell_msg(timeout=STOP_WITHIN_S + 10)
        while reply["parent_header"].get("msg_id") != msg_id:  # kernel_info's reply, from wait_for_ready
            reply = kc.get_shell_msg(timeout=STOP_WITHIN_S + 10)
        stopped_s = time.monotonic() - sent
        assert reply["content"]["status"] == "ok", reply["content"]  # evaluate returned what it measured
        assert stopped_s < STOP_WITHIN_S, stopped_s
        seen_out: list[str] = []
        check = kc.execute_interactive(
            "print(ev.outcomes['onnxruntime']['reason'], sorted(set(ev.latency['batch_size'])))", timeout=60,
            output_hook=lambda m: m["msg_type"] == "stream" and seen_out.append(m["content"]["text"]))
        assert check["content"]["status"] == "ok"
        assert "".join(seen_out).split() == ["interrupt", "[1]"], seen_out
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


@pytest.mark.slow  # PyTorch's import and a TorchScript load: ~5 s on a loaded machine
def test_a_torch_call_says_how_to_stop_and_a_second_ctrl_c_ends_the_process_keeping_what_was_measured(tmp_path):
    """A TorchScript loop runs in C++ (Python's handler waits for it): the first Ctrl-C says so and how to stop, the
    second ends the process with 130, the framework's row stored as partial / interrupt with batch size 1 in it."""
    torch = pytest.importorskip("torch")

    class Spin(torch.nn.Module):
        def forward(self, x):
            y = x.flatten(1)[:, :10]
            if x.shape[0] >= 2:
                for _ in range(1000000000000):
                    y = y + 0.0
            return y

    torch.jit.script(Spin()).save(str(tmp_path / "spin.pt"))
    (tmp_path / "spin.yaml").write_text("name: spin\nframework: {name: torch}\ninputs: [{type: tensor, layout: NCHW, "
                                        "dimensions: [3, 8, 8]}]\noutputs: [{type: tensor}]\n"
                                        "model: {graph_path: spin.pt}\n")
    env = fault_env(tmp_path / "home")
    run = Mlms(["eval", str(tmp_path / "spin.yaml"), "--trust", "--dataset", "synthetic:2", "--batch-sizes", "1,2",
                "--min-time", "0.2", "--min-repeats", "3", "--warmup", "1", "--json"], env)
    try:
        run.wait_for("timing torch at batch size 2")
        time.sleep(0.5)
        run.proc.send_signal(signal.SIGINT)
        run.wait_for("press Ctrl-C again to end the process now", timeout_s=STOP_WITHIN_S + 3)
        assert run.proc.poll() is None  # the first Ctrl-C cannot stop the C++ loop: it says so
        sent = time.monotonic()
        run.proc.send_signal(signal.SIGINT)
        run.proc.wait(timeout=STOP_WITHIN_S + 3)
        assert time.monotonic() - sent < STOP_WITHIN_S
        rc, _, err = run.finish()
    finally:
        if run.proc.poll() is None:
            run.proc.kill()
    assert rc == 130 and "ending the process now" in err, err
    from mlms_nb.store.history import HistoryStore

    store = HistoryStore(f"sqlite:///{env['MLMS_HOME']}/history.sqlite")
    [row] = store.query().to_dict("records")
    assert (row["status"], row["reason"]) == ("partial", "interrupt")
    assert sorted(set(store.load(int(row["id"])).latency["batch_size"])) == [1]
