"""FRAMEWORK / ML_LIBRARY tracing of the ONNX Runtime and TensorFlow predictors on the real EfficientNet-Lite0 and
ImageNet photos: layer spans per node execution (ONNX Runtime profiler) and per Keras layer call (tf.profiler),
named after the PyTorch modules, placed inside their predict calls; TF ops inside their layers; levels."""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

from mlms_nb.data.datasets import open_dataset
from mlms_nb.data.transforms import Preprocessor
from mlms_nb.manifest import find_manifest
from mlms_nb.naming import keras_layer_to_torch_name
from mlms_nb.frameworks import open_predictor
from mlms_nb.tracing import Tracer, TraceLevel, attrs_dict, use_tracer
from mlms_nb.tracing._align import match_windows, run_shifts
from mlms_nb.frameworks.tensorflow.xplane import scope_layer

L = TraceLevel
MODEL = "efficientnet_lite0"


@pytest.fixture(scope="module", autouse=True)
def shared_models_home():
    from tests.conftest import SESSION_HOME

    mp = pytest.MonkeyPatch()
    SESSION_HOME.mkdir(parents=True, exist_ok=True)
    mp.setenv("MLMS_HOME", str(SESSION_HOME))
    yield
    mp.undo()


def photo(framework: str) -> np.ndarray:
    """One ImageNet photo, preprocessed for the framework's manifest (NCHW for ONNX, NHWC for TF)."""
    manifest = find_manifest(MODEL, framework=framework)
    dataset = open_dataset("imagenet-samples", manifest)
    return next(dataset.iter_batches(1, Preprocessor(manifest))).data


@pytest.fixture(scope="module")
def torch_modules():
    with open_predictor(find_manifest(MODEL, framework="torch")) as p:
        return set(dict(p.model.named_modules()))


def run_traced(predictor, batch, level, calls=2, seen=None):
    """``calls`` predictions under a tracer at ``level``; then one more after stop_tracing (must record nothing).
    ``seen``: a dict that gets the predictor's profiling state while tracing."""
    tracer = Tracer(level)
    predictor.start_tracing(tracer)
    if seen is not None:
        seen.update(predictor._profile or {})
    try:
        with use_tracer(tracer):
            outputs = [predictor.predict(batch) for _ in range(calls)]
    finally:
        predictor.stop_tracing()
    recorded = len(tracer)
    predictor.predict(batch)
    assert len(tracer) == recorded, "a predict after stop_tracing recorded spans"
    return tracer, tracer.trace(), outputs


def layers_by_predict(spans):
    """predict span row -> its layer spans (children of kind 'layer'), ordered by layer_index."""
    predicts = spans[spans["name"] == "predict"]
    layers = spans[spans["kind"] == "layer"]
    return [(p, layers[layers["parent_id"] == p.span_id].sort_values("layer_index")) for p in predicts.itertuples()]


def assert_nested(children, parent_start, parent_end):
    assert (children["start_ns"] >= parent_start).all() and (children["end_ns"] <= parent_end).all()
    assert (children["end_ns"] >= children["start_ns"]).all()


# ------------------------------------------------------------------------------------------------ ONNX Runtime

@pytest.fixture(scope="module")
def ort_run(tmp_path_factory):
    batch = photo("onnxruntime")
    with open_predictor(find_manifest(MODEL, framework="onnxruntime")) as predictor:
        untraced = predictor.predict(batch)
        plain = predictor.session
        profiling = {}
        tracer, trace, outputs = run_traced(predictor, batch, L.FRAMEWORK, seen=profiling)
        restored = predictor.session
        # the reference: the graph ONNX Runtime optimizes and runs, saved by a session with the same options
        import onnx
        import onnxruntime as ort

        so = predictor.session_options()
        so.optimized_model_filepath = str(tmp_path_factory.mktemp("ort") / "optimized.onnx")
        ort.InferenceSession(predictor.artifact, sess_options=so, providers=["CPUExecutionProvider"])
        graph = onnx.load(so.optimized_model_filepath).graph
        yield {"predictor": predictor, "batch": batch, "tracer": tracer, "trace": trace, "outputs": outputs,
               "untraced": untraced, "layers_per_call": len(graph.node), "plain": plain, "restored": restored,
               "profiling": profiling, "nodes": [(n.name, n.op_type) for n in graph.node]}


