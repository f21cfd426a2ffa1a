"""Real signals to a real ``mlms eval`` mid-sweep (issue 12): SIGINT once, SIGINT twice 0.02 s apart, SIGTERM and
SIGKILL each leave every completed (framework, batch size) in the history, the row marked partial with the reason;
the cut-short loop is kept and flagged; after SIGKILL nothing is half written and the next run leaves no temp file.

The model is a tiny ONNX classifier built by the tests (tests/faults/models.py): each run takes a few seconds, most
of it the interpreter starting and the 1 s timed loop at batch size 1 before the signal."""
from __future__ import annotations

import json
import signal
import time

import pytest

from tests.faults.models import Mlms, fault_env, manifest, run_mlms, tiny_onnx

pytest.importorskip("onnxruntime")


@pytest.fixture()
def tiny(tmp_path):
    tiny_onnx(tmp_path / "tiny.onnx")
    return manifest(tmp_path, "tiny", "tiny.onnx"), fault_env(tmp_path / "home")


def sweep(path, *more: str) -> list[str]:
    return ["eval", str(path), "--dataset", "synthetic:4", "--batch-sizes", "1,2,4", "--min-time", "1",
            "--min-repeats", "1", "--warmup", "1", "--json", *more]


def store(env):
    from mlms_nb.store.history import HistoryStore

    return HistoryStore(f"sqlite:///{env['MLMS_HOME']}/history.sqlite")


def stored(env) -> list[dict]:
    return store(env).query().to_dict("records")


def stored_evaluation(env, row_id: int):
    return store(env).load(int(row_id))


@pytest.mark.parametrize("signals, reason, code, isolate", [
    ([signal.SIGINT], "interrupt", 130, False),
    ([signal.SIGINT, signal.SIGINT], "interrupt", 130, False),
    ([signal.SIGTERM], "signal", 143, False),
    ([signal.SIGTERM], "signal", 143, True),  # passed on to the worker, which sends what it measured first
], ids=["sigint", "sigint-twice", "sigterm", "sigterm-isolated"])
def test_a_stop_mid_sweep_keeps_every_completed_batch_size(tiny, signals, reason, code, isolate):
    path, env = tiny
    run = Mlms(sweep(path, *(["--isolate"] if isolate else [])), env)
    run.wait_for("timing onnxruntime at batch size 2")
    time.sleep(0.3)  # inside batch size 2's timed loop (its warm-up is one call of microseconds)
    for sig in signals:
        run.proc.send_signal(sig)
        time.sleep(0.02)
    rc, out, err = run.finish()
    assert rc == code, err
    data = json.loads(out)
    outcome = data["outcomes"]["onnxruntime"]
    assert (outcome["status"], outcome["reason"]) == ("partial", reason), outcome
    assert outcome["missing_batch_sizes"] == [2, 4] and outcome["cut_short_batch_sizes"] == [2]
    assert data["missing"] and "4" in data["missing"][0]
    latency = {row["batch_size"]: row for row in data["results"][0]["latency"]}
    assert latency[1]["complete"] and latency[1]["samples"] > 0
    assert not latency[2]["complete"] and latency[2]["samples"] > 0  # the cut-short loop, flagged
    [row] = stored(env)
    assert (row["status"], row["reason"], row["complete"]) == ("partial", reason, False)
    kept = stored_evaluation(env, row["id"])
    assert sorted(kept.latency["batch_size"]) == [1, 2] and kept.outcomes["onnxruntime"]["reason"] == reason


def test_sigkill_keeps_what_was_stored_and_the_next_run_leaves_no_temp_files(tiny):
    path, env = tiny
    # the traced pass profiles ONNX Runtime into a temporary folder: SIGKILL while it runs leaves that folder
    run = Mlms(sweep(path, "--batch-sizes", "1,2", "--min-time", "0.2", "--trace-level", "FRAMEWORK",
                     "--trace-repeats", "1000000"), env)
    run.wait_for("tracing onnxruntime at level")
    time.sleep(0.5)
    run.proc.kill()
    run.finish()
    tmp = env["TMPDIR"]
    from pathlib import Path

    left = [p.name for p in Path(tmp).iterdir() if p.name.startswith("mlms")]
    assert left, "the killed run left no profiling folder: the test no longer makes the fault it checks"
    [row] = stored(env)  # opening the store marks the killed run's row
    assert (row["status"], row["reason"], row["complete"]) == ("partial", "crash", False)
    kept = stored_evaluation(env, row["id"])
    assert sorted(kept.latency["batch_size"]) == [1, 2] and kept.latency["complete"].all()
    rc, _, err = run_mlms(sweep(path, "--batch-sizes", "1", "--min-time", "0.1"), env)
    assert rc == 0, err
    assert not [p.name for p in Path(tmp).iterdir() if p.name.startswith("mlms")]
    home = Path(env["MLMS_HOME"])
    assert not [p for p in home.rglob("*") if "~" in p.name], "a temporary file survived in MLMS_HOME"


def test_a_ctrl_c_that_lands_in_a_weakref_callback_still_stops(tmp_path):
    """The handler's KeyboardInterrupt raised inside a callback Python cannot raise from (a weakref callback the
    garbage collector runs) is signalled again and stops the work where it runs next: not lost, no traceback."""
    import subprocess
    import sys

    code = """
import os, signal, time, weakref
from mlms_nb.launchers.stopping import stop_signals
class Thing: pass
def callback(ref):
    os.kill(os.getpid(), signal.SIGINT)
    for _ in range(100000): pass  # Python runs the handler here, inside the callback
try:
    with stop_signals():
        thing = Thing(); ref = weakref.ref(thing, callback); del thing
        time.sleep(20)
    print("lost")
except KeyboardInterrupt:
    print("stopped")
"""
    started = time.monotonic()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         env=fault_env(tmp_path / "home"))
    assert out.stdout.split() == ["stopped"] and "Exception ignored" not in out.stderr, out.stderr
    assert time.monotonic() - started < 15
