"""Tracing overhead: mlms-nb's FRAMEWORK and ML_LIBRARY tracing against torch.profiler, on EfficientNet-Lite0 (CPU).

On this 2-core machine the untraced latency itself jumps between regimes (15.5 ms and 24 ms at batch 1 with two
threads, each lasting seconds: the second core is taken by the host), so a ratio of medians taken seconds apart
measures the machine, not the tracer. Three measurements, each interleaved as finely as the way allows:

**FRAMEWORK, paired call by call.** Two predictors of the same manifest (same weights, same options); one traces
into a FRAMEWORK Tracer (layer spans from timed layer calls, the MODEL ``predict`` span), its twin does not. Their
calls alternate (traced, untraced, untraced, traced, ...), so neighbouring calls see the same machine; the ratio is
the traced calls' median latency / the untraced calls' median. Each round runs both ways round (either predictor
traced), the order changing every round, and takes the geometric mean of the two ratios: two copies of a model can
differ in speed by a percent or two (their memory), which then cancels within the round (swapping the roles from one
round to the next left it in the median of an odd number of rounds). ``all-in`` adds the session's end
(``stop_tracing()``: recorded calls -> spans) per traced call to the traced median: everything FRAMEWORK tracing
costs a call. ``build`` is what turning those spans into the trace's frames (``tracer.trace()``) then costs per
traced call, reported beside it. ``--against REVISION`` measures the LayerHooks of an earlier revision the same way,
in the same rounds (today's and the earlier one in turn): before and after in one run.

**ML_LIBRARY's layer spans on top of the profiler, paired too.** The same alternation with the traced predictor at
ML_LIBRARY: torch.profiler is process-wide, so both calls are profiled and the ratio is what the layer spans add
on top of it (the profiler itself is then compared session by session, below).

**Sessions, in short interleaved blocks.** torch.profiler is process-wide (a twin would be profiled too), so these
ways are compared session by session, each session short (``--block`` timed calls after :data:`WARMUP_CALLS`
untimed ones) and the ways' sessions interleaved block by block, in a rotating order:

- untraced: ``predictor.predict(batch)``;
- mlms-nb FRAMEWORK: the same call tracing into a FRAMEWORK Tracer (the session-level figure of the paired one);
- torch.profiler (shapes+memory): the call inside ``torch.profiler.profile(record_shapes=True,
  profile_memory=True)`` (CPU activity);
- mlms-nb ML_LIBRARY: FRAMEWORK plus torch.profiler (CPU activity, ``record_shapes``, without the values of scalar
  arguments) for the op spans;
- torch.profiler (shapes, no values): the profiler as ML_LIBRARY runs it, alone (input shapes, not the values of
  scalar arguments): ML_LIBRARY's overhead minus this one is what the layer spans add on top of the profiler.

A block's ratio is the way's median latency / the untraced median of the same block; a way's figure is the median
over all blocks (IQR beside it). Starting and stopping a session is outside the timed calls: the **post-processing**
at the end -- ``stop_tracing()`` for mlms-nb (at ML_LIBRARY also stopping torch.profiler and Kineto events -> op
spans, nested in their layers) and ``prof.stop()`` for torch.profiler (its own event collection; reading its
events would cost more) -- is timed apart and reported per traced call ("post ms/call"), so it is neither in the
ratio nor hidden. ``cpu ratio``: the same comparison on this thread's CPU time (``time.thread_time_ns``).

Targets (issue 25): FRAMEWORK at most +3 % all-in; ML_LIBRARY at most torch.profiler's (shapes+memory) overhead.

Run: ``.venv/bin/python benchmarks/tracing_overhead.py [--rounds 7] [--calls 40] [--block 5] [--threads 2]
[--batch-sizes 1,8] [--against REVISION]``: per round, ``--calls`` paired calls per role and ``--calls`` timed calls per
session way (in ``--calls // --block`` blocks).
"""
from __future__ import annotations

import argparse
import contextlib
import subprocess
import time
import types
from pathlib import Path

import numpy as np
import torch
from torch.profiler import ProfilerActivity, profile

