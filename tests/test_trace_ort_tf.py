"""FRAMEWORK / ML_LIBRARY tracing of the ONNX Runtime and TensorFlow predictors, end to end on the real
EfficientNet-Lite0 and an ImageNet photo: layer spans per node execution (ONNX Runtime profiler) and per Keras
layer call (tf.profiler), named after the PyTorch modules, inside their predict calls. Assertions are on mapped
names and layer types, with expected layers taken from the model on this host (the optimized ONNX graph, the Keras
layer calls of an eager pass); the importers' details are tested on recorded profiles in test_importers.py."""
from __future__ import annotations

import tempfile
import time
from pathlib import Path

import numpy as np
import pytest

from mlms_nb.data.datasets import open_dataset
from mlms_nb.data.transforms import Preprocessor
from mlms_nb.frameworks import open_predictor
from mlms_nb.frameworks.tensorflow.xplane import scope_layer
from mlms_nb.manifest import find_manifest
from mlms_nb.naming import keras_layer_to_torch_name
from mlms_nb.tracing import Tracer, TraceLevel, attrs_dict, use_tracer
from mlms_nb.tracing.align import match_windows, run_shifts

L = TraceLevel
MODEL = "efficientnet_lite0"
pytestmark = pytest.mark.usefixtures("models_home")


def photo(framework: str) -> np.ndarray:
    """One ImageNet photo, preprocessed for the framework's manifest (NCHW for ONNX, NHWC for TF)."""
    manifest = find_manifest(MODEL, framework=framework)
    dataset = open_dataset("imagenet-samples", manifest)
    return next(dataset.iter_batches(1, Preprocessor(manifest))).data


def run_traced(predictor, batch, level, calls=2, profiles=None):
    """``calls`` predictions under a tracer at ``level``, then one more after stop_tracing (must record nothing).
    ``profiles``: a folder made the temporary directory while tracing; returns what was in it then."""
    tracer = Tracer(level)
    with pytest.MonkeyPatch.context() as mp:
        if profiles is not None:
            mp.setattr(tempfile, "tempdir", str(profiles))
        predictor.start_tracing(tracer)
        during = sorted(p.name for p in profiles.iterdir()) if profiles is not None else []
        try:
            with use_tracer(tracer):
                outputs = [predictor.predict(batch) for _ in range(calls)]
        finally:
            predictor.stop_tracing()
    recorded = len(tracer)
    predictor.predict(batch)
    assert len(tracer) == recorded, "a predict after stop_tracing recorded spans"
    return tracer, tracer.trace(), outputs, during


def layers_by_predict(spans):
    """predict span row -> its layer spans (children of kind 'layer'), ordered by layer_index."""
    predicts = spans[spans["name"] == "predict"]
    layers = spans[spans["kind"] == "layer"]
    return [(p, layers[layers["parent_id"] == p.span_id].sort_values("layer_index")) for p in predicts.itertuples()]


def assert_nested(children, parent_start, parent_end):
    assert (children["start_ns"] >= parent_start).all() and (children["end_ns"] <= parent_end).all()
    assert (children["end_ns"] >= children["start_ns"]).all()


@pytest.fixture(scope="module")
def torch_modules():
    with open_predictor(find_manifest(MODEL, framework="torch")) as p:
        return set(dict(p.native_model.named_modules()))


# ------------------------------------------------------------------------------------------------ ONNX Runtime

@pytest.fixture(scope="module")
def ort_run(tmp_path_factory):
    batch = photo("onnxruntime")
    with open_predictor(find_manifest(MODEL, framework="onnxruntime")) as predictor:
        untraced = predictor.predict(batch)
        plain = predictor.native_model
        profiles = tmp_path_factory.mktemp("profiles")
        tracer, trace, outputs, during = run_traced(predictor, batch, L.FRAMEWORK, profiles=profiles)
        # the reference: the graph ONNX Runtime optimizes and runs, saved by a session with the same options
        import onnx
        import onnxruntime as ort

        so = predictor.session_options()
        so.optimized_model_filepath = str(tmp_path_factory.mktemp("ort") / "optimized.onnx")
        ort.InferenceSession(predictor.artifact_path, sess_options=so, providers=["CPUExecutionProvider"])
        graph = onnx.load(so.optimized_model_filepath).graph
        yield {"predictor": predictor, "batch": batch, "tracer": tracer, "trace": trace, "outputs": outputs,
               "untraced": untraced, "layers_per_call": len(graph.node), "plain": plain, "profiles": profiles,
               "during": during, "nodes": [(n.name, n.op_type) for n in graph.node]}


