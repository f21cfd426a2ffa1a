"""Cross-framework divergence: EfficientNet-Lite0 in PyTorch, ONNX Runtime, TensorFlow and an INT8 ONNX copy,
compared layer by layer on 4 of the packaged photos, with layer latencies from each predictor's own FRAMEWORK
trace; plus the pure numbers on constructed arrays."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

import mlms_nb
from mlms_nb.analyses import divergence as A
from mlms_nb.divergence import diverge
from mlms_nb.divergence.align import attribute_latency
from mlms_nb.errors import MlmsError
from mlms_nb.frameworks.capture import Point
from mlms_nb.frameworks.onnxruntime.capture import onnx_key
from tests.helpers import axis_labels, titles

FP32_PAIRS = ("torch~onnxruntime", "torch~tensorflow", "onnxruntime~tensorflow")
INT8_PAIR = "torch~onnxruntime-int8"
PHOTOS = 4


@pytest.fixture(scope="module")
def lite0(models_home):
    """One run, 4 photos, three fp32 frameworks plus the INT8 copy (the slow part of this file)."""
    return diverge("efficientnet_lite0", frameworks="torch,onnxruntime,tensorflow", quantized=True, limit=PHOTOS,
                   latency_repeats=3)


# ------------------------------------------------------------------------------------------ real models

@pytest.mark.slow
def test_an_int8_copy_reads_after_its_home_moves(converted_models, tmp_path, monkeypatch):
    """The INT8 copy's artifact.json records the fp32 graph relative to MLMS_HOME: after the home moves, the copy is
    reused (not rebuilt) and ``quantized_from`` names the fp32 graph of the new home, which opens."""
    import shutil
    from pathlib import Path

    import onnxruntime as ort

    from mlms_nb.frameworks.onnxruntime.quantize import quantized_manifest

    version = mlms_nb.find_manifest("efficientnet_lite0", framework="onnxruntime").version
    fp32 = Path("artifacts", "efficientnet_lite0", version, "onnxruntime")
    first, moved = tmp_path / "first", tmp_path / "moved"
    shutil.copytree(converted_models / fp32, first / fp32)  # the fp32 graph, as convert built it
    monkeypatch.setenv("MLMS_HOME", str(first))
    built = quantized_manifest("efficientnet_lite0")
    record = json.loads((Path(built.model.graph_path).parent / "artifact.json").read_text())
    assert record["source"] == (fp32 / "model.onnx").as_posix()  # relative to MLMS_HOME, not the absolute path

    first.rename(moved)
    monkeypatch.setenv("MLMS_HOME", str(moved))
    again = quantized_manifest("efficientnet_lite0")
    assert again.model.sha256 == built.model.sha256
    assert json.loads((Path(again.model.graph_path).parent / "artifact.json").read_text()) == record  # not rebuilt
    source = Path(again.attributes["quantized_from"])
    assert source.is_file() and source.is_relative_to(moved) and Path(again.model.graph_path).is_relative_to(moved)
    for graph in (source, Path(again.model.graph_path)):
        session = ort.InferenceSession(str(graph), providers=["CPUExecutionProvider"])
        out = session.run(None, {"input": np.zeros((1, 3, 224, 224), np.float32)})[0]
        assert out.shape == (1, 1000) and np.isfinite(out).all()



@pytest.mark.slow
def test_fp32_frameworks_agree_layer_by_layer(lite0):
    layers = lite0.layers
    assert lite0.frameworks == ["torch", "onnxruntime", "tensorflow", "onnxruntime-int8"]
    assert len(layers) > 100 and list(layers["layer_index"]) == list(range(len(layers)))
    for pair in FP32_PAIRS:
        rel = layers[A.column("max_rel_error", pair)]
        assert rel.notna().sum() > 60
        assert rel.max() < 1e-4, pair
        assert layers[A.column("cosine_similarity", pair)].min() > 0.99999
        assert lite0.first_divergent_layer[pair] is None
    out = lite0.outputs.set_index("pair")
    assert (out.loc[list(FP32_PAIRS), "top1_agreement"] == 1.0).all()
    assert (out.loc[list(FP32_PAIRS), "max_abs_logit_error"] < 1e-4).all()
    # the alignment rule: ONNX folds _bn0 into _conv_stem, so the pre-BN conv output is compared for Keras only
    by_layer = layers.set_index("layer")
    assert np.isnan(by_layer.loc["_conv_stem", A.column("max_abs_error", "torch~onnxruntime")])
    assert np.isfinite(by_layer.loc["_conv_stem", A.column("max_abs_error", "torch~tensorflow")])
    assert np.isfinite(by_layer.loc["_bn0", A.column("max_abs_error", "torch~onnxruntime")])
    assert {"_swish", "_swish#1", "_blocks.1._swish#1", "_fc"} <= set(layers["layer"])  # shared ReLU6 calls


@pytest.mark.slow
def test_int8_first_divergent_layer_is_reported(lite0):
    first = lite0.first_divergent_layer[INT8_PAIR]
    assert first is not None
    rel = lite0.layers[A.column("max_rel_error", INT8_PAIR)].to_numpy(dtype=float)
    position = int(np.flatnonzero(lite0.layers["layer"].to_numpy() == first)[0])
    assert rel[position] > lite0.tolerance
    before = rel[:position]
    assert np.all(np.isnan(before) | (before <= lite0.tolerance))
    assert lite0.outputs.set_index("pair").loc[INT8_PAIR, "js_mean_nats"] > 0
    assert first in lite0.to_text() and first in lite0._repr_html_()


@pytest.mark.slow
def test_int8_accuracy_delta_matches_per_input_predictions(lite0):
    per_input = lite0.per_input
    assert per_input["input_id"].nunique() == PHOTOS
    acc = lite0.accuracy.set_index("framework")
    for fw, group in per_input.groupby("framework"):
        assert acc.loc[fw, "top1"] == pytest.approx(group["correct"].mean())
        assert acc.loc[fw, "top5"] == pytest.approx(group["top5_correct"].mean())
    ref = per_input[per_input.framework == "torch"].set_index("input_id")
    int8 = per_input[per_input.framework == "onnxruntime-int8"].set_index("input_id")
    delta = int8["correct"].mean() - ref["correct"].mean()
    assert acc.loc["onnxruntime-int8", "top1_delta"] == pytest.approx(delta)
    assert acc.loc["onnxruntime-int8", "changed_vs_reference"] == int((int8["correct"] != ref["correct"]).sum())

    # the captured int8 predictions are the quantized model's own: an untouched session agrees on every photo
    import onnxruntime as ort

    from mlms_nb.data.datasets import open_dataset
    from mlms_nb.data.transforms import Preprocessor
    from mlms_nb.frameworks.onnxruntime.quantize import quantized_onnx
    from mlms_nb.manifest import find_manifest

    manifest = find_manifest("efficientnet_lite0", framework="onnxruntime")
    artifact = quantized_onnx(manifest)
    meta = json.loads((artifact.path.parent / "artifact.json").read_text())
    assert meta["sha256"] == artifact.sha256 and meta["quantization"]["format"] == "QDQ"
    batch = next(open_dataset("imagenet-samples", manifest).iter_batches(PHOTOS, Preprocessor(manifest)))
    session = ort.InferenceSession(str(artifact.path), providers=["CPUExecutionProvider"])
    logits = session.run(None, {"input": batch.data})[0]
    assert list(int8.loc[batch.ids, "top1"]) == list(logits.argmax(1))
    assert list(int8.loc[batch.ids, "label"]) == list(batch.labels)


@pytest.mark.slow
def test_int8_layer_errors_are_read_against_the_outputs_agreement(lite0):
    """The INT8 copy's worst elements are far off at many layers (max_rel_error: the largest |b - a| over the
    layer's largest |a|) while top-1 agrees: each INT8 tensor is still its fp32 layer's own (as a whole every layer
    agrees: rms_rel_error and cosine similarity), and the run says so in one sentence, never a bare implausible
    figure."""
    layers = lite0.layers
    mx, rms, cos = (A.column(m, INT8_PAIR) for m in ("max_rel_error", "rms_rel_error", "cosine_similarity"))
    aligned = layers[rms].notna()
    assert aligned.sum() > 60 and lite0.outputs.set_index("pair").at[INT8_PAIR, "top1_agreement"] == 1.0
    assert (layers.loc[aligned, rms] <= A.WHOLE_LAYER_AGREES[0]).all()
    assert (layers.loc[aligned, cos] >= A.WHOLE_LAYER_AGREES[1]).all()
    for pair in FP32_PAIRS:
        assert layers[A.column("rms_rel_error", pair)].max() < 1e-5
    high = layers[layers[mx] > A.IMPLAUSIBLE_MAX_REL].sort_values(mx, ascending=False)
    said = [w for w in lite0.warnings if w.startswith(f"{INT8_PAIR}:")]
    assert not any("contradict" in w for w in lite0.warnings)
    assert len(said) == (1 if len(high) else 0)
    if len(high):  # 4 photos are enough for some: _blocks.3._swish is at 67% of its range from the first 2
        assert f"{len(high)} layer(s)" in said[0] and high["layer"].iloc[0] in said[0]
        assert "not a misalignment" in said[0] and said[0] in lite0.to_text()
    assert "largest |a| of the reference layer" in lite0.notes["relative errors"]


def _real_layer_tensors():
    """Two photos through EfficientNet-Lite0 in PyTorch: a ReLU6 output, the BatchNorm output it clips (the layer
    one before), a ReLU6 output of another block of the same shape, and the logits."""
    from mlms_nb.data.datasets import open_dataset
    from mlms_nb.data.transforms import Preprocessor
    from mlms_nb.frameworks.base import open_predictor
    from mlms_nb.manifest import find_manifest

    manifest = find_manifest("efficientnet_lite0", framework="torch")
    x = next(open_dataset("imagenet-samples", manifest).iter_batches(2, Preprocessor(manifest))).data
    predictor = open_predictor(manifest)
    try:
        capture = predictor.capture()
        keys = [("_blocks.2._swish", 0), ("_blocks.2._bn0", 0), ("_blocks.3._swish", 0)]
        out, logits = capture.run(x, keys)
    finally:
        predictor.close()
    return [np.asarray(out[k], np.float64) for k in keys], np.asarray(logits, np.float64).reshape(len(x), -1)


@pytest.mark.slow
def test_layer_errors_that_contradict_the_outputs_agreement_are_flagged(models_home):
    """On real activations: a tensor compared with the layer before it, with another block's, or with its uint8
    quantized copy not dequantized, is flagged as contradicting outputs that agree; a layer whose worst element is
    off but which agrees as a whole is said to be so; nothing is flagged when the outputs disagree anyway."""
    (swish, bn, other), logits = _real_layer_tensors()
    scale = 6 / 255  # ReLU6's range in uint8, as the INT8 copy quantizes it
    rounded = np.round(swish / scale) * scale
    flipped = rounded.copy().ravel()
    flipped[np.argmax(flipped)] = 0.0  # one element of 1.8 million off by the whole range
    compared = {"int8 round trip": rounded, "one element off": flipped.reshape(swish.shape), "layer before": bn,
                "another block": other, "uint8 not dequantized": np.round(swish / scale).astype(np.uint8)}
    errors = {(i, "torch~int8"): A.tensor_errors(swish, b) for i, b in enumerate(compared.values())}
    table = A.layer_table(pd.DataFrame({"layer": list(compared)}), errors, {}, [("torch", "int8")], ["torch", "int8"],
                          1e-4)
    agree = A.output_table({"torch": logits, "int8": logits + 1e-3}, [("torch", "int8")])
    [outliers, contradiction] = A.implausible_layers(table, agree)["torch~int8"]
    assert "1 layer(s)" in outliers and "one element off (100%)" in outliers and "not a misalignment" in outliers
    for name in ("layer before", "another block", "uint8 not dequantized"):
        assert name in contradiction
    assert "int8 round trip" not in outliers + contradiction and "likely misaligned" in contradiction
    disagree = A.output_table({"torch": logits, "int8": -logits}, [("torch", "int8")])
    assert A.implausible_layers(table, disagree) == {}


@pytest.mark.slow
def test_layer_latency_beside_error(lite0):
    layers = lite0.layers
    for fw in lite0.frameworks:
        lat = layers[A.column("latency_ms", fw)]
        assert (lat.dropna() >= 0).all() and lat.sum() > 0, fw
    assert layers[A.column("latency_ms", "torch")].notna().all()  # PyTorch has every row
    summary = lite0.latency.set_index("framework")
    assert (summary["total_ms"] > 0).all() and (summary["timed_calls"] == 3).all()
    assert (summary["layers_ms"] <= summary["total_ms"] * (1 + 1e-9)).all()  # layers + unattributed = total


@pytest.mark.slow
def test_layer_latency_is_what_layers_reports_on_the_same_trace(lite0):
    """%mlms diverge and ev.layers("latency") use one measurement: each framework's latencies come from the
    FRAMEWORK trace its predictor recorded (kept in .traces), read as layers() reads it; a row that one layer
    span lands on shows that layer's self_median_ms."""
    for fw in lite0.frameworks:
        trace = lite0.traces[fw]
        assert trace.metadata["framework"] == fw
        assert (trace.spans["name"] == "predict").sum() == 3 and (trace.spans["kind"] == "layer").any()
        assert "self time of the FRAMEWORK layer spans" in lite0.notes[f"latency {fw}"]
        reported = mlms_nb.layers(trace, "latency").table.sort_values("layer_index")
        predict = trace.spans[trace.spans["name"] == "predict"]
        assert lite0.latency.set_index("framework").at[fw, "total_ms"] == pytest.approx(
            float(np.median(predict["duration_ns"])) / 1e6)
        if fw in ("torch", "tensorflow"):  # layer spans named after their module: the k-th span is call k
            reported = reported.assign(call=reported.groupby("name").cumcount())
            col = A.column("latency_ms", fw)
            both = lite0.layers.merge(reported, left_on=["layer_name", "call"], right_on=["name", "call"])
            both = both[both[col].notna()]
            assert len(both) > 0.9 * lite0.layers[col].notna().sum()
            # a layer span of no row (PyTorch's Identity padding of a 1x1 conv) lands on the row after it, its
            # parent's: there the row is the median of the per-call sum, never less than the layer's own median
            rows = set(zip(lite0.layers["layer_name"], lite0.layers["call"]))
            extra = [n for n, c in zip(reported["name"], reported["call"]) if (n, c) not in rows]
            alone = both[[not any(e.startswith(f"{n}.") for e in extra) for n in both["layer_name"]]]
            assert len(alone) > 0.5 * len(both) and (fw == "torch" or len(alone) == len(both))
            np.testing.assert_allclose(alone[col], alone["self_median_ms"], rtol=1e-9, atol=1e-12)
            assert (both[col] >= both["self_median_ms"] * (1 - 1e-9)).all()
        # the classifier is one layer span in the fp32 frameworks (a Linear, a Gemm node, a Dense layer)
        if fw != "onnxruntime-int8":
            fc = lite0.layers.set_index("layer").at["_fc", A.column("latency_ms", fw)]
            assert fc == pytest.approx(float(reported.loc[reported["name"] == "_fc", "self_median_ms"].iloc[0]),
                                       rel=1e-9)


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["bokeh", "matplotlib"])
def test_plot_has_units_and_tolerance(lite0, backend):
    fig = lite0.plot(backend=backend)
    labels = axis_labels(fig)
    assert any("latency (ms)" in lab for lab in labels)
    assert any("max_rel_error" in lab for lab in labels)
    assert any("tolerance" in t for t in titles(fig))


