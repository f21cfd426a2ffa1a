"""ONNX Runtime's graph optimisation level: settable (options, manifest), recorded on the trace and the evaluation;
with it off a FRAMEWORK trace has one span per non-constant node; with it on every span says which original nodes
it stands for, so the costs (and the roofline) cover every Conv/Gemm/MatMul of the original graph."""
from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("onnxruntime")
torch = pytest.importorskip("torch")
onnx = pytest.importorskip("onnx")

from mlms_nb.errors import ManifestError, MlmsError  # noqa: E402
from mlms_nb.frameworks import PredictorOptions, open_predictor  # noqa: E402
from mlms_nb.frameworks.onnxruntime.costs import onnx_node_costs  # noqa: E402
from mlms_nb.frameworks.onnxruntime.graph_map import (  # noqa: E402
    check_covered, check_level, fold_costs_onto_trace, non_constant_nodes)
from mlms_nb.manifest import find_manifest, parse_manifest  # noqa: E402
from mlms_nb.schema.levels import TraceLevel  # noqa: E402
from mlms_nb.tracing.tracer import Tracer  # noqa: E402

MATMULS = ("Conv", "Gemm", "MatMul")


class Foreign(torch.nn.Module):
    """A graph no converter of ours wrote: Constant nodes, a Shape/Gather reshape chain, Conv+BN+ReLU, MatMul, Gemm."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)
        self.conv2 = torch.nn.Conv2d(8, 8, 3, padding=1, groups=8)
        self.proj = torch.nn.Parameter(torch.randn(8, 16))
        self.fc = torch.nn.Linear(16, 5)

    def forward(self, x):
        y = torch.relu(self.bn(self.conv(x)))
        y = torch.clamp(self.conv2(y), 0, 6) + y
        y = y.mean(dim=(2, 3))
        return self.fc(torch.relu(y.reshape(x.shape[0], -1) @ self.proj))


@pytest.fixture(scope="module")
def foreign_onnx(tmp_path_factory):
    torch.manual_seed(0)
    model = Foreign().eval()
    path = tmp_path_factory.mktemp("foreign") / "foreign.onnx"
    with torch.no_grad():
        torch.onnx.export(model, (torch.randn(1, 3, 16, 16),), str(path), dynamo=False, opset_version=17,
                          input_names=["x"], output_names=["y"], dynamic_axes={"x": {0: "n"}, "y": {0: "n"}},
                          do_constant_folding=False)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MLMS_ALLOW_PATHS", str(path.parent))  # a manifest's files come from allowed folders only
        yield path


def _manifest(path, level=None):
    framework = {"name": "onnxruntime"}
    if level:
        framework["options"] = {"graph_optimization_level": level}
    return parse_manifest({
        "name": "foreign", "version": "1.0.0", "framework": framework,
        "inputs": [{"type": "tensor", "dimensions": [3, 16, 16]}],
        "outputs": [{"type": "tensor"}], "model": {"graph_path": str(path)}})


def _trace(predictor, batch, calls=3):
    tracer = Tracer(TraceLevel.FRAMEWORK)
    predictor.start_tracing(tracer)
    for _ in range(calls):
        predictor.predict(batch)
    predictor.stop_tracing()
    return tracer.trace()


def _layers_per_call(trace):
    spans = trace.spans
    layers = spans[spans["kind"] == "layer"]
    return layers.groupby("parent_id").size().tolist(), layers


def test_levels_parse_and_bad_levels_are_sentences(foreign_onnx):
    assert [check_level(v) for v in ("Disabled", "ORT_ENABLE_BASIC", "extended", "all")] == [
        "disabled", "basic", "extended", "all"]
    with pytest.raises(MlmsError, match="not an ONNX Runtime graph optimisation level; expected one of disabled"):
        check_level("max")
    with pytest.raises(ManifestError, match="graph_optimization_level"):
        _manifest(foreign_onnx, "max")
    with pytest.raises(ManifestError, match="is an ONNX Runtime setting"):
        parse_manifest({**_manifest(foreign_onnx).to_dict(), "framework": {
            "name": "torch", "options": {"graph_optimization_level": "basic"}}})


def test_disabled_gives_one_span_per_non_constant_node(foreign_onnx):
    graph = onnx.load(str(foreign_onnx)).graph
    assert any(n.op_type == "Constant" for n in graph.node) and any(n.op_type == "Shape" for n in graph.node)
    x = np.random.default_rng(0).standard_normal((2, 3, 16, 16)).astype(np.float32)
    with open_predictor(_manifest(foreign_onnx, "disabled")) as predictor:
        assert predictor.info().details["graph_optimization_level"] == "disabled"
        trace = _trace(predictor, x)
    per_call, layers = _layers_per_call(trace)
    assert per_call == [non_constant_nodes(foreign_onnx)] * 3
    meta = trace.metadata["onnxruntime.graph"]
    assert meta["graph_optimization_level"] == "disabled" and meta["unmapped_nodes"] == 0
    assert meta["optimized_nodes"] == meta["original_nodes"] == per_call[0]


@pytest.mark.parametrize("level", ["basic", "extended", "all"])
def test_optimised_nodes_map_back_to_every_original_node(foreign_onnx, level):
    x = np.random.default_rng(1).standard_normal((2, 3, 16, 16)).astype(np.float32)
    with open_predictor(_manifest(foreign_onnx), options=PredictorOptions(graph_optimization_level=level)) as p:
        expected = p.predict(x)
        trace = _trace(p, x, calls=2)
    with open_predictor(_manifest(foreign_onnx, "disabled")) as p:
        np.testing.assert_allclose(p.predict(x), expected, rtol=1e-4, atol=1e-5)
    per_call, layers = _layers_per_call(trace)
    meta = trace.metadata["onnxruntime.graph"]
    assert meta["graph_optimization_level"] == level
    assert per_call[0] == meta["optimized_nodes"] < non_constant_nodes(foreign_onnx)
    assert meta["unmapped_nodes"] == 0 and meta["unmapped"] == []
    assert meta["mapped_original_nodes"] == meta["original_nodes"]
    if level != "basic":
        assert meta["fused_nodes"] > 0
    costs = onnx_node_costs(foreign_onnx, {"x": [2, 3, 16, 16]})
    folded = fold_costs_onto_trace(costs, trace.spans, 2)
    assert len(folded) == per_call[0]
    assert check_covered(costs, folded, MATMULS) == []
    assert sorted(costs.loc[costs["op_type"].isin(MATMULS), "op_type"]) == ["Conv", "Conv", "Gemm", "MatMul"]
    assert folded["flops"].sum() == pytest.approx(costs["flops"].sum())
    assert folded["flops_matmul_conv"].sum() == pytest.approx(costs["flops_matmul_conv"].sum())
    assert folded.attrs["unmapped"] == []
    first = layers[layers["parent_id"] == layers["parent_id"].iloc[0]]
    originals = [n for a in first["attrs"] for n in json.loads(a)["original_nodes"]]
    assert len(originals) == len(set(originals))  # each original node stands under one traced node


def test_builtin_artifact_levels(models_home):
    manifest = find_manifest("efficientnet_lite0", framework="onnxruntime")
    x = np.zeros((1, 3, 224, 224), np.float32)
    with open_predictor(manifest, options=PredictorOptions(graph_optimization_level="disabled")) as p:
        per_call, _ = _layers_per_call(_trace(p, x, calls=2))
        assert per_call == [non_constant_nodes(p.artifact_path)] * 2
    with open_predictor(manifest) as p:  # ONNX Runtime's default: all (NCHWc layout, fusions)
        trace = _trace(p, x, calls=1)
        artifact = p.artifact_path
    meta = trace.metadata["onnxruntime.graph"]
    assert meta["graph_optimization_level"] == "all" and meta["unmapped_nodes"] == 0
    assert meta["optimized_nodes"] < meta["original_nodes"] and meta["inserted_nodes"] >= 1  # ReorderOutput
    costs = onnx_node_costs(artifact, {"input": [1, 3, 224, 224]})
    folded = fold_costs_onto_trace(costs, trace.spans, 1)
    assert check_covered(costs, folded, MATMULS) == []
    assert (costs["op_type"] == "Conv").sum() == 49
    assert folded["flops_matmul_conv"].sum() == pytest.approx(costs["flops_matmul_conv"].sum())


def test_evaluation_records_the_level_and_the_roofline_covers_fused_nodes(models_home):
    import mlms_nb

    ev = mlms_nb.evaluate("efficientnet_lite0", framework="onnxruntime", dataset="synthetic:2",
                          graph_optimization_level="extended", trace_level="FRAMEWORK", trace_repeats=2,
                          min_repeats=3, min_time_s=0.05, warmup=1, history=False, progress=False)
    assert ev.options["graph_optimization_level"] == "extended"
    assert ev.options["predictors"]["onnxruntime"]["details"]["graph_optimization_level"] == "extended"
    meta = ev.traces["onnxruntime"].metadata["onnxruntime.graph"]
    assert meta["graph_optimization_level"] == "extended" and meta["fused_nodes"] > 0
    roof = mlms_nb.roofline(ev, per="layer").table
    costs = onnx_node_costs(ev.options["predictors"]["onnxruntime"]["artifact"], {"input": [1, 3, 224, 224]})
    assert roof["flops"].sum() == pytest.approx(costs["flops"].sum())  # fused Clip/Pad FLOPs are not lost
    assert len(roof) == meta["optimized_nodes"]
