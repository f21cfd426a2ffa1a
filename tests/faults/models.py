"""Small real models and manifests for the fault tests, built with onnx.helper (no download, milliseconds to run):
a tiny classifier (mean over H, W then a 3x10 MatMul), the same with its batch dimension fixed at 1 (so batch
size 2 fails in ONNX Runtime for real), and one whose Loop runs 10^12 iterations (a call that never returns).
Plus `run_mlms`, a real ``mlms`` subprocess whose stderr lines are collected as they come, and `Server`, an ``mlms``
scheduler or agent subprocess."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import yaml

MLMS = [sys.executable, "-m", "mlms_nb.cli"]
HW = 8  # inputs are 3 x HW x HW


def _classifier_nodes(onnx, helper, batch):
    from onnx import TensorProto

    weights = np.linspace(-1, 1, 30, dtype=np.float32).reshape(3, 10)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 3, HW, HW])
    nodes = [helper.make_node("ReduceMean", ["x"], ["pooled"], axes=[2, 3], keepdims=0),
             helper.make_node("MatMul", ["pooled", "w"], ["logits"])]
    inits = [onnx.numpy_helper.from_array(weights, "w")]
    return x, nodes, inits


def tiny_onnx(path: Path, batch: int | str = "N", never_returns: bool = False, spins_from_batch: int | None = None) -> Path:
    """A tiny ONNX classifier at ``path`` (opset 17); ``batch=1`` fixes the batch dimension; ``never_returns``
    adds a Loop of 10^12 iterations whose result feeds the logits (so it cannot be skipped); ``spins_from_batch=B``
    runs that Loop only for batches of B inputs or more (one iteration below: smaller batches are measured)."""
    import onnx
    from onnx import TensorProto, helper

    x, nodes, inits = _classifier_nodes(onnx, helper, batch)
    out = "logits"
    if never_returns or spins_from_batch:
        body = helper.make_graph(
            [helper.make_node("Identity", ["cond_in"], ["cond_out"]),
             helper.make_node("Add", ["v_in", "one"], ["v_out"])],
            "spin",
            [helper.make_tensor_value_info("i", TensorProto.INT64, []),
             helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
             helper.make_tensor_value_info("v_in", TensorProto.FLOAT, [])],
            [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
             helper.make_tensor_value_info("v_out", TensorProto.FLOAT, [])],
            [onnx.numpy_helper.from_array(np.array(0.0, dtype=np.float32), "one")])
        inits += [onnx.numpy_helper.from_array(np.array(10**12, dtype=np.int64), "forever"),
                  onnx.numpy_helper.from_array(np.array(True), "go"),
                  onnx.numpy_helper.from_array(np.array(0.0, dtype=np.float32), "zero")]
        if spins_from_batch:  # trips = 10^12 when the batch has spins_from_batch inputs or more, else 1
            inits += [onnx.numpy_helper.from_array(np.array(0, dtype=np.int64), "axis0"),
                      onnx.numpy_helper.from_array(np.array(spins_from_batch - 1, dtype=np.int64), "below"),
                      onnx.numpy_helper.from_array(np.array(1, dtype=np.int64), "once")]
            nodes += [helper.make_node("Shape", ["x"], ["shape"]),
                      helper.make_node("Gather", ["shape", "axis0"], ["n"]),
                      helper.make_node("Greater", ["n", "below"], ["big"]),
                      helper.make_node("Where", ["big", "forever", "once"], ["trips"])]
        else:
            nodes.append(helper.make_node("Identity", ["forever"], ["trips"]))
        nodes += [helper.make_node("Loop", ["trips", "go", "zero"], ["spun"], body=body),
                  helper.make_node("Add", ["logits", "spun"], ["spun_logits"])]
        out = "spun_logits"
    graph = helper.make_graph(nodes, "tiny", [x], [helper.make_tensor_value_info(out, TensorProto.FLOAT, [batch, 10])],
                              inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path


def manifest(folder: Path, name: str, graph: str, framework: str = "onnxruntime", **extra) -> Path:
    """A manifest ``folder/name-framework.yaml`` for a tiny image classifier whose graph is ``graph`` (beside it)."""
    data = {
        "name": name, "version": "1.0.0", "framework": {"name": framework, "version": "*"},
        "inputs": [{"type": "image", "layout": "NCHW", "dimensions": [3, HW, HW], "mean": [127], "scale": [128]}],
        "outputs": [{"type": "classification"}],
        "preprocess": [{"resize": {"size": HW}}, {"center_crop": {"size": HW}},
                       {"normalize": {"mean": [127], "scale": [128]}}, "to_layout"],
        "postprocess": ["softmax", {"top_k": {"k": 5}}],
        "model": {"graph_path": graph, "weights": "random"},
    }
    data.update(extra)
    path = folder / f"{name}-{framework}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def fault_env(home: Path, **more: str) -> dict[str, str]:
    """The environment of an ``mlms`` subprocess: its own MLMS_HOME and temp dir, the source tree importable."""
    tmp = home / "tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "MLMS_HOME": str(home), "TMPDIR": str(tmp), "PYTHONUNBUFFERED": "1",
           "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    env.pop("MLMS_HISTORY_URL", None)
    env.update(more)
    return env


class Mlms:
    """A running ``mlms`` command: ``wait_for(text)`` until a stderr line contains it; ``finish()`` -> (rc, out, err)."""

    def __init__(self, args: list[str], env: dict[str, str]):
        self.proc = subprocess.Popen([*MLMS, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     env=env)
        self.lines: list[str] = []
        self._reader = threading.Thread(target=lambda: self.lines.extend(iter(self.proc.stderr.readline, "")),
                                        daemon=True)
        self._reader.start()

    def wait_for(self, text: str, timeout_s: float = 120) -> None:
        deadline = time.monotonic() + timeout_s
        while not any(text in line for line in self.lines):
            assert self.proc.poll() is None, f"mlms ended before {text!r}:\n{''.join(self.lines)}"
            assert time.monotonic() < deadline, f"no {text!r} within {timeout_s} s:\n{''.join(self.lines)}"
            time.sleep(0.05)

    def finish(self, timeout_s: float = 120) -> tuple[int, str, str]:
        out = self.proc.stdout.read()
        self.proc.wait(timeout=timeout_s)
        self._reader.join(timeout=10)
        return self.proc.returncode, out, "".join(self.lines)


def run_mlms(args: list[str], env: dict[str, str], timeout_s: float = 180) -> tuple[int, str, str]:
    done = subprocess.run([*MLMS, *args], capture_output=True, text=True, env=env, timeout=timeout_s)
    return done.returncode, done.stdout, done.stderr


class Server:
    """An ``mlms`` server subprocess (scheduler or agent); its output lines collected as they come."""

    def __init__(self, args: list[str], env: dict[str, str]):
        self.proc = subprocess.Popen([*MLMS, *args], stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, env=env)
        self.lines: list[str] = []
        self.stopping = False
        threading.Thread(target=lambda: self.lines.extend(iter(self.proc.stdout.readline, "")), daemon=True).start()

    def wait_for(self, text: str, timeout_s: float = 90) -> str:
        deadline = time.monotonic() + timeout_s
        while True:
            found = [line for line in self.lines if text in line]
            if found:
                return found[0]
            assert self.proc.poll() is None, f"ended before {text!r}:\n{''.join(self.lines)}"
            assert time.monotonic() < deadline, f"no {text!r} within {timeout_s} s:\n{''.join(self.lines)}"
            time.sleep(0.05)

    def stop(self, wait: bool = True) -> None:
        if self.proc.poll() is None:
            if not self.stopping:
                self.proc.send_signal(signal.SIGTERM)
                self.stopping = True
            if not wait:
                return
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
