"""CUPTI activity: conversion, clock mapping, layer attribution and tracer output on RECORDED activity records;
the availability reason where there is no GPU; the live path where there is one (CUDA torch)."""
from __future__ import annotations

import json
import shutil
import sys
import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mlms_nb.errors import MlmsError
from mlms_nb.profilers import cupti as cu
from mlms_nb.profilers.cupti import CuptiActivity, CuptiConfig, clock_anchor
from mlms_nb.profilers.cupti_clock import fit_clock
from mlms_nb.profilers.cupti_convert import KindMap, convert_activity
from mlms_nb.tracing import TraceLevel, Tracer
from mlms_nb.tracing.attribution import innermost_enclosing, launching_calls
from mlms_nb.tracing.cuda_activity import RECORD_FIELDS, add_to_tracer, attribute_records, records_frame
from tests.helpers import innermost_enclosing_reference

# --------------------------------------------------------------------------------------------- the fixture
# One batch through a 3-layer model as CUPTI reports it: fields as the cupti-python activity classes name them
# (ActivityKernel*, ActivityMemcpy6, ActivityMemset*, ActivityAPI), times on CUPTI's clock (ns), ``kind`` as the
# ActivityKind name. The anchor pairs CUPTI's clock with perf_counter_ns. Layers are CPU spans on thread 4242
# (and one on another thread), on the perf_counter clock: P = perf time of CUPTI time C.
RECORDED = json.loads("""
{
  "anchor": {"perf_ns": 5000000000, "cupti_ns": 1700000000000000000},
  "layers": [
    {"name": "features",   "start": 50000,  "end": 550000, "thread": 4242},
    {"name": "features.0", "start": 100000, "end": 400000, "thread": 4242},
    {"name": "features.1", "start": 400000, "end": 500000, "thread": 4242},
    {"name": "fc",         "start": 600000, "end": 900000, "thread": 4242},
    {"name": "worker.op",  "start": 605000, "end": 625000, "thread": 5151}
  ],
  "activities": [
    {"kind": "RUNTIME", "cbid": 41,  "start": 20000,  "end": 40000,  "correlation_id": 101, "thread_id": 4242},
    {"kind": "MEMCPY", "copy_kind": 1, "src_kind": 1, "dst_kind": 3, "bytes": 602112, "start": 45000,
     "end": 95000, "correlation_id": 101, "device_id": 0, "context_id": 1, "stream_id": 7},
    {"kind": "RUNTIME", "cbid": 211, "start": 120000, "end": 130000, "correlation_id": 102, "thread_id": 4242},
    {"kind": "CONCURRENT_KERNEL", "name": "_Z23implicit_convolve_sgemmIffLi1024ELi5ELi5ELi3ELi3ELi3ELi1ELb0ELb1ELb1EEviiiPKT_iPS0_S2_18kernel_conv_paramsyiffiS2_S2_ii",
     "start": 140000, "end": 520000, "correlation_id": 102, "device_id": 0, "context_id": 1, "stream_id": 7,
     "grid_x": 98, "grid_y": 2, "grid_z": 1, "block_x": 128, "block_y": 1, "block_z": 1,
     "registers_per_thread": 64, "static_shared_memory": 16384, "dynamic_shared_memory": 0},
    {"kind": "RUNTIME", "cbid": 211, "start": 410000, "end": 415000, "correlation_id": 103, "thread_id": 4242},
    {"kind": "CONCURRENT_KERNEL", "name": "vectorized_elementwise_kernel", "start": 525000, "end": 540000,
     "correlation_id": 103, "device_id": 0, "context_id": 1, "stream_id": 7, "grid_x": 392, "grid_y": 1,
     "grid_z": 1, "block_x": 128, "block_y": 1, "block_z": 1, "registers_per_thread": 16,
     "static_shared_memory": 0, "dynamic_shared_memory": 0},
    {"kind": "DRIVER", "cbid": 307, "start": 610000, "end": 620000, "correlation_id": 104, "thread_id": 4242},
    {"kind": "CONCURRENT_KERNEL", "name": "ampere_sgemm_32x128_tn", "start": 630000, "end": 800000,
     "correlation_id": 104, "device_id": 0, "context_id": 1, "stream_id": 7, "grid_x": 8, "grid_y": 1,
     "grid_z": 1, "block_x": 256, "block_y": 1, "block_z": 1, "registers_per_thread": 120,
     "static_shared_memory": 0, "dynamic_shared_memory": 32768},
    {"kind": "RUNTIME", "cbid": 51, "start": 650000, "end": 655000, "correlation_id": 105, "thread_id": 4242},
    {"kind": "MEMSET", "memory_kind": 3, "bytes": 4096, "value": 0, "start": 660000, "end": 665000,
     "correlation_id": 105, "device_id": 0, "context_id": 1, "stream_id": 7},
    {"kind": "RUNTIME", "cbid": 211, "start": 612000, "end": 615000, "correlation_id": 108, "thread_id": 999},
    {"kind": "CONCURRENT_KERNEL", "name": "splitKreduce_kernel", "start": 700000, "end": 750000,
     "correlation_id": 0, "device_id": 0, "context_id": 1, "stream_id": 13, "grid_x": 1, "grid_y": 1,
     "grid_z": 1, "block_x": 32, "block_y": 1, "block_z": 1, "registers_per_thread": 8,
     "static_shared_memory": 0, "dynamic_shared_memory": 0},
    {"kind": "RUNTIME", "cbid": 165, "start": 900500, "end": 1000000, "correlation_id": 106, "thread_id": 4242},
    {"kind": "RUNTIME", "cbid": 41, "start": 1000100, "end": 1000200, "correlation_id": 107, "thread_id": 4242},
    {"kind": "MEMCPY", "copy_kind": 2, "src_kind": 3, "dst_kind": 1, "bytes": 4000, "start": 1000300,
     "end": 1000400, "correlation_id": 107, "device_id": 0, "context_id": 1, "stream_id": 7},
    {"kind": "CONCURRENT_KERNEL", "name": "incomplete_kernel", "start": 1000500, "end": 0,
     "correlation_id": 0, "device_id": 0, "context_id": 1, "stream_id": 7, "grid_x": 1, "grid_y": 1,
     "grid_z": 1, "block_x": 1, "block_y": 1, "block_z": 1, "registers_per_thread": 8,
     "static_shared_memory": 0, "dynamic_shared_memory": 0}
  ]
}
""")
C0 = RECORDED["anchor"]["cupti_ns"]
P0 = RECORDED["anchor"]["perf_ns"]

