"""Ceilings that hold (issue 20, item 2): each framework's roofline sits under ceilings measured with that
framework's own best kernels, every point above its roof is flagged with its likely cause (table, plot, report),
and ``roofline()`` works on a manifest with dynamic sizes and on a run evaluated by manifest path."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import yaml

pytest.importorskip("torch")

import mlms_nb  # noqa: E402
from mlms_nb import api  # noqa: E402
from mlms_nb.analyses import roofline  # noqa: E402
from mlms_nb.errors import MlmsError  # noqa: E402
from mlms_nb.store.history import HistoryStore  # noqa: E402
from mlms_nb.theory import ceilings as ceilings_module  # noqa: E402

PEAK, BW = 1e11, 1e10  # ridge at 10 FLOP/byte


def _no_silent_point_above_roof(table: pd.DataFrame) -> None:
    """Every point over 100% of attainable says so, with why; every 'above roof' names a likely cause."""
    over = table[table["pct_of_attainable"] > 100]
    assert (over["roof_check"] != "below roof").all(), over[["layer_name", "pct_of_attainable"]]
    assert over["roof_check_why"].str.len().gt(0).all()
    above = table[table["roof_check"] == "above roof"]
    # "machine busy" where the ceilings were measured on a busy machine (the roof is then too low)
    assert above["roof_check_why"].str.startswith(("measurement problem", "machine busy")).all()
    assert above["roof_check_why"].str.contains("likely: ").all()
    under = table[table["pct_of_attainable"] <= 100]
    assert (under["roof_check"] == "below roof").all() and (under["roof_check_why"] == "").all()


# ------------------------------------------------------------------------------------------ the check itself

def _frames():
    costs = pd.DataFrame({"layer_index": [0, 1, 2, 3], "layer_name": ["conv", "fused", "tiny", "slow"],
                          "layer_type": ["Conv2d"] * 4,
                          "flops": [2e9, 2e8, 1e4, 1e9], "bytes": [1e7, 1e8, 1e6, 1e7]})
    # conv: 200 FLOP/byte, 2e9 FLOPs at 19 ms = 105 GFLOP/s, 5% over a 100 GFLOP/s roof whose IQR is 10 GFLOP/s
    # fused: 2 FLOP/byte (roof 20 GFLOP/s) at 2 ms = 100 GFLOP/s, 5x its roof, far beyond its spread
    # tiny: 0.01 FLOP/byte (roof 100 MFLOP/s) in 10 us = 1 GFLOP/s: 10x, a span at the tracer's resolution
    # slow: 100 FLOP/byte at 100 ms = 10 GFLOP/s: below
    latency = pd.DataFrame({"framework": "onnxruntime", "batch_size": 1, "layer_index": [0, 1, 2, 3],
                            "name": ["conv", "fused", "tiny", "slow"], "median_ms": [19.0, 2.0, 0.01, 100.0],
                            "p25_ms": [18.5, 1.9, 0.009, 99.0], "p75_ms": [19.5, 2.1, 0.011, 101.0]})
    return costs, latency


def test_points_above_their_roof_are_flagged_with_their_likely_cause():
    costs, latency = _frames()
    ctx = roofline.RoofContext(peak_iqr=1e10, bandwidth_iqr=0.0, cache_bytes=2**20,
                               hints={"fused": "fused work timed under one node: it stands for 3 original nodes"})
    table = roofline.compute(costs, latency, PEAK, BW, roof=ctx).set_index("layer_name")
    assert table.loc["conv", "pct_of_attainable"] == pytest.approx(100 * 2e9 / 19e-3 / PEAK)
    assert table.loc["conv", "roof_check"] == "at roof, within spread"
    assert table.loc["fused", "roof_check"] == "above roof"
    assert "fused work timed under one node" in table.loc["fused", "roof_check_why"]
    assert table.loc["tiny", "roof_check"] == "above roof"
    assert "at the tracer's resolution" in table.loc["tiny", "roof_check_why"]
    assert "last-level cache" in table.loc["tiny", "roof_check_why"]  # 1 MB moved, under the 1 MiB cache
    assert table.loc["slow", "roof_check"] == "below roof"
    assert (table["ceiling_peak_flops_per_s"] == PEAK).all() and (table["ceiling_bandwidth_bytes_per_s"] == BW).all()
    _no_silent_point_above_roof(table.reset_index())
    assert "2 point(s) above their roof" in table.attrs["note"]

    # threads that differ between the ceilings and the run are a cause of their own
    other = roofline.compute(costs, latency, PEAK, BW, roof=roofline.RoofContext(ceiling_threads=1, run_threads=8))
    assert "measured with 1 threads, the run used 8" in other.set_index("layer_name").loc["fused", "roof_check_why"]


def test_on_cuda_tf32_math_is_named_as_a_cause():
    """A GPU run (found on an H200): torch's float32 convolutions may run in TF32, above a float32 roof measured
    with TF32 off, so that is named as a cause where torch allows it, and only there."""
    import torch

    from mlms_nb.evaluation import roofline_run

    before = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32  # torch's flags, not attributes
    try:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = True, False
        notes = roofline_run._tensor_math_notes("torch", "cuda", "float32")
        assert len(notes) == 1 and "TF32" in notes[0] and "convolutions" in notes[0] and "matrix" not in notes[0]
        assert roofline_run._tensor_math_notes("torch", "cpu", "float32") == ()
        assert roofline_run._tensor_math_notes("onnxruntime", "cuda", "float32") == ()
        torch.backends.cudnn.allow_tf32 = False
        assert roofline_run._tensor_math_notes("torch", "cuda", "float32") == ()
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = before

    costs, latency = _frames()
    table = roofline.compute(costs, latency, PEAK, BW, roof=roofline.RoofContext(run_notes=notes)).set_index(
        "layer_name")
    assert notes[0] in table.loc["fused", "roof_check_why"] and table.loc["slow", "roof_check_why"] == ""


def test_the_plot_draws_points_above_their_roof_apart_with_a_legend_entry():
    pytest.importorskip("matplotlib")
    costs, latency = _frames()
    fig = roofline.plot(roofline.compute(costs, latency, PEAK, BW, roof=roofline.RoofContext(peak_iqr=1e10)),
                        "matplotlib")
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert any(label.startswith("above roof: measurement problem") and label.endswith("(2)") for label in labels)
    assert any(label.startswith("at roof, within spread") for label in labels)


# ------------------------------------------------------------------------------------------ ceilings

@pytest.fixture
def ceilings_url(tmp_path):
    ceilings_module._memo.clear()
    yield f"sqlite:///{tmp_path / 'history.sqlite'}"
    ceilings_module._memo.clear()


def test_onnxruntime_ceilings_use_its_own_gemm_conv_and_copy_and_are_cached_per_threads(ceilings_url):
    pytest.importorskip("onnxruntime")
    first = api.machine_ceilings(url=ceilings_url, framework="onnxruntime", threads=1)
    assert first.framework == "onnxruntime" and first.threads == 1 and first.dtype == "float32"
    kernels = {k["kernel"]: k for k in first.kernels}
    assert set(kernels) == {"gemm", "conv", "copy"}
    assert first.peak_flops_per_s == max(kernels["gemm"]["best"], kernels["conv"]["best"])
    assert first.bandwidth_bytes_per_s == kernels["copy"]["best"]
    assert all(k["repetitions"] >= 3 and k["iqr"] >= 0 and k["best"] >= k["median"] > 0 for k in first.kernels)
    assert "Conv session" in first.method and "1 intra-op threads" in first.method
    frame = first.to_frame()
    assert {"gemm_flops_per_s", "conv_flops_per_s", "copy_bytes_per_s"} <= set(frame["metric"])
    assert (frame["framework"] == "onnxruntime").all()

    ceilings_module._memo.clear()  # a new process: the history store gives it back, unmeasured
    again = api.machine_ceilings(url=ceilings_url, framework="onnxruntime", threads=1)
    if first.busy:  # measured while other programs took the CPU (its roof too low): measured again, not kept
        assert again.measured_at > first.measured_at and "machine was busy" in first.note
    else:
        assert again == first and again.device == "cpu"
        # the same for a stored measurement made on a busy machine: measured again at the next call
        busy = {**again.to_dict(), "device": again.cache_key, "measured_at": "2999-01-01T00:00:00+00:00",
                "busy": "load 9.3 on 2 cores, other processes used 170% CPU"}
        HistoryStore(ceilings_url).save_ceilings(busy)
        ceilings_module._memo.clear()
        assert api.machine_ceilings(url=ceilings_url, framework="onnxruntime",
                                    threads=1).measured_at < busy["measured_at"]
    assert set(HistoryStore(ceilings_url).ceilings()["metric"].str.rsplit("/", n=1).str[0]) == {
        "cpu/onnxruntime/1/float32"}
    with pytest.raises(MlmsError, match="dtype 'float16'"):
        api.machine_ceilings(url=ceilings_url, framework="onnxruntime", dtype="float16")


# ------------------------------------------------------------------------------------------ dynamic sizes, by path

def _write_dynamic_conv_net(folder):
    """A conv net with symbolic H and W (ONNX, random weights) and its manifest, and a .npz of one size."""
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)

    def weight(name, *shape):
        return numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32) * 0.1, name)

    nodes = [helper.make_node("Conv", ["image", "w1", "b1"], ["c1"], kernel_shape=[3, 3], pads=[1, 1, 1, 1],
                              name="conv1"),
             helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
             helper.make_node("Conv", ["r1", "w2"], ["c2"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], name="conv2"),
             helper.make_node("Relu", ["c2"], ["r2"], name="relu2"),
             helper.make_node("Conv", ["r2", "w3"], ["mask"], kernel_shape=[1, 1], name="head")]
    graph = helper.make_graph(
        nodes, "dynamic_conv", [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["N", 3, "H", "W"])],
        [helper.make_tensor_value_info("mask", TensorProto.FLOAT, ["N", 2, "H", "W"])],
        [weight("w1", 16, 3, 3, 3), weight("b1", 16), weight("w2", 16, 16, 3, 3), weight("w3", 2, 16, 1, 1)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.save(model, folder / "dynamic_conv.onnx")
    (folder / "dynamic_conv.yaml").write_text(yaml.safe_dump({
        "name": "dynamic_conv_of_the_tests", "framework": {"name": "onnxruntime"},
        "inputs": [{"name": "image", "type": "tensor", "dimensions": [3, "H", "W"]}],
        "outputs": [{"name": "mask", "type": "tensor"}], "model": {"graph_path": "dynamic_conv.onnx"}}))
    np.savez(folder / "inputs.npz", x=rng.standard_normal((4, 3, 48, 64)).astype(np.float32))
    return folder / "dynamic_conv.yaml", folder / "inputs.npz"


def test_dynamic_size_onnx_net_evaluated_by_path_has_a_roofline(tmp_path, mlms_home):
    pytest.importorskip("onnxruntime")
    from mlms_nb.frameworks.onnxruntime.costs import onnx_node_costs

    manifest, data = _write_dynamic_conv_net(tmp_path)
    ev = mlms_nb.evaluate(str(manifest), dataset=str(data), batch_sizes=[2], trace_level="FRAMEWORK",
                          trace_repeats=2, warmup=1, min_repeats=3, min_time_s=0, threads=1, progress=False)
    layers = ev.roofline(per="layer")
    table = layers.table
    expected = onnx_node_costs(tmp_path / "dynamic_conv.onnx", {"image": [2, 3, 48, 64]})
    assert table["flops"].sum() == pytest.approx(expected["flops"].sum())  # costed at the traced 48 x 64
    assert expected.loc[expected["node_name"] == "conv2", "flops"].iloc[0] >= 2 * 16 * 16 * 9 * 2 * 48 * 64
    assert (table["framework"] == "onnxruntime").all() and len(table) >= 1
    _no_silent_point_above_roof(table)
    assert "onnxruntime" in layers.title
    assert set(layers.extra["ceilings"]["framework"]) == {"onnxruntime"}
    model = ev.roofline(per="model").table
    assert model["flops"].iloc[0] == pytest.approx(expected["flops"].sum())
    _no_silent_point_above_roof(model.assign(layer_name="model"))

    # the same run from the history store, by id: its manifest and artifact come with it, not a catalog lookup
    again = mlms_nb.roofline(ev.history_ids[0], per="model").table
    assert again["flops"].iloc[0] == pytest.approx(expected["flops"].sum())


def test_dynamic_sizes_without_a_trace_say_how_to_get_their_shapes(tmp_path, mlms_home):
    pytest.importorskip("onnxruntime")
    manifest, data = _write_dynamic_conv_net(tmp_path)
    ev = mlms_nb.evaluate(str(manifest), dataset=str(data), batch_sizes=[2], warmup=1, min_repeats=3, min_time_s=0,
                          threads=1, progress=False, history=False)
    with pytest.raises(MlmsError, match="dynamic sizes.*trace_level FRAMEWORK"):
        ev.roofline(per="model")


# ------------------------------------------------------------------------------------------ EfficientNet-Lite0

@pytest.mark.slow
def test_efficientnet_lite0_in_three_frameworks_has_no_silent_point_above_its_roof(models_home):
    pytest.importorskip("onnxruntime")
    pytest.importorskip("tensorflow")
    ev = mlms_nb.evaluate("efficientnet_lite0", framework="torch,onnxruntime,tensorflow", dataset="synthetic:2",
                          trace_level="FRAMEWORK", trace_repeats=2, warmup=1, min_repeats=3, min_time_s=0,
                          progress=False, history=False)
    layers = ev.roofline(per="layer")
    table = layers.table
    assert set(table["framework"]) == {"torch", "onnxruntime", "tensorflow"}
    _no_silent_point_above_roof(table)
    ceilings = layers.extra["ceilings"]
    assert set(ceilings["framework"]) == {"torch", "onnxruntime", "tensorflow"}
    for fw, rows in table.groupby("framework"):  # each framework under its own roof
        own = ceilings[(ceilings["framework"] == fw) & (ceilings["metric"] == "peak_flops_per_s")]["value"].iloc[0]
        assert (rows["ceiling_peak_flops_per_s"] == own).all()
    how = dict(zip(ceilings["framework"] + "/" + ceilings["metric"], ceilings["how"]))
    assert "Conv session" in how["onnxruntime/conv_flops_per_s"]
    assert "tf.nn.conv2d" in how["tensorflow/conv_flops_per_s"]
    model = ev.roofline(per="model").table
    _no_silent_point_above_roof(model.assign(layer_name="model"))
    if (table["roof_check"] == "above roof").any():
        pytest.importorskip("matplotlib")
        fw = table.loc[table["roof_check"] == "above roof", "framework"].iloc[0]
        fig = layers.plot("matplotlib", framework=fw)
        labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
        assert any(label.startswith("above roof: measurement problem") for label in labels)