from mlms_nb._quiet import quiet
from mlms_nb.manifest import find_manifest
from mlms_nb.frameworks import PredictorOptions, open_predictor
from mlms_nb.frameworks.torch.ops import record_concrete_inputs
from mlms_nb.tracing import Tracer, TraceLevel


WARMUP_CALLS = 3
"""Untimed calls at the start of each way's session: the first calls after another way's session ended (a
profiler's buffers freed, the allocator's pages given back) are slower whichever way runs them."""


def timed(predict, batch, calls: int) -> tuple[float, float]:
    """(median ns of ``calls`` calls, this thread's CPU ns per call), after :data:`WARMUP_CALLS` untimed calls."""
    for _ in range(WARMUP_CALLS):
        predict(batch)
    times = []
    cpu0 = time.thread_time_ns()
    for _ in range(calls):
        t0 = time.perf_counter_ns()
        predict(batch)
        times.append(time.perf_counter_ns() - t0)
    return float(np.median(times)), (time.thread_time_ns() - cpu0) / calls


def untraced(predictor, batch, calls):
    return (*timed(predictor.predict, batch, calls), 0.0)


def ours(level):
    def run(predictor, batch, calls):
        tracer = Tracer(level)
        predictor.start_tracing(tracer)
        try:
            median, cpu = timed(predictor.predict, batch, calls)
        finally:
            t0 = time.perf_counter_ns()
            predictor.stop_tracing()
            post = time.perf_counter_ns() - t0
        return median, cpu, post / calls
    return run


def torch_profiler(memory: bool, values: bool = True):
    def run(predictor, batch, calls):
        prof = profile(activities=[ProfilerActivity.CPU], record_shapes=True, profile_memory=memory)
        record_concrete_inputs(values)
        with quiet(label="torch.profiler start"):
            prof.start()
        try:
            median, cpu = timed(predictor.predict, batch, calls)
        finally:
            t0 = time.perf_counter_ns()
            with quiet(label="torch.profiler stop"):
                prof.stop()
            post = time.perf_counter_ns() - t0
            record_concrete_inputs(True)
        return median, cpu, post / calls
    return run


WAYS = {"untraced": untraced, "mlms-nb FRAMEWORK": ours(TraceLevel.FRAMEWORK),
        "torch.profiler (shapes+memory)": torch_profiler(True), "mlms-nb ML_LIBRARY": ours(TraceLevel.ML_LIBRARY),
        "torch.profiler (shapes, no values)": torch_profiler(False, values=False)}


def paired(traced, twin, batch, calls: int, level: TraceLevel = TraceLevel.FRAMEWORK
           ) -> tuple[float, float, float, float]:
    """One round of ``level`` tracing on ``traced`` against its untraced ``twin``, calls alternating (each pair in
    turn led by either): (traced median / untraced median, the same on CPU time, stop_tracing() and then
    tracer.trace() per traced call, each as a fraction of an untraced call). At ML_LIBRARY torch.profiler, process-wide, records the twin's calls too: the
    ratio is then what the layer spans add on top of the profiler (and the session's end also converts the twin's
    ops)."""
    tracer = Tracer(level)
    traced.start_tracing(tracer)
    wall = {True: [], False: []}
    cpu = {True: [], False: []}
    try:
        for _ in range(WARMUP_CALLS):
            traced.predict(batch)
            twin.predict(batch)
        for k in range(2 * calls):
            is_traced = (k % 4) in (0, 3)  # T U U T T U U T: neither role always goes first
            predict = traced.predict if is_traced else twin.predict
            c0 = time.thread_time_ns()
            t0 = time.perf_counter_ns()
            predict(batch)
            wall[is_traced].append(time.perf_counter_ns() - t0)
            cpu[is_traced].append(time.thread_time_ns() - c0)
    finally:
        t0 = time.perf_counter_ns()
        traced.stop_tracing()
        post = (time.perf_counter_ns() - t0) / (calls + WARMUP_CALLS)
    t0 = time.perf_counter_ns()
    tracer.trace()
    build = (time.perf_counter_ns() - t0) / (calls + WARMUP_CALLS)
    base = float(np.median(wall[False]))
    return (float(np.median(wall[True])) / base, float(np.median(cpu[True]) / np.median(cpu[False])),
            post / base, build / base)