# ActivityKind / callback ids as CUPTI defines them (cupti.ActivityKind, RuntimeApiTraceCbid, DriverApiTraceCbid)
ACTIVITY_KIND = {"MEMCPY": 1, "MEMSET": 2, "DRIVER": 4, "RUNTIME": 5, "CONCURRENT_KERNEL": 10}
KIND_MAP = KindMap({1: "memcpy", 2: "memset", 4: "driver", 5: "runtime", 10: "kernel"},
                       {41: "cudaMemcpyAsync", 51: "cudaMemsetAsync", 165: "cudaDeviceSynchronize",
                        211: "cudaLaunchKernel"},
                       {307: "cuLaunchKernel"})


def activities():
    """The fixture as activity objects (attribute access, like cupti-python's classes), times on CUPTI's clock."""
    out = []
    for a in RECORDED["activities"]:
        d = dict(a)
        d["kind"] = ACTIVITY_KIND[a["kind"]]
        d["start"] = C0 + a["start"]
        d["end"] = C0 + a["end"] if a["end"] else 0
        out.append(SimpleNamespace(**d))
    return out


def recorded_profiler(demangle: bool = False) -> CuptiActivity:
    """A CuptiActivity fed the fixture through its buffer-completed path, as CUPTI would feed it."""
    prof = CuptiActivity(CuptiConfig(kinds=("kernel", "memcpy", "memset", "runtime", "driver"), demangle=demangle))
    prof._kind_map = KIND_MAP
    prof.anchor = (P0, C0, 100)
    acts = activities()
    prof._ingest(acts[:7])  # two buffers
    prof._ingest(acts[7:])
    return prof


def layer_tracer(level=TraceLevel.SYSTEM_LIBRARY):
    tracer = Tracer(level, trace_id="cupti-test")
    root = tracer.add_span("predict", TraceLevel.MODEL, "model", P0, P0 + 1_100_000, parent_id=0, thread=4242)
    ids = {}
    for layer in RECORDED["layers"]:
        parent = ids.get("features") if layer["name"].startswith("features.") else root
        ids[layer["name"]] = tracer.add_span(layer["name"], TraceLevel.FRAMEWORK, "layer", P0 + layer["start"],
                                             P0 + layer["end"], parent_id=parent, thread=layer["thread"])
    return tracer, ids


# --------------------------------------------------------------------------------------------- conversion


