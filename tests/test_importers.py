"""The profile importers on recorded profiles (tests/data/, written by scripts/record_fixtures.py): a Kineto trace,
an ONNX Runtime session profile and a TensorFlow XSpace, imported as the predictors import them. No framework runs
here, so these check the importers' logic in milliseconds on any framework build; expected values come from the
models as they were recorded (the ``*.expected.json`` beside each file)."""
from __future__ import annotations

import json

import numpy as np
import pytest

import mlms_nb
from mlms_nb.frameworks.onnxruntime.profile import add_ort_profile, read_ort_profile
from mlms_nb.frameworks.tensorflow import xplane
from mlms_nb.naming import keras_layer_to_torch_name
from mlms_nb.schema.levels import TraceLevel as L
from mlms_nb.tracing import Tracer, attrs_dict
from tests.conftest import DATA


def expected(name: str) -> dict:
    return json.loads((DATA / f"{name}.expected.json").read_text())


def tracer_with_predict_calls(windows) -> tuple[Tracer, list[tuple]]:
    """A tracer holding one MODEL ``predict`` span per recorded window, and the windows re-pointed at them."""
    tracer = Tracer(L.ML_LIBRARY)
    out = []
    for w in windows:
        span = tracer.add_span("predict", L.MODEL, "model", w[0], w[1], 0, batch=1)
        out.append((w[0], w[1], span, *w[3:]))
    return tracer, out


def by_predict(spans, kind="layer"):
    """Per predict span (in time order): its children of ``kind``, in layer_index order."""
    predicts = spans[spans["name"] == "predict"].sort_values("start_ns")
    children = spans[spans["kind"] == kind]
    return [(p, children[children["parent_id"] == p.span_id].sort_values("layer_index")) for p in predicts.itertuples()]


def assert_inside(children, start, end):
    assert (children["start_ns"] >= start).all() and (children["end_ns"] <= end).all()
    assert (children["end_ns"] >= children["start_ns"]).all()


# ------------------------------------------------------------------------------------------------ Kineto

def test_kineto_trace_imports_mapped_and_nested():
    want = expected("kineto_small")
    trace = mlms_nb.load_trace(DATA / "kineto_small.json")
    s = trace.spans
    assert trace.metadata["source"] == "kineto" and trace.metadata["clock"]["wall_offset_ns"] > 0
    ops = s[s["kind"] == "op"]
    assert len(ops) and (ops["level"] == "ML_LIBRARY").all()
    predict = s[s["name"] == "predict"]
    assert len(predict) == want["calls"] and set(predict["kind"]) == {"annotation"}
    ids = dict(zip(s["span_id"], s["name"]))
    conv = s[s["name"] == "aten::conv2d"].sort_values("start_ns")
    assert len(conv) == want["calls"] * want["conv2d_modules"]
    assert (conv["parent_id"].map(ids) == "predict").all()
    assert (s.loc[s["name"] == "aten::convolution", "parent_id"].map(ids) == "aten::conv2d").all()
    n, c, h, w = want["input_shape"]
    first = want["conv2d_channels"][0]
    assert conv["shape"].iloc[0].startswith(f"[[{n},{c},{h},{w}],[{first},{c},3,3],[{first}]")
    assert set(conv["external_id"].dropna()) and "External id" not in conv["attrs"].iloc[0]
    merged = s.merge(s[["span_id", "start_ns", "end_ns"]], left_on="parent_id", right_on="span_id", suffixes=("", "_p"))
    assert ((merged["start_ns"] >= merged["start_ns_p"]) & (merged["end_ns"] <= merged["end_ns_p"])).all()
    assert {"memory.allocated", "memory.reserved"} <= set(trace.counters["metric"]) and (conv["memory"] > 0).all()


# ------------------------------------------------------------------------------------------------ ONNX Runtime