def both_ways(first, second, batch, calls: int, level: TraceLevel = TraceLevel.FRAMEWORK) -> tuple:
    """:func:`paired` with ``first`` traced, then with ``second`` traced: the ratios' geometric means (a copy's own
    speed cancels) and the session ends' mean costs."""
    a, b = paired(first, second, batch, calls, level), paired(second, first, batch, calls, level)
    return (float(np.sqrt(a[0] * b[0])), float(np.sqrt(a[1] * b[1])), (a[2] + b[2]) / 2, (a[3] + b[3]) / 2)


def earlier_layer_hooks(revision: str):
    """``LayerHooks`` as mlms_nb/frameworks/torch/tracing.py defines it at git ``revision`` (loaded as a module of
    its own, beside today's)."""
    source = subprocess.run(["git", "show", f"{revision}:mlms_nb/frameworks/torch/tracing.py"], check=True,
                            capture_output=True, text=True, cwd=Path(__file__).resolve().parent).stdout
    module = types.ModuleType(f"tracing_at_{revision}")
    exec(compile(source, f"tracing.py@{revision}", "exec"), module.__dict__)
    return module.LayerHooks


@contextlib.contextmanager
def layer_hooks(hooks):
    """Predictors started inside use ``hooks`` (None: today's) for their layer spans."""
    from mlms_nb.frameworks.torch import tracing

    today = tracing.LayerHooks
    tracing.LayerHooks = hooks or today
    try:
        yield
    finally:
        tracing.LayerHooks = today


