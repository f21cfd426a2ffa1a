"""PyTorch tracing on the real EfficientNet-Lite0: layer spans (timed layer calls), op spans (torch.profiler) nested in
their layers, levels, auto-tracing under mlms_nb.trace / %%mlms trace, and traced evaluations kept in history."""
from __future__ import annotations

import gc

import numpy as np
import pytest
import torch

import mlms_nb
from mlms_nb.manifest import find_manifest
from mlms_nb.frameworks import open_predictor
from mlms_nb.frameworks.torch.layers import layer_modules
from mlms_nb.frameworks.torch.tracing import LayerHooks
from mlms_nb.tracing import Tracer, TraceLevel, use_tracer

L = TraceLevel


@pytest.fixture(scope="module")
def predictor():
    with open_predictor(find_manifest("efficientnet_lite0", framework="torch")) as p:
        yield p


@pytest.fixture(scope="module")
def batch():
    return np.random.default_rng(0).standard_normal((2, 3, 224, 224)).astype(np.float32)


@pytest.fixture(scope="module")
def expected_calls(predictor, batch):
    """The layer-module calls of one forward pass, in order, seen through torch's *global* module hooks (a
    mechanism independent of the predictor's per-module hooks)."""
    names = {id(m): name for name, m in layer_modules(predictor.native_model)}
    calls: list[str] = []
    handle = torch.nn.modules.module.register_module_forward_pre_hook(
        lambda m, args: calls.append(names[id(m)]) if id(m) in names else None)
    try:
        with torch.inference_mode():
            predictor.native_model(torch.from_numpy(batch))
    finally:
        handle.remove()
    return calls


def traced(predictor, batch, level, calls=2):
    tracer = Tracer(level)
    predictor.start_tracing(tracer)
    try:
        with use_tracer(tracer):
            outputs = [predictor.predict(batch) for _ in range(calls)]
    finally:
        predictor.stop_tracing()
    return tracer.trace(), outputs


def test_layer_spans_follow_the_model_layer_by_layer(predictor, batch, expected_calls):
    trace, outputs = traced(predictor, batch, L.FRAMEWORK)
    spans = trace.spans
    predicts = spans[spans["name"] == "predict"]
    assert len(predicts) == 2 and set(predicts["level"]) == {"MODEL"}
    layers = spans[spans["kind"] == "layer"]
    assert set(layers["level"]) == {"FRAMEWORK"}
    # the model has more layers than a token count: EfficientNet-Lite0 has convs, BNs, ReLU6s, a Linear...
    assert len(expected_calls) > 100 and expected_calls[0] == "_conv_stem" and expected_calls[-1] == "_fc"
    by_id = spans.set_index("span_id")
    for predict_id in predicts["span_id"]:
        # the layer spans under one predict call (directly, or nested in a layer that owns a child)
        root_of = {}
        for row in layers.itertuples():
            p = row.parent_id
            while p in by_id.index and by_id.at[p, "kind"] == "layer":
                p = by_id.at[p, "parent_id"]
            root_of[row.span_id] = p
        mine = layers[layers["span_id"].map(root_of) == predict_id].sort_values("layer_index")
        assert list(mine["name"]) == expected_calls
        assert list(mine["layer_index"]) == list(range(len(expected_calls)))
        assert mine["start_ns"].is_monotonic_increasing
    stem = layers[layers["name"] == "_conv_stem"].iloc[0]
    assert stem["layer_type"] == "Conv2dStaticSamePadding" and stem["shape"] == "[[2,3,224,224]]"
    conv = predictor.native_model._conv_stem
    params = sum(p.numel() * 4 for p in conv.parameters(recurse=False))
    attrs = mlms_nb.tracing.attrs_dict(stem["attrs"])
    assert attrs["param_bytes"] == params and attrs["out_shape"] == [[2, 32, 112, 112]]
    assert stem["bytes"] == 2 * 3 * 224 * 224 * 4 + params + 2 * 32 * 112 * 112 * 4
    assert stem["memory"] == 2 * 32 * 112 * 112 * 4
    # tracing changes nothing in the answers
    np.testing.assert_array_equal(outputs[0], predictor.predict(batch))


