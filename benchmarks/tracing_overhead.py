"""Tracing overhead: mlms-nb's FRAMEWORK-level tracing against torch.profiler, on EfficientNet-Lite0 (CPU).

For batch 1 and 8, three ways to run the same predictor on the same batch, interleaved round by round
(untraced, mlms-nb FRAMEWORK, torch.profiler, untraced, ...) so drift hits all alike:

- untraced: ``predictor.predict(batch)``;
- mlms-nb FRAMEWORK: the same call with the predictor emitting layer spans (forward hooks) into a Tracer;
- torch.profiler: the same call inside ``torch.profiler.profile(record_shapes=True, profile_memory=True)``
  (CPU activity), the profiler kept running across the round like our tracer is.

Each round times ``--calls`` calls per way (``time.perf_counter_ns``); the ratio is the round's median latency
÷ the untraced median of the same round. Reported: median ratio over rounds, its min..max, and our overhead
as a fraction of torch.profiler's (target: at most 0.5). Also ML_LIBRARY (hooks + torch.profiler ops) for scale.

Run: ``.venv/bin/python benchmarks/tracing_overhead.py [--rounds 5] [--calls 20] [--threads 2]``.
"""
from __future__ import annotations

import argparse
import time

import numpy as np
import torch
from torch.profiler import ProfilerActivity, profile

from mlms_nb.manifest import find_manifest
from mlms_nb.frameworks import PredictorOptions, open_predictor
from mlms_nb.tracing import Tracer, TraceLevel


def timed(predict, batch, calls: int) -> float:
    """Median ns of ``calls`` calls."""
    times = []
    for _ in range(calls):
        t0 = time.perf_counter_ns()
        predict(batch)
        times.append(time.perf_counter_ns() - t0)
    return float(np.median(times))


def untraced(predictor, batch, calls):
    return timed(predictor.predict, batch, calls)


def ours(level):
    def run(predictor, batch, calls):
        tracer = Tracer(level)
        predictor.start_tracing(tracer)
        try:
            return timed(predictor.predict, batch, calls)
        finally:
            predictor.stop_tracing()
    return run


def torch_profiler(predictor, batch, calls):
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True, profile_memory=True):
        return timed(predictor.predict, batch, calls)


WAYS = {"untraced": untraced, "mlms-nb FRAMEWORK": ours(TraceLevel.FRAMEWORK),
        "torch.profiler (shapes+memory)": torch_profiler, "mlms-nb ML_LIBRARY": ours(TraceLevel.ML_LIBRARY)}


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
          f"interleaved rounds x {args.calls} calls per way; ratio = way's median latency / untraced median, "
          "same round")
    print(f"{'batch':>5}  {'way':<32}{'median ms':>10}  {'ratio (min..max)':>24}")
    for bs in [int(b) for b in args.batch_sizes.split(",")]:
        batch = rng.standard_normal((bs, 3, 224, 224)).astype(np.float32)
        for _ in range(3):
            predictor.predict(batch)
        medians = {name: [] for name in WAYS}
        for _ in range(args.rounds):
            for name, way in WAYS.items():
                medians[name].append(way(predictor, batch, args.calls))
        base = np.array(medians["untraced"])
        ratios = {name: np.array(m) / base for name, m in medians.items()}
        for name in WAYS:
            r = ratios[name]
            print(f"{bs:>5}  {name:<32}{np.median(medians[name]) / 1e6:>10.2f}  "
                  f"{np.median(r):>10.3f} ({r.min():.3f}..{r.max():.3f})")
        ours_over = np.median(ratios["mlms-nb FRAMEWORK"]) - 1
        theirs_over = np.median(ratios["torch.profiler (shapes+memory)"]) - 1
        print(f"{bs:>5}  our FRAMEWORK overhead / torch.profiler overhead = {ours_over:.3f} / {theirs_over:.3f} = "
              f"{ours_over / theirs_over:.2f} (target <= 0.5)")


if __name__ == "__main__":
    main()
