"""OpenTelemetry interop with the real opentelemetry-sdk (InMemorySpanExporter): the user's active span is read
and becomes the parent of a replayed Trace, parent/child structure and epoch times survive; without
opentelemetry the functions say which extra to install."""
from __future__ import annotations

import sys

import pytest

from mlms_nb.errors import FrameworkNotInstalledError, MlmsError
from mlms_nb.tracing import TraceLevel, Tracer
from mlms_nb.tracing import otel as motel

otel_trace = pytest.importorskip("opentelemetry.trace")
sdk_trace = pytest.importorskip("opentelemetry.sdk.trace")
from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402


def user_provider():
    exporter = InMemorySpanExporter()
    provider = TracerProvider(shutdown_on_exit=False)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def make_trace(tracer: Tracer):
    """A model run with two layers, an op inside the first, a failed layer, and a kernel added with known times."""
    with tracer.span("predict", TraceLevel.MODEL, "model", batch=8) as root:
        with tracer.span("features.0", TraceLevel.FRAMEWORK, "layer", layer_type="Conv2d", layer_index=0,
                         shape=[[8, 3, 224, 224]], flops=1.2e9, bytes=4.5e6):
            with tracer.span("aten::conv2d", TraceLevel.ML_LIBRARY, "op"):
                pass
        try:
            with tracer.span("fc", TraceLevel.FRAMEWORK, "layer", layer_type="Linear", layer_index=1):
                raise ValueError("boom")
        except ValueError:
            pass
        now = tracer.now()
        tracer.add_span("sgemm", TraceLevel.SYSTEM_LIBRARY, "kernel", now - 1000, now - 10, parent_id=root,
                        device="cuda:0", stream=7, grid=(8, 1, 1))
    return tracer.trace()


def by_name(spans):
    return {s.name: s for s in spans}


def test_parent_from_otel_reads_the_active_span_and_export_nests_under_it():
    provider, exporter = user_provider()
    otracer = provider.get_tracer("notebook")
    assert motel.parent_from_otel() is None  # nothing active
    with otracer.start_as_current_span("my experiment") as user_span:
        tracer = Tracer(TraceLevel.SYSTEM_LIBRARY)
        parent = motel.record_otel_parent(tracer)
        trace = make_trace(tracer)
    uctx = user_span.get_span_context()
    assert parent == {"trace_id": f"{uctx.trace_id:032x}", "span_id": f"{uctx.span_id:016x}",
                      "trace_flags": int(uctx.trace_flags), "trace_state": "", "is_remote": False}
    assert parent["trace_flags"] & 1  # sampled
    assert trace.metadata["otel_parent"] == parent

    exporter.clear()
    result = motel.export_trace(trace, tracer_provider=provider)
    spans = exporter.get_finished_spans()
    assert result["spans"] == len(trace.spans) == len(spans) == 5
    assert result["trace_id"] == parent["trace_id"]
    got = by_name(spans)
    # the user's span is the parent of the trace's root; everything is in the user's OTel trace
    assert got["predict"].parent.span_id == uctx.span_id
    assert all(s.context.trace_id == uctx.trace_id for s in spans)
    # parent/child structure preserved
    mlms = trace.spans.set_index("span_id")
    otel_id = {sid: int(h, 16) for sid, h in result["span_ids"].items()}
    for s in spans:
        sid = s.attributes["mlms.span_id"]
        assert otel_id[sid] == s.context.span_id
        mparent = int(mlms.loc[sid, "parent_id"])
        if mparent:
            assert s.parent.span_id == otel_id[mparent]
    assert got["aten::conv2d"].parent.span_id == got["features.0"].context.span_id
    assert got["sgemm"].parent.span_id == got["predict"].context.span_id
    # times: perf_counter clock + wall_offset_ns = epoch ns, exactly
    off = trace.metadata["clock"]["wall_offset_ns"]
    for s in spans:
        row = mlms.loc[s.attributes["mlms.span_id"]]
        assert s.start_time == int(row["start_ns"]) + off and s.end_time == int(row["end_ns"]) + off
    assert abs(got["predict"].start_time - user_span.start_time) < 5_000_000_000  # same epoch, same minute
    # attributes
    conv = got["features.0"].attributes
    assert conv["mlms.level"] == "FRAMEWORK" and conv["mlms.kind"] == "layer"
    assert conv["mlms.layer_type"] == "Conv2d" and conv["mlms.layer_index"] == 0
    assert conv["mlms.shape"] == "[[8,3,224,224]]" and conv["mlms.flops"] == 1.2e9 and conv["mlms.bytes"] == 4.5e6
    assert conv["mlms.device"] == "cpu" and "mlms.stream" not in conv and conv["thread.id"] > 0
    k = got["sgemm"].attributes
    assert k["mlms.level"] == "SYSTEM_LIBRARY" and k["mlms.device"] == "cuda:0" and k["mlms.stream"] == 7
    assert tuple(k["mlms.attrs.grid"]) == (8, 1, 1)
    assert got["predict"].attributes["mlms.attrs.batch"] == 8
    # a span that raised is an error span
    assert got["fc"].status.status_code == otel_trace.StatusCode.ERROR
    assert got["fc"].status.description == "ValueError"
    assert got["predict"].status.status_code == otel_trace.StatusCode.UNSET