def test_config_validates_kinds():
    assert CuptiConfig(kinds="kernel").kinds == ("kernel",)
    with pytest.raises(MlmsError, match="unknown CUPTI activity kind.*'kernels'"):
        CuptiConfig(kinds=("kernels",))


def test_records_from_recorded_buffers():
    prof = recorded_profiler()
    recs = prof.records()
    assert prof.dropped == 1  # the kernel CUPTI delivered without an end time
    assert len(recs) == len(RECORDED["activities"]) - 1
    assert [r["start_ns"] for r in recs] == sorted(r["start_ns"] for r in recs)
    by_corr = {}
    for r in recs:
        by_corr.setdefault(r["correlation_id"], []).append(r)
        assert set(RECORD_FIELDS) <= set(r)
        assert r["end_ns"] >= r["start_ns"]
    # times moved onto perf_counter: P0 + (cupti - C0)
    conv = next(r for r in recs if r["kind"] == "kernel" and r["correlation_id"] == 102)
    assert (conv["start_ns"], conv["end_ns"]) == (P0 + 140000, P0 + 520000)
    assert conv["grid"] == (98, 2, 1) and conv["block"] == (128, 1, 1)
    assert conv["device"] == "cuda:0" and conv["stream"] == 7 and conv["thread"] == 0
    assert conv["shared_memory"] == 16384 and conv["registers_per_thread"] == 64 and conv["bytes"] is None
    gemm = next(r for r in recs if r["name"] == "ampere_sgemm_32x128_tn")
    assert gemm["shared_memory"] == 32768
    h2d = next(r for r in recs if r["kind"] == "memcpy" and r["correlation_id"] == 101)
    assert h2d["name"] == "Memcpy HtoD (Pageable -> Device)" and h2d["bytes"] == 602112
    assert h2d["copy_kind"] == "HtoD"
    ms = next(r for r in recs if r["kind"] == "memset")
    assert ms["name"] == "Memset (Device)" and ms["bytes"] == 4096
    launch = next(r for r in recs if r["kind"] == "runtime" and r["correlation_id"] == 102)
    assert launch["name"] == "cudaLaunchKernel" and launch["thread"] == 4242 and launch["device"] == "cpu"
    assert launch["stream"] == -1 and launch["cbid"] == 211
    drv = next(r for r in recs if r["kind"] == "driver")
    assert drv["name"] == "cuLaunchKernel"
    meta = prof.metadata
    assert meta["dropped"] == 1 and meta["clock"]["offset_to_perf_ns"] == P0 - C0


def test_records_frame_types():
    df = records_frame(recorded_profiler().records())
    assert df["start_ns"].dtype == np.int64 and df["correlation_id"].dtype == np.int64
    assert df["bytes"].dtype == np.float64
    assert np.isnan(df.loc[df["kind"] == "kernel", "bytes"]).all()
    assert records_frame([]).empty


def test_unknown_kinds_are_skipped_and_unknown_cbids_named():
    other = SimpleNamespace(kind=99, start=1, end=2, correlation_id=1)
    assert convert_activity(other, KIND_MAP) is None
    api = SimpleNamespace(kind=5, cbid=12345, start=1, end=2, correlation_id=1, thread_id=7)
    assert convert_activity(api, KIND_MAP)[1] == "cudaApi#12345"


def test_kind_map_matches_cupti_python():
    cupti = pytest.importorskip("cupti.cupti")
    km = KindMap.of(cupti)
    for name, value in ACTIVITY_KIND.items():
        assert int(getattr(cupti.ActivityKind, name)) == value
        assert km.kinds[value] == KIND_MAP.kinds[value]
    for cbid, name in KIND_MAP.runtime_names.items():
        assert km.runtime_names[cbid] == name
    assert km.driver_names[307] == "cuLaunchKernel"


def test_demangle_kernel_names():
    if shutil.which("c++filt") is None:
        pytest.skip("c++filt is not on PATH")
    recs = recorded_profiler(demangle=True).records()
    conv = next(r for r in recs if r["kind"] == "kernel" and r["correlation_id"] == 102)
    assert conv["name"].startswith("void implicit_convolve_sgemm<float, float, 1024")
    assert any(r["name"] == "vectorized_elementwise_kernel" for r in recs)  # plain C names stay


def test_clock_anchor_takes_the_tightest_bracket():
    ticks = iter([1000, 2000, 3000])

    def fake():
        return next(ticks)

    perf, c, unc = clock_anchor(fake, tries=3)
    assert c in (1000, 2000, 3000) and unc >= 0 and perf > 0


