"""Output agreement that fits the output (issue 20 item 3). A two-head model of the test's own (a probability per
input and a vector of class logits) runs in PyTorch and, exported without its logits head, in ONNX Runtime: the
probability gets errors and flipped decisions by a 0.5 threshold but no cosine (two single values are always
parallel), the logits get cosine and argmax decisions, and the head ONNX Runtime lacks is listed with why. A
TorchScript module that keeps hidden state (tests/test_hidden_state.py), run with and without resetting it, shows
flipped decisions counted where the errors are large."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import yaml

torch = pytest.importorskip("torch")
pytest.importorskip("onnxruntime")

import mlms_nb  # noqa: E402
from mlms_nb.evaluation.agreement import agreement  # noqa: E402
from mlms_nb.evaluation.outputs import OutputRecorder  # noqa: E402
from mlms_nb.manifest import parse_manifest  # noqa: E402
from tests.test_hidden_state import FEATURES, Running  # noqa: E402

CLASSES, ITEMS = 3, 8


class TwoHead(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.read = torch.nn.Linear(FEATURES, CLASSES)

    def forward(self, x):
        logits = self.read(x)
        return torch.sigmoid(logits.sum(-1, keepdim=True)), logits


class ProbabilityOnly(torch.nn.Module):
    def __init__(self, model: TwoHead) -> None:
        super().__init__()
        self.model = model

    def forward(self, x):
        return self.model(x)[0]


def build_two_head() -> TwoHead:
    return TwoHead()


def _manifest(framework: str, outputs: list[str], model: dict) -> dict:
    return {"name": "twohead", "framework": {"name": framework},
            "inputs": [{"name": "x", "type": "tensor", "dimensions": [FEATURES]}],
            "outputs": [{"name": n, "type": "tensor"} for n in outputs], "model": model}


@pytest.fixture(scope="module")
def two_head(tmp_path_factory):
    folder = tmp_path_factory.mktemp("twohead")
    torch.manual_seed(1)
    module = TwoHead().eval()
    torch.save(module.state_dict(), folder / "twohead.pth")
    torch.onnx.export(ProbabilityOnly(module), (torch.zeros(1, FEATURES),), str(folder / "p.onnx"),
                      input_names=["x"], output_names=["p"], dynamic_axes={"x": {0: "n"}}, dynamo=False)
    torch_model = {"entrypoint": "tests.test_agreement_fit:build_two_head", "weights_path": "twohead.pth"}
    (folder / "torch.yaml").write_text(yaml.safe_dump(_manifest("torch", ["p", "logits"], torch_model)))
    (folder / "onnxruntime.yaml").write_text(yaml.safe_dump(_manifest("onnxruntime", ["p"], {"graph_path": "p.onnx"})))
    np.savez(folder / "x.npz", x=np.random.default_rng(2).standard_normal((ITEMS, FEATURES)).astype(np.float32))
    return folder


def test_each_output_gets_the_metrics_that_fit_it(two_head, mlms_home, monkeypatch):
    monkeypatch.setenv("MLMS_MANIFEST_PATH", str(two_head))
    ev = mlms_nb.evaluate("twohead", framework="torch,onnxruntime", trust=True, batch_sizes=[2], warmup=1,
                          min_repeats=2, min_time_s=0, progress=False, capture_outputs="all",
                          dataset=str(two_head / "x.npz"))
    assert ev.complete, ev.missing()
    rows = ev.output_agreement.set_index(["output", "metric"])
    assert not rows["value"].drop(("logits", "not_compared")).isna().any()
    # the probability: errors and decisions by its 0.5 threshold, no cosine
    assert rows.loc[("p", "max_abs_error"), "value"] < 1e-5 and ("p", "cosine") not in rows.index
    decided = rows.loc[("p", "flipped_decisions")]
    assert decided["value"] == 0 and decided["inputs"] == ITEMS and "0.5" in decided["detail"]
    # the logits ONNX Runtime does not give: listed by name, with why, and no metric of it
    missing = rows.loc[("logits", "not_compared")]
    assert missing["inputs"] == 0 and "onnxruntime" in missing["detail"] and "logits" in missing["detail"]
    assert [m for (o, m) in rows.index if o == "logits"] == ["not_compared"]
    text = ev.to_text()
    assert "not compared" in text and f"0 of {ITEMS} decisions flipped" in text and "p: cosine" not in text
    # stored with its rules and reasons
    pd.testing.assert_frame_equal(mlms_nb.load_evaluation(ev.id).output_agreement, ev.output_agreement)


def _record(manifest, framework: str, outputs: list[dict[str, np.ndarray]], capture="all"):
    recorder = OutputRecorder(manifest, framework, capture)
    for i, named in enumerate(outputs):
        recorder.add([f"item{i}"], named)
    return recorder.frame()


def test_hidden_state_flips_decisions_and_cosine_would_have_hidden_it(tmp_path):
    """The issue's case: a model's carried state moves its per-input probability; cosine 1.00 said nothing."""
    torch.manual_seed(4)
    scripted = torch.jit.script(Running().eval())
    scripted.save(str(tmp_path / "running.pt"))
    x = torch.from_numpy(np.random.default_rng(5).standard_normal((40, FEATURES)).astype(np.float32))
    fresh, carried = [], []
    with torch.no_grad():
        for item in x:
            scripted.reset_states()
            fresh.append({"p": scripted(item[None]).numpy()})
        scripted.reset_states()
        for item in x:
            carried.append({"p": scripted(item[None]).numpy()})
    manifest = parse_manifest({"name": "running", "framework": {"name": "torch"},
                               "inputs": [{"name": "x", "type": "tensor", "dimensions": [FEATURES]}],
                               "outputs": [{"name": "p", "type": "tensor"}],
                               "model": {"graph_path": "running.pt", "reset": "reset_states"}})
    frame = pd.concat([_record(manifest, "reset", fresh), _record(manifest, "carried", carried)], ignore_index=True)
    rows = agreement(frame, reference="reset").set_index("metric")
    a = np.concatenate([c["p"] for c in carried])
    r = np.concatenate([f["p"] for f in fresh])
    expected_flips = int(((a > 0.5) != (r > 0.5)).sum())
    assert expected_flips > 0  # the data makes the state matter
    assert rows.loc["flipped_decisions", "value"] == expected_flips and rows.loc["flipped_decisions", "inputs"] == 40
    assert rows.loc["max_abs_error", "value"] == pytest.approx(float(np.abs(a - r).max()))
    assert "cosine" not in rows.index


def test_decision_rules_and_reasons_not_to_compare():
    manifest = parse_manifest({"name": "m", "framework": {"name": "onnxruntime"},
                               "inputs": [{"name": "x", "type": "tensor", "dimensions": [FEATURES]}],
                               "outputs": [{"name": "logits", "type": "tensor"}, {"name": "score", "type": "tensor"},
                                           {"name": "mask", "type": "tensor"}],
                               "model": {"graph_path": "m.onnx"}})
    rng = np.random.default_rng(0)
    ref = [{"logits": rng.standard_normal((1, CLASSES)), "score": rng.standard_normal((1, 1)) * 5,
            "mask": rng.random((1, 2, 2))} for _ in range(6)]
    other = [{k: v.copy() for k, v in item.items()} for item in ref]
    other[2]["logits"][0, ::-1] = np.sort(other[2]["logits"][0])  # argmax moves to class 0
    if np.argmax(ref[2]["logits"]) == 0:
        other[2]["logits"][0] = other[2]["logits"][0, ::-1]
    frame = pd.concat([_record(manifest, "a", ref), _record(manifest, "b", other)], ignore_index=True)
    rows = agreement(frame, reference="a").set_index(["output", "metric"])
    assert rows.loc[("logits", "flipped_decisions"), "value"] == 1
    assert "argmax" in rows.loc[("logits", "flipped_decisions"), "detail"]
    assert ("score", "flipped_decisions") not in rows.index  # values outside [0, 1]: no threshold applies
    assert ("score", "cosine") not in rows.index and ("mask", "cosine") in rows.index
    assert ("mask", "flipped_decisions") not in rows.index  # a 2-D mask is not one vector of classes
    # one framework kept only summaries of its outputs: each output listed, with why, no NaN metric
    frame = pd.concat([_record(manifest, "a", ref), _record(manifest, "b", other, capture="summary")],
                      ignore_index=True)
    rows = agreement(frame, reference="a")
    assert set(rows["metric"]) == {"not_compared"} and len(rows) == 3
    assert rows["detail"].str.contains("b kept no values").all()