@pytest.fixture(scope="module")
def ort_profile():
    want = expected("ort_lite0")
    tracer, windows = tracer_with_predict_calls(want["windows"])
    found = add_ort_profile(tracer, DATA / "ort_lite0.json", want["profile_start_ns"], want["wall_offset_ns"],
                            windows, remove=False)
    return want, found, tracer.trace().spans


def test_ort_profile_runs_hold_the_optimized_graph_nodes_in_order():
    want = expected("ort_lite0")
    runs = read_ort_profile(DATA / "ort_lite0.json")
    assert len(runs) == len(want["windows"])
    for run in runs:
        assert [(n.node, n.op_type) for n in run.nodes] == [tuple(n) for n in want["nodes"]]
        assert all(run.start_ns <= n.start_ns <= n.end_ns <= run.end_ns for n in run.nodes)


def test_ort_nodes_become_layer_spans_inside_their_call(ort_profile):
    want, found, spans = ort_profile
    nodes = want["nodes"]
    assert found["runs"] == found["matched_runs"] == len(want["windows"])
    assert found["layer_spans"] == len(want["windows"]) * len(nodes) and found["clipped_spans"] == 0
    assert found["max_shift_ns"] < 5_000_000  # the clock mapping places runs; the shift only corrects it
    per_call = by_predict(spans)
    assert len(per_call) == len(want["windows"])
    for predict, layers in per_call:
        assert [attrs_dict(a)["onnx_node"] for a in layers["attrs"]] == [name for name, _ in nodes]
        assert list(layers["layer_type"]) == [op for _, op in nodes]
        assert list(layers["layer_index"]) == list(range(len(nodes)))
        assert_inside(layers, predict.start_ns, predict.end_ns)
        assert (layers["start_ns"].to_numpy()[1:] >= layers["end_ns"].to_numpy()[:-1]).all()  # one after another
        assert layers["duration_ns"].sum() > 0.5 * (predict.end_ns - predict.start_ns)


def test_ort_layer_spans_are_named_after_pytorch_modules(ort_profile):
    want, _, spans = ort_profile
    layers = spans[spans["kind"] == "layer"]
    scoped = layers[[attrs_dict(a)["onnx_node"].startswith("/") for a in layers["attrs"]]]
    assert len(scoped) > 0.9 * len(layers)
    assert {f"_blocks.{i}._project_conv" for i in range(16)} | {"_fc", "_avg_pooling"} <= set(scoped["name"])
    assert not scoped["name"].str.contains("/").any()
    unscoped = layers.drop(scoped.index)
    assert all(name == attrs_dict(a)["onnx_node"] for name, a in zip(unscoped["name"], unscoped["attrs"]))
    first = layers.sort_values("start_ns").iloc[0]
    a = attrs_dict(first["attrs"])
    assert first["shape"].startswith("[[1,3,224,224],") and len(a["out_shape"]) == 1
    assert first["bytes"] == 4 * 3 * 224 * 224 + a["param_bytes"] + a["output_bytes"]
    assert first["memory"] == a["output_bytes"] and a["provider"] == "CPUExecutionProvider"


def test_ort_profile_is_kept_unless_asked_to_remove(tmp_path):
    copy = tmp_path / "profile.json"
    copy.write_bytes((DATA / "ort_lite0.json").read_bytes())
    add_ort_profile(Tracer(L.FRAMEWORK), copy, 0, 0, [])
    assert not copy.exists()


# ------------------------------------------------------------------------------------------------ TensorFlow

@pytest.fixture(scope="module")
def tf_profile():
    want = expected("tf_lite0")
    graph = xplane.ModelGraph.from_dict(want["graph"])
    steps = {int(step): w for step, w in want["windows"].items()}
    tracer, windows = tracer_with_predict_calls([steps[k] for k in sorted(steps)])
    events = xplane.host_events(xplane.load_xspace(DATA / "tf_lite0.xplane.pb"))
    found = xplane.add_tf_profile(tracer, events, want["wall_offset_ns"], dict(zip(sorted(steps), windows)), graph)
    return want, graph, events, found, tracer.trace().spans


