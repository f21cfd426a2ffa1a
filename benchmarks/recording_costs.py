"""Recording costs: what one tracer span, one hook-style span and one perf-counter read cost on this machine.

The speed claims of mlms_nb.tracing.tracer ("well under a microsecond a span", a disabled level costs one
comparison) and of mlms_nb.profilers.perf_events ("about 4 µs a read for one thread") are measured here, not
asserted in tests. Ways are interleaved round by round so drift hits all alike; each round times ``--spans``
spans per way and reports ns per span (garbage collector as in normal use). The clock is this thread's CPU time
(``time.thread_time_ns``, the work the recording costs; ``--clock wall`` for ``time.perf_counter_ns``): on a
shared machine wall time also counts the time the process waits for a core.

- ``with span, no fields``: ``with tracer.span("layer", FRAMEWORK, "layer"): pass``
- ``with span, 3 fields``: the same with ``layer_index=i, layer_type="Conv2d", flops=1e6``
- ``start/end (hook style)``: ``tracer.end(tracer.start(...))``
- ``add_span (importers)``: ``tracer.add_span(name, level, kind, t0, t1, parent_id=0)``
- ``disabled level``: a MODEL tracer asked for a FRAMEWORK span
- ``perf read()``: one :meth:`PerfEvents.read` on this thread (software events; skipped where perf events are
  not available)

Run: ``.venv/bin/python benchmarks/recording_costs.py [--rounds 7] [--spans 100000] [--clock cpu|wall]``. Prints the median ns per
span (min..max over rounds).
"""
from __future__ import annotations

import argparse
import gc
import statistics
import time

_clock = time.thread_time_ns

from mlms_nb.schema.levels import TraceLevel
from mlms_nb.tracing import Tracer

L = TraceLevel


def _with_span(n: int) -> float:
    tr = Tracer(L.FRAMEWORK)
    span = tr.span
    t0 = _clock()
    for _ in range(n):
        with span("layer", L.FRAMEWORK, "layer"):
            pass
    return (_clock() - t0) / n


def _with_fields(n: int) -> float:
    tr = Tracer(L.FRAMEWORK)
    span = tr.span
    t0 = _clock()
    for i in range(n):
        with span("layer", L.FRAMEWORK, "layer", layer_index=i, layer_type="Conv2d", flops=1e6):
            pass
    return (_clock() - t0) / n


def _start_end(n: int) -> float:
    tr = Tracer(L.FRAMEWORK)
    start, end = tr.start, tr.end
    t0 = _clock()
    for _ in range(n):
        end(start("layer", L.FRAMEWORK, "layer"))
    return (_clock() - t0) / n


def _add_span(n: int) -> float:
    tr = Tracer(L.SYSTEM_LIBRARY)
    add = tr.add_span
    t0 = _clock()
    for i in range(n):
        add("kernel", L.SYSTEM_LIBRARY, "kernel", i, i + 10, parent_id=0)
    return (_clock() - t0) / n


def _disabled(n: int) -> float:
    span = Tracer(L.MODEL).span
    t0 = _clock()
    for _ in range(n):
        with span("layer", L.FRAMEWORK):
            pass
    return (_clock() - t0) / n


WAYS = {"with span, no fields": _with_span, "with span, 3 fields": _with_fields,
        "start/end (hook style)": _start_end, "add_span (importers)": _add_span, "disabled level": _disabled}


def _perf_read_ns(reads: int) -> float | None:
    from mlms_nb.profilers.perf_events import PerfEvents, PerfEventsConfig

    config = PerfEventsConfig(events=("task-clock", "page-faults"), attach_existing_threads=False)
    if not PerfEvents.available(config)[0]:
        return None
    p = PerfEvents(config).start()
    try:
        t0 = _clock()
        for _ in range(reads):
            p.read()
        return (_clock() - t0) / reads
    finally:
        p.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--spans", type=int, default=100_000)
    ap.add_argument("--clock", choices=("cpu", "wall"), default="cpu")
    args = ap.parse_args()
    global _clock
    _clock = time.thread_time_ns if args.clock == "cpu" else time.perf_counter_ns
    results: dict[str, list[float]] = {name: [] for name in WAYS}
    results["perf read()"] = []
    for _ in range(args.rounds):
        for name, way in WAYS.items():
            gc.collect()
            results[name].append(way(args.spans))
        per_read = _perf_read_ns(max(args.spans // 50, 100))
        if per_read is not None:
            results["perf read()"].append(per_read)
    clock = "thread CPU time" if args.clock == "cpu" else "wall time"
    print(f"{args.rounds} interleaved rounds x {args.spans:,} spans per way; {clock} ns per span (per read for "
          f"perf), median (min..max) over rounds")
    for name, values in results.items():
        if not values:
            print(f"{name:<26} not measured: perf events are not available here")
            continue
        print(f"{name:<26} {statistics.median(values):>8.0f} ns  ({min(values):.0f}..{max(values):.0f})")


if __name__ == "__main__":
    main()