def test_ort_layer_spans_are_the_optimized_graph_nodes_in_order(ort_run):
    nodes = ort_run["nodes"]
    assert len(nodes) > 40 and sum(op == "Conv" for _, op in nodes) >= 40  # a real network, not a token graph
    per_call = layers_by_predict(ort_run["trace"].spans)
    assert len(per_call) == 2
    for _, layers in per_call:
        assert set(layers["level"]) == {"FRAMEWORK"}
        assert [attrs_dict(a)["onnx_node"] for a in layers["attrs"]] == [name for name, _ in nodes]
        assert list(layers["layer_type"]) == [op for _, op in nodes]
        assert list(layers["layer_index"]) == list(range(len(nodes)))
        # the CPU provider runs nodes one after another: spans in index order, never overlapping
        assert (layers["start_ns"].to_numpy()[1:] >= layers["end_ns"].to_numpy()[:-1]).all()
    # traced and untraced sessions compute the same logits
    for out in ort_run["outputs"]:
        np.testing.assert_allclose(out, ort_run["untraced"], rtol=1e-5, atol=1e-5)


def test_ort_layer_names_map_to_pytorch_modules(ort_run, torch_modules):
    layers = ort_run["trace"].spans.query("kind == 'layer'")
    scoped = layers[[attrs_dict(a)["onnx_node"].startswith("/") for a in layers["attrs"]]]
    unscoped = layers.drop(scoped.index)
    assert set(scoped["name"]) <= torch_modules
    assert {f"_blocks.{i}._project_conv" for i in range(16)} | {"_fc", "_avg_pooling"} <= set(scoped["name"])
    assert all(name == attrs_dict(a)["onnx_node"] for name, a in zip(unscoped["name"], unscoped["attrs"]))
    first = layers.sort_values("start_ns").iloc[0]
    a = attrs_dict(first["attrs"])
    assert first["shape"] == "[[1,3,224,224],[32,3,3,3],[32]]" and a["out_shape"] == [[1, 32, 112, 112]]
    # bytes: input activations + parameters + outputs, as the profiler sized them (float32)
    assert a["output_bytes"] == 4 * 32 * 112 * 112 and a["param_bytes"] >= 4 * (32 * 3 * 3 * 3 + 32)
    assert first["bytes"] == 4 * 3 * 224 * 224 + a["param_bytes"] + a["output_bytes"]
    assert a["provider"] == "CPUExecutionProvider"


def test_ort_layer_spans_nest_in_their_predict_call(ort_run):
    found = ort_run["tracer"].metadata["onnxruntime.profiler"]
    assert found["runs"] == found["matched_runs"] == 2 and found["layer_spans"] == 2 * len(ort_run["nodes"])
    # placed by the clock mapping, not forced in: the Unix-clock mapping alone lands within a few ms of the
    # call, and no node had to be clipped to fit
    assert found["max_shift_ns"] < 5_000_000 and found["clipped_spans"] == 0
    for predict, layers in layers_by_predict(ort_run["trace"].spans):
        assert len(layers) == len(ort_run["nodes"])
        assert_nested(layers, predict.start_ns, predict.end_ns)
        # the nodes take most of the call: the spans were placed on the call, not somewhere near it
        assert layers["duration_ns"].sum() > 0.5 * (predict.end_ns - predict.start_ns)


def test_ort_profiling_start_is_on_the_unix_clock(ort_run, tmp_path):
    import onnxruntime as ort

    so = ort_run["predictor"].session_options()
    so.enable_profiling = True
    so.profile_file_prefix = str(tmp_path / "ort")
    before = time.time_ns()
    session = ort.InferenceSession(ort_run["predictor"].artifact, sess_options=so, providers=["CPUExecutionProvider"])
    after = time.time_ns()
    assert before <= session.get_profiling_start_time_ns() <= after
    Path(session.end_profiling()).unlink()