def test_tf_every_keras_layer_call_is_accounted_for(tf_profile):
    want, graph, events, found, spans = tf_profile
    calls = [(name, cls) for name, cls, identity in want["keras_calls"] if not identity]  # Dropout: no op
    assert len(calls) == len(graph.calls) and [c[0] for c in calls][-1] == graph.calls[-1].split("/")[1][:-2]
    per_call = by_predict(spans)
    assert len(per_call) == len(want["windows"]) == found["runs"]
    for predict, layers in per_call:
        assert [attrs_dict(a)["keras_layer"] for a in layers["attrs"]] == [name for name, _ in calls]
        assert list(layers["name"]) == [keras_layer_to_torch_name(name) for name, _ in calls]
        assert list(layers["layer_type"]) == [cls for _, cls in calls]
        assert list(layers["layer_index"]) == list(range(len(calls)))
        assert_inside(layers, predict.start_ns, predict.end_ns)
        assert layers["start_ns"].is_monotonic_increasing


def test_tf_layers_fused_into_a_consumer_say_so(tf_profile):
    """Layer calls whose ops the optimizer fused into a later call's op (on the recording host, oneDNN's
    _MklNativePadWithConv2D: the stem's ZeroPadding2D into its Conv2D) are zero-length spans marked fused."""
    _, graph, events, found, spans = tf_profile
    ran = {found[1] for found in (xplane.scope_layer(n, set(graph.layer_types), graph.model_name)
                                  for n, t in zip(events.name, events.op_type) if t) if found}
    silent = [scope for scope in graph.calls if scope not in ran]
    assert list(found["fused_layers"]) == silent
    if silent:
        assert "fused" in found["note"]
    layers = spans[spans["kind"] == "layer"]
    fused = layers[[bool(attrs_dict(a).get("fused")) for a in layers["attrs"]]]
    assert len(fused) == len(silent) * found["runs"]
    by_scope = {(attrs_dict(a)["keras_call"], p): row for a, p, row in
                zip(layers["attrs"], layers["parent_id"], layers.itertuples())}
    for row in fused.itertuples():
        a = attrs_dict(row.attrs)
        assert row.duration_ns == 0 and a["ops"] == 0
        into = by_scope[(found["fused_layers"][a["keras_call"]], row.parent_id)]
        assert a["fused_into"] == into.name and row.start_ns == into.start_ns and row.layer_index == into.layer_index - 1


def test_tf_ops_nest_in_their_layers_with_standard_op_names(tf_profile):
    _, _, events, found, spans = tf_profile
    ops = spans[spans["kind"] == "op"]
    assert len(ops) == found["op_spans"] and set(ops["level"]) == {"ML_LIBRARY"}
    assert not ops["name"].str.startswith("_").any()  # _MklNative..., _Fused... are mapped to the standard op
    raw = {t for t in events.op_type if t}
    mapped = {xplane.standard_op_type(t): t for t in raw}
    renamed = ops[[("tf_op_type" in attrs_dict(a)) for a in ops["attrs"]]]
    assert all(attrs_dict(a)["tf_op_type"] in raw for a in renamed["attrs"])
    by_id = spans.set_index("span_id")
    layers = spans[spans["kind"] == "layer"]
    for predict, own_layers in by_predict(spans):
        mine = ops[ops["parent_id"].isin(set(own_layers["span_id"]) | {predict.span_id})]
        assert_inside(mine, predict.start_ns, predict.end_ns)
    in_layers = ops[ops["parent_id"].isin(set(layers["span_id"]))]
    for op in in_layers.itertuples():
        layer = by_id.loc[op.parent_id]
        assert layer["start_ns"] <= op.start_ns and op.end_ns <= layer["end_ns"]
        assert attrs_dict(op.attrs)["keras_layer"] == attrs_dict(layer["attrs"])["keras_layer"]
    kinds = {}
    for parent, group in in_layers.groupby("parent_id"):
        kinds.setdefault(by_id.at[parent, "layer_type"], set()).update(group["name"])
    assert "Conv2D" in kinds["Conv2D"] and "DepthwiseConv2dNative" in kinds["DepthwiseConv2D"]
    assert "MatMul" in kinds["Dense"] and "Conv2D" in mapped
    outside = [attrs_dict(a) for a in ops.loc[~ops["parent_id"].isin(set(layers["span_id"])), "attrs"]]
    assert outside and all(a.get("weights_only") or "keras_layer" not in a for a in outside)
    assert any(a["tf_op"].endswith("batchnorm/Rsqrt") for a in outside if a.get("weights_only"))


