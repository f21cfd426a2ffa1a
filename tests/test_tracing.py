"""Tracing core: the tracer (nesting, levels, cost), the frames' schema, Parquet and Chrome round trips, and
imports of real PyTorch Kineto and ONNX Runtime profiles."""
from __future__ import annotations

import gc
import gzip
import importlib.util
import json
import os
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import orjson
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mlms_nb.errors import MlmsError
from mlms_nb.tracing import (NO_SPAN, NULL_TRACER, SPAN_COLUMNS, Trace, TraceFormatError, TraceLevel,
                             TraceSchemaError, Tracer, attrs_dict, current_tracer, empty_counters, empty_spans,
                             load_trace, use_tracer, validate_spans)
from mlms_nb.profilers import PsutilSampler
from mlms_nb.schema.columns import LEVEL_DTYPE
from mlms_nb.schema.counters import COUNTER_COLUMNS, counters_frame
from mlms_nb.tracing import records
from mlms_nb.tracing.attribution import containment_parents
from mlms_nb.tracing.records import part_numbers, shared_part_numbers
from mlms_nb.tracing._jsonscan import EventStream
from tests.helpers import containment_parents_reference

REPO = Path(__file__).resolve().parent.parent

L = TraceLevel


def _spans_by_name(trace: Trace) -> dict:
    return {row.name: row for row in trace.spans.itertuples(index=False)}


def _sample_trace() -> Trace:
    """A tracer-made trace exercising every column: nesting, hooks, fields, attrs, an error, counters."""
    tr = Tracer(L.ML_LIBRARY, trace_id="t-1")
    tr.metadata["unavailable"] = {"perf": "perf_event_paranoid is 4; set it to 1 or lower"}
    with tr.span("predict", L.MODEL, "model", batch=8) as sid:
        assert sid > 0
        tok = tr.start("features.0", L.FRAMEWORK, "layer", layer_index=0, layer_type="Conv2d",
                       shape=((1, 3, 32, 32),), flops=1.5e6, bytes=12288.0)
        with tr.span("aten::conv2d", L.ML_LIBRARY, "op", device="cpu", note="x \"quoted\" {brace}"):
            tr.annotate(memory=4096.0)
        tr.end(tok, out_shape=(1, 16, 32, 32))
        tr.add_span("kernel", L.ML_LIBRARY, "kernel", tr.now() - 500, tr.now(), device="cuda:0", stream=7)
    try:
        with tr.span("fails", L.MODEL):
            raise RuntimeError("boom")
    except RuntimeError:
        pass
    now = time.perf_counter_ns()
    tr.add_counter(now, "psutil", "cpu.percent", 37.5, "%", "cpu")
    tr.add_counters([(now + 10, "nvml", "power", 71.25, "W", "cuda:0")])
    return tr.trace()


# ------------------------------------------------------------------------------------------------- tracer

def test_nesting_gives_parent_ids_per_thread():
    tr = Tracer(L.FRAMEWORK)
    seen = {}

    def work(k):
        with tr.span(f"run{k}", L.MODEL) as outer:
            with tr.span(f"layer{k}", L.FRAMEWORK) as inner:
                seen[k] = (outer, inner)
            tok = tr.start(f"hook{k}", L.FRAMEWORK)
            with tr.span(f"inside-hook{k}", L.FRAMEWORK):
                pass
            tr.end(tok)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    trace = tr.trace()
    s = trace.spans
    assert len(s) == 16
    by = _spans_by_name(trace)
    ids = set(s["span_id"])
    assert len(ids) == 16
    for k in range(4):
        outer, inner = seen[k]
        assert by[f"run{k}"].span_id == outer and by[f"run{k}"].parent_id == 0
        assert by[f"layer{k}"].span_id == inner and by[f"layer{k}"].parent_id == outer
        assert by[f"hook{k}"].parent_id == outer
        assert by[f"inside-hook{k}"].parent_id == by[f"hook{k}"].span_id
        # one thread id per worker, shared by its spans
        assert len({by[n].thread for n in (f"run{k}", f"layer{k}", f"hook{k}")}) == 1
    assert s["thread"].nunique() == 4
    assert (s["start_ns"].diff().dropna() >= 0).all()
    assert (s["duration_ns"] == s["end_ns"] - s["start_ns"]).all()
    assert trace.metadata["clock"]["wall_offset_ns"] == (trace.metadata["clock"]["anchor_wall_ns"]
                                                         - trace.metadata["clock"]["anchor_perf_ns"])