def tick_clock_profiler(record_calibration: bool = True) -> CuptiActivity:
    """The fixture stamped on a tick clock (2.5 ticks per ns, as when PyTorch's profiler has registered the CPU's
    time-stamp counter as CUPTI's timestamp callback), with the calibration calls made at start and stop; CUPTI's
    own get_timestamp anchor (C0) says nothing about that clock."""
    tid = threading.get_native_id()
    t0 = 9_000_000_000_000

    def tick(perf_offset):  # record time of perf P0 + perf_offset
        return t0 + round(2.5 * perf_offset)

    prof = CuptiActivity(CuptiConfig(kinds=("kernel", "memcpy", "memset", "runtime", "driver")))
    prof._kind_map = KindMap(KIND_MAP.kinds, KIND_MAP.runtime_names, {**KIND_MAP.driver_names, 3: "cuDriverGetVersion"})
    prof.anchor = (P0, C0, 100)
    prof._calibration = {"start": [(P0 - 20_000 + 2_000 * i, P0 - 19_000 + 2_000 * i) for i in range(5)],
                         "stop": [(P0 + 1_100_000 + 2_000 * i, P0 + 1_101_000 + 2_000 * i) for i in range(5)]}
    prof._calibration_threads = {tid}
    prof._calibration_cbid = 3
    acts = []
    for a in RECORDED["activities"]:
        d = dict(a, kind=ACTIVITY_KIND[a["kind"]], start=tick(a["start"]), end=tick(a["end"]) if a["end"] else 0)
        acts.append(SimpleNamespace(**d))
    if record_calibration:
        for p0, p1 in prof._calibration["start"] + prof._calibration["stop"]:
            acts.append(SimpleNamespace(kind=4, cbid=3, start=tick(p0 - P0 + 300), end=tick(p1 - P0 - 300),
                                        correlation_id=0, thread_id=tid))
    prof._ingest(acts)
    return prof


def test_a_tick_clock_is_mapped_by_the_calibration_calls():
    prof = tick_clock_profiler()
    recs = prof.records()
    assert len(recs) == len(RECORDED["activities"]) - 1  # calibration calls are not the user's records
    conv = next(r for r in recs if r["kind"] == "kernel" and r["correlation_id"] == 102)
    assert abs(conv["start_ns"] - (P0 + 140_000)) <= 2 and abs(conv["end_ns"] - (P0 + 520_000)) <= 2
    clock = prof.clock()
    assert clock.how == "calibrated, tick clock" and clock.slope == pytest.approx(0.4)
    meta = prof.metadata
    assert meta["clock"]["mapping"] == "calibrated, tick clock" and meta["clock_check"]["holds"]
    # and attribution works on the mapped times, as with CUPTI's own clock
    tracer, ids = layer_tracer()
    att = attribute_records(recs, tracer.trace().spans.query("kind == 'layer'"))
    assert att.loc[att["correlation_id"] == 102, "layer_name"].tolist() == ["features.0", "features.0"]


def test_without_calibration_records_the_anchor_is_used_and_the_check_says_it_does_not_hold():
    prof = tick_clock_profiler(record_calibration=False)
    assert prof.clock().how == "anchor"
    meta = prof.metadata
    assert meta["clock_check"]["outside_recording"] > 0 and not meta["clock_check"]["holds"]


def test_a_recording_that_got_none_of_its_own_calls_says_its_buffers_were_taken():
    prof = tick_clock_profiler(record_calibration=False)
    with prof._raw_lock:
        prof._raw = []
    assert "another CUPTI client took its activity buffers" in prof.metadata["warning"]
    assert "warning" not in tick_clock_profiler().metadata


def test_fit_clock():
    brackets = [(1_000 + 100 * i, 1_010 + 100 * i) for i in range(5)]
    later = [(b0 + 5_000_000, b1 + 5_000_000) for b0, b1 in brackets]
    ns = fit_clock(brackets, [(b0 + 7, b1 - 1) for b0, b1 in brackets], later, [(b0 + 7, b1 - 1) for b0, b1 in later])
    assert ns.how == "calibrated, ns clock" and ns.slope == 1.0 and abs(ns.to_perf(2_000) - 1_997) <= 1
    shifted = fit_clock(brackets, [(b0 + 10**12, b1 + 10**12) for b0, b1 in brackets], later,
                        [(b0 + 10**12 + 3, b1 + 10**12 + 3) for b0, b1 in later])  # 0.6 ppm of drift: a ns clock
    assert shifted.slope == 1.0 and abs(shifted.to_perf(10**12 + 2_000) - 2_000) <= 2
    ticks = fit_clock(brackets, [(3 * b0, 3 * b1) for b0, b1 in brackets], later, [(3 * b0, 3 * b1) for b0, b1 in later])
    assert ticks.how == "calibrated, tick clock" and ticks.to_perf(3 * 4_000_000) == pytest.approx(4_000_000, abs=2)
    assert fit_clock(brackets, [], later, []) is None  # CUPTI recorded none of the calls
    assert fit_clock(brackets, brackets[:3], later, later) is None  # calls and records do not pair up