def test_ops_nest_inside_their_layer(predictor, batch):
    trace, _ = traced(predictor, batch, L.ML_LIBRARY, calls=1)
    spans = trace.spans
    ops = spans[spans["kind"] == "op"]
    assert len(ops) > 1000 and set(ops["level"]) == {"ML_LIBRARY"}
    by_id = spans.set_index("span_id")
    parents = by_id.loc[ops["parent_id"].to_numpy()]
    assert set(parents["kind"]) <= {"op", "layer", "model"}
    assert (ops["start_ns"].to_numpy() >= parents["start_ns"].to_numpy()).all()
    assert (ops["end_ns"].to_numpy() <= parents["end_ns"].to_numpy()).all()
    # every convolution layer holds the aten convolution it ran, with the layer's input shape
    layers = spans[spans["kind"] == "layer"]
    convs = layers[layers["layer_type"].str.startswith("Conv2d")]
    top_ops = ops[ops["parent_id"].isin(convs["span_id"])]
    conv_ops = top_ops[top_ops["name"] == "aten::conv2d"]
    assert set(conv_ops["parent_id"]) == set(convs["span_id"])
    assert trace.metadata["torch.profiler"]["ops"] == len(ops)


def test_levels_below_framework_record_no_layers(predictor, batch):
    trace, _ = traced(predictor, batch, L.MODEL)
    assert set(trace.spans["kind"]) == {"model"} and len(trace.spans) == 2
    trace, _ = traced(predictor, batch, L.NONE)
    assert trace.spans.empty
    assert "forward" not in predictor.native_model._conv_stem.__dict__  # the wrapper is removed on stop


class _Halves(torch.nn.Module):
    """A layer with two tensors out (the wrapper's generic path)."""

    def forward(self, x):
        return x.chunk(2, dim=1)


class _TwoWay(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.act, self.halves = torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU(inplace=True), _Halves()

    def forward(self, x):
        a, b = self.halves(self.act(self.conv(x)))
        return a + b


def test_recorded_layer_calls_leave_nothing_for_the_garbage_collector():
    """A traced call's record holds plain values only, so a long traced run adds no objects that every garbage
    collection must walk (a record holding torch.Size stayed tracked: 7 objects a call)."""
    model = _TwoWay().eval()
    tracer = Tracer(L.FRAMEWORK)
    hooks = LayerHooks(model, tracer)
    x = torch.zeros(2, 3, 8, 8)
    with torch.inference_mode():
        model(x)
        # a collection untracks a tuple of plain values, one level of nesting per pass: a record of a layer with
        # two outputs nests four deep (call, part, outputs, output)
        for _ in range(4):
            gc.collect()
        before = len(gc.get_objects())
        for _ in range(300):
            model(x)
        for _ in range(4):
            gc.collect()
        after = len(gc.get_objects())
    hooks.remove()
    assert after - before < 100  # 900 layer calls recorded
    spans = tracer.trace().spans
    assert len(spans) == 3 * 301
    halves = spans[spans["name"] == "halves"].iloc[0]
    assert halves["shape"] == "[[2,4,6,6]]" and mlms_nb.tracing.attrs_dict(halves["attrs"])["out_shape"] == [
        [2, 2, 6, 6], [2, 2, 6, 6]]
    act = spans[spans["name"] == "act"].iloc[0]
    assert act["memory"] == 0 and act["bytes"] == 2 * (2 * 4 * 6 * 6 * 4)  # in place: allocates nothing


def test_each_call_records_its_own_shapes_when_they_change_within_a_session():
    """The wrapper looks shapes up in a table of those seen: calls of different sizes through the same layers, in
    any order, each get their own input and output shapes and bytes."""
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU()).eval()
    tracer = Tracer(L.FRAMEWORK)
    hooks = LayerHooks(model, tracer)
    sizes = [(1, 3, 8, 8), (2, 3, 10, 6), (1, 3, 8, 8), (3, 3, 5, 7)]
    with torch.inference_mode():
        for size in sizes:
            model(torch.zeros(size))
    hooks.remove()
    spans = tracer.trace().spans
    conv = spans[spans["name"] == "0"].sort_values("start_ns")
    relu = spans[spans["name"] == "1"].sort_values("start_ns")
    outs = [(n, 4, h - 2, w - 2) for n, _, h, w in sizes]
    assert conv["shape"].tolist() == [f"[[{n},{c},{h},{w}]]" for n, c, h, w in sizes]
    assert [mlms_nb.tracing.attrs_dict(a)["out_shape"] for a in conv["attrs"]] == [[list(o)] for o in outs]
    assert relu["shape"].tolist() == [f"[[{n},{c},{h},{w}]]" for n, c, h, w in outs]
    assert relu["bytes"].tolist() == [2 * 4 * np.prod(o) for o in outs]  # in and out, float32


