"""Layer latency beside the divergence, taken from the FRAMEWORK-level trace the predictor itself records.

Each framework's opened predictor runs one untraced warm-up call, then ``repeats`` calls traced at FRAMEWORK
level (:func:`traced_calls`, as the runner's traced pass does). The layer spans of that trace are read by
:func:`mlms_nb.analyses.layers.layer_calls` -- the function behind ``ev.layers("latency")`` -- and each span's
**self time** is added to the divergence row of the point it stands for (:meth:`LayerCapture.layer_keys`,
:func:`~mlms_nb.divergence.align.attribute_latency`). A row that one layer span lands on therefore shows exactly
that layer's ``self_median_ms`` of ``layers(trace, "latency")``; a row that several land on (a fused or
unaligned op) shows the median of their per-call sum.

ONNX Runtime runs an *optimised* graph: a fused node (``Conv`` + ``Clip`` -> ``FusedConv``, a MatMul + Add -> Gemm, an
NCHWc ``Conv`` named ``<tensor>_nchwc``, ...) may carry no module scope in its name. Its span records the original
nodes it stands for (``attrs["original_nodes"]``, :mod:`mlms_nb.frameworks.onnxruntime.graph_map`); the span's time
goes to the point of the *last* of them in execution order -- the node whose output the fused node produces -- so it
lands on that layer's row instead of being lost in the unattributed time (:func:`fused_keys`; the report says how
many spans were keyed this way).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import orjson
import pandas as pd

from mlms_nb.analyses.layers import layer_calls
from mlms_nb.divergence.align import attribute_latency
from mlms_nb.frameworks.base import Predictor
from mlms_nb.frameworks.capture import LayerCapture, Point
from mlms_nb.schema.levels import TraceLevel
from mlms_nb.schema.spans import attrs_dict
from mlms_nb.tracing.trace import Trace
from mlms_nb.tracing.tracer import Tracer, use_tracer


def traced_calls(predictor: Predictor, x: np.ndarray, repeats: int, label: str) -> Trace:
    """One untraced warm-up call of ``x`` (NCHW; transposed for an NHWC model), then ``repeats`` calls traced at
    FRAMEWORK level into a trace of their own (``metadata["framework"]`` = ``label``)."""
    if predictor.manifest.inputs[0].layout == "NHWC":
        x = np.ascontiguousarray(x.transpose(0, 2, 3, 1))
    predictor.predict(x)
    tracer = Tracer(TraceLevel.FRAMEWORK)
    tracer.metadata["framework"] = label
    predictor.start_tracing(tracer)
    try:
        with use_tracer(tracer):
            for _ in range(repeats):
                predictor.predict(x)
    finally:
        predictor.stop_tracing()
    return tracer.trace()


def row_latency(trace: Trace, capture: LayerCapture, points: Sequence[Point], rows: Sequence[Point]
                ) -> tuple[dict[int, np.ndarray], np.ndarray, np.ndarray]:
    """Per traced call (ns): ``({row index: self time of the layers attributed to it}, the rest of the call,
    the whole predict call)``; the rest is time outside every layer span plus layers no row takes."""
    spans = trace.spans
    calls = layer_calls(spans)
    attrs = spans.set_index("span_id")["attrs"]
    frame = calls.assign(attrs=attrs.reindex(calls["span_id"].to_numpy()).to_numpy())
    frame = frame.sort_values(["repetition", "layer_index"], kind="stable", ignore_index=True)
    keys, _ = fused_keys(frame, capture, points)
    reps = int(frame["repetition"].max()) + 1
    rep = frame["repetition"].to_numpy()
    self_ns = frame["self_ns"].to_numpy(float)
    durations: dict = {}
    for key, r, ns in zip(keys, rep, self_ns):
        durations.setdefault(key, np.zeros(reps))[r] += ns
    total = frame.drop_duplicates("repetition").sort_values("repetition")["predict_duration_ns"].to_numpy(float)
    outside = total - np.bincount(rep, weights=self_ns, minlength=reps)
    durations[None] = durations.get(None, np.zeros(reps)) + outside
    per_row, unattributed = attribute_latency(points, rows, capture.keys, durations)
    return per_row, unattributed, total


def fused_keys(frame: pd.DataFrame, capture: LayerCapture, points: Sequence[Point]) -> tuple[list, dict[str, int]]:
    """The point of each layer span (``frame``: one row per span with its ``attrs``): the capture's own key, except
    for a span that records the original nodes it stands for (an optimised ONNX Runtime node): the point, among
    theirs, that comes last in execution order. Returns (keys, counts: ``fused`` spans standing for several original
    nodes, ``rekeyed`` spans whose point the original nodes gave and the name alone did not, ``unkeyed`` spans that
    still have no point)."""
    keys = list(capture.layer_keys(frame))
    counts = {"fused": 0, "rekeyed": 0, "unkeyed": 0}
    position = {p.key: p.position for p in points}
    last_of: dict[tuple, object] = {}  # original nodes -> the last of their points (None: none has one)
    for i, text in enumerate(frame["attrs"]):
        nodes = tuple(attrs_dict(text).get("original_nodes") or ()) if text else ()
        if nodes:
            counts["fused"] += len(nodes) > 1
            if nodes not in last_of:
                named = pd.DataFrame({"attrs": [orjson.dumps({"onnx_node": n}).decode() for n in nodes]})
                known = [k for k in capture.layer_keys(named) if k in position]
                last_of[nodes] = max(known, key=position.__getitem__) if known else None
            if last_of[nodes] is not None:
                counts["rekeyed"] += keys[i] not in position
                keys[i] = last_of[nodes]
        counts["unkeyed"] += keys[i] not in position
    return keys, counts


def how_measured(predictor: Predictor, repeats: int, trace: Trace | None = None, capture: LayerCapture | None = None,
                 points: Sequence[Point] = ()) -> str:
    """A sentence on how a framework's layer latencies were measured; with its ``trace``, ``capture`` and ``points``,
    what happened to the spans of fused nodes (ONNX Runtime's optimised graph) too."""
    text = (f"self time of the FRAMEWORK layer spans its predictor records ({predictor.tracing_levels()['FRAMEWORK']})"
            f", median over {repeats} traced calls at batch 1 after one untraced warm-up: what "
            f"layers(trace, 'latency') reports (self_median_ms); a row sums the layers aligned to it")
    if trace is None or capture is None:
        return text
    layers = trace.spans[trace.spans["kind"] == "layer"]
    if layers.empty or not layers["attrs"].astype(str).str.contains('"original_nodes"').any():
        return text
    _, counts = fused_keys(layers[["attrs"]].reset_index(drop=True), capture, points)
    calls = max(int(repeats), 1)
    level = trace.metadata.get("onnxruntime.graph", {}).get("graph_optimization_level", "")
    return (f"{text}; the graph ran optimised (level {level!r}): a node standing for several original nodes (fused) is "
            f"timed on the row of the last of them, its output ({counts['fused'] // calls} fused nodes per call; "
            f"{counts['rekeyed'] // calls} placed only by their original nodes, {counts['unkeyed'] // calls} with no "
            "layer of the model, counted as unattributed)")