# --------------------------------------------------------------------------------------------- attribution


def test_attribution_by_correlation_then_time():
    tracer, ids = layer_tracer()
    layers = tracer.trace().spans
    layers = layers[layers["kind"] == "layer"]
    att = attribute_records(recorded_profiler().records(), layers)
    got = {(r.kind, r.correlation_id, r.name): (r.layer_name, r.attribution) for r in att.itertuples()}

    # the kernel runs past its layer's CPU span: only its launch (correlation 102) ties it to features.0
    assert got[("kernel", 102, att.loc[(att.kind == "kernel") & (att.correlation_id == 102), "name"].item())] == \
        ("features.0", "correlation")
    # by time the ReLU kernel would fall in "features"; its launch inside features.1 says otherwise
    assert got[("kernel", 103, "vectorized_elementwise_kernel")] == ("features.1", "correlation")
    # launched through the driver API
    assert got[("kernel", 104, "ampere_sgemm_32x128_tn")] == ("fc", "correlation")
    assert got[("memset", 105, "Memset (Device)")] == ("fc", "correlation")
    # no launch record: by time containment
    assert got[("kernel", 0, "splitKreduce_kernel")] == ("fc", "time")
    # the input copy: its call ran before any layer and the copy itself lies outside every layer
    assert got[("memcpy", 101, "Memcpy HtoD (Pageable -> Device)")] == ("", "none")
    assert got[("memcpy", 107, "Memcpy DtoH (Device -> Pageable)")] == ("", "none")
    # API calls: the innermost layer on the same thread ...
    assert got[("runtime", 102, "cudaLaunchKernel")] == ("features.0", "cpu")
    assert got[("driver", 104, "cuLaunchKernel")] == ("fc", "cpu")  # not worker.op: another thread
    # ... or on any thread when the call's thread has no layers (thread 999 -> the innermost overall)
    assert got[("runtime", 108, "cudaLaunchKernel")] == ("worker.op", "cpu")
    assert got[("runtime", 106, "cudaDeviceSynchronize")] == ("", "none")
    # ids are the tracer's
    row = att[(att.kind == "kernel") & (att.correlation_id == 104)].iloc[0]
    assert row.layer_span_id == ids["fc"]
    assert (att.loc[att.attribution == "none", "layer_span_id"] == 0).all()
    assert list(att["start_ns"]) == sorted(att["start_ns"])  # rows stay in the order given


def test_attribution_without_layers_or_records():
    recs = recorded_profiler().records()
    empty_layers = Tracer(TraceLevel.FRAMEWORK).trace().spans
    att = attribute_records(recs, empty_layers)
    assert (att["attribution"] == "none").all() and (att["layer_span_id"] == 0).all()
    tracer, _ = layer_tracer()
    assert attribute_records([], tracer.trace().spans).empty


def _nested(intervals):
    """The intervals that keep the family properly nested (each pair disjoint or one inside the other)."""
    kept: list[tuple[int, int]] = []
    for a, b in sorted(set(intervals), key=lambda iv: (iv[0], -iv[1])):
        if all(b <= x or y <= a or (x <= a and b <= y) for x, y in kept):
            kept.append((a, b))
    return kept


@settings(max_examples=150, derandomize=True, deadline=None)
@given(layers=st.lists(st.tuples(st.integers(0, 100), st.integers(1, 60)), max_size=40).map(
           lambda v: _nested([(a, a + d) for a, d in v])),
       queries=st.lists(st.tuples(st.integers(0, 120), st.integers(0, 30)), min_size=1, max_size=20))
