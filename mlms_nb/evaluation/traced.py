"""The traced pass: the same batch, run again under the tracer at the requested level.

Latency is never taken from a traced run: the untraced sweep (the lowest level that measures it) gives
the latency numbers; this pass gives the timeline, and its own overhead — the median of the traced
``predict`` spans against the untraced median of the same batch.

Levels: APPLICATION (the runner's phases: load, preprocess, each batch size), MODEL (predict and
postprocess per call), FRAMEWORK and ML_LIBRARY (the predictor's layer and op spans), SYSTEM_LIBRARY
(CUDA kernels through CUPTI, where a GPU exists), HARDWARE (perf / PAPI counters read around every call,
psutil and NVML samplers beside them). What is not available here is named, with its reason, in
``trace.metadata["unavailable"]``.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from mlms_nb.evaluation.stats import bootstrap_median_ci
from mlms_nb.profilers.load import MIN_WINDOW_S, is_busy, reading, snapshot

from mlms_nb.schema.levels import TraceLevel
from mlms_nb.tracing.tracer import Tracer, use_tracer

HARDWARE_PROFILERS = ("perf", "papi", "psutil", "nvml")


@dataclass
class TracedPass:
    """One framework's traced pass: the tracer it filled, and one overhead row per batch size."""
    tracer: Tracer
    overhead: list[dict] = field(default_factory=list)


def start_traced_pass(level: TraceLevel, trace_id: str, framework: str) -> TracedPass:
    tracer = Tracer(level, trace_id=trace_id)
    tracer.metadata["framework"] = framework
    tracer.metadata.setdefault("unavailable", {})
    return TracedPass(tracer)


def trace_batches(traced: TracedPass, predictor, postprocess, batches: dict[int, np.ndarray],
                  untraced_median_ns: dict[int, float], repeats: int = 5,
                  untraced_ci_ns: dict[int, tuple[float, float]] | None = None, threads: int | None = None) -> None:
    """Run each batch ``repeats`` times under the tracer; record the overhead against the untraced median, and its
    noise: the half-widths of the two medians' 95% CIs (untraced: ``untraced_ci_ns``; traced: bootstrapped from the
    traced calls) relative to each median, summed, in % (`noise_pct`; NaN when either is unknown), and the machine's
    load over the traced calls (``other_cpu_cores``, ``busy``: :mod:`mlms_nb.profilers.load`, with ``threads``, the
    framework's intra-op threads): an overhead measured on a busy machine is the other programs' as much as the
    tracer's."""
    tracer = traced.tracer
    level = tracer.level
    framework = predictor.framework
    levels = predictor.tracing_levels() if hasattr(predictor, "tracing_levels") else {}
    for name in ("FRAMEWORK", "ML_LIBRARY", "SYSTEM_LIBRARY"):
        if level >= TraceLevel[name] and not _supported(levels.get(name)):
            tracer.metadata["unavailable"][f"{framework} {name}"] = levels.get(name) or "not supported by this predictor"
    profilers = _start_profilers(tracer) if level >= TraceLevel.HARDWARE else None
    kernels = None
    counting = profilers is not None and any(hasattr(p, "read") for p in profilers.profilers.values())
    own_model_span = _supported(levels.get("MODEL"))
    try:
        with use_tracer(tracer):
            predictor.start_tracing(tracer)
            # CUPTI delivers activity buffers to the last client that registered its callbacks: start ours after
            # the framework's profiler (Kineto, in PyTorch) and flush ours before that one stops.
            kernels = _start_cupti(tracer) if level >= TraceLevel.SYSTEM_LIBRARY else None
            try:
                for batch_size, batch in batches.items():
                    with tracer.span(f"{framework} batch size {batch_size}", TraceLevel.APPLICATION, "application",
                                     batch=batch_size):
                        durations = []
                        before = snapshot()
                        for _ in range(repeats):
                            if counting:
                                profilers.read(record=True)
                            t0 = time.perf_counter_ns()
                            if own_model_span:
                                out = predictor.predict(batch)
                            else:
                                with tracer.span("predict", TraceLevel.MODEL, "model", batch=batch_size):
                                    out = predictor.predict(batch)
                            durations.append(time.perf_counter_ns() - t0)
                            if counting:
                                profilers.read(record=True)
                            if postprocess is not None:  # a tensor output has no postprocessing to time
                                with tracer.span("postprocess", TraceLevel.MODEL, "model", batch=batch_size):
                                    postprocess(out)
                    load = reading(before, snapshot(), threads)
                    traced_ns = float(np.median(durations))
                    base = untraced_median_ns.get(batch_size)
                    traced.overhead.append({
                        "framework": framework, "batch_size": int(batch_size), "trace_level": level.name,
                        "untraced_median_ms": base / 1e6 if base else float("nan"),
                        "traced_median_ms": traced_ns / 1e6, "traced_calls": repeats,
                        "overhead_pct": 100.0 * (traced_ns / base - 1.0) if base else float("nan"),
                        "noise_pct": _noise_pct(base, (untraced_ci_ns or {}).get(batch_size), traced_ns, durations),
                        **({} if load is None or load.seconds < MIN_WINDOW_S else  # too short to read: the loop's
                           {"other_cpu_cores": load.other_cpu_cores, "busy": is_busy(load)}),
                    })
            finally:
                if kernels is not None:
                    kernels.stop()
                predictor.stop_tracing()
    finally:
        if kernels is not None:
            _add_kernels(tracer, kernels)
        if profilers is not None:
            profilers.stop()
            tracer.add_counters(profilers.counters())


def _noise_pct(base: float | None, base_ci: tuple[float, float] | None, traced_ns: float, durations: list[int]) -> float:
    """The overhead's noise (%): each median's 95% CI half-width over that median, summed; NaN when unknown."""
    if not base or base_ci is None or len(durations) < 2 or not traced_ns:
        return float("nan")
    low, high = bootstrap_median_ci(np.asarray(durations, dtype=float))
    return 100.0 * ((base_ci[1] - base_ci[0]) / 2 / base + (high - low) / 2 / traced_ns)


def _supported(how: str | None) -> bool:
    return bool(how) and not how.lower().startswith(("not supported", "unavailable", "no "))


def _start_profilers(tracer: Tracer):
    from mlms_nb.profilers import start_profilers

    profilers = start_profilers(list(HARDWARE_PROFILERS))
    for name, reason in profilers.unavailable.items():
        tracer.metadata["unavailable"][name] = reason
    return profilers


def _start_cupti(tracer: Tracer):
    """CUDA kernels, copies and runtime calls (SYSTEM_LIBRARY); None, with the reason noted, where unavailable."""
    from mlms_nb.profilers.cupti import CuptiActivity

    ok, reason = CuptiActivity.available()
    if not ok:
        tracer.metadata["unavailable"]["cupti"] = reason
        return None
    return CuptiActivity().start()


def _add_kernels(tracer: Tracer, kernels) -> None:
    """Attach each record of the (stopped) CUPTI recorder to the layer that launched it (correlation id, else
    time)."""
    from mlms_nb.tracing.cuda_activity import add_to_tracer, attribute_records

    records = kernels.records()
    meta = tracer.metadata["cupti"] = kernels.metadata  # also when there are none: its warning says why
    if records:
        spans = tracer.trace().spans
        layers = spans[spans["kind"] == "layer"]
        add_to_tracer(tracer, records, attribute_records(records, layers), metadata=meta)
