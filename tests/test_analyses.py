"""analyses/: each analysis computes what it says from real traces and constructed inputs, and plots with units."""
from __future__ import annotations

import collections
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mlms_nb._bootstrap import RESAMPLES, bootstrap_medians
from mlms_nb.analyses import batch_scaling, compare, figure_page, kernels, layers, normalized, roofline
from mlms_nb.analyses._plot import AnalysisError
from mlms_nb.errors import MlmsError
from tests.helpers import axis_labels, titles
from mlms_nb.tracing import TraceLevel, Tracer

BACKENDS = ("bokeh", "matplotlib")
CATEGORICAL_AXES = {"layer", "layer type", "kernel", "framework, batch size"}  # bar rows: names, no unit
REPS = 3
BATCHES = (1, 2)


# ------------------------------------------------------------------------------------------ a real traced model

def layer_modules(model):
    """What counts as a layer, written down here independently of the tracer: modules without children, and
    modules owning parameters (the package's Conv2dStaticSamePadding owns its weight and a padding child), but not
    the modules that pass their input through (in this model: its Identity paddings, no work)."""
    return [(n, m) for n, m in model.named_modules()
            if n and (not list(m.children()) or list(m.parameters(recurse=False)))
            and type(m).__name__ != "Identity"]


@pytest.fixture(scope="module")
def evaluation(traced_evaluation, models_home):
    """A real traced evaluation: EfficientNet-Lite0 in PyTorch, layer spans at FRAMEWORK level (the PyTorch part of
    the session's traced evaluation)."""
    return traced_evaluation.for_framework("torch")


@pytest.fixture(scope="module")
def trace(evaluation):
    return evaluation.trace


@pytest.fixture(scope="module")
def model():
    from mlms_nb.zoo.registry import build_torch_model

    return build_torch_model("efficientnet_lite0")


@pytest.fixture(scope="module")
def module_calls(model):
    """Module types called in one forward pass of the model, counted by plain forward hooks (no tracer)."""
    import torch

    counts = collections.Counter()
    hooks = [m.register_forward_hook(lambda mod, a, o: counts.update([type(mod).__name__]))
             for _, m in layer_modules(model)]
    with torch.no_grad():
        model(torch.zeros(1, 3, 224, 224))
    for h in hooks:
        h.remove()
    return counts


def check_plot(fig, *units):
    """Rendered without error, titled, every numeric axis label has a unit in parentheses, ``units`` among them."""
    labels = [lab for lab in axis_labels(fig) if lab not in CATEGORICAL_AXES]
    assert labels and all("(" in lab and lab.endswith(")") for lab in labels), labels
    for unit in units:
        assert any(unit in lab for lab in labels), (unit, labels)
    assert titles(fig) and all(len(t) > 20 for t in titles(fig))
    assert "<html" in figure_page(fig).lower()  # Bokeh: INLINE resources; matplotlib: an embedded PNG


# ------------------------------------------------------------------------------------------ layers

def test_occurrence_counts_equal_the_models_layer_calls(trace, module_calls):
    occ = layers.occurrence(trace.spans)
    got = dict(zip(occ["layer_type"], occ["count"]))
    assert got == dict(module_calls)
    assert got["Conv2dStaticSamePadding"] == 49 and got["BatchNorm2d"] == 49 and got["Linear"] == 1
    assert occ["percent"].sum() == pytest.approx(100.0)
    relu = occ.set_index("layer_type").loc["ReLU6"]
    assert relu["count"] == 33 and relu["modules"] == 17  # each block's one ReLU6 module runs twice
    assert "every predict call ran the same number of layers" in occ.attrs["note"]


def test_layer_calls_groups_repetitions_and_nesting(trace):
    calls = layers.layer_calls(trace.spans)
    assert set(calls["batch_size"]) == set(BATCHES)
    assert calls.groupby("batch_size")["repetition"].nunique().tolist() == [REPS] * len(BATCHES)
    conv = calls[calls["layer_type"] == "Conv2dStaticSamePadding"]
    pad = calls[calls["name"].str.endswith("static_padding")]
    assert pad["nested"].all() and not conv["nested"].any()
    assert (conv["self_ns"] <= conv["duration_ns"]).all() and (conv["self_ns"] < conv["duration_ns"]).any()
    # self times of one predict call add up to the top-level layers' time: nothing counted twice
    one = calls[(calls["batch_size"] == 1) & (calls["repetition"] == 0)]
    assert one["self_ns"].sum() == one.loc[~one["nested"], "duration_ns"].sum()