# ------------------------------------------------------------------------------------------ bad input

@pytest.mark.parametrize("kwargs, message", [
    (dict(frameworks="torch"), "at least two frameworks"),
    (dict(frameworks="torch,mxnet"), "unknown framework 'mxnet'"),
    (dict(tolerance=0), "tolerance must be a positive number"),
    (dict(limit=0), "limit must be None or a positive integer"),
    (dict(quantized="tensorrt-int8"), "the only quantized copy is 'onnxruntime-int8'"),
])
def test_bad_arguments_are_one_sentence(kwargs, message):
    with pytest.raises(MlmsError, match=message):
        diverge("efficientnet_lite0", **kwargs)


# ------------------------------------------------------------------------------------------ pure numbers

def test_error_metrics_on_constructed_tensors():
    a = np.array([[0.0, 2.0, -4.0]], dtype=np.float32)
    b = np.array([[0.0, 2.5, -4.0]], dtype=np.float32)
    e = A.tensor_errors(a, b)
    assert e["max_abs_error"] == pytest.approx(0.5)
    assert e["max_rel_error"] == pytest.approx(0.5 / 4.0)  # relative to max |reference|, zeros are harmless
    assert e["rms_rel_error"] == pytest.approx(np.sqrt(0.25 / 20.0))  # sum of squared errors over that of a
    assert e["cosine_similarity"] == pytest.approx((0 + 5 + 16) / (np.sqrt(20) * np.sqrt(22.25)))
    stats = A.ErrorStats().update(a[:, :2], b[:, :2]).update(a[:, 2:], b[:, 2:])  # batch by batch == at once
    assert stats.result() == pytest.approx(e)