def spread(values) -> str:
    q1, q3 = np.percentile(values, [25, 75])
    return f"{np.median(values):.3f} [{q1:.3f}..{q3:.3f}]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=40)
    parser.add_argument("--block", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch-sizes", default="1,8")
    parser.add_argument("--against", metavar="REVISION", help="also measure FRAMEWORK, paired and in the same "
                        "rounds, with the LayerHooks of mlms_nb/frameworks/torch/tracing.py at this git revision (one "
                        "that runs against today's package): before and after in one run")
    args = parser.parse_args()
    earlier = None if args.against is None else earlier_layer_hooks(args.against)
    manifest = find_manifest("efficientnet_lite0", framework="torch")
    twins = [open_predictor(manifest, options=PredictorOptions(threads=args.threads)) for _ in range(2)]
    predictor = twins[0]
    rng = np.random.default_rng(0)
    blocks = max(1, args.calls // args.block)
    print(f"EfficientNet-Lite0, torch {torch.__version__}, CPU, {torch.get_num_threads()} threads; {args.rounds} "
          f"rounds. Paired: {args.calls} traced calls alternating with {args.calls} untraced calls of a twin "
          f"predictor, each predictor traced in turn per round; ratio = traced median / untraced median, geometric "
          f"mean of the round's two (median [IQR] over rounds). Sessions: {blocks} blocks of {args.block} timed "
          "calls per way and round, ways interleaved block by block; ratio = way's median / untraced median of the "
          "same block (median [IQR] over blocks). post = the session's end (stop_tracing / prof.stop()) per traced "
          "call, not in the ratios")
    for bs in [int(b) for b in args.batch_sizes.split(",")]:
        batch = rng.standard_normal((bs, 3, 224, 224)).astype(np.float32)
        for p in twins:
            for _ in range(3):
                p.predict(batch)
        pairs, on_profiler = [], []
        runs = {name: [] for name in WAYS}
        names = list(WAYS)
        before = []  # FRAMEWORK paired with --against's LayerHooks, in the same rounds
        for r in range(args.rounds):
            first, second = twins[r % 2], twins[1 - r % 2]
            if earlier is None:
                pairs.append(both_ways(first, second, batch, args.calls))
            else:  # today's and the earlier LayerHooks in turn, either one first
                for which in ((False, True) if r % 2 else (True, False)):
                    with layer_hooks(earlier if which else None):
                        (before if which else pairs).append(both_ways(first, second, batch, args.calls))
            on_profiler.append(both_ways(first, second, batch, args.calls, TraceLevel.ML_LIBRARY)[:2])
            for b in range(blocks):  # each block starts with another way: no way always follows the same one
                k = r * blocks + b
                for name in names[k % len(names):] + names[:k % len(names)]:
                    runs[name].append(WAYS[name](predictor, batch, args.block))
        pairs, on_profiler = np.array(pairs), np.array(on_profiler)
        wall, cpu, post, build = pairs[:, 0], pairs[:, 1], pairs[:, 2], pairs[:, 3]
        print(f"\n{bs:>5}  FRAMEWORK, paired call by call ({args.rounds} rounds): ratio {spread(wall)}, cpu ratio "
              f"{spread(cpu)}, post {np.median(post):.1%} of an untraced call; all-in {spread(wall + post)}; "
              f"building the trace's frames then {np.median(build):.1%} more")
        if before:
            b = np.array(before)
            print(f"{bs:>5}  FRAMEWORK with LayerHooks at {args.against}, paired in the same rounds: ratio "
                  f"{spread(b[:, 0])}, cpu ratio {spread(b[:, 1])}, post {np.median(b[:, 2]):.1%}; all-in "
                  f"{spread(b[:, 0] + b[:, 2])}")
        print(f"{bs:>5}  ML_LIBRARY's layer spans on top of torch.profiler, paired (both calls profiled): ratio "
              f"{spread(on_profiler[:, 0])}, cpu ratio {spread(on_profiler[:, 1])}")
        print(f"{bs:>5}  {'way (sessions)':<32}{'median ms':>10}  {'ratio [IQR]':>22}  {'cpu ratio':>9}  "
              f"{'post ms/call':>12}")
        base = np.array(runs["untraced"])
        ratio, cpu_ratio = {}, {}
        for name in WAYS:
            r = np.array(runs[name])
            ratio[name], cpu_ratio[name] = r[:, 0] / base[:, 0], r[:, 1] / base[:, 1]
            post_ms = f"{np.median(r[:, 2]) / 1e6:>12.2f}" if name != "untraced" else f"{'-':>12}"
            print(f"{bs:>5}  {name:<32}{np.median(r[:, 0]) / 1e6:>10.2f}  {spread(ratio[name]):>22}  "
                  f"{np.median(cpu_ratio[name]):>9.3f}  {post_ms}")
        fw_all_in = np.median(wall + post) - 1
        for label, over in (("wall", ratio), ("cpu", cpu_ratio)):
            ml, theirs = (np.median(over[k]) - 1 for k in ("mlms-nb ML_LIBRARY", "torch.profiler (shapes+memory)"))
            same = np.median(over["torch.profiler (shapes, no values)"]) - 1
            fw = fw_all_in if label == "wall" else np.median(cpu) - 1
            print(f"{bs:>5}  {label:>4}: FRAMEWORK {fw:+.1%} {'all-in, paired' if label == 'wall' else 'paired'} "
                  f"(target <= +3%); ML_LIBRARY {ml:+.1%} (target <= torch.profiler's {theirs:+.1%}; the profiler "
                  f"as ML_LIBRARY runs it: {same:+.1%})")
        untraced_ms = base[:, 0] / 1e6
        q = np.percentile(untraced_ms, [0, 25, 75, 100])
        print(f"{bs:>5}  the machine: untraced block medians {q[0]:.2f} / {q[1]:.2f} / {q[2]:.2f} / {q[3]:.2f} ms "
              "(min / q1 / q3 / max)")
        for name in names[1:]:
            q1, q3 = np.percentile(ratio[name], [25, 75]) - 1
            if q1 <= 0 <= q3:  # an overhead whose blocks straddle zero is noise, whichever sign its median has
                print(f"{bs:>5}  note: {name}'s overhead is inside the noise (blocks' IQR {q1:+.1%}..{q3:+.1%}): "
                      "more rounds or calls to resolve it")
        q1, q3 = np.percentile(wall, [25, 75]) - 1
        if q1 <= 0 <= q3:
            print(f"{bs:>5}  note: the paired FRAMEWORK overhead is inside the noise (rounds' IQR {q1:+.1%}..{q3:+.1%})")


if __name__ == "__main__":
    main()
