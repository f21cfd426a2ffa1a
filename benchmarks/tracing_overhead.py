"""Tracing overhead: mlms-nb's FRAMEWORK and ML_LIBRARY tracing against torch.profiler, on EfficientNet-Lite0 (CPU).

For each batch size, five ways to run the same predictor on the same batch, interleaved round by round
(untraced, mlms-nb FRAMEWORK, torch.profiler, mlms-nb ML_LIBRARY, torch.profiler (shapes), untraced, ...) so drift hits all alike:

- untraced: ``predictor.predict(batch)``;
- mlms-nb FRAMEWORK: the same call with the predictor emitting a MODEL ``predict`` span and its layer spans
  (wrapped layer forwards) into a Tracer;
- torch.profiler: the same call inside ``torch.profiler.profile(record_shapes=True, profile_memory=True)``
  (CPU activity), the profiler kept running across the round like our tracer is;
- mlms-nb ML_LIBRARY: FRAMEWORK plus torch.profiler (CPU activity, ``record_shapes``) for the op spans;
- torch.profiler (shapes): the profiler as ML_LIBRARY runs it, alone: ML_LIBRARY's overhead minus this one is what
  the layer spans add on top of the profiler.

What is timed: each of ``--calls`` calls per way and round, alone (``time.perf_counter_ns`` around
``predict``); the ratio is the round's median latency / the untraced median of the same round. Starting and
stopping a session is outside that: the **post-processing** at the end of a session -- ``stop_tracing()`` for
mlms-nb (layer calls -> spans; at ML_LIBRARY also stopping torch.profiler and Kineto events -> op spans, nested in
their layers) and ``prof.stop()`` for torch.profiler (its own event collection; reading its events would cost
more) -- is timed apart and reported per traced call ("post ms/call"), so it is neither in the ratio nor hidden.
``cpu ratio``: the same comparison on this thread's CPU time (``time.thread_time_ns`` over the calls), which a
loaded machine disturbs less than wall time (it still counts the intra-op pool's spin-waits on this thread).

Reported per way: median latency, median ratio over rounds (min..max), cpu ratio, post-processing; then our
FRAMEWORK overhead as a fraction of torch.profiler's, and ML_LIBRARY's overhead against torch.profiler's
(the targets: FRAMEWORK at most +3 %, ML_LIBRARY at most torch.profiler's overhead).

Run: ``.venv/bin/python benchmarks/tracing_overhead.py [--rounds 7] [--calls 20] [--threads 2] [--batch-sizes 1,8]``.
"""
from __future__ import annotations

import argparse
import time

import numpy as np
import torch
from torch.profiler import ProfilerActivity, profile

from mlms_nb._quiet import quiet
from mlms_nb.manifest import find_manifest
from mlms_nb.frameworks import PredictorOptions, open_predictor
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


def torch_profiler(memory: bool):
    def run(predictor, batch, calls):
        prof = profile(activities=[ProfilerActivity.CPU], record_shapes=True, profile_memory=memory)
        with quiet(label="torch.profiler start"):
            prof.start()
        try:
            median, cpu = timed(predictor.predict, batch, calls)
        finally:
            t0 = time.perf_counter_ns()
            with quiet(label="torch.profiler stop"):
                prof.stop()
            post = time.perf_counter_ns() - t0
        return median, cpu, post / calls
    return run


WAYS = {"untraced": untraced, "mlms-nb FRAMEWORK": ours(TraceLevel.FRAMEWORK),
        "torch.profiler (shapes+memory)": torch_profiler(True), "mlms-nb ML_LIBRARY": ours(TraceLevel.ML_LIBRARY),
        "torch.profiler (shapes)": torch_profiler(False)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch-sizes", default="1,8")
    args = parser.parse_args()
    predictor = open_predictor(find_manifest("efficientnet_lite0", framework="torch"),
                               options=PredictorOptions(threads=args.threads))
    rng = np.random.default_rng(0)
    print(f"EfficientNet-Lite0, torch {torch.__version__}, CPU, {torch.get_num_threads()} threads; {args.rounds} "
          f"interleaved rounds x {args.calls} calls per way; ratio = way's median latency / untraced median, same "
          "round (median over rounds, min..max); cpu ratio = the same on this thread's CPU time; post = the session's "
          "end (stop_tracing / prof.stop()) per traced call, not in the ratios")
    print(f"{'batch':>5}  {'way':<32}{'median ms':>10}  {'ratio (min..max)':>24}  {'cpu ratio':>9}  {'post ms/call':>12}")
    for bs in [int(b) for b in args.batch_sizes.split(",")]:
        batch = rng.standard_normal((bs, 3, 224, 224)).astype(np.float32)
        for _ in range(3):
            predictor.predict(batch)
        runs = {name: [] for name in WAYS}
        names = list(WAYS)
        for r in range(args.rounds):  # each round starts with another way: no way always follows the same one
            for name in names[r % len(names):] + names[:r % len(names)]:
                runs[name].append(WAYS[name](predictor, batch, args.calls))
        base = np.array(runs["untraced"])
        ratio, cpu_ratio = {}, {}
        for name in WAYS:
            r = np.array(runs[name])
            ratio[name], cpu_ratio[name] = r[:, 0] / base[:, 0], r[:, 1] / base[:, 1]
            post = f"{np.median(r[:, 2]) / 1e6:>12.2f}" if name != "untraced" else f"{'-':>12}"
            print(f"{bs:>5}  {name:<32}{np.median(r[:, 0]) / 1e6:>10.2f}  {np.median(ratio[name]):>10.3f} "
                  f"({ratio[name].min():.3f}..{ratio[name].max():.3f})  {np.median(cpu_ratio[name]):>9.3f}  {post}")
        for label, over in (("wall", ratio), ("cpu", cpu_ratio)):
            fw, ml, theirs = (np.median(over[k]) - 1 for k in
                              ("mlms-nb FRAMEWORK", "mlms-nb ML_LIBRARY", "torch.profiler (shapes+memory)"))
            same = np.median(over["torch.profiler (shapes)"]) - 1
            print(f"{bs:>5}  {label:>4}: FRAMEWORK {fw:+.1%} (target <= +3%), {fw / theirs:.2f} of torch.profiler's "
                  f"{theirs:+.1%}; ML_LIBRARY {ml:+.1%} (target <= torch.profiler's {theirs:+.1%}; the profiler "
                  f"as ML_LIBRARY runs it: {same:+.1%})")
        untraced_spread = np.percentile([t for t, _, _ in runs["untraced"]], [25, 75]) / np.median(
            [t for t, _, _ in runs["untraced"]]) - 1
        for name in names[1:]:
            q1, q3 = np.percentile(ratio[name], [25, 75]) - 1
            if q1 <= 0 <= q3:  # an overhead whose rounds straddle zero is noise, whichever sign its median has
                print(f"{bs:>5}  note: {name}'s overhead is inside the noise (rounds' IQR {q1:+.1%}..{q3:+.1%}; the "
                      f"untraced median itself varies {untraced_spread[0]:+.1%}..{untraced_spread[1]:+.1%} over "
                      "rounds): more rounds or calls to resolve it")


if __name__ == "__main__":
    main()