def test_innermost_matches_a_brute_force_search(layers, queries):
    """Layers properly nested (as a model's are): each query gets the innermost layer containing it, or -1."""
    ls = np.array([a for a, _ in layers], np.int64)
    le = np.array([b for _, b in layers], np.int64)
    qs = np.array([a for a, _ in queries], np.int64)
    qe = qs + np.array([d for _, d in queries], np.int64)
    got = innermost_enclosing(np.zeros(len(ls), np.int64), ls, le, np.zeros(len(qs), np.int64), qs, qe)
    want = innermost_enclosing_reference(ls, le, qs, qe)
    assert [(ls[i], le[i]) if i >= 0 else None for i in got] == [(ls[i], le[i]) if i >= 0 else None for i in want]


def test_launching_calls_prefer_the_runtime_call_over_the_driver_call_beneath_it():
    assert list(launching_calls([5, 7, 7, 9], [7, 9, 8, 5], call_rank=[0, 1, 0, 0])) == [2, 3, -1, 0]
    assert list(launching_calls([7, 7], [7])) == [0] and list(launching_calls([], [7])) == [-1]
    # cudaLaunchKernel in layer "a" calls cuLaunchKernel, which ran while the inner layer "b" was open; CUPTI
    # gives both the kernel's correlation id. The kernel belongs to the runtime call's layer and span.
    tracer = Tracer(TraceLevel.SYSTEM_LIBRARY)
    a = tracer.add_span("a", TraceLevel.FRAMEWORK, "layer", 0, 100, parent_id=0, thread=1)
    b = tracer.add_span("b", TraceLevel.FRAMEWORK, "layer", 40, 60, parent_id=a, thread=1)
    base = dict.fromkeys(RECORD_FIELDS)
    recs = [{**base, "kind": "driver", "name": "cuLaunchKernel", "start_ns": 45, "end_ns": 55, "correlation_id": 7,
             "thread": 1},
            {**base, "kind": "runtime", "name": "cudaLaunchKernel", "start_ns": 30, "end_ns": 70, "correlation_id": 7,
             "thread": 1},
            {**base, "kind": "kernel", "name": "k", "start_ns": 80, "end_ns": 200, "correlation_id": 7,
             "device": "cuda:0", "stream": 7}]
    spans = tracer.trace().spans
    att = attribute_records(recs, spans[spans["kind"] == "layer"])
    assert list(att["layer_span_id"]) == [b, a, a] and list(att["attribution"]) == ["cpu", "cpu", "correlation"]
    ids = add_to_tracer(tracer, att)
    parents = tracer.trace().spans.set_index("span_id")["parent_id"]
    assert parents[ids[2]] == ids[1]  # the kernel hangs under cudaLaunchKernel, not cuLaunchKernel


# --------------------------------------------------------------------------------------------- tracer output


def test_add_to_tracer_links_kernels_to_their_launch_and_layer():
    tracer, ids = layer_tracer()
    layers = tracer.trace().spans
    att = attribute_records(recorded_profiler().records(), layers[layers["kind"] == "layer"])
    prof_meta = {"kinds": ["kernel"], "dropped": 1}
    new = add_to_tracer(tracer, att, metadata=prof_meta)
    assert len(new) == len(att) and all(new)
    trace = tracer.trace()
    s = trace.spans.set_index("span_id")
    assert trace.metadata["cupti"] == prof_meta
    sys_spans = s[s["level"] == "SYSTEM_LIBRARY"]
    assert len(sys_spans) == len(att)
    assert set(sys_spans["kind"].astype(str)) == {"kernel", "memcpy", "memset", "runtime"}

    def span_of(kind, corr):
        i = att.index[(att.kind == kind) & (att.correlation_id == corr)][0]
        return new[i], s.loc[new[i]]

    # kernel -> its cudaLaunchKernel span -> the layer
    kid, kernel = span_of("kernel", 102)
    lid, launch = span_of("runtime", 102)
    assert kernel["parent_id"] == lid and launch["parent_id"] == ids["features.0"]
    assert kernel["device"] == "cuda:0" and kernel["stream"] == 7 and kernel["thread"] == 7
    assert launch["device"] == "cpu" and launch["thread"] == 4242 and launch["stream"] == -1
    assert kernel["start_ns"] == P0 + 140000 and kernel["duration_ns"] == 380000
    a = json.loads(kernel["attrs"])
    assert a["grid"] == [98, 2, 1] and a["block"] == [128, 1, 1] and "correlation_id" not in a
    assert kernel["correlation"] == launch["correlation"] == 102  # the id column joins them in pandas
    assert a["layer_span_id"] == ids["features.0"] and a["registers_per_thread"] == 64
    # driver-launched kernel -> the cuLaunchKernel span (kind runtime, api=driver)
    _, gemm = span_of("kernel", 104)
    did, drv = span_of("driver", 104)
    assert gemm["parent_id"] == did and drv["kind"] == "runtime" and json.loads(drv["attrs"])["api"] == "driver"
    # memcpy: bytes column; unattributed -> its launch, itself a root
    _, h2d = span_of("memcpy", 101)
    rid, rt = span_of("runtime", 101)
    assert h2d["bytes"] == 602112.0 and h2d["kind"] == "memcpy" and h2d["parent_id"] == rid
    assert rt["parent_id"] == 0
    _, mset = span_of("memset", 105)
    assert mset["bytes"] == 4096.0
    # no launch record: the layer directly
    _, split = span_of("kernel", 0)
    assert split["parent_id"] == ids["fc"] and split["stream"] == 13
    assert split["correlation"] == -1  # CUPTI's 0: no correlation
    assert np.isnan(kernel["bytes"])