def test_per_type_latency_sums_equal_per_layer_sums(trace):
    per_layer = layers.latency(trace.spans, by="layer")
    per_type = layers.latency(trace.spans, by="type")
    sums = per_layer.groupby(["framework", "batch_size", "layer_type"])[["self_total_ms", "self_mean_ms"]].sum()
    joined = per_type.set_index(["framework", "batch_size", "layer_type"]).join(sums)
    np.testing.assert_allclose(joined["total_ms"], joined["self_total_ms"], rtol=1e-12)
    np.testing.assert_allclose(joined["mean_ms"], joined["self_mean_ms"], rtol=1e-12)
    assert (per_layer["repetitions"] == REPS).all()
    assert (per_layer["p25_ms"] <= per_layer["median_ms"]).all()
    assert (per_layer["median_ms"] <= per_layer["p75_ms"]).all()
    assert per_type.groupby("batch_size")["share_pct"].sum().between(50, 100.0001).all()
    assert "over 3 predict calls" in per_type.attrs["note"]


def test_layer_memory_reports_what_the_tracer_recorded(trace):
    mem = layers.memory(trace.spans)
    bn = mem[(mem["batch_size"] == 2) & (mem["name"] == "_bn0")].iloc[0]
    activation = 2 * 32 * 112 * 112 * 4  # the first BatchNorm's output at batch size 2, float32
    assert bn["memory_bytes"] == bn["memory_max_bytes"] == activation   # the output it allocated and holds
    assert bn["io_bytes"] >= 2 * activation                             # reads its input, writes its output
    assert "recorded here: memory, bytes" in mem.attrs["note"]


def test_layer_analyses_refuse_traces_without_layers():
    tracer = Tracer(TraceLevel.MODEL)
    with tracer.span("predict", TraceLevel.MODEL, "model", batch=1):
        pass
    with pytest.raises(AnalysisError, match="no layer spans.*trace_level='FRAMEWORK'"):
        layers.occurrence(tracer.trace().spans)
    with pytest.raises(MlmsError, match="lacks column"):
        layers.latency(pd.DataFrame({"name": ["x"]}))
    with pytest.raises(AnalysisError, match="expected 'occurrence', 'latency' or 'memory'"):
        layers.compute(tracer.trace().spans, "nonsense")


@pytest.mark.parametrize("backend", BACKENDS)
def test_layer_plots_have_units(trace, backend):
    check_plot(layers.plot(layers.occurrence(trace.spans), backend), "(count)")
    check_plot(layers.plot(layers.latency(trace.spans, by="layer"), backend, batch_size=2, top=15), "(ms)")
    check_plot(layers.plot(layers.latency(trace.spans, by="type"), backend), "(ms)")
    check_plot(layers.plot(layers.memory(trace.spans), backend), "(bytes)")
    with pytest.raises(AnalysisError, match="unknown plot backend"):
        layers.plot(layers.occurrence(trace.spans), "plotly")


# ------------------------------------------------------------------------------------------ roofline

PEAK, BW = 200e9, 20e9  # a machine with a ridge at 10 FLOP/byte


def roofline_inputs():
    costs = pd.DataFrame({
        "layer_index": [0, 1, 2, 3, 4],
        "layer_name": ["conv", "bn", "act", "act", "view"],
        "layer_type": ["Conv2d", "BatchNorm2d", "ReLU6", "ReLU6", "Flatten"],
        "flops": [2e9, 4e6, 1e6, 1e6, 0.0],
        "bytes": [2e7, 4e6, 2e6, 2e6, 0.0],     # intensities 100, 1, 0.5, 0.5, (none)
    })
    latency = pd.DataFrame({
        "framework": "torch", "batch_size": 1, "layer_index": [0, 1, 2, 3, 4],
        "name": ["conv", "bn", "act", "act", "view"], "layer_type": list(costs["layer_type"]),
        "self_median_ms": [20.0, 1.0, 0.5, 0.25, 0.01], "self_p25_ms": [19.0, 0.9, 0.4, 0.2, 0.01],
        "self_p75_ms": [25.0, 1.2, 0.6, 0.3, 0.01],
    })
    return costs, latency