def test_fields_fill_columns_and_attrs():
    trace = _sample_trace()
    by = _spans_by_name(trace)
    layer = by["features.0"]
    assert (layer.level, layer.kind, layer.layer_index, layer.layer_type) == ("FRAMEWORK", "layer", 0, "Conv2d")
    assert layer.shape == "[[1,3,32,32]]" and layer.flops == 1.5e6 and layer.bytes == 12288.0
    assert attrs_dict(layer.attrs) == {"out_shape": [1, 16, 32, 32]}
    op = by["aten::conv2d"]
    assert op.parent_id == layer.span_id and op.memory == 4096.0
    assert attrs_dict(op.attrs) == {"note": 'x "quoted" {brace}'}
    assert by["kernel"].device == "cuda:0" and by["kernel"].stream == 7
    assert attrs_dict(by["fails"].attrs) == {"error": "RuntimeError"}
    assert attrs_dict(by["predict"].attrs) == {"batch": 8}
    assert np.isnan(by["predict"].flops) and by["predict"].layer_index == -1 and by["predict"].stream == -1
    assert list(trace.counters["metric"]) == ["cpu.percent", "power"]
    assert isinstance(trace.spans["attrs"].dtype, pd.CategoricalDtype)


def test_id_keywords_fill_id_columns_only_when_given():
    tracer = Tracer(TraceLevel.SYSTEM_LIBRARY)
    with tracer.span("predict", TraceLevel.MODEL):
        now = tracer.now()
        tracer.add_span("cudaLaunchKernel", TraceLevel.SYSTEM_LIBRARY, "runtime", now, now + 5, correlation=7)
        tracer.add_span("gemm", TraceLevel.SYSTEM_LIBRARY, "kernel", now + 10, now + 50, correlation=7, grid=[8, 1, 1])
    s = tracer.trace().spans.set_index("name")
    assert s["correlation"].to_dict() == {"predict": -1, "cudaLaunchKernel": 7, "gemm": 7}
    assert attrs_dict(s.loc["gemm", "attrs"]) == {"grid": [8, 1, 1]}
    assert "external_id" not in s.columns and "correlation" not in _sample_trace().spans.columns


def test_disabled_levels_record_nothing():
    tr = Tracer(L.MODEL)
    assert tr.enabled(L.MODEL) and tr.enabled(L.APPLICATION) and not tr.enabled(L.FRAMEWORK)
    assert tr.span("layer", L.FRAMEWORK) is NO_SPAN
    with tr.span("layer", L.FRAMEWORK, layer_index=3) as sid:
        assert sid == 0
    assert tr.start("hook", L.ML_LIBRARY) is None
    assert tr.end(None) == 0
    assert tr.add_span("k", L.SYSTEM_LIBRARY, "kernel", 0, 10) == 0
    assert len(tr) == 0 and len(tr.trace().spans) == 0
    # NONE records nothing at all, counters included; the default current tracer is such a tracer
    none = Tracer("none")
    with none.span("x", L.APPLICATION):
        pass
    none.add_counter(1, "psutil", "cpu.percent", 1.0, "%")
    assert len(none.trace().spans) == 0 and len(none.trace().counters) == 0
    assert current_tracer() is NULL_TRACER


def test_current_tracer_context():
    tr = Tracer(L.FRAMEWORK)
    with use_tracer(tr) as active:
        assert active is tr and current_tracer() is tr
        with current_tracer().span("predict", L.MODEL):
            with current_tracer().span("layer", L.FRAMEWORK):
                pass
        inner = Tracer(L.MODEL)
        with use_tracer(inner):
            assert current_tracer() is inner
        assert current_tracer() is tr
    assert current_tracer() is NULL_TRACER
    by = _spans_by_name(tr.trace())
    assert by["layer"].parent_id == by["predict"].span_id


