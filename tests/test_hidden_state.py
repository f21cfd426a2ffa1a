"""Models that carry state between calls (issue 20 item 1): a TorchScript module of the test's own keeps a running
memory in a buffer and updates it inside ``forward`` (as streaming audio models ship), with a ``reset_states``
method exported for TorchScript. Evaluated over an ordered ``.npz`` of several items: with ``model.reset`` declared
its captured outputs equal a fresh module per item; without it the evaluation refuses the framework in one sentence
and measures nothing. A stateless module passes the check at the cost of one extra call."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

torch = pytest.importorskip("torch")

import mlms_nb  # noqa: E402
from mlms_nb.errors import ManifestError, MlmsError  # noqa: E402
from mlms_nb.manifest import parse_manifest  # noqa: E402

FEATURES, HIDDEN, ITEMS = 4, 3, 5
RUN = dict(framework="torch", trust=True, batch_sizes=[2], warmup=1, min_repeats=3, min_time_s=0, progress=False,
           capture_outputs="all")


class Running(torch.nn.Module):
    """One probability per item; each call adds to a running memory that the next call reads."""

    def __init__(self) -> None:
        super().__init__()
        self.read = torch.nn.Linear(FEATURES, HIDDEN)
        self.register_buffer("memory", torch.zeros(HIDDEN))

    def forward(self, x):
        h = torch.tanh(self.read(x) + self.memory)
        self.memory = 0.5 * self.memory + h.mean(0)
        return torch.sigmoid(h.sum(-1))

    @torch.jit.export
    def reset_states(self):
        self.memory = torch.zeros_like(self.memory)

    @torch.jit.export
    def forget_nothing(self):
        pass


class Stateless(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.read = torch.nn.Linear(FEATURES, HIDDEN)

    def forward(self, x):
        return torch.sigmoid(torch.tanh(self.read(x)).sum(-1))


def _manifest(folder, name: str, graph: str, reset: str | None = None, file: str | None = None) -> str:
    model = {"graph_path": graph, **({"reset": reset} if reset else {})}
    data = {"name": name, "framework": {"name": "torch"},
            "inputs": [{"name": "x", "type": "tensor", "dimensions": [FEATURES]}],
            "outputs": [{"name": "p", "type": "tensor"}], "model": model}
    path = folder / f"{file or name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """The scripted modules (saved beside their manifests) and an ordered dataset of ``ITEMS`` items."""
    folder = tmp_path_factory.mktemp("hidden_state")
    torch.manual_seed(0)
    torch.jit.script(Running().eval()).save(str(folder / "running.pt"))
    torch.jit.script(Stateless().eval()).save(str(folder / "stateless.pt"))
    x = np.random.default_rng(3).standard_normal((ITEMS, FEATURES)).astype(np.float32)
    np.savez(folder / "items.npz", x=x)
    return {"folder": folder, "x": x, "data": str(folder / "items.npz")}


def _fresh_per_item(path, x: np.ndarray) -> np.ndarray:
    """The reference loop: a freshly loaded module for every item."""
    out = []
    with torch.no_grad():
        for item in x:
            out.append(torch.jit.load(str(path))(torch.from_numpy(item[None])).numpy())
    return np.concatenate(out)


def test_declared_reset_gives_each_item_the_fresh_module_outputs(models, mlms_home):
    folder = models["folder"]
    manifest = _manifest(folder, "running", "running.pt", reset="reset_states")
    ev = mlms_nb.evaluate(manifest, dataset=models["data"], **RUN)
    assert ev.complete, ev.missing()
    got = np.concatenate(ev.outputs["values"].map(np.asarray).tolist())  # in dataset order
    expected = _fresh_per_item(folder / "running.pt", models["x"])
    np.testing.assert_allclose(got, expected, atol=1e-6, rtol=0)
    # without the reset the same items give other numbers: the state mattered
    carried = []
    module = torch.jit.load(str(folder / "running.pt"))
    with torch.no_grad():
        for item in models["x"]:
            carried.append(module(torch.from_numpy(item[None])).numpy())
    assert np.abs(np.concatenate(carried) - expected).max() > 1e-3
    # one item per call in the full pass; the timed loop says it timed a model carrying state
    assert int(ev.full_pass["batches"].iloc[0]) == ITEMS and int(ev.full_pass["batch_size"].iloc[0]) == 1
    assert bool(ev.latency["carries_state"].iloc[0]) is True
    assert "carried" in ev.cold_start["state_check"].iloc[0]
    assert any("hidden state" in w and "reset_states" in w for w in ev.warnings)
    assert "hidden state: carried" in mlms_nb.display.render_text(ev)


def test_hidden_state_without_a_reset_is_refused_and_nothing_is_measured(models, mlms_home):
    manifest = _manifest(models["folder"], "running_undeclared", "running.pt")
    with pytest.raises(MlmsError) as refused:
        mlms_nb.evaluate(manifest, dataset=models["data"], **RUN)
    sentence = str(refused.value)
    assert "\n" not in sentence and "model.reset" in sentence and "state:" in sentence
    stored = mlms_nb.history()  # nothing measured: no row, or (issue 20 item 5) a failed row without numbers
    assert stored.empty or ((stored["status"] == "failed") & stored["median_ms"].isna()).all()


def test_a_reset_that_does_not_clear_the_state_is_refused(models, mlms_home):
    manifest = _manifest(models["folder"], "running_noop", "running.pt", reset="forget_nothing")
    with pytest.raises(MlmsError, match="forget_nothing"):
        mlms_nb.evaluate(manifest, dataset=models["data"], **RUN)
    missing = _manifest(models["folder"], "running_missing", "running.pt", reset="clear")
    with pytest.raises(MlmsError, match=r"model\.reset"):
        mlms_nb.evaluate(missing, dataset=models["data"], **RUN)


def test_a_stateless_module_passes_the_check_for_one_extra_call(models, mlms_home, monkeypatch):
    from mlms_nb.frameworks.torch.predictor import TorchPredictor

    calls = []
    original = TorchPredictor.predict

    def counting(self, batch):  # the real predictor, its calls counted
        calls.append(1)
        return original(self, batch)

    monkeypatch.setattr(TorchPredictor, "predict", counting)
    ev = mlms_nb.evaluate(_manifest(models["folder"], "stateless", "stateless.pt"), dataset=models["data"],
                          **{**RUN, "warmup": 0, "min_repeats": 1})
    assert ev.complete, ev.missing()
    assert "none seen" in ev.cold_start["state_check"].iloc[0]
    assert "carries_state" not in ev.latency or not ev.latency["carries_state"].fillna(False).any()
    assert int(ev.full_pass["batch_size"].iloc[0]) == 2  # batched as usual
    np.testing.assert_allclose(np.concatenate(ev.outputs["values"].map(np.asarray).tolist()),
                               _fresh_per_item(models["folder"] / "stateless.pt", models["x"]), atol=1e-6)
    # cold start, the check, one timed call, the full pass's ceil(5 / 2) batches
    assert len(calls) == 1 + 1 + 1 + 3


def test_reset_is_for_torch_only():
    with pytest.raises(ManifestError, match=r"model\.reset"):
        parse_manifest({"name": "m", "framework": {"name": "onnxruntime"},
                        "inputs": [{"type": "tensor", "dimensions": [FEATURES]}], "outputs": [{"type": "tensor"}],
                        "model": {"graph_path": "m.onnx", "reset": "reset_states"}})
    with pytest.raises(ManifestError, match=r"model\.reset"):
        parse_manifest({"name": "m", "framework": {"name": "torch"},
                        "inputs": [{"type": "tensor", "dimensions": [FEATURES]}], "outputs": [{"type": "tensor"}],
                        "model": {"graph_path": "m.pt", "reset": "reset states()"}})


def test_ordered_chunks_of_audio_files_reset_per_file_and_carry_state_within(models, mlms_home):
    """The streaming case: each WAV file cut into ordered chunks, the hidden state carried from chunk to chunk of a
    file and cleared (model.reset) before the next file, as a fresh module per file would run it."""
    soundfile = pytest.importorskip("soundfile")
    pytest.importorskip("scipy")
    from mlms_nb.data.transforms import Preprocessor

    folder = models["folder"]
    (folder / "audio").mkdir()
    for i, samples in enumerate((12, 20, 8)):  # 3, 5 and 2 chunks of 4 samples at 16 kHz
        t = np.arange(samples) / 16000
        soundfile.write(folder / "audio" / f"clip{i}.wav", (0.5 * np.sin(2 * np.pi * 900 * (i + 1) * t)).astype(
            np.float32), 16000)
    # its own manifest: under worksteal the test that writes running.yaml may run on another worker, or after this one
    data = yaml.safe_load(Path(_manifest(folder, "running", "running.pt", reset="reset_states",
                                         file="running_for_audio")).read_text())
    data["inputs"][0]["type"] = "audio"
    data["preprocess"] = [{"decode_audio": {"sample_rate": 16000}}, {"chunk": {"size": FEATURES}}]
    (folder / "running_audio.yaml").write_text(yaml.safe_dump(data))
    ev = mlms_nb.evaluate(str(folder / "running_audio.yaml"), dataset=str(folder / "audio"), **RUN)
    assert ev.complete, ev.missing()
    manifest = parse_manifest(data, source=str(folder / "running_audio.yaml"))
    for i in range(3):
        chunks = Preprocessor(manifest)(folder / "audio" / f"clip{i}.wav")
        module = torch.jit.load(str(folder / "running.pt"))  # fresh per file, state carried over its chunks
        with torch.no_grad():
            expected = np.concatenate([module(torch.from_numpy(c[None])).numpy() for c in chunks])
        rows = ev.outputs[ev.outputs["input_id"].str.endswith(f"clip{i}.wav")]
        assert list(rows["chunk"]) == list(range(len(chunks)))
        np.testing.assert_allclose(np.concatenate(rows["values"].map(np.asarray).tolist()), expected, atol=1e-6,
                                   rtol=0)


def test_a_refused_framework_costs_the_others_nothing(models, mlms_home, monkeypatch):
    pytest.importorskip("onnxruntime")
    folder = models["folder"] / "two"
    folder.mkdir()
    torch.manual_seed(0)
    torch.onnx.export(Running().eval(), (torch.zeros(1, FEATURES),), str(folder / "running.onnx"), input_names=["x"],
                      output_names=["p"], dynamic_axes={"x": {0: "n"}}, dynamo=False)  # the state frozen at zeros
    (folder / "running.pt").write_bytes((models["folder"] / "running.pt").read_bytes())
    _manifest(folder, "running", "running.pt", file="torch")
    data = yaml.safe_load((folder / "torch.yaml").read_text())
    (folder / "onnxruntime.yaml").write_text(yaml.safe_dump({**data, "framework": {"name": "onnxruntime"},
                                                             "model": {"graph_path": "running.onnx"}}))
    monkeypatch.setenv("MLMS_MANIFEST_PATH", str(folder))
    ev = mlms_nb.evaluate("running", **{**RUN, "framework": "torch,onnxruntime"})
    assert ev.outcomes["torch"]["status"] == "failed" and "model.reset" in ev.outcomes["torch"]["message"]
    assert ev.outcomes["onnxruntime"]["status"] == "complete"
    assert set(ev.latency["framework"]) == {"onnxruntime"} and set(ev.cold_start["framework"]) == {"onnxruntime"}
    assert "none seen" in ev.cold_start["state_check"].iloc[0]