def test_ridge_point_is_peak_over_bandwidth():
    assert roofline.ridge_point(PEAK, BW) == PEAK / BW == 10.0
    assert roofline.ridge_point(1.3e12, 4.1e11) == pytest.approx(1.3e12 / 4.1e11, rel=1e-15)
    with pytest.raises(AnalysisError, match="bandwidth_bytes_per_s: expected a positive"):
        roofline.ridge_point(PEAK, 0)


def test_roofline_classifies_layers_left_and_right_of_the_ridge():
    costs, latency = roofline_inputs()
    roof = roofline.compute(costs, latency, PEAK, BW)
    assert roof.attrs["ridge_flop_per_byte"] == 10.0 and (roof["ridge_flop_per_byte"] == 10.0).all()
    by = roof.set_index(["layer_name", "layer_index"])
    assert by.loc[("conv", 0), "bound"] == "compute"            # 100 FLOP/B, right of the ridge
    assert by.loc[("bn", 1), "bound"] == "memory"               # 1 FLOP/B, left of it
    assert (roof.loc[roof["layer_name"] == "act", "bound"] == "memory").all()
    assert "view" not in set(roof["layer_name"]) and "1 layer(s) moving no bytes" in roof.attrs["note"]
    # the shared module's two calls are matched call by call
    assert roof.loc[roof["layer_name"] == "act", "median_ms"].tolist() == [0.5, 0.25]
    conv = by.loc[("conv", 0)]
    assert conv["achieved_flops_per_s"] == pytest.approx(2e9 / 0.020)
    assert conv["attainable_flops_per_s"] == PEAK                        # on the plateau
    assert by.loc[("bn", 1), "attainable_flops_per_s"] == pytest.approx(1.0 * BW)  # on the slope
    assert conv["achieved_low_flops_per_s"] < conv["achieved_flops_per_s"] < conv["achieved_high_flops_per_s"]
    np.testing.assert_array_equal(roofline.classify([9.99, 10.0, 10.01], 10.0), ["memory", "compute", "compute"])


def test_roofline_model_per_batch_size():
    costs, _ = roofline_inputs()
    per_batch = {1: costs, 8: costs.assign(flops=costs["flops"] * 8, bytes=costs["bytes"] * 2)}
    latency = pd.DataFrame({"framework": ["torch", "torch", "onnxruntime"], "batch_size": [1, 8, 1],
                            "median_ms": [30.0, 100.0, 25.0], "median_ci_low_ms": [29.0, 95.0, 24.0],
                            "median_ci_high_ms": [31.0, 110.0, 26.0]})
    model = roofline.compute_model(per_batch, latency, PEAK, BW)
    total_flops, total_bytes = costs["flops"].sum(), costs["bytes"].sum()
    row = model[(model["framework"] == "torch") & (model["batch_size"] == 8)].iloc[0]
    assert row["flops"] == 8 * total_flops and row["bytes"] == 2 * total_bytes
    assert row["intensity_flop_per_byte"] == pytest.approx(8 * total_flops / (2 * total_bytes))
    assert row["achieved_flops_per_s"] == pytest.approx(8 * total_flops / 0.1)
    assert set(model["bound"]) == {"compute"} and len(model) == 3
    with pytest.raises(AnalysisError, match="no batch size is in both"):
        roofline.compute_model(per_batch, latency.assign(batch_size=4), PEAK, BW)


@pytest.mark.parametrize("backend", BACKENDS)
def test_roofline_plots_have_units(backend):
    costs, latency = roofline_inputs()
    check_plot(roofline.plot(roofline.compute(costs, latency, PEAK, BW), backend), "(FLOP/byte)", "(FLOP/s)")
    model = roofline.compute_model({1: costs}, latency.assign(median_ms=30.0).head(1), PEAK, BW)
    check_plot(roofline.plot(model, backend), "(FLOP/s)")