def test_unfinished_hook_span_is_closed_by_enclosing_span():
    tr = Tracer(L.FRAMEWORK)
    with tr.span("predict", L.MODEL):
        tok = tr.start("layer", L.FRAMEWORK)  # a post-hook that never ran
    assert tr.end(tok) == tok[0]  # late end of an already recorded span is ignored
    with tr.span("next", L.MODEL):
        pass
    by = _spans_by_name(tr.trace())
    assert attrs_dict(by["layer"].attrs) == {"error": "unfinished"}
    assert by["next"].parent_id == 0 and len(by) == 3


def test_records_are_flat_named_and_left_alone_by_the_garbage_collector():
    """What keeps a span cheap (benchmarks/recording_costs.py measures it): the tracer keeps one flat tuple of
    atomic values per span, which a collection untracks; readers get the same record with names."""
    tr = Tracer(L.FRAMEWORK)
    for i in range(100):
        with tr.span("layer", L.FRAMEWORK, "layer", layer_index=i, shape=((1, 3, 8, 8),)):
            pass
    tr.add_span("k", L.FRAMEWORK, None, 10, 20, parent_id=0, thread=7, flops=2.0)
    gc.collect()
    assert not any(gc.is_tracked(r) for r in tr._spans)  # noqa: SLF001 - the tracer's own storage is the subject
    named = tr.records()
    assert len(named) == len(tr) == 101
    first, last = named[0], named[-1]
    assert (first.name, first.level, first.kind, first.fields) == ("layer", int(L.FRAMEWORK), "layer",
                                                                   {"layer_index": 0, "shape": ((1, 3, 8, 8),)})
    assert first.end_ns >= first.start_ns and first.thread == tr.thread_id()
    assert (last.span_id, last.start_ns, last.end_ns, last.thread, last.kind, last.fields) == (
        101, 10, 20, 7, None, {"flops": 2.0})
    assert [r.span_id for r in tr.records(since=100)] == [101]
    assert records.SpanRecord.of(tr._spans[0]) == first  # noqa: SLF001
    assert tr.max_level == int(L.FRAMEWORK) and Tracer("none").max_level == 0


def test_a_block_of_spans_is_the_same_trace_as_its_spans_added_one_by_one():
    """A recorder's spans handed over as one SpanBlock (columns, each part's name and fields once) read back and
    build exactly what the same spans added one by one give: frame, records, positions and intervals."""
    parts = (("features.0", {"layer_type": "Conv2d", "shape": ((1, 3, 8, 8),), "bytes": 96.0, "param_bytes": 4}),
             ("features.1", {"layer_type": "ReLU", "shape": ((1, 4, 8, 8),), "memory": 0.0, "out_shape": (1, 2)}))
    rows = [(0, 100, 150, 1), (1, 160, 170, 0), (0, 180, 260, 1), (1, 265, 270, 0)]  # part, start, end, parent
    one_by_one, blocked = Tracer(L.FRAMEWORK, trace_id="t"), Tracer(L.FRAMEWORK, trace_id="t")
    for tr in (one_by_one, blocked):
        tr.add_span("predict", L.MODEL, None, 90, 300, parent_id=0, thread=5)
    for i, (part, start, end, parent) in enumerate(rows):
        name, fields = parts[part]
        one_by_one.add_span(name, L.FRAMEWORK, "layer", start, end, parent_id=parent, thread=5, layer_index=i,
                            **fields)
    ids = blocked.new_span_ids(len(rows))
    blocked.add_block(records.SpanBlock(
        int(L.FRAMEWORK), "layer", np.array(ids), np.array([r[3] for r in rows]), np.array([r[1] for r in rows]),
        np.array([r[2] for r in rows]), np.full(len(rows), 5), np.array([r[0] for r in rows]), parts,
        {"layer_index": np.arange(len(rows))}))
    for tr in (one_by_one, blocked):  # a span recorded after the block keeps its place after it
        tr.add_span("predict", L.MODEL, None, 400, 500, parent_id=0, thread=5)
    pd.testing.assert_frame_equal(blocked.trace().spans, one_by_one.trace().spans)
    assert len(blocked) == len(one_by_one) == 6
    for since in range(7):
        assert blocked.records(since) == one_by_one.records(since), since
        for level, kind, name in ((L.FRAMEWORK, "layer", None), (L.MODEL, None, "predict"),
                                  (L.FRAMEWORK, None, "features.1")):
            np.testing.assert_array_equal(blocked.intervals(level, kind, name, since=since),
                                          one_by_one.intervals(level, kind, name, since=since))
    assert blocked.intervals(L.FRAMEWORK, name="features.1")[:, 0].tolist() == [160, 265]
    blocked.clear()
    assert len(blocked) == 0 and blocked.records() == [] and len(blocked.trace().spans) == 0