def test_add_to_tracer_link_layer_and_disabled_level():
    tracer, ids = layer_tracer()
    layers = tracer.trace().spans
    att = attribute_records(recorded_profiler().records(), layers[layers["kind"] == "layer"])
    new = add_to_tracer(tracer, att.drop(columns=["layer_span_id"]), att, link="layer")
    s = tracer.trace().spans.set_index("span_id")
    k = new[att.index[(att.kind == "kernel") & (att.correlation_id == 103)][0]]
    assert s.loc[k, "parent_id"] == ids["features.1"]
    # plain records, no attribution: roots
    t2 = Tracer(TraceLevel.FULL)
    ids2 = add_to_tracer(t2, recorded_profiler().records())
    assert (t2.trace().spans["parent_id"] == 0).sum() == sum(
        1 for r in recorded_profiler().records() if r["kind"] in ("runtime", "driver")) + 1  # + the unlaunched kernel
    assert all(ids2)
    # a tracer below SYSTEM_LIBRARY records nothing
    t3 = Tracer(TraceLevel.FRAMEWORK)
    assert add_to_tracer(t3, att) == [0] * len(att) and len(t3) == 0
    with pytest.raises(MlmsError, match="entries for"):
        add_to_tracer(t3, att, [1, 2])
    with pytest.raises(MlmsError, match="link must be"):
        add_to_tracer(t3, att, link="stream")


# --------------------------------------------------------------------------------------------- availability


def _gpu_here() -> bool:
    ok, _ = CuptiActivity.available()
    return ok


def test_available_gives_a_reason_here():
    ok, reason = CuptiActivity.available()
    assert isinstance(ok, bool) and reason.strip()
    if ok:
        assert "CUPTI" in reason and "kernel" in reason
        return
    try:
        import cupti.cupti  # noqa: F401
    except ImportError:
        assert "cupti-python" in reason and "mlms-nb[gpu]" in reason
        return
    # cupti-python is installed but there is no NVIDIA driver / GPU in this VM: the library's load error
    assert reason.startswith("CUPTI cannot run here") or "no CUDA device" in reason
    assert "libcuda" in reason or "driver" in reason


def test_available_without_cupti_python_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "cupti", None)
    ok, reason = CuptiActivity.available()
    assert not ok
    assert "cupti-python" in reason and "pip install 'mlms-nb[gpu]'" in reason


def test_one_recorder_at_a_time(monkeypatch):
    other = CuptiActivity()
    monkeypatch.setattr(cu, "_active", other)
    fake = SimpleNamespace(ActivityKind=SimpleNamespace(**{k: v for k, v in ACTIVITY_KIND.items()}))
    monkeypatch.setattr(cu, "import_cupti", lambda: fake)
    with pytest.raises(MlmsError, match="already recording"):
        CuptiActivity().start()