def test_kl_js_known_values():
    p = np.array([[1.0, 0.0], [0.5, 0.5]])
    q = np.array([[0.0, 1.0], [0.5, 0.5]])
    js = A.js_divergence(p, q)
    assert js[0] == pytest.approx(np.log(2)) and js[1] == pytest.approx(0.0)
    assert A.kl_divergence(np.array([[0.5, 0.5]]), np.array([[0.25, 0.75]]))[0] == pytest.approx(
        0.5 * np.log(2) + 0.5 * np.log(0.5 / 0.75))


def test_first_divergent_and_accuracy_on_constructed_frames():
    layers = pd.DataFrame({"layer": ["a", "b", "c", "d"]})
    errors = {(0, "x~y"): {"max_rel_error": 1e-6}, (2, "x~y"): {"max_rel_error": 3e-3},
              (3, "x~y"): {"max_rel_error": 1e-1}}
    table = A.layer_table(layers, errors, {}, [("x", "y")], ["x", "y"], 1e-3)
    assert A.first_divergent(table, "x~y", 1e-3) == 2 and A.first_divergent(table, "x~y", 1.0) is None
    logits = {"x": np.eye(3)[[0, 1, 2, 0]] * 5, "y": np.eye(3)[[0, 2, 2, 1]] * 5}
    per_input = A.per_input_table(["i0", "i1", "i2", "i3"], np.array([0, 1, 2, 0]), logits, k=2)
    acc = A.accuracy_table(per_input, "x", k=2).set_index("framework")
    assert acc.loc["x", "top1"] == 1.0 and acc.loc["y", "top1"] == 0.5
    assert acc.loc["y", "top1_delta"] == -0.5 and acc.loc["y", "changed_vs_reference"] == 2
    out = A.output_table(logits, [("x", "y")]).iloc[0]
    assert out["top1_agreement"] == 0.5