# ------------------------------------------------------------------------------------------------- schema

def test_schema_empty_frames_and_validation():
    spans, counters = empty_spans(), empty_counters()
    assert tuple(spans.columns) == SPAN_COLUMNS and tuple(counters.columns) == COUNTER_COLUMNS
    assert spans["level"].dtype == LEVEL_DTYPE and spans["start_ns"].dtype == np.int64
    validate_spans(spans)
    good = _sample_trace().spans
    with pytest.raises(TraceSchemaError, match="missing column.*flops.*attrs"):
        validate_spans(good.drop(columns=["flops", "attrs"]))
    with pytest.raises(TraceSchemaError, match="start_ns is float64, expected int64"):
        validate_spans(good.astype({"start_ns": "float64"}))
    with pytest.raises(TraceSchemaError, match="level is"):
        validate_spans(good.astype({"level": "str"}))
    bad = good.copy()
    bad.loc[0, "duration_ns"] = 1
    with pytest.raises(TraceSchemaError, match="duration_ns"):
        validate_spans(bad)
    assert issubclass(TraceSchemaError, MlmsError) and issubclass(TraceFormatError, MlmsError)


def test_profiler_rows_and_the_tracer_share_one_counters_frame():
    """Profilers emit rows into the schema's counters frame; a Trace takes that frame and no other."""
    sampler = PsutilSampler().start()
    sampler.stop()
    rows = sampler.counters()
    frame = sampler.counters_frame()
    assert len(frame) == len(rows) > 0 and tuple(frame.columns) == COUNTER_COLUMNS
    assert all(isinstance(frame[c].dtype, pd.CategoricalDtype) for c in ("source", "metric", "unit", "device"))
    assert frame["ts_ns"].is_monotonic_increasing
    pd.testing.assert_frame_equal(counters_frame(rows), frame)
    tracer = Tracer(L.MODEL)
    tracer.add_counters(rows)
    pd.testing.assert_frame_equal(pd.DataFrame(tracer.trace().counters), frame)  # shown for people, same data
    with pytest.raises(TraceSchemaError, match="metric is object, expected category"):
        Trace(counters=frame.astype({"metric": object}))


# ------------------------------------------------------------------------------------------------- round trips

def test_parquet_round_trip(tmp_path):
    trace = _sample_trace()
    out = trace.save(tmp_path / "t")
    assert sorted(p.name for p in out.iterdir()) == ["counters.parquet", "spans.parquet"]
    back = Trace.load(out)
    pd.testing.assert_frame_equal(back.spans, trace.spans)
    pd.testing.assert_frame_equal(back.counters, trace.counters)
    assert back.metadata == json.loads(json.dumps(trace.metadata))
    assert load_trace(out).trace_id == "t-1"
    with pytest.raises(TraceFormatError, match="does not exist"):
        Trace.load(tmp_path / "nope")