def test_roofline_on_the_real_trace_with_measured_spans(trace):
    """Layer costs built from the traced shapes (bytes recorded per span) join the measured layers."""
    lat = layers.latency(trace.spans, by="layer")
    one = lat[lat["batch_size"] == 1]
    costs = pd.DataFrame({"layer_index": one["layer_index"], "layer_name": one["name"],
                          "layer_type": one["layer_type"], "flops": 1e6, "bytes": 1e5})
    roof = roofline.compute(costs, one, PEAK, BW)
    assert len(roof) == len(one) and (roof["bound"] == "compute").all()
    assert roof["median_ms"].tolist() == one["self_median_ms"].tolist()


# ------------------------------------------------------------------------------------------ batch scaling

def scaling_frame():
    bs = np.array([1, 2, 4, 8, 16, 32])
    throughput = np.array([100.0, 180.0, 300.0, 340.0, 350.0, 352.0])
    median = bs / throughput * 1e3
    return pd.DataFrame({"framework": "torch", "batch_size": bs, "scenario": "single-stream", "samples": 20,
                         "median_ms": median, "median_ci_low_ms": median * 0.97, "median_ci_high_ms": median * 1.05,
                         "p90_ms": median * 1.1, "iqr_ms": median * 0.04, "throughput_per_s": throughput})