def test_ort_stop_restores_the_untraced_session_and_removes_the_profile(ort_run):
    predictor = ort_run["predictor"]
    assert ort_run["restored"] is ort_run["plain"] and predictor._profile is None
    folder = Path(ort_run["profiling"]["folder"])
    assert folder.name.startswith("mlms_ort_profile_") and not folder.exists()
    levels = predictor.tracing_levels()
    assert levels["FRAMEWORK"].startswith("one span per ONNX node")
    assert levels["ML_LIBRARY"].startswith("not supported") and levels["SYSTEM_LIBRARY"].startswith("not supported")


def test_ort_model_level_records_no_layers_and_keeps_the_session(ort_run):
    predictor = ort_run["predictor"]
    batch = photo("onnxruntime")
    plain = predictor.session
    tracer = Tracer(L.MODEL)
    predictor.start_tracing(tracer)
    assert predictor.session is plain  # no profiling session below FRAMEWORK
    predictor.predict(batch)
    predictor.stop_tracing()
    spans = tracer.trace().spans
    assert list(spans["name"]) == ["predict"]


# ------------------------------------------------------------------------------------------------ TensorFlow

@pytest.fixture(scope="module")
def tf_run():
    import tensorflow as tf

    batch = photo("tensorflow")
    with open_predictor(find_manifest(MODEL, framework="tensorflow")) as predictor:
        untraced = predictor.predict(batch)
        # the reference: the Keras layer calls of one eager forward pass, seen by wrapping every layer's call;
        # a call that returns its input unchanged (Dropout at inference) runs no TF op
        calls = []

        def recorder(layer):
            inner = layer.call

            def call(*args, **kwargs):
                out = inner(*args, **kwargs)
                calls.append((layer.name, type(layer).__name__, out is args[0]))
                return out
            return call

        model = predictor.model
        for layer in model.layers:
            layer.call = recorder(layer)
        try:
            model(tf.convert_to_tensor(batch), training=False)
        finally:
            for layer in model.layers:
                del layer.call
        profiling = {}
        tracer, trace, outputs = run_traced(predictor, batch, L.ML_LIBRARY, seen=profiling)
        yield {"predictor": predictor, "profiling": profiling, "batch": batch, "layers_per_call": 159,
               "tracer": tracer, "trace": trace, "outputs": outputs, "untraced": untraced, "calls": calls}


def test_tf_layer_spans_are_the_keras_layer_calls_in_order(tf_run):
    calls = tf_run["calls"]
    assert [c for c in calls if c[2]] == [("_dropout", "Dropout", True)]
    expected = [(name, cls) for name, cls, identity in calls if not identity]
    assert len(expected) == 159 and expected[0][0] == "_conv_stem__static_padding" and expected[-1][0] == "_fc"
    per_call = layers_by_predict(tf_run["trace"].spans)
    assert len(per_call) == 2
    for _, layers in per_call:
        assert set(layers["level"]) == {"FRAMEWORK"}
        assert [attrs_dict(a)["keras_layer"] for a in layers["attrs"]] == [name for name, _ in expected]
        assert list(layers["name"]) == [keras_layer_to_torch_name(name) for name, _ in expected]
        assert list(layers["layer_type"]) == [cls for _, cls in expected]
        assert list(layers["layer_index"]) == list(range(len(expected)))
    for out in tf_run["outputs"]:
        np.testing.assert_allclose(out, tf_run["untraced"], rtol=1e-5, atol=1e-5)


def test_tf_layer_names_map_to_pytorch_modules(tf_run, torch_modules):
    names = set(tf_run["trace"].spans.query("kind == 'layer'")["name"])
    assert names <= torch_modules
    assert {f"_blocks.{i}._depthwise_conv" for i in range(16)} | {"_conv_stem", "_fc"} <= names


