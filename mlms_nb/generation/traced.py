"""The traced generate pass: after the timed loops, one batch per batch size generated again under the tracer, each
step in a MODEL ``predict`` span tagged with its phase (``prefill``, or ``decode`` with its ``step`` k), and at
FRAMEWORK the step model's layer spans inside them (where the step model can trace: ``start_tracing(tracer)`` /
``stop_tracing()``), each tagged with the phase and step of the call it ran in (``attrs["phase"]``,
``attrs["step"]``). Latency never comes from this pass."""
from __future__ import annotations

import json
from typing import Any, Sequence

import numpy as np
import pandas as pd

from mlms_nb.evaluation.traced import start_traced_pass
from mlms_nb.generation.loop import generate_batch
from mlms_nb.schema.levels import TraceLevel
from mlms_nb.tracing.trace import Trace
from mlms_nb.tracing.tracer import use_tracer


class PhaseSpans:
    """A step model whose every call runs in a MODEL ``predict`` span tagged with its phase and step."""

    def __init__(self, step: Any, tracer, batch_size: int):
        self.step, self.tracer, self.batch_size, self.k = step, tracer, batch_size, 0
        self.framework, self.kv_cache, self.vocab_size = step.framework, step.kv_cache, step.vocab_size

    def prefill(self, input_ids: np.ndarray, attention_mask: np.ndarray):
        self.k = 0
        with self.tracer.span("predict", TraceLevel.MODEL, "model", batch=self.batch_size, phase="prefill", step=0,
                              kv_cache=self.kv_cache, framework=self.framework):
            return self.step.prefill(input_ids, attention_mask)

    def decode(self, next_ids: np.ndarray, attention_mask: np.ndarray, state: Any):
        self.k += 1
        with self.tracer.span("predict", TraceLevel.MODEL, "model", batch=self.batch_size, phase="decode",
                              step=self.k, kv_cache=self.kv_cache, framework=self.framework):
            return self.step.decode(next_ids, attention_mask, state)

    def kv_cache_bytes(self, state: Any) -> int:
        return self.step.kv_cache_bytes(state)


def trace_generation(step: Any, prompts: Sequence[np.ndarray], batch_sizes: Sequence[int], max_new_tokens: int,
                     level: TraceLevel, trace_id: str) -> Trace:
    """One traced batch per batch size (see the module); returns the trace with layer spans tagged by phase."""
    traced = start_traced_pass(level, trace_id, step.framework)
    tracer = traced.tracer
    tracer.metadata["generation"] = {"kv_cache": bool(step.kv_cache), "max_new_tokens": int(max_new_tokens)}
    can = hasattr(step, "start_tracing")
    if level >= TraceLevel.FRAMEWORK and not can:
        tracer.metadata["unavailable"][f"{step.framework} FRAMEWORK"] = "this step model records no layer spans"
    with use_tracer(tracer):
        if can and level >= TraceLevel.FRAMEWORK:
            step.start_tracing(tracer)
        try:
            for batch_size in batch_sizes:
                batch = [prompts[i % len(prompts)] for i in range(batch_size)]
                with tracer.span(f"{step.framework} batch size {batch_size}", TraceLevel.APPLICATION, "application",
                                 batch=batch_size):
                    generate_batch(PhaseSpans(step, tracer, batch_size), batch, max_new_tokens)
        finally:
            if can and level >= TraceLevel.FRAMEWORK:
                step.stop_tracing()
    return tag_phases(tracer.trace())


def tag_phases(trace: Trace) -> Trace:
    """Every span inside a phase-tagged ``predict`` span gets its ``phase`` and ``step`` in ``attrs``."""
    spans = trace.spans
    if spans.empty:
        return trace
    attrs = [json.loads(a) if isinstance(a, str) and a else {} for a in spans["attrs"].astype(str)]
    ids, parents = spans["span_id"].to_numpy(), spans["parent_id"].to_numpy()
    phase = {int(i): (a["phase"], a.get("step")) for i, a in zip(ids, attrs) if "phase" in a}
    parent = dict(zip(ids.tolist(), parents.tolist()))
    found: dict[int, Any] = {}

    def of(sid: int):
        seen = []
        while sid and sid not in phase and sid not in found:
            seen.append(sid)
            sid = parent.get(sid, 0)
        result = phase.get(sid) or found.get(sid)
        for s in seen:
            found[s] = result
        return result

    changed = False
    for row, (sid, a) in enumerate(zip(ids.tolist(), attrs)):
        if "phase" not in a:
            tag = of(int(parent.get(sid, 0)))
            if tag:
                a["phase"], a["step"] = tag
                changed = True
    if not changed:
        return trace
    spans = spans.copy()
    spans["attrs"] = pd.Categorical([json.dumps(a, separators=(",", ":")) for a in attrs])
    return Trace(spans, trace.counters, trace.metadata)