def test_parquet_layout_reopens_without_copies(tmp_path):
    """One row group per file, so a reopened int64 column is the Arrow buffer itself (no concatenation), int64
    columns are delta-encoded, categoricals dictionary-encoded; the metadata says which version wrote it."""
    import pyarrow.parquet as pq

    trace = _sample_trace()
    out = trace.save(tmp_path / "t")
    meta = pq.ParquetFile(out / "spans.parquet").metadata
    assert meta.num_row_groups == 1
    names = [meta.schema.column(i).name for i in range(meta.num_columns)]
    encodings = {n: meta.row_group(0).column(i).encodings for i, n in enumerate(names)}
    assert "DELTA_BINARY_PACKED" in encodings["start_ns"] and "RLE_DICTIONARY" in encodings["name"]
    assert orjson.loads(pq.read_schema(out / "spans.parquet").metadata[b"mlms_nb"])["version"] == 2
    back = Trace.load(out)
    start = back.spans["start_ns"].to_numpy()
    assert start.base is not None and not start.flags.owndata  # a view of the Arrow buffer, not a copy


def test_parquet_version_1_traces_still_load(tmp_path):
    """Traces saved before version 2 (attrs as text, pandas' own conversion, 65,536-row groups) reopen the same."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    trace = _sample_trace()
    root = tmp_path / "v1"
    root.mkdir()
    meta = orjson.dumps({"format": "mlms-nb/trace-parquet", "version": 1, "metadata": trace.metadata})
    spans = trace.spans.astype({"attrs": "str"})
    for name, df, extra in (("spans.parquet", spans, {b"mlms_nb": meta}), ("counters.parquet", trace.counters, {})):
        table = pa.Table.from_pandas(df, preserve_index=False)
        table = table.replace_schema_metadata({**table.schema.metadata, **extra})
        pq.write_table(table, root / name, row_group_size=2)
    back = Trace.load(root)
    pd.testing.assert_frame_equal(back.spans, trace.spans)
    pd.testing.assert_frame_equal(back.counters, trace.counters)


def test_chrome_round_trip_is_lossless(tmp_path):
    trace = _sample_trace()
    path = trace.to_chrome(tmp_path / "t.json")
    doc = orjson.loads(path.read_bytes())
    x = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    c = [e for e in doc["traceEvents"] if e["ph"] == "C"]
    assert len(x) == len(trace.spans) and len(c) == 2
    first = x[0]
    assert first["ts"] == 0.0 and isinstance(first["dur"], float) and first["args"]["level"] == "MODEL"
    assert doc["otherData"]["unavailable"] == trace.metadata["unavailable"]
    back = Trace.from_chrome(path)
    pd.testing.assert_frame_equal(back.spans, trace.spans)
    pd.testing.assert_frame_equal(back.counters, trace.counters)
    assert back.metadata == json.loads(json.dumps(trace.metadata))


# ------------------------------------------------------------------------------------------------- real profiles

@pytest.fixture(scope="module")
def kineto_file(tmp_path_factory):
    """The recipe that recorded tests/data/kineto_small.json, run live (scripts/record_fixtures.py)."""
    pytest.importorskip("torch")
    spec = importlib.util.spec_from_file_location("record_fixtures", REPO / "scripts" / "record_fixtures.py")
    recipe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(recipe)
    path = tmp_path_factory.mktemp("kineto") / "trace.json"
    recipe.profile_kineto(path)
    return path


def test_kineto_flops_arg_fills_the_flops_column(kineto_file, tmp_path):
    """torch.profiler(with_flops=True) wrote ``args["flops"]`` in the Kineto JSON of earlier torch releases (2.13
    keeps them in its Python-side events only): the real file with that arg added the same way."""
    raw = orjson.loads(kineto_file.read_bytes())
    for e in raw["traceEvents"]:
        if e.get("name") == "aten::conv2d":
            dims = e["args"]["Input Dims"]
            n, c, h, w = dims[0]
            e["args"]["flops"] = 2 * n * dims[1][0] * h * w * c * dims[1][2] * dims[1][3]  # padding=1: same H, W
    path = tmp_path / "with_flops.json"
    path.write_bytes(orjson.dumps(raw))
    s = Trace.from_chrome(path).spans
    conv = s[s["name"] == "aten::conv2d"].sort_values("start_ns")
    assert conv["flops"].iloc[0] == 2 * (2 * 8 * 32 * 32) * (3 * 3 * 3)
    assert conv["flops"].notna().all() and "flops" not in attrs_dict(conv["attrs"].iloc[0])
    assert s.loc[s["name"] != "aten::conv2d", "flops"].isna().all()


def test_real_kineto_trace_imports_mapped_and_nested(kineto_file, tmp_path):
    trace = Trace.from_chrome(kineto_file)
    s = trace.spans
    raw = orjson.loads(kineto_file.read_bytes())
    assert len(s) == sum(1 for e in raw["traceEvents"] if e.get("ph") == "X")
    assert trace.metadata["source"] == "kineto" and trace.metadata["clock"]["wall_offset_ns"] > 0
    ops = s[s["kind"] == "op"]
    assert len(ops) > 50 and (ops["level"] == "ML_LIBRARY").all()
    ann = s[s["name"] == "predict"]
    assert len(ann) == 3 and (ann["level"] == "FRAMEWORK").all() and (ann["kind"] == "annotation").all()
    ids = dict(zip(s["span_id"], s["name"]))
    parent_name = s["parent_id"].map(lambda p: ids.get(p, ""))
    conv = s[s["name"] == "aten::conv2d"]
    assert len(conv) == 9 and (parent_name[conv.index] == "predict").all()
    assert (parent_name[s["name"] == "aten::convolution"] == "aten::conv2d").all()
    assert conv["shape"].iloc[0].startswith("[[2,3,32,32],[8,3,3,3],[8]")
    assert "Input Dims" not in conv["attrs"].iloc[0] and "External id" not in conv["attrs"].iloc[0]
    ext = {e["args"]["External id"] for e in raw["traceEvents"] if e.get("name") == "aten::conv2d"}
    assert set(conv["external_id"]) == ext and len(ext) == len(conv)  # per-span ids: columns, not attrs
    assert ops["attrs"].nunique() * 3 <= len(ops)  # the 3 predict calls share each op's attrs text
    # children lie within their parents
    merged = s.merge(s[["span_id", "start_ns", "end_ns"]], left_on="parent_id", right_on="span_id",
                     suffixes=("", "_p"))
    assert ((merged["start_ns"] >= merged["start_ns_p"]) & (merged["end_ns"] <= merged["end_ns_p"])).all()
    # profile_memory: counters and each op's net allocation
    assert {"memory.allocated", "memory.reserved"} <= set(trace.counters["metric"])
    assert (conv["memory"] > 0).all()
    # exported again and read back: no loss
    back = Trace.from_chrome(trace.to_chrome(tmp_path / "again.json"))
    pd.testing.assert_frame_equal(back.spans, s)
    pd.testing.assert_frame_equal(back.counters, trace.counters)
    # and through Parquet: the id columns, the categorical attrs, NaN and every dtype come back
    again = Trace.load(trace.save(tmp_path / "kineto_parquet"))
    pd.testing.assert_frame_equal(again.spans, s)
    pd.testing.assert_frame_equal(again.counters, trace.counters)
    # gzip reads the same
    gz = tmp_path / "trace.json.gz"
    gz.write_bytes(gzip.compress(kineto_file.read_bytes()))
    pd.testing.assert_frame_equal(Trace.from_chrome(gz).spans.drop(columns="trace_id"), s.drop(columns="trace_id"))


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_real_onnxruntime_profile_imports(tmp_path):
    torch = pytest.importorskip("torch")
    ort = pytest.importorskip("onnxruntime")
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(),
                                torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(8, 4)).eval()
    x = torch.randn(1, 3, 16, 16)
    onnx_path = tmp_path / "m.onnx"
    torch.onnx.export(model, (x,), str(onnx_path), dynamo=False, input_names=["x"])
    so = ort.SessionOptions()
    so.enable_profiling = True
    so.profile_file_prefix = str(tmp_path / "ort")
    sess = ort.InferenceSession(str(onnx_path), so, providers=["CPUExecutionProvider"])
    for _ in range(2):
        sess.run(None, {"x": x.numpy()})
    prof = sess.end_profiling()
    trace = Trace.from_chrome(prof)
    s = trace.spans
    assert trace.metadata["source"] == "onnxruntime"
    nodes = s[s["kind"] == "layer"]
    assert len(nodes) >= 6 and (nodes["level"] == "FRAMEWORK").all()
    assert "Conv" in set(nodes["layer_type"]) and (nodes["layer_index"] >= 0).all()
    assert not nodes["name"].str.endswith("_kernel_time").any()
    assert nodes["shape"].str.startswith("[{").all() and (nodes["bytes"] > 0).all()
    session = s[s["level"] == "MODEL"]
    assert {"model_run", "session_initialization"} <= set(session["name"])
    ids = dict(zip(s["span_id"], s["name"]))
    assert set(nodes["parent_id"].map(ids)) <= {"SequentialExecutor::Execute", "model_run"}


# ------------------------------------------------------------------------------------------------- bad files

def test_truncated_and_malformed_files_raise_clear_errors(kineto_file, tmp_path):
    data = kineto_file.read_bytes()
    cut = tmp_path / "cut.json"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(TraceFormatError, match=r"cut\.json.*truncated.*inside the event array"):
        Trace.from_chrome(cut)
    cut.write_bytes(data[:-3])
    with pytest.raises(TraceFormatError, match="truncated"):
        Trace.from_chrome(cut)
    cases = {
        "empty.json": b"",
        "object.json": b'{"schemaVersion": 1, "events": []}',
        "scalar.json": b"42",
        "numbers.json": b'{"traceEvents": [1, 2, 3]}',
        "nots.json": b'{"traceEvents": [{"ph": "X", "name": "a", "dur": 1}]}',
        "garbage.json": b'{"traceEvents": [{"ph": "X", "ts": 1, "dur": 2,, "name": "a"}]}',
        "binary.json": bytes(range(256)),
    }
    expect = {"empty.json": "empty", "object.json": "without a \"traceEvents\" array", "scalar.json": "does not start with a JSON object",
              "numbers.json": "not a JSON object", "nots.json": "lacks 'ts'", "garbage.json": "malformed JSON",
              "binary.json": "does not start with a JSON object or array"}
    for name, content in cases.items():
        p = tmp_path / name
        p.write_bytes(content)
        with pytest.raises(TraceFormatError, match=expect[name]) as info:
            Trace.from_chrome(p)
        assert name in str(info.value)
    with pytest.raises(TraceFormatError, match="does not exist"):
        Trace.from_chrome(tmp_path / "missing.json")


# ------------------------------------------------------------------------------------------------- internals

_TRICKY_TEXT = st.text(alphabet=st.sampled_from(list('ab"\\{}[],: \n\t') + ["é", "ü", "漢", "😀", "\x00"]),
                       max_size=12)
_JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-2**63, 2**63 - 1) | st.floats(allow_nan=False, allow_infinity=False)
    | _TRICKY_TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_TRICKY_TEXT, inner, max_size=3), max_leaves=8)
_EVENTS = st.lists(
    st.fixed_dictionaries({"ph": st.sampled_from(["X", "i", "C"]), "name": _TRICKY_TEXT, "ts": st.integers(0, 10**9),
                           "args": st.dictionaries(_TRICKY_TEXT, _JSON_VALUES, max_size=3)})
    | _JSON_VALUES,  # the array may hold any JSON value; the importer, not the stream, rejects non-objects
    max_size=6)


@settings(max_examples=80, derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(events=_EVENTS, top=st.sampled_from(["object", "array", "object, events last"]),
       style=st.sampled_from(["compact", "indented", "spaced", "ascii"]), data=st.data())
def test_stream_parses_what_a_plain_json_parse_does_at_any_block_size(events, top, style, data):
    """Cut anywhere -- inside strings, escapes, multi-byte characters, nested values -- the streamed events and
    the file's skeleton are what one orjson.loads of the whole file gives."""
    if top == "array":
        doc = events
    elif top == "object":
        doc = {"deviceProperties": [{"x": [1]}], "traceEvents": events, "traceName": "t"}
    else:
        doc = {"schemaVersion": 1, "traceEvents": events}
    text = {"compact": lambda d: orjson.dumps(d).decode(), "indented": lambda d: json.dumps(d, indent=2,
                                                                                              ensure_ascii=False),
            "spaced": lambda d: json.dumps(d, separators=(" ,  ", " : "), ensure_ascii=False),
            "ascii": lambda d: json.dumps(d)}[style](doc)
    raw = text.encode()
    block = data.draw(st.integers(1, 16) | st.integers(1, len(raw) + 1), label="block_bytes")
    plain = orjson.loads(raw)
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "s.json")
        with open(path, "wb") as f:
            f.write(raw)
        stream = EventStream(path, block_bytes=block)
        got = [e for chunk in stream for e in chunk]
    assert got == (plain if top == "array" else plain["traceEvents"])
    assert stream.skeleton == ([] if top == "array" else {**plain, "traceEvents": []})
    assert stream.top == ("array" if top == "array" else "object")