class _Mixed(torch.nn.Module):
    """Layers of every kind the compiled call meets: a parameterised one whose shapes change between calls, an
    in-place one (output is input), one of two outputs, one called by keyword, one fed a tensor of 9 dimensions
    (past what the compiled call reads itself) and one fed an integer tensor."""

    def __init__(self):
        super().__init__()
        self.conv, self.act, self.halves = torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU(inplace=True), _Halves()
        self.flat, self.fc, self.deep, self.embed = torch.nn.Flatten(), torch.nn.Linear(2, 3), torch.nn.Tanh(), \
            torch.nn.Embedding(10, 2)

    def forward(self, x):
        a, b = self.halves(self.act(self.conv(x)))
        d = self.deep((a + b).reshape(*[1] * 7, a.shape[0] * 2, -1))
        e = self.embed(torch.arange(d.shape[-1]) % 10)
        return self.fc(input=e).sum() + self.flat(d).sum()


def _layer_spans(compiled: bool, sizes):
    model = _Mixed().eval()
    torch.manual_seed(0)
    tracer = Tracer(L.FRAMEWORK)
    hooks = LayerHooks(model, tracer, compiled=compiled)
    if compiled:  # the calls do go through the compiled call
        from mlms_nb.frameworks.torch import native

        assert all(isinstance(m._compiled_call_impl, native.recorder().LayerCall) for m in (model.conv, model.act))
    with torch.inference_mode():
        for size in sizes:
            model(torch.zeros(size))
    hooks.remove()
    assert tracer.metadata["torch.layer_calls"] == "compiled" if compiled else "python (asked for)"
    spans = tracer.trace().spans
    return spans[["name", "layer_type", "layer_index", "shape", "bytes", "memory", "attrs"]].reset_index(drop=True)


def test_the_compiled_layer_call_records_what_the_python_one_records():
    """Where the compiled call could be built (scripts/setup.sh builds it), the spans it gives are the Python
    call's, span for span: names, indices, input and output shapes, bytes and memory, for every kind of layer."""
    from mlms_nb.frameworks.torch import native

    why = native._unbuildable()
    if why:
        pytest.skip(f"the compiled layer call cannot be built here: {why}")
    assert native.recorder() is not None, native.status()
    sizes = [(1, 3, 8, 8), (2, 3, 10, 6), (1, 3, 8, 8)]
    compiled, python = _layer_spans(True, sizes), _layer_spans(False, sizes)
    assert len(compiled) == 3 * 7 and compiled["shape"].nunique() > 5
    assert compiled.equals(python)


def test_a_failed_build_of_the_compiled_call_is_said_and_not_tried_again(tmp_path, monkeypatch):
    """A compiler that fails leaves layer calls timed in Python, the reason in the trace's metadata, and a note
    beside the cache key so that later processes do not spend a build on it again."""
    from mlms_nb.frameworks.torch import native

    monkeypatch.setenv("MLMS_NATIVE_CACHE", str(tmp_path))
    monkeypatch.setenv("CXX", "false")  # a command that exists and fails
    monkeypatch.setattr(native, "_loaded", {})
    model = torch.nn.Sequential(torch.nn.ReLU())
    tracer = Tracer(L.FRAMEWORK)
    LayerHooks(model, tracer).remove()
    assert tracer.metadata["torch.layer_calls"].startswith("python (the build failed")
    assert len(list(tmp_path.glob("*.failed"))) == 1
    with pytest.raises(RuntimeError, match="earlier build failed"):
        native.build()
    monkeypatch.setattr(native, "_loaded", {})
    monkeypatch.setenv("MLMS_NATIVE", "0")
    assert native.recorder() is None and native.status() == "python (MLMS_NATIVE=0)"