def test_ort_layer_spans_are_the_optimized_graph_nodes_in_their_calls(ort_run):
    nodes = ort_run["nodes"]
    assert len(nodes) > 40 and sum(op == "Conv" for _, op in nodes) >= 40  # a real network, not a token graph
    found = ort_run["tracer"].metadata["onnxruntime.profiler"]
    assert found["runs"] == found["matched_runs"] == 2 and found["clipped_spans"] == 0
    per_call = layers_by_predict(ort_run["trace"].spans)
    assert len(per_call) == 2
    for predict, layers in per_call:
        assert set(layers["level"]) == {"FRAMEWORK"}
        assert [attrs_dict(a)["onnx_node"] for a in layers["attrs"]] == [name for name, _ in nodes]
        fused = [attrs_dict(a).get("fused_ops") for a in layers["attrs"]]  # a fused node's type lists its ops
        assert list(layers["layer_type"]) == [op if not ops else "+".join(ops) if len(ops) <= 3 else
                                              f"{op} ({len(ops)} ops fused)" for (_, op), ops in zip(nodes, fused)]
        assert "Conv+Clip" in set(layers["layer_type"])  # Lite0's convolutions fused with their ReLU6
        assert_nested(layers, predict.start_ns, predict.end_ns)
    # traced and untraced sessions compute the same logits
    for out in ort_run["outputs"]:
        np.testing.assert_allclose(out, ort_run["untraced"], rtol=1e-5, atol=1e-5)


def test_ort_layer_names_map_to_pytorch_modules(ort_run, torch_modules):
    layers = ort_run["trace"].spans.query("kind == 'layer'")
    nodes = [attrs_dict(a)["onnx_node"] for a in layers["attrs"]]
    scoped = layers[[n.startswith("/") for n in nodes]]
    originals = {o for a in map(attrs_dict, layers["attrs"]) for o in a.get("original_nodes", [a["onnx_node"]])}
    root_level = {n[1:] for n in originals | set(nodes) if n.count("/") == 1}  # /Shape: only the whole model owns it
    assert set(scoped["name"]) <= torch_modules - {""} | root_level and "" not in set(layers["name"])
    assert {f"_blocks.{i}._project_conv" for i in range(16)} | {"_fc", "_avg_pooling"} <= set(scoped["name"])


def test_ort_profiling_start_is_on_the_unix_clock(ort_run, tmp_path):
    import onnxruntime as ort

    so = ort_run["predictor"].session_options()
    so.enable_profiling = True
    so.profile_file_prefix = str(tmp_path / "ort")
    before = time.time_ns()
    session = ort.InferenceSession(ort_run["predictor"].artifact_path, sess_options=so,
                                   providers=["CPUExecutionProvider"])
    after = time.time_ns()
    assert before <= session.get_profiling_start_time_ns() <= after
    Path(session.end_profiling()).unlink()


def test_ort_stop_restores_the_untraced_session_and_removes_the_profile(ort_run):
    predictor = ort_run["predictor"]
    assert predictor.native_model is ort_run["plain"]
    assert [n[:17] for n in ort_run["during"]] == ["mlms_ort_profile_"] and not list(ort_run["profiles"].iterdir())
    levels = predictor.tracing_levels()
    assert levels["FRAMEWORK"].startswith("one span per ONNX node")
    assert levels["ML_LIBRARY"].startswith("not supported") and levels["SYSTEM_LIBRARY"].startswith("not supported")
    # MODEL level: the predict span only, on the untraced session
    tracer = Tracer(L.MODEL)
    predictor.start_tracing(tracer)
    predictor.predict(ort_run["batch"])
    predictor.stop_tracing()
    assert list(tracer.trace().spans["name"]) == ["predict"] and predictor.native_model is ort_run["plain"]


# ------------------------------------------------------------------------------------------------ TensorFlow

@pytest.fixture(scope="module")
def tf_run(tmp_path_factory):
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

        model = predictor.native_model
        for layer in model.layers:
            layer.call = recorder(layer)
        try:
            model(tf.convert_to_tensor(batch), training=False)
        finally:
            for layer in model.layers:
                del layer.call
        profiles = tmp_path_factory.mktemp("profiles")
        tracer, trace, outputs, during = run_traced(predictor, batch, L.ML_LIBRARY, profiles=profiles)
        expected = [(name, cls) for name, cls, identity in calls if not identity]
        yield {"predictor": predictor, "profiles": profiles, "during": during, "batch": batch, "calls": calls,
               "expected": expected, "layers_per_call": len(expected), "tracer": tracer, "trace": trace,
               "outputs": outputs, "untraced": untraced}


def test_tf_every_keras_layer_call_is_accounted_for(tf_run):
    """Each Keras layer call that runs ops has its span, in call order, named after its PyTorch module; a call
    whose ops the graph optimizer fused into a later op (oneDNN's Pad+Conv2D) is a zero-length span saying so."""
    expected = tf_run["expected"]
    assert expected[0][1] == "ZeroPadding2D" and expected[-1] == ("_fc", "Dense")
    found = tf_run["tracer"].metadata["tensorflow.profiler"]
    assert found["runs"] == 2 and found["clipped_spans"] == 0
    per_call = layers_by_predict(tf_run["trace"].spans)
    assert len(per_call) == 2
    for predict, layers in per_call:
        assert set(layers["level"]) == {"FRAMEWORK"}
        assert [attrs_dict(a)["keras_layer"] for a in layers["attrs"]] == [name for name, _ in expected]
        assert list(layers["name"]) == [keras_layer_to_torch_name(name) for name, _ in expected]
        assert list(layers["layer_type"]) == [cls for _, cls in expected]
        assert list(layers["layer_index"]) == list(range(len(expected)))
        assert_nested(layers, predict.start_ns, predict.end_ns)
        fused = [attrs_dict(a) for a in layers["attrs"] if attrs_dict(a).get("fused")]
        assert sorted(a["keras_call"] for a in fused) == sorted(found["fused_layers"])
        assert all(a["ops"] == 0 for a in fused)
        assert (layers.loc[[bool(attrs_dict(a).get("fused")) for a in layers["attrs"]], "duration_ns"] == 0).all()
    for out in tf_run["outputs"]:
        np.testing.assert_allclose(out, tf_run["untraced"], rtol=1e-5, atol=1e-5)


