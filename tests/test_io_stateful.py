"""Named multi-tensor I/O (issue 11): a two-input model with a scalar constant and a state tensor, built here
(``forward(x, state, sr) -> (out, new_state)``), exported to ONNX, run in PyTorch and ONNX Runtime through one
evaluation with its captured outputs compared; evaluated over ordered chunks of a WAV file written here, it carries
its state (checked against a manual loop)."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import yaml

torch = pytest.importorskip("torch")
pytest.importorskip("onnxruntime")

import mlms_nb  # noqa: E402
from mlms_nb.data.feeds import FeedError  # noqa: E402
from mlms_nb.data.transforms import Preprocessor  # noqa: E402
from mlms_nb.evaluation.outputs import OutputRecorder, run_sequences  # noqa: E402
from mlms_nb.frameworks import open_predictor  # noqa: E402
from mlms_nb.manifest import load_manifest, parse_manifest  # noqa: E402
from mlms_nb.errors import ManifestError  # noqa: E402

SIGNAL, STATE = 16, 8


class Streamer(torch.nn.Module):
    """A tiny recurrent cell: the new state mixes the chunk (scaled by the sample rate) with the old state."""

    def __init__(self) -> None:
        super().__init__()
        self.read = torch.nn.Linear(SIGNAL, STATE)
        self.mix = torch.nn.Linear(STATE, STATE)

    def forward(self, x, state, sr):
        new_state = torch.tanh(self.read(x) * (sr.to(x.dtype) / 16000.0) + self.mix(state))
        return new_state.sum(dim=-1, keepdim=True), new_state


def build_streamer() -> Streamer:
    return Streamer()


def _manifest(framework: str, model: dict, preprocess=None, input_type: str = "tensor") -> dict:
    return {"name": "streamer", "framework": {"name": framework},
            "inputs": [{"name": "x", "type": input_type, "dimensions": [SIGNAL]},
                       {"name": "state", "type": "tensor", "dimensions": [STATE]},
                       {"name": "sr", "type": "constant", "value": 16000, "dtype": "int64"}],
            "outputs": [{"name": "out", "type": "tensor"}, {"name": "new_state", "type": "tensor", "metrics": ["mse"]}],
            "state": {"new_state": "state"}, "preprocess": preprocess or [], "model": model}


def write_streamer(folder) -> "Streamer":
    """A seeded `Streamer`, its weights (``streamer.pth``) and its ONNX export (``streamer.onnx``) in ``folder``."""
    torch.manual_seed(0)
    module = Streamer().eval()
    torch.save(module.state_dict(), folder / "streamer.pth")
    example = (torch.zeros(1, SIGNAL), torch.zeros(1, STATE), torch.tensor(16000, dtype=torch.int64))
    torch.onnx.export(module, example, str(folder / "streamer.onnx"), input_names=["x", "state", "sr"],
                      output_names=["out", "new_state"], dynamic_axes={"x": {0: "n"}, "state": {0: "n"}},
                      dynamo=False)
    return module


@pytest.fixture(scope="module")
def streamer_models(tmp_path_factory):
    """The module's weights, its ONNX export and one manifest per framework in a folder of their own."""
    folder = tmp_path_factory.mktemp("streamer")
    module = write_streamer(folder)
    manifests = folder  # the model files sit beside the manifests: assets stay inside a manifest's own root
    torch_model = {"entrypoint": "tests.test_io_stateful:build_streamer", "weights_path": "streamer.pth"}
    (manifests / "torch.yaml").write_text(yaml.safe_dump(_manifest("torch", torch_model)))
    (manifests / "onnxruntime.yaml").write_text(yaml.safe_dump(_manifest("onnxruntime", {"graph_path": "streamer.onnx"})))
    np.savez(folder / "signals.npz", x=np.random.default_rng(1).standard_normal((6, SIGNAL)).astype(np.float32))
    return {"folder": folder, "module": module, "manifests": manifests}


def test_two_frameworks_feed_every_input_and_compare_every_output(streamer_models, mlms_home, monkeypatch):
    monkeypatch.setenv("MLMS_MANIFEST_PATH", str(streamer_models["manifests"]))
    calls = []

    def largest_gap(output, reference):
        calls.append(output.shape)
        return float(np.max(np.abs(output - reference)))

    ev = mlms_nb.evaluate("streamer", framework="torch,onnxruntime", trust=True, batch_sizes=[2],
                          dataset=str(streamer_models["folder"] / "signals.npz"), capture_outputs="all",
                          metrics={"largest_gap": largest_gap}, warmup=1, min_repeats=3, min_time_s=0,
                          progress=False)
    assert ev.complete, ev.missing()
    outputs = ev.outputs
    assert set(outputs["framework"]) == {"torch", "onnxruntime"}
    assert set(outputs["output"]) == {"out", "new_state"}
    assert len(outputs) == 2 * 6 * 2  # frameworks x inputs x outputs
    # the values are the module's own, fed zeros for the state and 16000 for sr
    x = np.load(streamer_models["folder"] / "signals.npz")["x"]
    with torch.no_grad():
        _, expected = streamer_models["module"](torch.from_numpy(x), torch.zeros(6, STATE), torch.tensor(16000))
    for fw in ("torch", "onnxruntime"):
        rows = outputs[(outputs["framework"] == fw) & (outputs["output"] == "new_state")]
        assert list(rows["shape"].iloc[0]) == [STATE]
        np.testing.assert_allclose(np.stack(rows["values"].map(np.asarray)), expected.numpy(), atol=1e-5)
    agreement = ev.output_agreement.set_index(["output", "metric"])["value"]
    assert set(ev.output_agreement["framework"]) == {"onnxruntime"}
    assert set(ev.output_agreement["reference"]) == {"torch"}
    assert agreement[("new_state", "max_abs_error")] < 1e-5
    assert agreement[("new_state", "cosine")] > 0.9999 and ("out", "cosine") not in agreement.index
    assert agreement[("new_state", "mse")] < 1e-10  # the manifest's own built-in metric, on that output only
    assert ("out", "mse") not in agreement.index
    # the user's metric ran on each input's pair of arrays (shaped as the output) and was averaged over the inputs
    assert 0 <= agreement[("out", "largest_gap")] <= agreement[("out", "max_abs_error")]
    assert sorted(set(calls)) == [(1,), (STATE,)] and len(calls) == 2 * 6
    # stored with the evaluation in the history store, both frames whole
    back = mlms_nb.load_evaluation(ev.id)
    pd.testing.assert_frame_equal(back.outputs, ev.outputs)
    pd.testing.assert_frame_equal(back.output_agreement, ev.output_agreement)