def test_saturation_point_on_a_constructed_curve():
    table = batch_scaling.compute(scaling_frame())
    assert (table["saturation_batch_size"] == 8).all()   # 340 >= 0.9 * 352 = 316.8; 300 is not
    assert table["saturated"].tolist() == [False, False, False, True, True, True]
    assert table["saturated_within_range"].all()
    assert batch_scaling.compute(scaling_frame(), threshold=0.99)["saturation_batch_size"].iloc[0] == 16
    assert batch_scaling.saturation_batch_size([1, 2, 4], [10.0, 20.0, 40.0]) == 4  # still rising
    rising = batch_scaling.compute(scaling_frame().head(3))
    assert not rising["saturated_within_range"].any() and "not reached" in rising.attrs["note"]
    row = table.iloc[0]
    assert row["per_input_ms"] == pytest.approx(10.0)
    assert row["throughput_ci_low_per_s"] < 1e3 / row["median_ms"] < row["throughput_ci_high_per_s"]
    assert ">= 90% of the highest throughput" in table.attrs["note"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_batch_scaling_plot_has_units(backend):
    check_plot(batch_scaling.plot(batch_scaling.compute(scaling_frame()), backend), "(ms)", "(inputs/s)")


# ------------------------------------------------------------------------------------------ normalised latency

def test_normalized_latency_to_a_baseline():
    torch_rows = scaling_frame().head(3)
    ort_rows = torch_rows.assign(framework="onnxruntime", median_ms=torch_rows["median_ms"] * 0.5,
                                 median_ci_low_ms=torch_rows["median_ci_low_ms"] * 0.5,
                                 median_ci_high_ms=torch_rows["median_ci_high_ms"] * 0.5)
    frame = pd.concat([torch_rows, ort_rows], ignore_index=True)
    norm = normalized.compute(frame, baseline="torch")
    ort = norm[norm["framework"] == "onnxruntime"]
    np.testing.assert_allclose(ort["latency_ratio"], 0.5)
    np.testing.assert_allclose(ort["speedup"], 2.0)
    assert (ort["latency_ratio_low"] < 0.5).all() and (ort["latency_ratio_high"] > 0.5).all()
    np.testing.assert_allclose(norm.loc[norm["framework"] == "torch", "latency_ratio"], 1.0)
    systems = normalized.compute({"laptop": torch_rows, "server": ort_rows.assign(framework="torch")},
                                 baseline="laptop")
    assert systems.attrs["group"] == "system"
    np.testing.assert_allclose(systems.loc[systems["system"] == "server", "latency_ratio"], 0.5)
    laptop = SimpleNamespace(latency=torch_rows, stack={"hardware": {"cpu_model": "Laptop CPU"}}, stack_hash="aa" * 8)
    server = SimpleNamespace(latency=ort_rows.assign(framework="torch"), stack={"hardware": {"cpu_model": "EPYC"}},
                             stack_hash="bb" * 8)
    by_stack = normalized.compute([laptop, server], by="system")
    assert set(by_stack["system"]) == {"Laptop CPU [aaaaaaaa]", "EPYC [bbbbbbbb]"}
    np.testing.assert_allclose(by_stack.loc[by_stack["system"] == "EPYC [bbbbbbbb]", "latency_ratio"], 0.5)
    with pytest.raises(AnalysisError, match="baseline 'tensorflow' is not among"):
        normalized.compute(frame, baseline="tensorflow")
    for backend in BACKENDS:
        check_plot(normalized.plot(norm, backend), "(ratio, 1 = same)", "(inputs per call)")


# ------------------------------------------------------------------------------------------ A/B comparison

def evaluation_parts(medians_ns: dict, seed: int):
    rng = np.random.default_rng(seed)
    samples, rows = {}, []
    for (fw, bs), med in medians_ns.items():
        s = rng.lognormal(np.log(med), 0.05, 200).astype(np.int64)
        samples[(fw, bs, "single-stream")] = s
        ms = s / 1e6
        rows.append({"framework": fw, "batch_size": bs, "scenario": "single-stream", "median_ms": np.median(ms),
                     "p90_ms": np.percentile(ms, 90), "throughput_per_s": bs / ms.mean() * 1e3})
    return pd.DataFrame(rows), samples


def test_compare_p_value_small_for_different_samples_and_large_for_identical_distributions():
    a = evaluation_parts({("torch", 1): 10e6, ("torch", 8): 40e6}, seed=0)
    b = evaluation_parts({("torch", 1): 12e6, ("torch", 8): 40e6}, seed=100)
    cmp = compare.compute(a, b, labels=("before", "after"))
    slower = cmp[cmp["batch_size"] == 1].iloc[0]
    same = cmp[cmp["batch_size"] == 8].iloc[0]
    assert slower["p_value"] < 1e-10 and slower["significant"] and slower["faster"] == "before"
    assert slower["delta_median_pct"] == pytest.approx(20.0, abs=3.0)
    assert slower["latency_ratio_low"] < slower["latency_ratio"] < slower["latency_ratio_high"]
    assert slower["latency_ratio"] == pytest.approx(1 + slower["delta_median_pct"] / 100)
    assert same["p_value"] > 0.2 and not same["significant"] and same["faster"] == "no significant difference"
    assert same["latency_ratio_low"] < 1 < same["latency_ratio_high"]
    assert cmp.attrs["warnings"] == []  # the same frameworks and batch sizes on both sides
    assert "Mann-Whitney U" in cmp.attrs["note"] and cmp["a_samples"].eq(200).all()
    # two frameworks, one each: matched on batch size
    c = evaluation_parts({("onnxruntime", 1): 6e6}, seed=3)
    cross = compare.compute(a, c)
    assert cross["framework"].tolist() == ["torch vs onnxruntime"] and cross["significant"].all()
    for backend in BACKENDS:
        check_plot(compare.plot(cmp, backend), "(%)")


def test_a_latency_change_interval_never_falls_below_minus_100_percent():
    """The case a user met: A's calls spread wide (a busy machine), B a model 1000x faster. A bootstrap of the
    difference of medians over A's median reaches below -100% (B's latency negative); the ratio's cannot."""
    a_ms = np.array([900.0, 1100.0, 1720.0, 3800.0, 3900.0])
    b_ms = np.array([0.55, 0.6, 0.62, 0.58, 0.61])
    rng = np.random.default_rng(0)
    difference = bootstrap_medians(b_ms, RESAMPLES, rng) - bootstrap_medians(a_ms, RESAMPLES, rng)
    assert 100 * np.quantile(difference, 0.025) / np.median(a_ms) < -100  # what the old interval showed
    def side(ms):
        latency = pd.DataFrame([{"framework": "torch", "batch_size": 1, "median_ms": float(np.median(ms))}])
        return latency, {("torch", 1, "single-stream"): (ms * 1e6).astype(np.int64)}

    cmp = compare.compute(side(a_ms), side(b_ms))
    row = cmp.iloc[0]
    assert 0 < row["latency_ratio_low"] <= row["latency_ratio"] <= row["latency_ratio_high"] < 1
    assert "a change above -100%" in cmp.attrs["note"]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(1e-3, 1e4), min_size=1, max_size=40), st.lists(st.floats(1e-3, 1e4), min_size=1, max_size=40),
       st.integers(0, 2**16))