def test_tf_layers_nest_in_predict_and_ops_in_their_layer(tf_run):
    spans = tf_run["trace"].spans
    found = tf_run["tracer"].metadata["tensorflow.profiler"]
    assert found["runs"] == 2 and found["max_shift_ns"] < 5_000_000 and found["clipped_spans"] == 0
    ops = spans[spans["kind"] == "op"]
    assert set(ops["level"]) == {"ML_LIBRARY"}
    by_id = spans.set_index("span_id")
    for predict, layers in layers_by_predict(spans):
        assert_nested(layers, predict.start_ns, predict.end_ns)
        assert layers["start_ns"].is_monotonic_increasing and layers["duration_ns"].sum() > 0.3 * (
            predict.end_ns - predict.start_ns)
        mine = ops[ops["parent_id"].isin(set(layers["span_id"]) | {predict.span_id})]
        assert_nested(mine, predict.start_ns, predict.end_ns)
        in_layers = mine[mine["parent_id"] != predict.span_id]
        # every layer holds its data-path ops: a Conv2D layer a Conv2D op, a DepthwiseConv2D a DepthwiseConv2dNative
        assert set(in_layers["parent_id"]) == set(layers["span_id"])
        for op in in_layers.itertuples():
            layer = by_id.loc[op.parent_id]
            assert layer["start_ns"] <= op.start_ns and op.end_ns <= layer["end_ns"]
            assert attrs_dict(op.attrs)["keras_layer"] == attrs_dict(layer["attrs"])["keras_layer"]
        conv_types = {by_id.at[p, "layer_type"]: set(g["name"]) for p, g in in_layers.groupby("parent_id")
                      if by_id.at[p, "layer_type"] in ("Conv2D", "DepthwiseConv2D", "Dense")}
        assert "Conv2D" in conv_types["Conv2D"] and "DepthwiseConv2dNative" in conv_types["DepthwiseConv2D"]
        # ops directly under predict: weights-only work (variable reads, BatchNorm's scale from its variance)
        # or ops outside every layer scope
        outside = [attrs_dict(a) for a in mine[mine["parent_id"] == predict.span_id]["attrs"]]
        assert outside and all(a.get("weights_only") or "keras_layer" not in a for a in outside)
        assert any(a["tf_op"].endswith("batchnorm/Rsqrt") for a in outside if a.get("weights_only"))


def test_tf_levels(tf_run):
    predictor, batch = tf_run["predictor"], tf_run["batch"]
    assert predictor._profile is None and not Path(tf_run["profiling"]["folder"]).exists()
    levels = predictor.tracing_levels()
    assert levels["FRAMEWORK"].startswith("one span per Keras layer call")
    assert levels["ML_LIBRARY"].startswith("one span per executed TF op")
    assert levels["SYSTEM_LIBRARY"].startswith("not supported")
    # FRAMEWORK: layers, no ops; MODEL: the predict span only, and no profiler started
    _, trace, _ = run_traced(predictor, batch, L.FRAMEWORK, calls=1)
    kinds = trace.spans["kind"].value_counts()
    assert kinds.get("layer", 0) == 159 and kinds.get("op", 0) == 0
    tracer = Tracer(L.MODEL)
    predictor.start_tracing(tracer)
    assert predictor._profile is None
    predictor.predict(batch)
    predictor.stop_tracing()
    assert list(tracer.trace().spans["name"]) == ["predict"]


# ------------------------------------------------------------------------------------------------ both

@pytest.mark.parametrize("run", ["ort_run", "tf_run"])
def test_predictors_used_inside_mlms_trace_give_their_layers(run, request):
    import mlms_nb

    r = request.getfixturevalue(run)
    predictor = r["predictor"]
    with mlms_nb.trace("FRAMEWORK") as session:
        predictor.predict(r["batch"])
    assert predictor._tracer is None and predictor._profile is None
    spans = session.trace.spans
    predict = spans[spans["name"] == "predict"]
    layers = spans[spans["kind"] == "layer"]
    assert len(predict) == 1 and len(layers) == r["layers_per_call"]
    assert (layers["parent_id"] == predict["span_id"].iloc[0]).all()
    assert_nested(layers, predict["start_ns"].iloc[0], predict["end_ns"].iloc[0])


