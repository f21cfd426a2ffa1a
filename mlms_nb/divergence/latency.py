"""Layer latency beside the divergence, taken from the FRAMEWORK-level trace the predictor itself records.

Each framework's opened predictor runs one untraced warm-up call, then ``repeats`` calls traced at FRAMEWORK
level (:func:`traced_calls`, as the runner's traced pass does). The layer spans of that trace are read by
:func:`mlms_nb.analyses.layers.layer_calls` -- the function behind ``ev.layers("latency")`` -- and each span's
**self time** is added to the divergence row of the point it stands for (:meth:`LayerCapture.layer_keys`,
:func:`~mlms_nb.divergence.align.attribute_latency`). A row that one layer span lands on therefore shows exactly
that layer's ``self_median_ms`` of ``layers(trace, "latency")``; a row that several land on (a fused or
unaligned op) shows the median of their per-call sum.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from mlms_nb.analyses.layers import layer_calls
from mlms_nb.divergence.align import attribute_latency
from mlms_nb.frameworks.base import Predictor
from mlms_nb.frameworks.capture import LayerCapture, Point
from mlms_nb.schema.levels import TraceLevel
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
    keys = capture.layer_keys(frame)
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


def how_measured(predictor: Predictor, repeats: int) -> str:
    """A sentence on how a framework's layer latencies were measured."""
    return (f"self time of the FRAMEWORK layer spans its predictor records ({predictor.tracing_levels()['FRAMEWORK']})"
            f", median over {repeats} traced calls at batch 1 after one untraced warm-up: what "
            f"layers(trace, 'latency') reports (self_median_ms); a row sums the layers aligned to it")
