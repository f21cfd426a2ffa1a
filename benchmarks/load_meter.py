"""What reading the machine's load costs a timed loop (issue 37): the claim of mlms_nb.profilers.load is that nothing
runs on the loop's hot path (three snapshots at the edges of the warm-up and the timed loop), so the per-call
latencies a loop reports are the same with and without the meter.

Each round times the same call in two loops of :func:`mlms_nb.evaluation.scenarios.run_scenario`, with and without
a :class:`~mlms_nb.profilers.load.LoadMeter`, in alternating order (so drift hits both alike), and reports the ratio
of their median per-call latencies; then the cost of one snapshot (``/proc/stat`` and this process's tree), which is
paid three times per loop outside the timed window. The call is a real piece of work of a chosen size: a float32
matrix product in numpy (``--size 64``: about 10 µs, the regime where a per-call cost would show).

Run: ``.venv/bin/python benchmarks/load_meter.py [--rounds 15] [--calls 2000] [--size 64]``. Prints the ratio's
median and its min..max over rounds, and the snapshot's median cost in ms (min..max).
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from mlms_nb.evaluation.scenarios import run_scenario
from mlms_nb.options import Timing
from mlms_nb.profilers.load import LoadMeter, snapshot


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--calls", type=int, default=2000, help="timed calls per loop")
    parser.add_argument("--size", type=int, default=64, help="the matrices' side")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    a = rng.standard_normal((args.size, args.size), dtype=np.float32)
    batch = rng.standard_normal((1, args.size, args.size), dtype=np.float32)

    def predict(x):
        return x[0] @ a

    cfg = Timing(warmup=50, min_repeats=args.calls, max_repeats=args.calls, min_time_s=0)
    ratios = []
    for r in range(args.rounds):
        medians = {}
        for metered in ((False, True) if r % 2 == 0 else (True, False)):
            loop = run_scenario("single-stream", predict, batch, cfg, load=LoadMeter() if metered else None)
            medians[metered] = float(np.median(loop.samples_ns))
        ratios.append(medians[True] / medians[False])
    costs = []
    for _ in range(200):
        t0 = time.perf_counter_ns()
        snapshot()
        costs.append((time.perf_counter_ns() - t0) / 1e6)
    print(f"median per-call latency, metered / bare: {statistics.median(ratios):.3f} "
          f"[{min(ratios):.3f}..{max(ratios):.3f}] over {args.rounds} interleaved rounds of {args.calls} calls "
          f"({args.size}x{args.size} float32 matmul, {statistics.median(medians.values()) / 1e3:.1f} µs a call)")
    print(f"one snapshot (3 per loop, outside the timed window): {statistics.median(costs):.2f} ms "
          f"[{min(costs):.2f}..{max(costs):.2f}] over {len(costs)} reads")


if __name__ == "__main__":
    main()