# ------------------------------------------------------------------------------------------------ building blocks

def test_runs_are_matched_to_their_calls_and_moved_inside():
    # three calls (windows) and three profiled runs whose clock reads 40 µs late; one stray run far away
    win_start = np.array([0, 10_000, 20_000]) * 1000
    win_end = win_start + 8_000_000
    run_start = win_start + 1_000_000 + 40_000
    run_end = run_start + 6_999_000
    which = match_windows(np.r_[run_start, 90_000_000], np.r_[run_end, 91_000_000], win_start, win_end)
    assert list(which) == [0, 1, 2, -1]
    shifts = run_shifts(run_start, run_end, win_start, win_end)
    assert list(shifts) == [-39_000] * 3  # the smallest move that fits each run in its call
    assert list(run_shifts([0], [10], [0], [100])) == [0]


def test_keras_scope_of_a_tf_op():
    layers = {"_blocks__3", "_blocks__3___depthwise_conv", "_swish"}
    assert scope_layer("efficientnet_lite0_1/_blocks__3___depthwise_conv_1/depthwise", layers,
                       "efficientnet_lite0") == ("_blocks__3___depthwise_conv",
                                                 "efficientnet_lite0_1/_blocks__3___depthwise_conv_1")
    assert scope_layer("m_1/_blocks__3_1/ArithmeticOptimizer/AddOpsRewrite_Add", layers, "m")[0] == "_blocks__3"
    assert scope_layer("m/_swish_3/Relu6", layers, "m") == ("_swish", "m/_swish_3")
    assert scope_layer("other_1/_swish_3/Relu6", layers, "m") is None
    assert scope_layer("m_1/Identity", layers, "m") is None


def test_ort_profile_nodes_become_layer_spans_of_their_call(tmp_path):
    import orjson

    from mlms_nb.frameworks.onnxruntime.profile import add_ort_profile

    def event(cat, name, ts, dur, **args):
        return {"cat": cat, "name": name, "ts": ts, "dur": dur, "ph": "X", "pid": 1, "tid": 42, "args": args}

    conv = dict(op_name="Conv", node_index="3", provider="CPUExecutionProvider", input_type_shape=[{"float": [1, 3]}],
                output_type_shape=[{"float": [1, 4]}], activation_size="12", parameter_size="48", output_size="16")
    path = tmp_path / "ort_profile.json"
    path.write_bytes(orjson.dumps([
        event("Session", "model_run", 100, 50), event("Node", "/_blocks.0/_conv/Conv_kernel_time", 110, 10, **conv),
        event("Node", "ReorderOutput_kernel_time", 125, 5, op_name="ReorderOutput", node_index="9"),
        event("Session", "model_run", 1000, 50),  # a run outside any traced predict call
        event("Node", "/_fc/Gemm_kernel_time", 1010, 10, op_name="Gemm", node_index="4")]))
    tracer = Tracer(L.FRAMEWORK)
    # profile start 1e18 ns on the Unix clock; the Unix clock reads 1e18 - 5 ms when perf_counter reads 0
    found = add_ort_profile(tracer, path, 10**18, 10**18 - 5_000_000, [(5_090_000, 5_170_000, 7)])
    assert not path.exists()
    assert found["runs"] == 2 and found["matched_runs"] == 1 and found["layer_spans"] == 2
    spans = tracer.trace().spans.sort_values("layer_index")
    assert list(spans["name"]) == ["_blocks.0._conv", "ReorderOutput"] and set(spans["parent_id"]) == {7}
    assert list(spans["start_ns"]) == [5_110_000, 5_125_000] and list(spans["end_ns"]) == [5_120_000, 5_130_000]
    assert list(spans["layer_type"]) == ["Conv", "ReorderOutput"] and list(spans["thread"]) == [42, 42]
    conv_span = spans.iloc[0]
    assert conv_span["shape"] == "[[1,3]]" and conv_span["bytes"] == 12 + 48 + 16 and conv_span["memory"] == 16
    assert attrs_dict(conv_span["attrs"])["onnx_node"] == "/_blocks.0/_conv/Conv"