def test_a_layer_called_by_keyword_is_traced_and_answers_as_untraced():
    """The wrapper of a one-argument forward takes that argument by its own name, as the forward does."""
    class Doubler(torch.nn.Module):
        def forward(self, x):
            return x * 2

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.twice, self.act, self.fc = Doubler(), torch.nn.ReLU(), torch.nn.Linear(3, 2)

        def forward(self, x):
            return self.fc(input=self.act(self.twice(x=x)))

    model, x = Net().eval(), torch.arange(6.0).reshape(2, 3)
    with torch.inference_mode():
        expected = model(x)
        tracer = Tracer(L.FRAMEWORK)
        hooks = LayerHooks(model, tracer)
        got = model(x)
        hooks.remove()
    assert torch.equal(got, expected)
    spans = tracer.trace().spans.set_index("name")
    assert list(spans.index) == ["twice", "act", "fc"]
    assert spans.loc["fc", "shape"] == "[[2,3]]" and spans.loc["fc", "bytes"] == (6 + 8 + 4) * 4  # input, weight and bias, output


def test_hooks_registered_while_tracing_run_and_each_call_is_one_span():
    """A traced layer's call goes back through torch's hook machinery while any hook is registered (its own or a
    global one, as a layer capture registers): the hooks run as untraced, each call still gives one span, and
    a module whose call was already taken over (as Module.compile() does) keeps it, traced, after tracing."""
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU(), torch.nn.Tanh()).eval()
    compiled_calls = []
    plain_call = model[2]._call_impl
    model[2]._compiled_call_impl = lambda *args, **kwargs: compiled_calls.append(1) or plain_call(*args, **kwargs)
    seen = []
    x = torch.zeros(1, 3, 8, 8)
    with torch.inference_mode():
        expected = model(x)
        tracer = Tracer(L.FRAMEWORK)
        hooks = LayerHooks(model, tracer)
        first = model(x)
        own = model[0].register_forward_hook(lambda m, args, out: seen.append(tuple(out.shape)))
        every = torch.nn.modules.module.register_module_forward_pre_hook(
            lambda m, args: seen.append(type(m).__name__))
        hooked = model(x)
        own.remove()
        every.remove()
        last = model(x)
        hooks.remove()
        after = model(x)
    assert seen == ["Sequential", "Conv2d", (1, 4, 6, 6), "ReLU", "Tanh"]
    for y in (first, hooked, last, after):
        assert torch.equal(y, expected)
    spans = tracer.trace().spans
    assert spans.groupby("name").size().to_dict() == {"0": 3, "1": 3, "2": 3}
    assert spans["duration_ns"].gt(0).all()
    assert len(compiled_calls) == 5  # the module's own compiled call ran, traced and untraced
    assert "_compiled_call_impl" in model[2].__dict__
    for layer in model[:2]:  # nothing of the tracing is left on the modules
        assert "_compiled_call_impl" not in layer.__dict__ and "forward" not in layer.__dict__


def test_two_sessions_tracing_one_model_both_record_every_call():
    """A second LayerHooks on a model another one is tracing (a generation traced while its predictor is) gets every
    call too, and the model answers as untraced."""
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU()).eval()
    x = torch.zeros(1, 3, 8, 8)
    with torch.inference_mode():
        expected = model(x)
        first, second = Tracer(L.FRAMEWORK), Tracer(L.FRAMEWORK)
        outer = LayerHooks(model, first)
        model(x)
        inner = LayerHooks(model, second)
        for _ in range(2):
            assert torch.equal(model(x), expected)
        inner.remove()
        outer.remove()
    assert first.trace().spans.groupby("name").size().to_dict() == {"0": 3, "1": 3}
    assert second.trace().spans.groupby("name").size().to_dict() == {"0": 2, "1": 2}


def test_a_forward_set_while_tracing_is_the_one_that_runs():
    """Code that sets a traced layer's forward meanwhile (as accelerate's hooks do) has it called, as untraced."""
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU()).eval()
    x = torch.zeros(1, 3, 8, 8)
    with torch.inference_mode():
        expected = model(x)
        hooks = LayerHooks(model, Tracer(L.FRAMEWORK))
        traced = model[1].forward
        model[1].forward = lambda t: traced(t) + 1
        got = model(x)
        hooks.remove()
        after = model(x)  # tracing stopped: the forward set meanwhile stays (it still calls the wrapper it kept)
    assert torch.equal(got, expected + 1) and torch.equal(after, expected + 1)


