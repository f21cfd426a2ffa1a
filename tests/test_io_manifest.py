"""The manifest's input/output fields of issue 11, feeds, chunks and the output metrics, without a framework."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from mlms_nb.data.feeds import FeedBuilder, FeedError
from mlms_nb.data.signals import chunk
from mlms_nb.data.transforms import fit_size
from mlms_nb.errors import ManifestError, MlmsError
from mlms_nb.evaluation.agreement import agreement
from mlms_nb.evaluation.outputs import OutputRecorder, parse_capture
from mlms_nb.manifest import ChunkArgs, ResizeFitArgs, load_manifest, parse_manifest
from mlms_nb.options import EvaluateOptions


def _tensor(**changes) -> dict:
    data = {"name": "m", "framework": {"name": "onnxruntime"}, "model": {"graph_path": "m.onnx"},
            "inputs": [{"name": "x", "type": "tensor", "dimensions": [4]}],
            "outputs": [{"name": "y", "type": "tensor"}]}
    data.update(changes)
    return data


def _error(data: dict) -> str:
    with pytest.raises(ManifestError) as info:
        parse_manifest(data)
    return str(info.value)


def test_dynamic_dimensions_constants_state_and_batch_axis_round_trip(tmp_path):
    data = _tensor(inputs=[{"name": "x", "type": "tensor", "dimensions": [None, "T"]},
                           {"name": "h", "type": "tensor", "dimensions": [2, 3], "batch_axis": 1},
                           {"name": "sr", "type": "constant", "value": 16000, "dtype": "int64"}],
                   outputs=[{"name": "y", "type": "tensor"}, {"name": "h_next", "type": "tensor"}],
                   state={"h_next": "h"})
    manifest = parse_manifest(data)
    sr = manifest.inputs[2]
    assert (sr.element_type, sr.dimensions, sr.batch_axis) == ("int64", [], None)
    assert manifest.fed_input.name == "x" and manifest.fed_input.dynamic
    saved = load_manifest(manifest.save(tmp_path / "m.yaml"))
    assert [s.model_dump() for s in saved.inputs] == [s.model_dump() for s in manifest.inputs]
    assert saved.state == {"h_next": "h"}

    feed = FeedBuilder(manifest)(np.zeros((5, 7, 9), np.float32))
    assert feed["h"].shape == (2, 5, 3) and not feed["h"].any()  # zeros, the batch on axis 1
    assert feed["sr"].shape == () and feed["sr"].dtype == np.int64 and feed["sr"] == 16000
    data["inputs"][2]["batch_axis"] = 0  # a constant repeated per input
    assert FeedBuilder(parse_manifest(data))(np.zeros((5, 7, 9), np.float32))["sr"].tolist() == [16000] * 5


@pytest.mark.parametrize("changes, message", [
    ({"inputs": [{"name": "x", "type": "tensor", "dimensions": [-1, 4]}]},
     "inputs[0].dimensions[0]: write a dynamic dimension as null or a symbol such as H, not -1"),
    ({"inputs": [{"name": "x", "type": "tensor", "dimensions": [4], "batch_axis": 2}]},
     "inputs[0].batch_axis: an input of 1 dimensions (without the batch) can take the batch at axis 0 to 1, not 2"),
    ({"inputs": [{"name": "x", "type": "tensor", "dimensions": [4]}, {"name": "sr", "type": "constant"}]},
     "inputs[1].value: a constant input needs the value to feed, such as 16000"),
    ({"state": {"nope": "x"}}, "state.nope: 'nope' is not the name of an output"),
    ({"outputs": [{"name": "y", "type": "tensor"}, {"type": "tensor"}]},
     "outputs[1].name: a model with several outputs names each one"),
    ({"inputs": [{"name": "x", "type": "tensor", "dimensions": [4]}, {"name": "z", "type": "tensor", "dimensions": [2]}]},
     "inputs[1]: nothing feeds input 'z'"),
    ({"inputs": [{"type": "image", "dimensions": [3, 32, 32]}],
      "preprocess": [{"decode": {}}, {"resize_fit": {"long_side": 64, "multiple_of": 32}}]},
     "preprocess: the steps leave the image size to each image"),
    ({"preprocess": [{"resize_fit": {"multiple_of": 32}}]}, "preprocess[0].resize_fit: give short_side, long_side or both"),
    ({"inputs": [{"name": "x", "type": "audio", "dimensions": [16]}], "preprocess": [{"resize": {"size": 3}}]},
     "preprocess[0]: step resize does not apply to a audio input"),
    ({"inputs": [{"name": "x", "type": "text", "dimensions": [8]}],
      "preprocess": [{"tokenize": {"tokenizer": "t.json", "attention_mask": "mask"}}]},
     "preprocess[0].tokenize.attention_mask: 'mask' is not the name of an input"),
])
def test_bad_io_fields_name_their_path(changes, message):
    assert message in _error(_tensor(**changes))


def test_feeds_check_symbols_and_static_sizes():
    manifest = parse_manifest(_tensor(inputs=[{"name": "x", "type": "tensor", "dimensions": ["T", 2]},
                                              {"name": "m", "type": "tensor", "dimensions": [3]}],
                                      outputs=[{"name": "y", "type": "tensor"}, {"name": "m2", "type": "tensor"}],
                                      state={"m2": "m"}))
    feeds = FeedBuilder(manifest)
    assert feeds({"x": np.zeros((1, 3, 2), np.float32)})["m"].shape == (1, 3)
    with pytest.raises(FeedError, match=r"input 'x' dimension 1 is 5 but the manifest says 2"):
        feeds({"x": np.zeros((1, 3, 5), np.float32)})
    with pytest.raises(FeedError, match=r"input 'x' is shaped \[3\] without the batch, but its dimensions are \[T, 2\]"):
        feeds(np.zeros((1, 3), np.float32))
    with pytest.raises(FeedError, match=r"input 'm' dimension 0 is 4 but the manifest says 3"):
        feeds({"x": np.zeros((1, 3, 2), np.float32), "m": np.zeros((1, 4), np.float32)})


def test_resize_fit_and_chunks_by_the_numbers():
    assert fit_size((640, 480), ResizeFitArgs(long_side=320, multiple_of=32)) == (256, 320)  # 240 -> 256
    assert fit_size((480, 640), ResizeFitArgs(short_side=100, long_side=1000, multiple_of=1)) == (133, 100)
    assert fit_size((10, 1000), ResizeFitArgs(long_side=64, multiple_of=32)) == (64, 32)  # at least one multiple
    chunks = chunk(np.arange(1, 8, dtype=np.float32), ChunkArgs(size=3, context=2))
    assert chunks.tolist() == [[0, 0, 1, 2, 3], [2, 3, 4, 5, 6], [5, 6, 7, 0, 0]]
    overlapping = chunk(np.arange(6), ChunkArgs(size=4, hop=2))
    assert overlapping.tolist() == [[0, 1, 2, 3], [2, 3, 4, 5]]


def test_capture_modes_and_output_metrics():
    assert [parse_capture(m) for m in ("none", "summary", "all", "first:3", 2)] == [-1, 0, None, 3, 2]
    assert EvaluateOptions(capture_outputs=5).capture_outputs == "first:5"
    with pytest.raises(ValueError, match="expected none, summary, all or first:N"):
        EvaluateOptions(capture_outputs="most")
    manifest = parse_manifest(_tensor(outputs=[{"name": "y", "type": "tensor", "metrics": ["iou"]}]))
    frames = []
    masks = {"torch": [np.array([[0.9, 0.1], [0.8, 0.2]]), np.array([[0.0, 0.0], [0.0, 0.0]])],
             "onnxruntime": [np.array([[0.9, 0.7], [0.8, 0.2]]), np.array([[0.0, 0.0], [0.0, 0.0]])]}
    for fw, values in masks.items():
        recorder = OutputRecorder(manifest, fw, "first:1")
        recorder.add(["a"], {"y": values[0][None]})
        recorder.add(["b"], {"y": values[1][None]})
        frames.append(recorder.frame())
    outputs = pd.concat(frames, ignore_index=True)
    assert outputs["values"].isna().tolist() == [False, True, False, True]  # first:1 kept one input's values
    rows = agreement(outputs, metrics=["exact_match"], per_output={"y": ["iou"]}).set_index("metric")
    assert rows.loc["iou", "value"] == pytest.approx(2 / 3) and rows.loc["iou", "inputs"] == 1
    assert rows.loc["exact_match", "value"] == 0.0 and rows.loc["max_abs_error", "value"] == pytest.approx(0.6)
    with pytest.raises(MlmsError, match="unknown metric 'rmse'"):
        agreement(outputs, metrics=["rmse"])


def test_a_fed_input_batched_on_another_axis_is_moved_there():
    from mlms_nb.evaluation.inputs import LoadedInputs

    inputs = LoadedInputs("dense", np.arange(12, dtype=np.float32).reshape(3, 4), ["a", "b", "c"],
                          batch_axes={"x": 1}, fed="x")
    batch = inputs.batch(2)  # datasets stack on axis 0; the model takes (4, N)
    assert batch.shape == (4, 2) and batch[:, 1].tolist() == [4, 5, 6, 7]
    assert [b.shape for _, b in inputs.calls(2)] == [(4, 2), (4, 1)]


def test_output_summaries_are_per_input_over_its_finite_elements_whatever_the_batch():
    """The recorder summarises a whole call at once (issue 25): each row's min/max/mean/std must be those of its
    own input's finite elements (NaN when it has none), the values kept only for the first N inputs, an output
    without the batch repeated per input, and rows back in dataset order when calls came out of order."""
    manifest = parse_manifest(_tensor(outputs=[{"name": "y", "type": "tensor"}, {"name": "scale", "type": "tensor"}]))
    rng = np.random.default_rng(0)
    y = rng.standard_normal((5, 2, 3))
    y[1, 0, 0], y[2, 1, 2], y[3] = np.nan, np.inf, np.nan  # input 3: nothing finite
    recorder = OutputRecorder(manifest, "torch", "first:2")
    recorder.add(["c", "d"], {"y": y[3:], "scale": np.float32(2.0)}, place=3)
    recorder.add(["a", "b", "e"], {"y": y[[0, 1, 2]], "scale": np.float32(2.0)}, place=0)
    frame = recorder.frame()
    assert frame["input_id"].tolist() == ["a", "a", "b", "b", "e", "e", "c", "c", "d", "d"]
    ys = frame[frame["output"] == "y"].reset_index(drop=True)
    for row, k in zip(ys.itertuples(), [0, 1, 2, 3, 4]):
        own = y[k].reshape(-1)
        finite = own[np.isfinite(own)]
        expected = [f(finite) if finite.size else np.nan for f in (np.min, np.max, np.mean, np.std)]
        np.testing.assert_allclose([row.min, row.max, row.mean, row.std], expected, rtol=1e-12)
        assert row.shape == [2, 3] and row.dtype == "float64"
    assert ys["values"].notna().tolist() == [True, True, False, False, False]
    assert ys["values"][1][0] != ys["values"][1][0]  # the NaN is kept in the values
    scale = frame[frame["output"] == "scale"]
    assert scale["mean"].tolist() == [2.0] * 5 and scale["shape"].tolist() == [[]] * 5
    in_order = OutputRecorder(manifest, "torch", "first:2")  # calls in order are summarised together
    in_order.add(["a", "b", "e"], {"y": y[[0, 1, 2]], "scale": np.float32(2.0)})
    in_order.add(["c", "d"], {"y": y[3:], "scale": np.float32(2.0)})
    pd.testing.assert_frame_equal(in_order.frame(), frame)
    stacked = OutputRecorder(manifest, "torch", "first:2")  # every output batched: one numpy pass over both calls
    stacked.add(["a", "b", "e"], {"y": y[[0, 1, 2]]})
    stacked.add(["c", "d"], {"y": y[3:]})
    pd.testing.assert_frame_equal(stacked.frame(), ys.assign(framework="torch"), check_like=False)