def test_the_ratio_interval_is_a_latency_change_that_can_happen(a, b, seed):
    """Any positive samples: the interval of B's median over A's lies in (0, inf) and is ordered; as a change,
    within (-100%, inf)."""
    low, high = compare.ratio_ci(np.array(a), np.array(b), seed, resamples=200)
    assert 0 < low <= high < np.inf
    assert low <= max(b) / min(a) and high >= min(b) / max(a)


def test_compare_names_what_one_side_alone_measured():
    a = evaluation_parts({("torch", 1): 10e6, ("torch", 8): 40e6, ("tensorflow", 1): 9e6}, seed=0)
    b = evaluation_parts({("torch", 1): 11e6, ("onnxruntime", 1): 6e6}, seed=1)
    cmp = compare.compute(a, b)
    assert cmp["framework"].tolist() == ["torch"]
    assert cmp.attrs["warnings"] == ["left out: tensorflow measured in A only",
                                     "left out: torch at batch size(s) 8, measured in A only",
                                     "left out: onnxruntime measured in B only"]


def test_compare_and_scaling_take_real_evaluations(evaluation):
    same = compare.compute(evaluation, evaluation)
    assert len(same) == len(BATCHES) and (same["p_value"] == 1.0).all() and (same["delta_median_ms"] == 0).all()
    assert (same["a_samples"] >= 3).all() and not same["significant"].any()
    scaling = batch_scaling.compute(evaluation)
    assert scaling["batch_size"].tolist() == list(BATCHES)
    assert scaling["saturation_batch_size"].iloc[0] in BATCHES
    np.testing.assert_allclose(scaling["per_input_ms"], scaling["median_ms"] / scaling["batch_size"])


def test_compare_layers_between_two_traces(trace, model):
    same = compare.layers(trace.spans, trace.spans)
    assert (same["delta_ms"] == 0).all() and (same["p_value"] == 1.0).all()
    names = {n for n, _ in layer_modules(model)}
    assert set(same["name"]) == names and set(same["batch_size"]) == set(BATCHES)
    for backend in BACKENDS:
        check_plot(compare.plot(same, backend, top=10), "(ms)")


# ------------------------------------------------------------------------------------------ kernels

def gpu_trace():
    """A trace as the CUPTI importer files it: kernel -> runtime launch -> layer -> predict, on cuda:0."""
    t = Tracer(TraceLevel.SYSTEM_LIBRARY, trace_id="gpu")
    lvl = TraceLevel
    clock = 1_000_000
    for rep in range(REPS):
        base = clock + rep * 10_000_000
        p = t.add_span("predict", lvl.MODEL, "model", base, base + 5_000_000, 0, batch=4, framework="torch")
        for i, (name, typ, kern) in enumerate([("conv", "Conv2d", [("implicit_gemm", 800_000), ("bias_add", 100_000)]),
                                               ("relu", "ReLU", [("elementwise_relu", 50_000 + rep * 10_000)])]):
            start = base + 100_000 + i * 2_000_000
            layer = t.add_span(name, lvl.FRAMEWORK, "layer", start, start + 1_000_000, p, layer_index=i, layer_type=typ)
            k_start = start + 50_000
            for kname, dur in kern:
                rt = t.add_span("cudaLaunchKernel", lvl.SYSTEM_LIBRARY, "runtime", k_start, k_start + 5_000, layer)
                t.add_span(kname, lvl.SYSTEM_LIBRARY, "kernel", k_start + 10_000, k_start + 10_000 + dur, rt,
                           device="cuda:0", stream=7)
                k_start += dur + 20_000
        t.add_span("Memcpy HtoD", lvl.SYSTEM_LIBRARY, "memcpy", base + 10_000, base + 60_000, p, device="cuda:0",
                   stream=7, bytes=4 * 3 * 224 * 224 * 4.0)
    return t.trace()