def test_op_tracing_leaves_torch_profilers_argument_values_on():
    """ML_LIBRARY tracing profiles ops without the values of their scalar arguments (cheaper per op), and puts
    torch's default back when it stops: a torch.profiler run afterwards records them."""
    from mlms_nb.frameworks.torch.ops import OpProfiler

    x = torch.rand(2, 6)
    tracer = Tracer(L.ML_LIBRARY)
    profiler = OpProfiler(tracer)
    x.as_strided([4, 3], [1, 4])
    profiler.stop()
    assert "aten::as_strided" in set(tracer.trace().spans["name"])
    with torch.profiler.profile(record_shapes=True) as prof:
        x.as_strided([4, 3], [1, 4])
    strided = [e for e in prof.events() if e.name == "aten::as_strided"]
    assert strided and [4, 3] in strided[0].concrete_inputs


def test_a_module_that_passes_its_input_through_is_not_a_layer():
    """nn.Identity and any module whose forward is `return input` run no op: no span, no cost row. A forward that
    returns its input after working on it in place, or that takes *args, is judged a layer as before."""
    from mlms_nb.frameworks.torch.costs import torch_layer_costs
    from mlms_nb.frameworks.torch.layers import is_layer

    class Pass(torch.nn.Module):
        def forward(self, x):
            return x

    class InPlace(torch.nn.Module):
        def forward(self, x):
            x.relu_()
            return x

    class Packs(torch.nn.Module):
        def forward(self, *xs):
            return xs

    model = torch.nn.Sequential(torch.nn.Identity(), torch.nn.Conv2d(3, 4, 3), Pass(), InPlace()).eval()
    assert [is_layer(m) for m in (*model, Packs())] == [False, True, False, True, True]
    tracer = Tracer(L.FRAMEWORK)
    hooks = LayerHooks(model, tracer)
    with torch.inference_mode():
        model(torch.zeros(1, 3, 8, 8))
    hooks.remove()
    assert tracer.trace().spans["name"].tolist() == ["1", "3"]
    costs = torch_layer_costs(model, torch.zeros(1, 3, 8, 8))
    assert costs["layer_name"].tolist() == ["1", "3"]


def test_auto_tracing_in_a_user_block_and_after(predictor, batch, expected_calls):
    with mlms_nb.trace("FRAMEWORK", name="my pipeline") as session:
        predictor.predict(batch)
    spans = session.trace.spans
    root = spans[spans["name"] == "my pipeline"]
    assert len(root) == 1 and root["level"].iloc[0] == "APPLICATION"
    predict = spans[spans["name"] == "predict"]
    assert predict["parent_id"].tolist() == root["span_id"].tolist()
    assert (spans["kind"] == "layer").sum() == len(expected_calls)
    assert predictor._tracer is None and "forward" not in predictor.native_model._fc.__dict__
    outside = Tracer(L.FULL)  # not the current tracer: a predict outside any block records nowhere
    predictor.predict(batch)
    assert len(outside) == 0 and len(session.tracer) == len(spans)


def test_trace_cell_magic(predictor, batch):
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    try:
        shell.run_line_magic("load_ext", "mlms_nb")
        shell.user_ns.update(p=predictor, x=batch)
        shell.run_cell_magic("mlms", "trace --level ML_LIBRARY --save t", "y = p.predict(x)\n")
        trace = shell.user_ns["t"]
        kinds = trace.spans.groupby("kind", observed=True).size()
        assert kinds["application"] == 1 and kinds["model"] == 1 and kinds["layer"] > 100 and kinds["op"] > 500
        assert shell.user_ns["y"].shape == (2, 1000)
    finally:
        InteractiveShell.clear_instance()