def test_tf_layer_names_map_to_pytorch_modules(tf_run, torch_modules):
    names = set(tf_run["trace"].spans.query("kind == 'layer'")["name"])
    assert names <= torch_modules
    assert {f"_blocks.{i}._depthwise_conv" for i in range(16)} | {"_conv_stem", "_fc"} <= names


def test_tf_ops_nest_in_their_layers_under_standard_names(tf_run):
    spans = tf_run["trace"].spans
    ops = spans[spans["kind"] == "op"]
    assert set(ops["level"]) == {"ML_LIBRARY"} and not ops["name"].str.startswith("_").any()
    by_id = spans.set_index("span_id")
    for predict, layers in layers_by_predict(spans):
        mine = ops[ops["parent_id"].isin(set(layers["span_id"]) | {predict.span_id})]
        assert_nested(mine, predict.start_ns, predict.end_ns)
        in_layers = mine[mine["parent_id"] != predict.span_id]
        ran = layers[[not attrs_dict(a).get("fused") for a in layers["attrs"]]]
        assert set(in_layers["parent_id"]) == set(ran["span_id"])  # every layer that ran holds its ops
        types = {}
        for parent, group in in_layers.groupby("parent_id"):
            types.setdefault(by_id.at[parent, "layer_type"], set()).update(group["name"])
        assert "Conv2D" in types["Conv2D"] and "DepthwiseConv2dNative" in types["DepthwiseConv2D"]


def test_tf_levels_and_profile_folder(tf_run):
    predictor, batch = tf_run["predictor"], tf_run["batch"]
    assert [n[:16] for n in tf_run["during"]] == ["mlms_tf_profile_"] and not list(tf_run["profiles"].iterdir())
    levels = predictor.tracing_levels()
    assert levels["FRAMEWORK"].startswith("one span per Keras layer call")
    assert levels["ML_LIBRARY"].startswith("one span per executed TF op")
    assert levels["SYSTEM_LIBRARY"].startswith("not supported")
    # FRAMEWORK: layers, no ops; MODEL: the predict span only
    _, trace, _, _ = run_traced(predictor, batch, L.FRAMEWORK, calls=1)
    kinds = trace.spans["kind"].value_counts()
    assert kinds.get("layer", 0) == tf_run["layers_per_call"] and kinds.get("op", 0) == 0
    _, trace, _, _ = run_traced(predictor, batch, L.MODEL, calls=1)
    assert list(trace.spans["name"]) == ["predict"]


# ------------------------------------------------------------------------------------------------ both

@pytest.mark.parametrize("run", ["ort_run", "tf_run"])
def test_predictors_used_inside_mlms_trace_give_their_layers(run, request):
    import mlms_nb

    r = request.getfixturevalue(run)
    predictor = r["predictor"]
    with mlms_nb.trace("FRAMEWORK") as session:
        predictor.predict(r["batch"])
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


def test_ort_nodes_are_named_for_the_model_layers_they_stand_for():
    """A fused node takes the name of the first node it fused and lists the fused ops as its type; a node under the
    root is named by its own name, never blank; a node ONNX Runtime inserted says so."""
    from mlms_nb.frameworks.onnxruntime.profile import node_layer

    covers = {"/act/Clip_output_0_nchwc": ["/dw/Conv", "/act/Clip"], "/Add": ["/Add"], "ReorderOutput": [],
              "/ln/LayerNorm": [f"/ln/Op_{i}" for i in range(5)]}
    op_types = {"/dw/Conv": "Conv", "/act/Clip": "Clip", "/Add": "Add", **{f"/ln/Op_{i}": "Mul" for i in range(5)}}
    assert node_layer("/act/Clip_output_0_nchwc", "Conv", covers, op_types) == (
        "dw", "Conv+Clip", {"fused_ops": ["Conv", "Clip"]})
    assert node_layer("/Add", "Add", covers, op_types) == ("Add", "Add", {})
    assert node_layer("ReorderOutput", "ReorderOutput", covers, op_types) == (
        "ReorderOutput (inserted by onnxruntime)", "ReorderOutput", {"inserted": True})
    assert node_layer("/ln/LayerNorm", "LayerNormalization", covers, op_types)[1] == "LayerNormalization (5 ops fused)"
    assert node_layer("/Flatten", "Flatten") == ("Flatten", "Flatten", {})  # no graph map: still never blank


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