def test_onnx_names_and_latency_attribution():
    names = {"_swish", "_blocks.1", "_blocks.1._swish", "_blocks.1._bn1", "_conv_stem"}
    assert onnx_key("/_blocks.1/_swish_1/Clip_output_0_nchwc", names) == ("_blocks.1._swish", 1)
    assert onnx_key("/_swish_1/Clip", names) == ("_swish", 1)
    assert onnx_key("/_blocks.1/Add", names) == ("_blocks.1", 0)
    assert onnx_key("input_QuantizeLinear", names) is None and onnx_key("/Reshape", names) is None
    points = [Point(i, n, 0, "", ()) for i, n in enumerate(["c", "bn", "relu", "fc"])]
    rows = points[1:]  # "c" is not a row; this framework has tensors for "bn" and "fc" only
    per_row, rest = attribute_latency(points, rows, {("bn", 0), ("fc", 0)},
                                      {("c", 0): [1.0, 2.0], ("relu", 0): [10.0, 10.0], None: [5.0, 5.0]})
    assert list(per_row[0]) == [1.0, 2.0]   # the conv's time lands on the bn row it produces
    assert list(per_row[2]) == [10.0, 10.0]  # relu (no tensor here) lands on the next row this framework has
    assert list(rest) == [5.0, 5.0]