def test_traced_evaluation_keeps_latency_untraced_and_stores_the_trace(shared_home):
    ev = mlms_nb.evaluate("efficientnet_lite0", framework="torch", batch_sizes=[1], dataset="synthetic:2",
                          trace_level="FRAMEWORK", trace_repeats=2, warmup=1, min_repeats=3, min_time_s=0,
                          progress=False)
    assert ev.latency["samples"].iloc[0] >= 3  # latency from the untraced sweep
    spans = ev.trace.spans
    assert (spans["name"] == "predict").sum() == 2 and (spans["kind"] == "layer").sum() > 200
    overhead = ev.trace_overhead.iloc[0]
    assert overhead["trace_level"] == "FRAMEWORK" and overhead["traced_calls"] == 2
    assert overhead["untraced_median_ms"] > 0 and np.isfinite(overhead["overhead_pct"])
    again = mlms_nb.load_evaluation(ev.id)
    assert again.traces["torch"].spans.equals(ev.traces["torch"].spans)


def _cupti_reason() -> str | None:
    if not torch.cuda.is_available():
        return "no CUDA device here (this test runs on a GPU machine)"
    from mlms_nb.profilers.cupti import CuptiActivity

    ok, why = CuptiActivity.available()
    return None if ok else why


@pytest.mark.skipif(_cupti_reason() is not None, reason=str(_cupti_reason()))
def test_gpu_evaluation_puts_kernels_under_their_layers(shared_home):
    ev = mlms_nb.evaluate("efficientnet_lite0", framework="torch", device="cuda", batch_sizes=[1, 8],
                          dataset="synthetic:8", trace_level="SYSTEM_LIBRARY", trace_repeats=2, warmup=3,
                          min_repeats=5, min_time_s=0, progress=False, history=False)
    spans = ev.trace.spans
    by_id = spans.set_index("span_id")
    kernels = spans[spans["kind"] == "kernel"]
    assert len(kernels) > 100 and kernels["device"].astype(str).str.startswith("cuda:").all()
    # each kernel hangs under the runtime call that launched it, and that call under a layer or an op of one
    launch = by_id.reindex(kernels["parent_id"].to_numpy())  # NaN rows: a kernel whose launch CUPTI did not record
    assert (launch["kind"] == "runtime").mean() > 0.95
    launch = launch[launch["kind"] == "runtime"]
    owners = by_id.reindex(launch["parent_id"].to_numpy()).dropna(subset=["kind"])
    assert set(owners["kind"]) <= {"layer", "op", "model"} and (owners["kind"] != "model").mean() > 0.9
    convs = spans[(spans["kind"] == "layer") & spans["layer_type"].str.startswith("Conv2d")]
    from mlms_nb.zoo.registry import build_torch_model

    per_call = sum(isinstance(m, torch.nn.Conv2d) for m in build_torch_model("efficientnet_lite0").modules())
    assert len(convs) >= 2 * 2 * per_call  # every convolution, 2 traced calls at each of 2 batch sizes
    assert ev.trace_overhead["trace_level"].eq("SYSTEM_LIBRARY").all()


def test_costs_and_op_tracing_leave_torchs_compiler_unloaded(tmp_path):
    """Working out a model's costs and tracing its ops at ML_LIBRARY import neither torch._dynamo nor
    torch._inductor (about a second of CPU each time a process did), and both still do their work."""
    import subprocess
    import sys

    code = ("import sys, torch\n"
            "from mlms_nb.frameworks.torch.costs import torch_layer_costs\n"
            "from mlms_nb.frameworks.torch.ops import OpProfiler\n"
            "from mlms_nb.tracing import Tracer, TraceLevel\n"
            "model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU(), torch.nn.ZeroPad2d(1)).eval()\n"
            "x = torch.zeros(1, 3, 8, 8)\n"
            "costs = torch_layer_costs(model, x)\n"
            "tracer = Tracer(TraceLevel.ML_LIBRARY)\n"
            "ops = OpProfiler(tracer)\n"
            "with torch.inference_mode():\n"
            "    model(x)\n"
            "ops.stop()\n"
            "spans = tracer.trace().spans\n"
            "print(int(costs['flops'].sum() > 0), int((spans['kind'] == 'op').sum() > 0),\n"
            "      sorted(m for m in ('torch._dynamo', 'torch._inductor') if m in sys.modules))\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["1", "1", "[]"], done.stdout