def test_state_is_carried_over_ordered_chunks_of_a_wav_file(streamer_models, tmp_path):
    soundfile = pytest.importorskip("soundfile")
    pytest.importorskip("scipy")
    seconds, rate = 0.01, 8000  # 80 samples at 8 kHz -> 160 at 16 kHz -> 10 chunks of 16
    t = np.arange(int(seconds * rate)) / rate
    soundfile.write(tmp_path / "tone.wav", (0.5 * np.sin(2 * np.pi * 440 * t)).astype(np.float32), rate)
    folder = streamer_models["folder"]
    audio_steps = [{"decode_audio": {"sample_rate": 16000}}, {"chunk": {"size": SIGNAL}}]
    data = _manifest("onnxruntime", {"graph_path": str(folder / "streamer.onnx")}, audio_steps, input_type="audio")
    manifest = parse_manifest(data, source=str(folder / "audio.yaml"))
    chunks = Preprocessor(manifest)(tmp_path / "tone.wav")
    assert chunks.shape == (10, SIGNAL) and chunks.dtype == np.float32

    module = streamer_models["module"]
    with torch.no_grad():  # the manual loop
        state, expected = torch.zeros(1, STATE), []
        for chunk in chunks:
            out, state = module(torch.from_numpy(chunk[None]), state, torch.tensor(16000))
            expected.append(out.numpy())
    for fw, model in (("onnxruntime", data["model"]),
                      ("torch", {"entrypoint": "tests.test_io_stateful:build_streamer",
                                 "weights_path": "streamer.pth"})):
        manifest = parse_manifest({**data, "framework": {"name": fw}, "model": model}, source=str(folder / "a.yaml"))
        recorder = OutputRecorder(manifest, fw, "all")
        with open_predictor(manifest, options=mlms_nb.frameworks.PredictorOptions(trust=True)) as predictor:
            results = run_sequences(predictor.predict, manifest, ["tone.wav"], [chunks], recorder)
            fresh = predictor.predict({"x": chunks[-1:]})  # no state given: zeros, not the carried state
        got = np.concatenate([r["out"] for r in results[0]])
        np.testing.assert_allclose(got, np.concatenate(expected), atol=1e-5)
        assert not np.allclose(fresh["out"], results[0][-1]["out"])  # the state mattered
        frame = recorder.frame()
        assert list(frame.loc[frame["output"] == "out", "chunk"]) == list(range(10))


def test_inputs_are_checked_by_name_and_shape(streamer_models):
    manifest = load_manifest(streamer_models["manifests"] / "onnxruntime.yaml")
    with open_predictor(manifest) as predictor:
        with pytest.raises(FeedError, match=r"input 'x' dimension 0 is 15 but the manifest says 16"):
            predictor.predict({"x": np.zeros((1, 15), np.float32)})
        with pytest.raises(FeedError, match=r"'y' is not an input of this model; its inputs are x, state, sr"):
            predictor.predict({"x": np.zeros((1, SIGNAL), np.float32), "y": np.zeros(1)})
        # a numpy batch is the fed input: constants and zero states are added, the first output comes back
        assert predictor.predict(np.zeros((3, SIGNAL), np.float32)).shape == (3, 1)
    data = yaml.safe_load((streamer_models["manifests"] / "onnxruntime.yaml").read_text())
    data["inputs"][0].pop("name")
    with pytest.raises(ManifestError, match=r"inputs\[0\]\.name: a model with several inputs names each one"):
        parse_manifest(data)
    data = yaml.safe_load((streamer_models["manifests"] / "onnxruntime.yaml").read_text())
    data["state"] = {}
    with pytest.raises(ManifestError, match=r"inputs\[1\]: nothing feeds input 'state'"):
        parse_manifest(data)


def test_output_divergence_for_a_model_without_an_architecture(streamer_models, mlms_home, monkeypatch):
    from mlms_nb import display
    from mlms_nb.divergence import diverge_outputs

    monkeypatch.setenv("MLMS_MANIFEST_PATH", str(streamer_models["manifests"]))
    result = diverge_outputs("streamer", frameworks="torch,onnxruntime", trust=True, limit=4,
                             dataset=str(streamer_models["folder"] / "signals.npz"))
    assert result.diverged == []
    rows = result.table.set_index(["output", "metric"])
    assert rows.loc[("new_state", "max_rel_error"), "value"] < 1e-4 and rows.loc[("new_state", "mse"), "inputs"] == 4
    text = display.render_text(result)
    assert "Output divergence of streamer (reference: torch)" in text and "4 inputs of" in text
    assert display.render_json(result)["rows"]
    assert result.plot("bokeh") is not None