def test_export_with_an_exporter_and_no_parent():
    tracer = Tracer(TraceLevel.SYSTEM_LIBRARY)
    trace = make_trace(tracer)
    assert "otel_parent" not in trace.metadata
    exporter = InMemorySpanExporter()
    result = motel.export_trace(trace, exporter=exporter)
    spans = exporter.get_finished_spans()
    got = by_name(spans)
    assert len(spans) == 5 and got["predict"].parent is None
    assert got["predict"].resource.attributes["service.name"] == "mlms-nb"
    assert got["predict"].instrumentation_scope.name == "mlms_nb"
    assert len({s.context.trace_id for s in spans}) == 1
    assert result["trace_id"] == f"{got['predict'].context.trace_id:032x}"
    # the exporter is flushed, not shut down: it can be used again
    motel.export_trace(trace, exporter=exporter)
    assert len(exporter.get_finished_spans()) == 10


def test_export_does_not_pick_up_the_current_span_implicitly_and_takes_an_explicit_parent():
    provider, exporter = user_provider()
    trace = make_trace(Tracer(TraceLevel.FRAMEWORK))
    otracer = provider.get_tracer("notebook")
    with otracer.start_as_current_span("unrelated"):
        motel.export_trace(trace, tracer_provider=provider, parent=None)
    got = by_name(exporter.get_finished_spans())
    assert got["predict"].parent is None
    exporter.clear()
    explicit = {"trace_id": "0af7651916cd43dd8448eb211c80319c", "span_id": "b7ad6b7169203331", "trace_flags": 1,
                "trace_state": "vendor=x", "is_remote": True}
    motel.export_trace(trace, tracer_provider=provider, parent=explicit)
    got = by_name(exporter.get_finished_spans())
    assert got["predict"].parent.span_id == 0xB7AD6B7169203331 and got["predict"].parent.is_remote
    assert got["predict"].context.trace_id == 0x0AF7651916CD43DD8448EB211C80319C
    assert got["predict"].context.trace_state.get("vendor") == "x"
    with pytest.raises(MlmsError, match="otel_parent"):
        motel.export_trace(trace, tracer_provider=provider, parent={"trace_id": "zz"})


