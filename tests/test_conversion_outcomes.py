"""One framework's conversion failure never refuses the others (issue 21 item 6), and the torch -> ONNX route keeps
every dynamic axis a manifest declares.

Two PyTorch models of this test's own, built by an entrypoint from a package written to a temp folder:
``eig`` (a linear layer plus ``torch.linalg.eigvals``, which neither ONNX exporter supports) and ``tinylm``, a
GPT-2-style causal LM built from a config (random weights) whose input is token ids with a dynamic length ``T``.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import yaml

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")

import mlms_nb  # noqa: E402

pytestmark = pytest.mark.slow  # real exports (each exporter's attempt) and one `mlms eval` process: 10-30 s each

RUN = dict(batch_sizes=[1, 2], warmup=1, min_repeats=2, min_time_s=0, progress=False, history=False)

PACKAGE = '''
import torch
import transformers


class Eig(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)

    def forward(self, x):
        return self.linear(x) + torch.linalg.eigvals(x.reshape(-1, 2, 2)).real.sum()


class TinyLM(torch.nn.Module):
    """Token ids (batch, T) -> logits (batch, T, vocab)."""

    def __init__(self):
        super().__init__()
        config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64, n_positions=32,
                                         bos_token_id=0, eos_token_id=0)
        self.lm = transformers.GPT2LMHeadModel(config)

    def forward(self, input_ids):
        return self.lm(input_ids=input_ids).logits


def build_eig():
    torch.manual_seed(0)
    return Eig()


def build_lm():
    torch.manual_seed(0)
    return TinyLM()
'''


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("conversion")
    (root / "pkg" / "convpkg").mkdir(parents=True)
    (root / "pkg" / "convpkg" / "__init__.py").write_text(PACKAGE)
    sys.path.insert(0, str(root / "pkg"))
    manifests = {
        "eig": {"name": "eig", "framework": {"name": "torch"},
                "inputs": [{"name": "x", "type": "tensor", "dimensions": [4]}],
                "outputs": [{"name": "y", "type": "tensor"}],
                "model": {"entrypoint": "convpkg:build_eig", "weights": "random"}},
        "tinylm": {"name": "tinylm", "framework": {"name": "torch"},
                   "inputs": [{"name": "input_ids", "type": "tensor", "element_type": "int64", "dimensions": ["T"]}],
                   "outputs": [{"name": "logits", "type": "tensor"}],
                   "model": {"entrypoint": "convpkg:build_lm", "weights": "random"}},
    }
    for name, data in manifests.items():
        (root / f"{name}.yaml").write_text(yaml.safe_dump(data))
    rng = np.random.default_rng(0)
    np.savez(root / "tokens.npz", x=rng.integers(0, 64, (4, 12), dtype=np.int64))
    yield root
    sys.path.remove(str(root / "pkg"))
    sys.modules.pop("convpkg", None)


def test_a_failed_conversion_is_that_frameworks_outcome_and_pytorch_is_still_measured(models, mlms_home):
    ev = mlms_nb.evaluate(str(models / "eig.yaml"), framework="torch,onnxruntime,tensorflow", trust=True,
                          dataset="synthetic:4", **RUN)
    assert ev.outcomes["torch"]["status"] == "complete"
    assert sorted(ev.latency.loc[ev.latency["framework"] == "torch", "batch_size"]) == [1, 2]
    assert not ev.complete
    for fw in ("onnxruntime", "tensorflow"):
        outcome = ev.outcomes[fw]
        assert outcome["status"] == "failed" and outcome["missing_batch_sizes"] == [1, 2]
        message = outcome["message"]
        assert "\n" not in message and "\x1b" not in message
        assert "eig" in message and "legacy" in message and "dynamo" in message  # each route's error, named
        assert any(line.startswith(f"{fw}: failed") and "not converted" in line for line in ev.missing())
    assert set(ev.latency["framework"]) == {"torch"}
    assert ev.frameworks == ["torch", "onnxruntime", "tensorflow"]  # listed, with nothing measured
    assert set(ev.summary["framework"]) >= {"torch"}
    assert "onnxruntime: failed" in ev.to_text() and ev.for_framework("onnxruntime").outcomes["onnxruntime"]
    assert "onnxruntime" in ev.to_dict()["outcomes"]


def test_mlms_eval_exits_1_when_a_conversion_failed_and_prints_the_pytorch_numbers(models, mlms_home):
    env = {**os.environ, "MLMS_HOME": str(mlms_home), "PYTHONPATH": os.pathsep.join(
        [str(models / "pkg"), str(Path(__file__).resolve().parents[1]), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-m", "mlms_nb.cli", "eval", str(models / "eig.yaml"), "--trust",
                          "--framework", "torch,onnxruntime", "--batch-sizes", "1", "--dataset", "synthetic:2",
                          "--warmup", "1", "--min-repeats", "2", "--min-time", "0", "--no-history", "--json"],
                         capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 1, out.stdout[-2000:] + out.stderr[-2000:]
    data = json.loads(out.stdout)
    text = json.dumps(data)
    assert "not converted from the PyTorch model" in text
    assert data["outcomes"]["torch"]["status"] == "complete" and data["outcomes"]["onnxruntime"]["status"] == "failed"


def test_a_dynamic_sequence_axis_is_exported_dynamic_and_runs_at_other_lengths(models, mlms_home):
    from mlms_nb.frameworks.converters import read_record

    ev = mlms_nb.evaluate(str(models / "tinylm.yaml"), framework="torch,onnxruntime", trust=True,
                          dataset=str(models / "tokens.npz"), capture_outputs="all", **RUN)
    assert ev.complete, ev.missing()
    graph = Path(ev.manifests["onnxruntime"]["model"]["graph_path"])
    record = read_record(graph)
    assert record["dynamic_axes"] == [[1]] and record["max_abs_diff"] < 1e-4
    import onnx

    dims = onnx.load(str(graph)).graph.input[0].type.tensor_type.shape.dim
    assert [d.HasField("dim_value") for d in dims] == [False, False]  # batch and T both symbolic
    # the ONNX graph at a length and batch it was not exported with, against PyTorch
    import onnxruntime as ort

    sys.modules.pop("convpkg", None)
    import convpkg

    ids = np.random.default_rng(3).integers(0, 64, (3, 5), dtype=np.int64)
    with torch.no_grad():
        expected = convpkg.build_lm().eval()(torch.from_numpy(ids)).numpy()
    session = ort.InferenceSession(str(graph), providers=["CPUExecutionProvider"])
    actual = session.run(None, {session.get_inputs()[0].name: ids})[0]
    assert actual.shape == (3, 5, 64) and float(np.max(np.abs(actual - expected))) < 1e-4
    agreement = ev.output_agreement
    assert not agreement.empty


def test_the_export_example_has_two_rows_and_several_positions_on_each_dynamic_axis():
    from mlms_nb.errors import MlmsError
    from mlms_nb.frameworks.converters.manifests import example_batch
    from mlms_nb.manifest import parse_manifest

    def manifest(inputs):
        return parse_manifest({"name": "m", "framework": {"name": "torch"}, "inputs": inputs,
                               "outputs": [{"type": "tensor"}], "model": {"entrypoint": "x:y", "weights": "random"}})

    example, dynamic = example_batch(manifest([{"type": "tensor", "element_type": "int64", "dimensions": ["T", 3, None]}]))
    assert example.shape[0] >= 2 and example.shape[1] >= 2 and example.shape[3] >= 2 and example.shape[2] == 3
    assert dynamic == [1, 3] and example.dtype == np.int64
    with pytest.raises(MlmsError) as refused:
        example_batch(manifest([{"name": "ids", "type": "tensor", "element_type": "int64", "dimensions": ["T"]},
                                {"name": "scale", "type": "constant", "value": 1}]))
    assert "ids, scale" in str(refused.value) and "one input" in str(refused.value)
