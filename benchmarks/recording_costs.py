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
- ``torch layer call: LayerHooks``: what tracing adds to one call of a layer module at FRAMEWORK level
  (:class:`~mlms_nb.frameworks.torch.tracing.LayerHooks` on a chain of pass-through modules fed a 1x32x56x56
  tensor), the untraced chain's time per module subtracted in the same round; ``--spans // 10`` calls. With
  the compiled layer call (mlms_nb.frameworks.torch.native; ``MLMS_NATIVE=0`` for the Python one) this is
  negative: the traced call runs a C function where the untraced one runs torch's Python ``Module._call_impl``,
  and that saves more than the clock reads and the record cost (-270 ns against +430 ns for the Python call)
- ``torch layer call: global hooks``: the same with torch's global module pre/post hooks doing nothing but
  appending a clock read (the design LayerHooks replaced: every module leaves ``Module.__call__``'s fast path)
- ``torch layer span: flush``: turning one recorded layer call into its span when tracing stops (not on the hot
  path; reported so that it is not hidden)

Run: ``.venv/bin/python benchmarks/recording_costs.py [--rounds 7] [--spans 100000] [--clock cpu|wall]``. Prints the median ns per
span (min..max over rounds). The torch ways need the ``torch`` extra.
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


def _torch_chain(modules: int = 50):
    import torch

    class Pass(torch.nn.Module):
        """A layer that runs no op, so that a call costs only what calling and tracing it cost. Not a plain
        ``return input``: mlms_nb.frameworks.torch.layers takes a module whose forward is exactly that for a
        pass-through, not a layer (nn.Identity), and the chain would record nothing."""

        def forward(self, input):
            output = input
            return output

    chain = torch.nn.Sequential(*[Pass() for _ in range(modules)])
    return torch, chain, torch.zeros(1, 32, 56, 56)


def _chain_ns(torch, chain, x, calls: int) -> float:
    """ns per module call of ``calls`` passes through ``chain``."""
    with torch.inference_mode():
        t0 = _clock()
        for _ in range(calls):
            chain(x)
        return (_clock() - t0) / calls / len(chain)


def _torch_wrapped(n: int) -> float:
    from mlms_nb.frameworks.torch.tracing import LayerHooks

    torch, chain, x = _torch_chain()
    calls = max(n // 10 // len(chain), 1)
    bare = _chain_ns(torch, chain, x, calls)
    hooks = LayerHooks(chain, Tracer(L.FRAMEWORK))
    try:
        traced = _chain_ns(torch, chain, x, calls)
    finally:
        hooks.remove()
    return traced - bare


def _torch_global_hooks(n: int) -> float:
    from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook

    torch, chain, x = _torch_chain()
    calls = max(n // 10 // len(chain), 1)
    bare = _chain_ns(torch, chain, x, calls)
    stamps: list[int] = []
    stamp, perf = stamps.append, time.perf_counter_ns
    pre = register_module_forward_pre_hook(lambda module, args: stamp(perf()))
    post = register_module_forward_hook(lambda module, args, output: stamp(perf()))
    try:
        traced = _chain_ns(torch, chain, x, calls)
    finally:
        pre.remove()
        post.remove()
    return traced - bare


def _torch_flush(n: int) -> float:
    from mlms_nb.frameworks.torch.tracing import LayerHooks

    torch, chain, x = _torch_chain()
    calls = max(n // 10 // len(chain), 1)
    tracer = Tracer(L.FRAMEWORK)
    hooks = LayerHooks(chain, tracer)
    _chain_ns(torch, chain, x, calls)
    t0 = _clock()
    hooks.remove()
    return (_clock() - t0) / len(tracer)


WAYS = {"with span, no fields": _with_span, "with span, 3 fields": _with_fields,
        "start/end (hook style)": _start_end, "add_span (importers)": _add_span, "disabled level": _disabled,
        "torch layer call: LayerHooks": _torch_wrapped, "torch layer call: global hooks": _torch_global_hooks,
        "torch layer span: flush": _torch_flush}


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
            print(f"{name:<34} not measured: perf events are not available here")
            continue
        print(f"{name:<34} {statistics.median(values):>8.0f} ns  ({min(values):.0f}..{max(values):.0f})")


if __name__ == "__main__":
    main()