def test_start_and_stop_make_the_calibration_calls_with_driver_records_on_only_for_them(monkeypatch):
    calls = []
    enabled: list[int] = []
    fake = SimpleNamespace(
        ActivityKind=SimpleNamespace(**ACTIVITY_KIND), ActivityThreadIdType=SimpleNamespace(SYSTEM=1),
        ActivityFlag=SimpleNamespace(FLUSH_FORCED=1), activity_register_callbacks=lambda a, b: None,
        set_thread_id_type=lambda t: None, get_timestamp=time.perf_counter_ns,
        activity_enable=enabled.append, activity_disable=enabled.remove,
        activity_flush_all=lambda flag: calls.append("flush"))
    driver = SimpleNamespace(cuDriverGetVersion=lambda: calls.append(sorted(enabled)) or (0, 13000))
    monkeypatch.setattr(cu, "import_cupti", lambda: fake)
    monkeypatch.setattr(cu, "_driver_module", lambda: driver)
    monkeypatch.setattr(cu.KindMap, "of", classmethod(lambda cls, c: KindMap(
        KIND_MAP.kinds, KIND_MAP.runtime_names, {3: "cuDriverGetVersion"})))
    monkeypatch.setattr(cu, "_sync_current_context", lambda: None)
    prof = CuptiActivity(CuptiConfig(kinds=("kernel", "runtime"))).start()
    assert enabled == [10, 5]  # the driver kind is off again after the calibration calls
    prof.stop()
    assert enabled == [] and not prof.errors
    assert calls.pop(0) == "flush"  # another client's buffers go back to it before our callbacks are registered
    assert calls.pop(-1) == "flush"
    assert len(calls) == 10 and all(4 in on for on in calls)  # 5 at start, 5 at stop, each with driver records on
    assert [len(prof._calibration[w]) for w in ("start", "stop")] == [5, 5]
    assert prof._calibration["start"][-1][1] <= prof._calibration["stop"][0][0]
    assert prof._calibration_threads == {threading.get_native_id()} and prof._calibration_cbid == 3


# --------------------------------------------------------------------------------------------- live (GPU)


@pytest.mark.skipif(not _gpu_here(), reason=f"CUPTI cannot run here: {CuptiActivity.available()[1]}")
def test_live_kernels_are_attributed_to_torch_layers():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA")
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3), torch.nn.ReLU(), torch.nn.Flatten(),
                                torch.nn.Linear(16 * 30 * 30, 10)).cuda().eval()
    x_cpu = torch.randn(4, 3, 32, 32)
    with torch.no_grad():
        model(x_cpu.cuda())  # warm up: cuDNN/cuBLAS handles, lazy module loading
    torch.cuda.synchronize()

    tracer = Tracer(TraceLevel.SYSTEM_LIBRARY)
    tokens = {}
    for name, mod in model.named_children():
        mod.register_forward_pre_hook(lambda m, a, n=name: tokens.__setitem__(
            n, tracer.start(n, TraceLevel.FRAMEWORK, "layer", layer_type=type(m).__name__)))
        mod.register_forward_hook(lambda m, a, o, n=name: tracer.end(tokens.pop(n)) and None)  # None: keep o

    prof = CuptiActivity(CuptiConfig(kinds=("kernel", "memcpy", "memset", "runtime")))
    prof.start()
    try:
        with torch.no_grad(), tracer.span("predict", TraceLevel.MODEL, "model"):
            x = x_cpu.cuda()
            y = model(x)
            torch.cuda.synchronize()
    finally:
        prof.stop()
    recs = prof.records()
    assert prof.metadata["dropped"] == 0
    kinds = {r["kind"] for r in recs}
    assert {"kernel", "memcpy", "runtime"} <= kinds, kinds
    h2d = [r for r in recs if r["kind"] == "memcpy" and r["copy_kind"] == "HtoD"]
    assert any(r["bytes"] == x_cpu.numel() * 4 for r in h2d)
    spans = tracer.trace().spans
    predict = spans[spans["name"] == "predict"].iloc[0]
    for r in recs:  # the clock mapping puts CUPTI's records inside the run (a few us of slack)
        assert predict["start_ns"] - 50_000 <= r["start_ns"] <= r["end_ns"] <= predict["end_ns"] + 50_000, r
    layers = spans[spans["kind"] == "layer"]
    att = attribute_records(recs, layers)
    kern = att[att["kind"] == "kernel"]
    assert len(kern) >= 3
    assert set(kern.loc[kern["attribution"] == "correlation", "layer_name"]) >= {"0", "3"}  # conv, linear
    assert (kern["attribution"] != "none").all()
    launch_threads = set(att.loc[att["kind"] == "runtime", "thread"])
    assert threading.get_native_id() in launch_threads  # SYSTEM thread ids: the same as the tracer's
    ids = add_to_tracer(tracer, att, metadata=prof.metadata)
    t = tracer.trace()
    s = t.spans.set_index("span_id")
    k = s.loc[[i for i, kd in zip(ids, att["kind"]) if kd == "kernel"]]
    assert (k["level"] == "SYSTEM_LIBRARY").all() and k["device"].astype(str).str.startswith("cuda:").all()
    assert y.shape == (4, 10)