@settings(max_examples=200, derandomize=True, deadline=None)
@given(st.lists(st.integers(0, 5), max_size=60), st.lists(st.integers(0, 3), min_size=6, max_size=6))
def test_parts_shared_by_identity_are_numbered_as_by_value(picks, values):
    """Keys handed on as the same objects, or rebuilt equal, or different: numbered exactly as hashing every key's
    contents numbers them (first appearance first)."""
    objects = [(v, (v, v + 1)) for v in values]  # six objects, some of them equal in value
    keys = [objects[k] for k in picks]
    keys = [k if i % 3 else k[:1] + k[1:] for i, k in enumerate(keys)]
    numbers, distinct = shared_part_numbers(keys)
    want_numbers, want_distinct = part_numbers(iter(keys), len(keys))
    assert numbers.tolist() == want_numbers.tolist() and distinct == want_distinct


_INTERVALS = st.lists(st.tuples(st.integers(0, 2), st.integers(0, 60), st.integers(0, 40)), max_size=80)


@settings(max_examples=200, derandomize=True, deadline=None)
@given(_INTERVALS)
def test_containment_parents_match_a_stack_sweep(intervals):
    """Any intervals -- nested, disjoint, partly overlapping, equal -- get the stack sweep's parents."""
    group = np.array([g for g, _, _ in intervals], np.int64)
    start = np.array([s for _, s, _ in intervals], np.int64)
    end = start + np.array([d for _, _, d in intervals], np.int64)
    got = containment_parents(group, start, end)
    np.testing.assert_array_equal(got, containment_parents_reference(group, start, end))
    has = got >= 0
    assert (group[got[has]] == group[has]).all() and (end[got[has]] >= end[has]).all()
    assert (start[got[has]] <= start[has]).all()


def test_generic_chrome_begin_end_and_counters(tmp_path):
    doc = [{"ph": "B", "name": "outer", "pid": 1, "tid": 2, "ts": 0}, {"ph": "X", "name": "leaf", "cat": "misc",
                                                                       "pid": 1, "tid": 2, "ts": 1, "dur": 2},
           {"ph": "E", "pid": 1, "tid": 2, "ts": 10}, {"ph": "C", "name": "mem", "pid": 1, "ts": 5,
                                                       "args": {"used": 10, "free": 5}}]
    p = tmp_path / "g.json"
    p.write_text(json.dumps(doc))
    trace = Trace.from_chrome(p)
    by = _spans_by_name(trace)
    assert by["leaf"].parent_id == by["outer"].span_id
    assert by["outer"].duration_ns == 10_000 and attrs_dict(by["leaf"].attrs) == {"cat": "misc"}
    assert by["leaf"].kind == "other"
    assert sorted(trace.counters["metric"]) == ["mem.free", "mem.used"]
