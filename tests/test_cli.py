"""The `mlms` command as a user runs it: a real subprocess, real models, JSON they can parse."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

MLMS = [sys.executable, "-m", "mlms_nb.cli"]
#: the progress lines mlms-nb writes on stderr; the frameworks' own lines go to $MLMS_HOME/logs/frameworks.log
OUR_LINES = re.compile(r"(opened \S+ in [\d,]+ ms|timing \w+ at batch size|tracing \w+ at level|building |built |"
                       r"\S+ \w+: full pass |stored )")


def mlms(*args: str, home: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "MLMS_HOME": str(home)}
    return subprocess.run([*MLMS, *args], capture_output=True, text=True, env=env, timeout=timeout)


def test_models_json(shared_home):
    out = mlms("models", "--json", home=shared_home)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    keys = {(m["model"], m["framework"]) for m in data["models"]}
    assert ("efficientnet_lite0", "tensorflow") in keys and ("resnet50", "torch") in keys
    assert data["errors"] == {}
    rows = {(m["model"], m["framework"]): m for m in data["models"]}
    # every row says what the model does, and its input as that task reads it: images in their layout, text as tokens
    assert all(m["task"] for m in data["models"])
    gpt2, bert, lite0 = rows["tiny_gpt2", "torch"], rows["bert_tiny", "torch"], rows["efficientnet_lite0", "tensorflow"]
    assert (gpt2["task"], gpt2["input"], gpt2["layout"]) == ("text-generation", "tokens[≤256]", None)
    assert (bert["task"], bert["input"], bert["layout"]) == ("text-classification", "tokens[128]", None)
    assert (lite0["task"], lite0["input"], lite0["layout"]) == ("image-classification", "224x224x3", "NHWC")


@pytest.mark.parametrize("args, message", [
    (["eval", "efficientnet_lite9"], "unknown model 'efficientnet_lite9'; did you mean efficientnet_lite"),
    (["eval", "efficientnet_lite0", "--batch-sizes", "1,zero"], "--batch-sizes 1,zero: 'zero' is not an integer"),
    (["eval", "efficientnet_lite0", "--batch-sizes", "0"], "--batch-sizes 0: 0 is not a positive integer"),
    (["eval", "efficientnet_lite0", "--framework", "caffe"], "--framework caffe: unknown framework 'caffe'"),
    (["eval", "efficientnet_lite0", "--min-time", "-1"], "--min-time -1: expected at least 0 s"),
    (["eval", "efficientnet_lite0", "--scenario", "server"], "the server scenario needs a target rate: --qps"),
    (["eval", "efficientnet_lite0", "--dataset", "/no/such/folder"], "dataset"),
    (["eval", "resnet50", "--dataset", "imagenet-samples"], "random weights: only performance runs accept it"),
])
def test_bad_input_is_one_sentence(args, message, shared_home):
    out = mlms(*args, "--no-history", home=shared_home)
    assert out.returncode == 2, out.stdout + out.stderr
    assert message in out.stderr
    assert "Traceback" not in out.stderr


def test_empty_dataset_and_mismatched_images(shared_home, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    out = mlms("eval", "efficientnet_lite0", "--dataset", str(empty), "--no-history", home=shared_home)
    assert out.returncode == 2 and "no images found" in out.stderr
    import numpy as np

    np.savez(tmp_path / "wrong.npz", x=np.zeros((4, 3, 32, 32), np.float32))
    out = mlms("eval", "efficientnet_lite0", "--dataset", str(tmp_path / "wrong.npz"), "--no-history", home=shared_home)
    assert out.returncode == 2 and "[3, 224, 224]" in out.stderr, out.stderr


@pytest.mark.slow
def test_eval_json_schema_and_history(shared_home, tmp_path):
    home = tmp_path / "home"
    # converted models are shared: this fresh home's artifacts are the session's cache, whatever ran before (a
    # model this test converts first lands in that cache too), so its time does not depend on the test order
    home.mkdir()
    (shared_home / "artifacts").mkdir(parents=True, exist_ok=True)
    (home / "artifacts").symlink_to(shared_home / "artifacts", target_is_directory=True)
    out = mlms("eval", "efficientnet_lite0", "--framework", "torch,onnxruntime", "--batch-sizes", "1,2",
               "--dataset", "imagenet-samples", "--min-repeats", "5", "--min-time", "0.1", "--warmup", "3", "--json",
               home=home)
    assert out.returncode == 0, out.stderr
    theirs = [line for line in out.stderr.splitlines() if not OUR_LINES.match(line)]
    assert not theirs, f"stderr holds lines that are not mlms-nb's own: {theirs}"
    data = json.loads(out.stdout)
    assert [r["framework"] for r in data["results"]] == ["torch", "onnxruntime"]
    for result in data["results"]:
        assert result["model"] == "efficientnet_lite0"
        assert result["accuracy"]["n"] == 20 and result["accuracy"]["top1"] >= 0.85
        assert [row["batch_size"] for row in result["latency"]] == [1, 2]
        for row in result["latency"]:
            assert row["samples"] >= 5
            assert 0 < row["median_ms"] <= row["p90_ms"] <= row["p99_ms"]
            assert row["throughput_per_s"] > 0
    hist = mlms("history", "--model", "efficientnet_lite0", "--framework", "onnxruntime", "--json", home=home)
    rows = json.loads(hist.stdout)
    assert len(rows) == 1 and rows[0]["framework"] == "onnxruntime" and rows[0]["complete"]


@pytest.mark.slow
def test_ctrl_c_keeps_what_was_measured(shared_home, tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    (shared_home / "artifacts").mkdir(parents=True, exist_ok=True)
    (home / "artifacts").symlink_to(shared_home / "artifacts", target_is_directory=True)  # converted once per session
    env = {**os.environ, "MLMS_HOME": str(home)}
    proc = subprocess.Popen(
        [*MLMS, "eval", "resnet50", "--framework", "onnxruntime", "--dataset", "synthetic:4", "--batch-sizes", "1,2,4",
         "--min-time", "30", "--warmup", "2", "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    # interrupt two seconds into the first timed loop (the runner logs when each loop starts; a fixed, short
    # warm-up makes sure the timed calls have begun by then, however loaded the machine)
    seen: list[str] = []
    reader = threading.Thread(target=lambda: seen.extend(iter(proc.stderr.readline, "")), daemon=True)
    reader.start()
    deadline = time.time() + 300
    while proc.poll() is None and time.time() < deadline and not any("timing onnxruntime at batch size 1" in line
                                                                     for line in seen):
        time.sleep(0.2)
    assert proc.poll() is None, "".join(seen)  # it died before its timed loop began: say why, do not wait
    time.sleep(2)
    proc.send_signal(signal.SIGINT)
    stdout = proc.stdout.read()
    proc.wait(timeout=120)
    reader.join(timeout=10)
    stderr = "".join(seen)
    assert proc.returncode == 130, stderr
    data = json.loads(stdout)
    assert data["complete"] is False and any("interrupted" in w for w in data["warnings"])
    latency = data["results"][0]["latency"]
    assert latency and latency[0]["batch_size"] == 1 and latency[0]["samples"] > 0
    hist = subprocess.run([*MLMS, "history", "--model", "resnet50", "--json"], capture_output=True, text=True, env=env)
    rows = json.loads(hist.stdout)
    assert len(rows) == 1 and rows[0]["complete"] is False