def test_tf_op_types_map_to_the_standard_op():
    cases = {"_MklNativeConv2D": "Conv2D", "_MklNativePadWithConv2D": "Conv2D", "_MklConv2D": "Conv2D",
             "_MklNativeDepthwiseConv2dNative": "DepthwiseConv2dNative", "_MklNativeFusedMatMul": "MatMul",
             "_FusedConv2D": "Conv2D", "_FusedMatMul": "MatMul", "_MklNativeFusedConv2D": "Conv2D",
             "FusedBatchNormV3": "FusedBatchNormV3", "_MklFusedBatchNormV3": "FusedBatchNormV3", "Relu6": "Relu6",
             "AddV2": "AddV2", "_Recv": "_Recv"}
    assert {t: xplane.standard_op_type(t) for t in cases} == cases


def test_fused_calls_follow_consumers_to_the_first_call_that_ran():
    graph = xplane.ModelGraph(calls=["m/pad", "m/conv", "m/bn", "m/relu", "m/tail"],
                              consumers={"m/pad": ["m/conv"], "m/conv": ["m/bn"], "m/bn": ["m/relu"],
                                         "m/relu": ["m/tail"]})
    assert xplane.fused_calls(graph, {"m/conv", "m/bn", "m/relu", "m/tail"}) == {"m/pad": "m/conv"}
    assert xplane.fused_calls(graph, {"m/relu", "m/tail"}) == {"m/pad": "m/relu", "m/conv": "m/relu",
                                                                "m/bn": "m/relu"}
    assert xplane.fused_calls(graph, {"m/pad", "m/conv", "m/bn", "m/relu"}) == {"m/tail": None}


def test_xspace_descriptor_matches_the_one_tensorflow_ships():
    xplane_pb2 = pytest.importorskip("tensorflow.tsl.profiler.protobuf.xplane_pb2")
    ours = xplane.load_xspace(DATA / "tf_lite0.xplane.pb").DESCRIPTOR
    theirs = xplane_pb2.XSpace.DESCRIPTOR

    def fields(message, seen=None):
        seen = set() if seen is None else seen
        if message.name in seen:
            return {}
        seen.add(message.name)
        out = {message.name: sorted((f.name, f.number, f.type, f.is_repeated, f.containing_oneof.name
                                     if f.containing_oneof else "") for f in message.fields)}
        for f in message.fields:
            if f.message_type is not None:
                out.update(fields(f.message_type, seen))
        return out

    assert fields(ours) == fields(theirs)
    space = xplane_pb2.XSpace()
    space.ParseFromString((DATA / "tf_lite0.xplane.pb").read_bytes())
    assert xplane.load_xspace(DATA / "tf_lite0.xplane.pb").SerializeToString(deterministic=True) == \
        space.SerializeToString(deterministic=True)


def test_bad_xplane_is_one_sentence(tmp_path):
    from mlms_nb.errors import TraceFormatError

    bad = tmp_path / "bad.xplane.pb"
    bad.write_bytes(b"\xff\xff not a protobuf")
    with pytest.raises(TraceFormatError, match="is not a TensorFlow XSpace file"):
        xplane.load_xspace(bad)
    with pytest.raises(TraceFormatError, match="no .xplane.pb"):
        xplane.find_xplane(tmp_path)
    np.testing.assert_array_equal(xplane.host_events(xplane.load_xspace(DATA / "tf_lite0.xplane.pb")).step[:0], [])