def test_gpu_vs_cpu_time_per_layer_and_kernel_table():
    trace = gpu_trace()
    per_layer = kernels.compute(trace).set_index("name")
    assert per_layer.loc["conv", "gpu_median_ms"] == pytest.approx(0.9)     # 800 + 100 us of kernels
    assert per_layer.loc["conv", "cpu_median_ms"] == pytest.approx(1.0)     # the layer span on the host
    assert per_layer.loc["conv", "kernels_per_call"] == 2
    assert per_layer.loc["relu", "gpu_p25_ms"] < per_layer.loc["relu", "gpu_median_ms"] == pytest.approx(0.06)
    note = kernels.compute(trace).attrs["note"]
    memcpy_us, device_us = 50 * REPS, sum(1000 + 10 * rep for rep in range(REPS))
    assert f"{REPS} device span(s), {100 * memcpy_us / device_us:.1f}% of the device time, were launched outside" in note
    assert "WARNING" not in note
    table = kernels.kernel_table(trace).set_index("name")
    assert table.loc["implicit_gemm", "count"] == REPS and table.loc["implicit_gemm", "total_ms"] == pytest.approx(2.4)
    assert table["gpu_time_pct"].sum() == pytest.approx(100.0)
    assert table.index[0] == "implicit_gemm" and table.loc["Memcpy HtoD", "kind"] == "memcpy"
    for backend in BACKENDS:
        check_plot(kernels.plot(kernels.compute(trace), backend), "(ms)")
        check_plot(kernels.plot(kernels.kernel_table(trace), backend), "(ms)")


def test_a_cupti_clock_mapping_that_did_not_hold_is_named_in_both_kernel_frames():
    tracer_trace = gpu_trace()
    tracer_trace.metadata["cupti"] = {"clock_check": {"api_calls": 120, "outside_recording": 97, "holds": False}}
    for frame in (kernels.compute(tracer_trace), kernels.kernel_table(tracer_trace)):
        assert "WARNING: CUPTI's clock mapping put 97 of 120 API calls outside the recording" in frame.attrs["note"]


def test_cpu_only_trace_has_no_kernels(trace):
    for frame in (kernels.compute(trace), kernels.kernel_table(trace.spans)):
        assert frame.empty and "no device kernels in this trace" in frame.attrs["note"]
    explained = SimpleNamespace(spans=trace.spans, metadata={"unavailable": {"cupti": "CUPTI needs an NVIDIA GPU"}})
    assert "the trace says: cupti: CUPTI needs an NVIDIA GPU" in kernels.compute(explained).attrs["note"]
    with pytest.raises(AnalysisError, match="nothing to plot: there are no device kernels"):
        kernels.plot(kernels.compute(trace))


# ------------------------------------------------------------------------------------------ the example notebook

@pytest.mark.slow
def test_04_roofline_and_layers_notebook(shared_home):
    from tests.test_notebooks import run_notebook_once, stray_stderr, text_of

    nb = run_notebook_once("04_roofline_and_layers.ipynb")  # the PDF test in test_report.py reads the same run
    assert stray_stderr(nb) == []  # as every example notebook: nothing on stderr but what is listed with why
    code = [c for c in nb.cells if c.cell_type == "code"]
    occurrence = text_of(code[1])
    assert "Conv2dStaticSamePadding" in occurrence and "every predict call ran the same number of layers" in occurrence
    from mlms_nb.analyses import BOKEHJS_MARK, FIGURE_MARK

    html = [[o.get("data", {}).get("text/html", "") for o in c.outputs] for c in code]
    bokeh = [c for c in html if any(FIGURE_MARK in h for h in c)]
    assert len(bokeh) == 4  # occurrence, per-layer latency, roofline per layer, batch scaling
    assert sum(h.count(BOKEHJS_MARK) for c in html for h in c) == 1  # BokehJS travels once per notebook
    assert any(o.get("data", {}).get("image/png") for o in code[4].outputs)  # matplotlib per-type latency
    ceilings = text_of(code[7])
    assert "ridge = peak / bandwidth" in ceilings and "FLOP/byte" in ceilings
    bounds = text_of(code[8])
    assert "memory" in bounds and "ridge point" in bounds
    assert any(o.get("data", {}).get("image/png") for o in code[11].outputs)  # roofline of the model
    assert "saturation batch size" in text_of(code[12])
    assert "no device kernels in this trace" in text_of(code[-1])
