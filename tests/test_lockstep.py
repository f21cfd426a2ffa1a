"""State in lockstep (issue 11): a recurrent model at batch size B runs B items side by side, each row with its own
state, a finished item's row going to the next item; its outputs are those of one item at a time. And inputs whose
batch axis is not the first (a time-major GRU, built and exported here) in the streamed full pass."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import yaml

torch = pytest.importorskip("torch")
pytest.importorskip("onnxruntime")

import mlms_nb  # noqa: E402
from mlms_nb.data.transforms import Preprocessor  # noqa: E402
from mlms_nb.evaluation.outputs import OutputRecorder, run_sequences  # noqa: E402
from mlms_nb.frameworks import PredictorOptions, open_predictor  # noqa: E402
from mlms_nb.manifest import parse_manifest  # noqa: E402
from tests.test_io_stateful import SIGNAL, STATE, _manifest, write_streamer  # noqa: E402

CHUNKS = [3, 7, 1, 10, 5]  # chunks per audio file: items of different lengths
#: rows per call at B = 3, a row refilled as its item ends: clip2 after call 1, clip0 after 3; then the tail
ROWS_AT_3 = [3, 3, 3, 3, 3, 3, 3, 2, 1, 1, 1]
STREAMER = {"entrypoint": "tests.test_io_stateful:build_streamer", "weights_path": "streamer.pth"}
AUDIO = [{"decode_audio": {"sample_rate": 16000}}, {"chunk": {"size": SIGNAL}}]


@pytest.fixture(scope="module")
def audio_streamer(tmp_path_factory):
    """The streamer's weights and ONNX export, manifests for both frameworks reading audio, and a folder of WAV
    files of different lengths (8 kHz, resampled to 16 kHz: 16 samples a chunk)."""
    soundfile = pytest.importorskip("soundfile")
    pytest.importorskip("scipy")
    folder = tmp_path_factory.mktemp("lockstep")
    module = write_streamer(folder)
    rng = np.random.default_rng(3)
    (folder / "audio").mkdir()
    for i, chunks in enumerate(CHUNKS):
        t = np.arange(8 * chunks) / 8000
        signal = 0.4 * np.sin(2 * np.pi * (300 + 90 * i) * t) + 0.05 * rng.standard_normal(t.size)
        soundfile.write(folder / "audio" / f"clip{i}.wav", signal.astype(np.float32), 8000)
    for fw, model in (("torch", STREAMER), ("onnxruntime", {"graph_path": "streamer.onnx"})):
        data = _manifest(fw, model, AUDIO, input_type="audio")
        (folder / f"{fw}.yaml").write_text(yaml.safe_dump(data))
    return {"folder": folder, "module": module}


def _counting(predict, rows: list[int]):
    def call(feed):
        rows.append(len(feed["x"]))
        return predict(feed)
    return call


def test_items_side_by_side_give_the_outputs_of_one_at_a_time(audio_streamer):
    folder, module = audio_streamer["folder"], audio_streamer["module"]
    paths = [folder / "audio" / f"clip{i}.wav" for i in range(len(CHUNKS))]
    ids = [p.name for p in paths]
    for fw in ("torch", "onnxruntime"):
        manifest = parse_manifest(yaml.safe_load((folder / f"{fw}.yaml").read_text()), source=str(folder / "m.yaml"))
        items = [Preprocessor(manifest)(p) for p in paths]
        assert [len(item) for item in items] == CHUNKS
        with open_predictor(manifest, options=PredictorOptions(trust=True)) as predictor:
            runs = {}
            for b in (1, 3):
                rows: list[int] = []
                recorder = OutputRecorder(manifest, fw, "first:2")
                results = run_sequences(_counting(predictor.predict, rows), manifest, ids, items, recorder,
                                        batch_size=b)
                runs[b] = (results, recorder.frame(), rows)
        one, three = runs[1], runs[3]
        assert one[2] == [1] * sum(CHUNKS) and three[2] == ROWS_AT_3  # refilled, shrinking only at the tail
        for item, a, b in zip(items, one[0], three[0]):
            assert len(a) == len(b) == len(item)
            with torch.no_grad():  # the module itself, item by item, state carried by hand
                state = torch.zeros(1, STATE)
                for chunk, got1, got3 in zip(item, a, b):
                    out, state = module(torch.from_numpy(chunk[None]), state, torch.tensor(16000))
                    for got in (got1, got3):
                        np.testing.assert_allclose(got["out"], out.numpy(), atol=1e-5)
                        np.testing.assert_allclose(got["new_state"], state.numpy(), atol=1e-5)
        # the captured rows: the same rows in the same order, values of the first two items (all their chunks)
        frame1, frame3 = one[1], three[1]
        assert len(frame3) == 2 * sum(CHUNKS)
        assert list(frame3["input_id"].drop_duplicates()) == ids
        pd.testing.assert_frame_equal(frame1.drop(columns=["values", "min", "max", "mean", "std"]),
                                      frame3.drop(columns=["values", "min", "max", "mean", "std"]))
        kept = frame3["values"].notna()
        assert set(frame3.loc[kept, "input_id"]) == set(ids[:2]) and kept.sum() == 2 * (CHUNKS[0] + CHUNKS[1])
        assert (kept == frame1["values"].notna()).all()
        for a, b in zip(frame1.loc[kept, "values"], frame3.loc[kept, "values"]):
            np.testing.assert_allclose(a, b, atol=1e-5)
        np.testing.assert_allclose(frame1["mean"], frame3["mean"], atol=1e-5)


def test_the_streamed_full_pass_runs_the_audio_folder_in_lockstep(audio_streamer, mlms_home, monkeypatch):
    folder = audio_streamer["folder"]
    monkeypatch.setenv("MLMS_MANIFEST_PATH", str(folder))
    ev = mlms_nb.evaluate("streamer", framework="torch,onnxruntime", trust=True, batch_sizes=[1, 3],
                          dataset=str(folder / "audio"), capture_outputs="all", warmup=1, min_repeats=2,
                          min_time_s=0, progress=False, history=False)
    assert ev.complete, ev.missing()
    full = ev.full_pass.set_index("framework")
    for fw in ("torch", "onnxruntime"):
        row = full.loc[fw]
        # items are counted, not chunks; a call is one chunk of up to 3 items
        assert int(row["inputs"]) == len(CHUNKS) and int(row["batch_size"]) == 3
        assert int(row["batches"]) == len(ROWS_AT_3)
        assert row["inputs_per_s"] == pytest.approx(len(CHUNKS) / row["wall_s"])
        assert 0 < row["inference_s"] <= row["wall_s"]
    outputs = ev.outputs[ev.outputs["output"] == "out"]
    assert len(outputs) == 2 * sum(CHUNKS)
    module = audio_streamer["module"]
    manifest = parse_manifest(yaml.safe_load((folder / "torch.yaml").read_text()), source=str(folder / "m.yaml"))
    for i, chunks in enumerate(CHUNKS):
        item = Preprocessor(manifest)(folder / "audio" / f"clip{i}.wav")
        with torch.no_grad():
            state, expected = torch.zeros(1, STATE), []
            for chunk in item:
                out, state = module(torch.from_numpy(chunk[None]), state, torch.tensor(16000))
                expected.append(float(out))
        for fw in ("torch", "onnxruntime"):
            rows = outputs[(outputs["framework"] == fw) & (outputs["input_id"].str.endswith(f"clip{i}.wav"))]
            assert list(rows["chunk"]) == list(range(chunks))
            np.testing.assert_allclose([v[0] for v in rows["values"]], expected, atol=1e-5)
    assert ev.output_agreement.set_index(["output", "metric"])["value"][("new_state", "max_abs_error")] < 1e-5


# ---------------------------------------------------------------- a batch on axis 1

FEATURES, HIDDEN, STEPS = 4, 6, 5


class TimeMajorGRU(torch.nn.Module):
    """A GRU reading (time, batch, features), its hidden state (1, batch, hidden): the batch on axis 1 of both."""

    def __init__(self) -> None:
        super().__init__()
        self.gru = torch.nn.GRU(FEATURES, HIDDEN)
        self.head = torch.nn.Linear(HIDDEN, 2)

    def forward(self, x, h):
        y, h_new = self.gru(x, h)
        return self.head(y[-1]), h_new


def build_gru() -> TimeMajorGRU:
    return TimeMajorGRU()


def _gru_manifest(framework: str, model: dict) -> dict:
    return {"name": "gru", "framework": {"name": framework},
            "inputs": [{"name": "x", "type": "tensor", "dimensions": [STEPS, FEATURES], "batch_axis": 1},
                       {"name": "h", "type": "tensor", "dimensions": [1, HIDDEN], "batch_axis": 1}],
            "outputs": [{"name": "out", "type": "tensor"}, {"name": "new_h", "type": "tensor"}],
            "state": {"new_h": "h"}, "model": model}


@pytest.fixture(scope="module")
def gru_models(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gru")
    torch.manual_seed(1)
    module = TimeMajorGRU().eval()
    torch.save(module.state_dict(), folder / "gru.pth")
    torch.onnx.export(module, (torch.zeros(STEPS, 2, FEATURES), torch.zeros(1, 2, HIDDEN)), str(folder / "gru.onnx"),
                      input_names=["x", "h"], output_names=["out", "new_h"],
                      dynamic_axes={"x": {1: "n"}, "h": {1: "n"}, "out": {0: "n"}, "new_h": {1: "n"}}, dynamo=False)
    for fw, model in (("torch", {"entrypoint": "tests.test_lockstep:build_gru", "weights_path": "gru.pth"}),
                      ("onnxruntime", {"graph_path": "gru.onnx"})):
        (folder / f"{fw}.yaml").write_text(yaml.safe_dump(_gru_manifest(fw, model)))
    x = np.random.default_rng(5).standard_normal((7, STEPS, FEATURES)).astype(np.float32)
    np.savez(folder / "sequences.npz", x=x)
    return {"folder": folder, "module": module, "x": x}


def test_a_batch_on_axis_1_is_moved_there_in_the_streamed_pass(gru_models, mlms_home, monkeypatch):
    folder, module, x = gru_models["folder"], gru_models["module"], gru_models["x"]
    monkeypatch.setenv("MLMS_MANIFEST_PATH", str(folder))
    ev = mlms_nb.evaluate("gru", framework="torch,onnxruntime", trust=True, batch_sizes=[3],
                          dataset=str(folder / "sequences.npz"), capture_outputs="all", warmup=1, min_repeats=2,
                          min_time_s=0, progress=False, history=False)
    assert ev.complete, ev.missing()
    full = ev.full_pass.set_index("framework")
    assert full["inputs"].tolist() == [7, 7] and full["batches"].tolist() == [3, 3]
    with torch.no_grad():  # each sequence alone, time-major, from a zero hidden state
        alone = [module(torch.from_numpy(seq[:, None]), torch.zeros(1, 1, HIDDEN)) for seq in x]
    for fw in ("torch", "onnxruntime"):
        rows = ev.outputs[ev.outputs["framework"] == fw].set_index(["input_id", "output"])
        ids = list(dict.fromkeys(rows.index.get_level_values(0)))
        assert len(ids) == 7
        for input_id, (out, h) in zip(ids, alone):
            assert list(rows.loc[(input_id, "out"), "shape"]) == [2]
            np.testing.assert_allclose(rows.loc[(input_id, "out"), "values"], out.numpy()[0], atol=1e-5)
            np.testing.assert_allclose(rows.loc[(input_id, "new_h"), "values"], h.numpy().reshape(-1), atol=1e-5)


def test_lockstep_state_on_axis_1(gru_models):
    """Ordered chunks of time-major sequences: state rows gathered and refilled on axis 1, as one at a time."""
    folder, module = gru_models["folder"], gru_models["module"]
    rng = np.random.default_rng(7)
    items = [rng.standard_normal((n, STEPS, FEATURES)).astype(np.float32) for n in (2, 4, 1, 3)]
    ids = [f"seq{i}" for i in range(len(items))]
    for fw in ("torch", "onnxruntime"):
        manifest = parse_manifest(yaml.safe_load((folder / f"{fw}.yaml").read_text()), source=str(folder / "m.yaml"))
        with open_predictor(manifest, options=PredictorOptions(trust=True)) as predictor:
            rows: list[int] = []

            def call(feed):
                assert feed["x"].shape[0] == STEPS and feed["h"].shape[1] == feed["x"].shape[1]
                rows.append(feed["x"].shape[1])
                return predictor.predict(feed)

            three = run_sequences(call, manifest, ids, items, batch_size=3)
        assert rows == [3, 3, 2, 2]  # seq2 ends after call 1 (seq3 takes its row), seq0 after call 2
        for item, got in zip(items, three):
            with torch.no_grad():
                h = torch.zeros(1, 1, HIDDEN)
                for chunk, outputs in zip(item, got):
                    out, h = module(torch.from_numpy(chunk[:, None]), h)
                    np.testing.assert_allclose(outputs["out"], out.numpy(), atol=1e-5)
                    np.testing.assert_allclose(outputs["new_h"], h.numpy(), atol=1e-5)
