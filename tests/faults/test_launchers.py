"""Hangs and crashes (issues 12 and 15): a model call that never returns (an ONNX Loop of 10^12 iterations) is
stopped by the per-call timeout -- in this process through ONNX Runtime's run termination, and in a worker
process under ``--isolate`` -- with the caller alive; a framework whose worker segfaults (a trusted manifest's
``code`` step calling ``ctypes.string_at(0)``) is reported as a crash while the other framework's results are kept;
a worker past its memory limit fails there, not here; a per-call timeout that cannot stop a framework in this
process says to use ``--isolate``."""
from __future__ import annotations

import json
import time

import numpy as np
import pytest

from tests.faults.models import HW, fault_env, manifest, run_mlms, tiny_onnx

pytest.importorskip("onnxruntime")

QUICK = ["--dataset", "synthetic:2", "--batch-sizes", "1", "--min-time", "0", "--min-repeats", "3", "--warmup", "1",
         "--no-history"]


@pytest.mark.parametrize("isolate", [False, True], ids=["in-process", "isolated"])
def test_a_call_that_never_returns_is_stopped_by_the_timeout(tmp_path, monkeypatch, isolate):
    import mlms_nb

    tiny_onnx(tmp_path / "spin.onnx", never_returns=True)
    path = manifest(tmp_path, "spin", "spin.onnx")
    monkeypatch.setenv("MLMS_HOME", str(tmp_path / "home"))
    started = time.monotonic()
    ev = mlms_nb.evaluate(str(path), dataset="synthetic:2", batch_sizes=[1], min_time_s=0, warmup=1, history=False,
                          progress=False, call_timeout_s=1.0, isolate=isolate)
    assert time.monotonic() - started < 60  # stopped, not waited out
    outcome = ev.outcomes["onnxruntime"]
    assert (outcome["status"], outcome["reason"]) == ("failed", "timeout")
    assert "call_timeout_s=1.0" in outcome["message"] and "first inference" in outcome["message"]
    assert not ev.complete and ev.missing()
    # this process goes on: the same predictor code runs a model that returns
    tiny_onnx(tmp_path / "tiny.onnx")
    ok = mlms_nb.evaluate(str(manifest(tmp_path, "tiny", "tiny.onnx")), dataset="synthetic:2", batch_sizes=[1],
                          min_time_s=0, min_repeats=3, warmup=1, history=False, progress=False, call_timeout_s=5.0,
                          isolate=isolate)
    assert ok.complete and ok.latency["samples"].iloc[0] >= 3


def test_a_run_past_its_run_timeout_is_stopped(tmp_path, monkeypatch):
    import mlms_nb

    tiny_onnx(tmp_path / "spin.onnx", never_returns=True)
    monkeypatch.setenv("MLMS_HOME", str(tmp_path / "home"))
    ev = mlms_nb.evaluate(str(manifest(tmp_path, "spin", "spin.onnx")), dataset="synthetic:2", batch_sizes=[1],
                          min_time_s=0, warmup=1, history=False, progress=False, isolate=True, run_timeout_s=3.0)
    outcome = ev.outcomes["onnxruntime"]
    assert (outcome["status"], outcome["reason"]) == ("failed", "timeout")
    assert "run_timeout_s=3.0" in outcome["message"] and "worker process was stopped" in outcome["message"]


def test_a_timeout_for_a_framework_that_cannot_cancel_says_to_isolate(tmp_path):
    rc, _, err = run_mlms(["eval", "efficientnet_lite0", "--framework", "torch", "--call-timeout", "2", *QUICK],
                          fault_env(tmp_path / "home"))
    assert rc == 2 and "--isolate" in err and "cannot stop a torch call" in err


def _tiny_torchscript(path):
    torch = pytest.importorskip("torch")

    class Tiny(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(3, 10)

        def forward(self, x):
            return self.fc(x.mean(dim=(2, 3)))

    torch.jit.trace(Tiny().eval(), torch.zeros(1, 3, HW, HW)).save(str(path))


def _images(folder, count=2):
    from PIL import Image

    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for i in range(count):
        Image.fromarray(rng.integers(0, 255, (HW, HW, 3), dtype=np.uint8)).save(folder / f"in{i}.png")
    return folder


@pytest.mark.slow  # two worker processes, one of them importing torch: ~20-30 s on 2 shared cores
def test_a_worker_that_segfaults_is_reported_and_the_other_frameworks_results_kept(tmp_path):
    models = tmp_path / "models"
    tiny_onnx(models / "crashy.onnx")
    _tiny_torchscript(models / "crashy.pt")
    crash = {"code": {"source": "import ctypes\n\ndef process(x):\n    ctypes.string_at(0)\n    return x\n"}}
    manifest(models, "crashy", "crashy.onnx", preprocess=[crash])
    manifest(models, "crashy", "crashy.pt", framework="torch")
    env = fault_env(tmp_path / "home", MLMS_MANIFEST_PATH=str(models))
    rc, out, err = run_mlms(["eval", "crashy", "--framework", "onnxruntime,torch", "--isolate", "--trust",
                             "--dataset", str(_images(tmp_path / "images")), "--batch-sizes", "1,2", "--min-time",
                             "0", "--min-repeats", "3", "--warmup", "1", "--json"], env)
    assert rc == 1, err
    data = json.loads(out)
    crashed, kept = data["outcomes"]["onnxruntime"], data["outcomes"]["torch"]
    assert (crashed["status"], crashed["reason"]) == ("failed", "crash")
    assert "segmentation fault" in crashed["message"] and "SIGSEGV" in crashed["message"]
    assert kept["status"] == "complete" and kept["measured_batch_sizes"] == [1, 2]
    torch_rows = [r for r in data["results"] if r["framework"] == "torch"][0]
    assert [row["batch_size"] for row in torch_rows["latency"]] == [1, 2]


def test_a_worker_past_its_memory_limit_fails_there(tmp_path):
    tiny_onnx(tmp_path / "tiny.onnx")
    path = manifest(tmp_path, "tiny", "tiny.onnx")
    # 64 MiB of heap cannot hold ONNX Runtime and numpy: the worker's own allocations fail, this process goes on
    rc, _, err = run_mlms(["eval", str(path), "--isolate", "--memory-limit", "64MiB", "--json", *QUICK],
                            fault_env(tmp_path / "home"))
    assert rc == 1, err  # it started and failed while running: 1 (2 is "refused before measuring"), one sentence
    assert "ran out of memory within --memory-limit 64MiB" in err, err