def test_several_roots_get_one_synthetic_root():
    tracer = Tracer(TraceLevel.MODEL)
    with tracer.span("open", TraceLevel.MODEL, "model"):
        pass
    with tracer.span("predict", TraceLevel.MODEL, "model"):
        pass
    trace = tracer.trace()
    exporter = InMemorySpanExporter()
    result = motel.export_trace(trace, exporter=exporter)
    got = by_name(exporter.get_finished_spans())
    assert result["spans"] == 3 and set(got) == {"open", "predict", motel.SYNTHETIC_ROOT}
    root = got[motel.SYNTHETIC_ROOT]
    assert root.parent is None and got["open"].parent.span_id == root.context.span_id
    assert got["predict"].parent.span_id == root.context.span_id
    assert root.start_time == got["open"].start_time and root.end_time == got["predict"].end_time


def test_export_needs_a_wall_offset_and_a_provider(monkeypatch):
    trace = make_trace(Tracer(TraceLevel.MODEL))
    trace.metadata["clock"] = {"name": "unknown"}
    with pytest.raises(MlmsError, match="wall-clock offset"):
        motel.export_trace(trace, exporter=InMemorySpanExporter())
    exporter = InMemorySpanExporter()
    motel.export_trace(trace, exporter=exporter, wall_offset_ns=1_700_000_000_000_000_000)
    assert exporter.get_finished_spans()[0].start_time > 1_700_000_000_000_000_000
    monkeypatch.setattr(otel_trace, "get_tracer_provider", lambda: otel_trace.ProxyTracerProvider())
    with pytest.raises(MlmsError, match="no OpenTelemetry tracer provider is set"):
        motel.export_trace(trace, wall_offset_ns=0)
    with pytest.raises(MlmsError, match="not both"):
        motel.export_trace(trace, tracer_provider=user_provider()[0], exporter=exporter, wall_offset_ns=0)


def _hide_opentelemetry(monkeypatch):
    for name in list(sys.modules):
        if name == "opentelemetry" or name.startswith("opentelemetry."):
            monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setitem(sys.modules, "opentelemetry", None)


def test_without_opentelemetry_the_functions_name_the_extra(monkeypatch):
    trace = make_trace(Tracer(TraceLevel.MODEL))
    _hide_opentelemetry(monkeypatch)
    assert motel.parent_from_otel() is None  # called on every run: quietly nothing
    assert motel.record_otel_parent({}) is None
    with pytest.raises(FrameworkNotInstalledError) as err:
        motel.parent_from_otel(required=True)
    assert "pip install 'mlms-nb[otel]'" in str(err.value) and "opentelemetry-api" in str(err.value)
    with pytest.raises(FrameworkNotInstalledError, match=r"mlms-nb\[otel\]") as err:
        motel.export_trace(trace, exporter=object())
    assert "\n" not in str(err.value) and str(err.value).startswith("OpenTelemetry interop needs")
    ok, reason = motel.otel_available()
    assert not ok and "mlms-nb[otel]" in reason


def test_without_the_sdk_an_exporter_names_the_extra(monkeypatch):
    trace = make_trace(Tracer(TraceLevel.MODEL))
    for name in list(sys.modules):
        if name.startswith("opentelemetry.sdk"):
            monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setitem(sys.modules, "opentelemetry.sdk", None)
    with pytest.raises(FrameworkNotInstalledError, match=r"needs opentelemetry-sdk.*mlms-nb\[otel\]"):
        motel.export_trace(trace, exporter=object())
    assert motel.otel_available()[0] is False


def test_id_columns_are_exported_as_attributes():
    """An imported trace's per-span ids (columns, not attrs) still reach OTel, only where a span has one."""
    import numpy as np

    from mlms_nb.tracing import Trace

    trace = make_trace(Tracer(TraceLevel.SYSTEM_LIBRARY))
    spans = trace.spans.copy()
    spans["external_id"] = np.where(spans["name"] == "aten::conv2d", 41, -1).astype(np.int64)
    trace = Trace(spans, trace.counters, trace.metadata)
    exporter = InMemorySpanExporter()
    motel.export_trace(trace, exporter=exporter)
    got = by_name(exporter.get_finished_spans())
    assert got["aten::conv2d"].attributes["mlms.external_id"] == 41
    assert "mlms.external_id" not in got["predict"].attributes
