"""Harness overhead and timing truth: mlms-nb's timed loop against the bare framework, in one process.

1. Throughput ratio (inputs/s through mlms-nb ÷ inputs/s of a bare framework loop) for ONNX Runtime
   and PyTorch at batch 1 and 8, same model (EfficientNet-Lite0), same batch, same threads. The two
   loops are interleaved: rounds alternate A, B, A, B so drift (thermal, other load) hits both alike.
   Target: >= 0.99.
2. Timing truth: mlms-nb's median latency against ``torch.utils.benchmark.Timer`` (PyTorch) and a plain
   ``perf_counter_ns`` ONNX Runtime loop, interleaved the same way. Target: within 3%.

Run: ``.venv/bin/python benchmarks/harness_overhead.py [--rounds 6] [--round-time 1.5] [--threads 2]``.
Prints one table; every figure is the median over rounds with its min..max across rounds.
"""
from __future__ import annotations

import argparse
import time

import numpy as np

from mlms_nb.evaluation.scenarios import run_scenario
from mlms_nb.options import Timing
from mlms_nb.manifest import find_manifest
from mlms_nb.frameworks import PredictorOptions, open_predictor


def bare_onnxruntime(session, batch, seconds: float) -> tuple[float, np.ndarray]:
    """A plain ONNX Runtime loop: (inputs/s over the loop's wall time, per-call ns)."""
    name, outs = session.get_inputs()[0].name, [session.get_outputs()[0].name]
    feeds = {name: batch}
    times = []
    start = time.perf_counter_ns()
    end = start + seconds * 1e9
    while True:
        t0 = time.perf_counter_ns()
        session.run(outs, feeds)
        t1 = time.perf_counter_ns()
        times.append(t1 - t0)
        if t1 >= end and len(times) >= 20:
            break
    wall = time.perf_counter_ns() - start
    return len(times) * batch.shape[0] / (wall / 1e9), np.array(times)


def bare_torch(model, batch, seconds: float) -> tuple[float, np.ndarray]:
    """A plain PyTorch inference loop on a pre-built tensor: (inputs/s, per-call ns)."""
    import torch

    x = torch.from_numpy(batch)
    times = []
    start = time.perf_counter_ns()
    end = start + seconds * 1e9
    with torch.inference_mode():
        while True:
            t0 = time.perf_counter_ns()
            model(x)
            t1 = time.perf_counter_ns()
            times.append(t1 - t0)
            if t1 >= end and len(times) >= 20:
                break
    wall = time.perf_counter_ns() - start
    return len(times) * batch.shape[0] / (wall / 1e9), np.array(times)


def torch_timer_median_ns(model, batch, seconds: float) -> float:
    """torch.utils.benchmark.Timer's median (blocked_autorange) for one forward, in ns."""
    import torch
    import torch.utils.benchmark as tb

    x = torch.from_numpy(batch)
    timer = tb.Timer(stmt="with torch.inference_mode(): model(x)", globals={"model": model, "x": x, "torch": torch},
                     num_threads=torch.get_num_threads())
    return timer.blocked_autorange(min_run_time=seconds).median * 1e9


def mlms_round(predictor, batch, seconds: float) -> tuple[float, float]:
    """One mlms-nb timed loop (single-stream; no warm-up: the model is warm): (inputs/s, median ns)."""
    cfg = Timing(warmup=0, min_repeats=20, min_time_s=seconds)
    result = run_scenario("offline", predictor.predict, batch, cfg)
    return len(result.samples_ns) * batch.shape[0] / (result.wall_ns / 1e9), float(np.median(result.samples_ns))


def spread(values: list[float]) -> str:
    return f"{np.median(values):.4f} ({min(values):.4f}..{max(values):.4f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--round-time", type=float, default=1.5, help="seconds per loop per round")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch-sizes", default="1,8")
    args = parser.parse_args()

    rng = np.random.default_rng(0)
    rows = []
    for fw in ("onnxruntime", "torch"):
        manifest = find_manifest("efficientnet_lite0", framework=fw)
        predictor = open_predictor(manifest, options=PredictorOptions(threads=args.threads))
        if fw == "torch":
            import torch

            torch.set_num_threads(args.threads)
        for b in [int(x) for x in args.batch_sizes.split(",")]:
            batch = rng.standard_normal((b, *manifest.inputs[0].dimensions)).astype(np.float32)
            for _ in range(10):
                predictor.predict(batch)
            ratios, truth = [], []
            for _ in range(args.rounds):
                ours_tput, ours_med = mlms_round(predictor, batch, args.round_time)
                if fw == "onnxruntime":
                    bare_tput, bare_times = bare_onnxruntime(predictor.session, batch, args.round_time)
                    ref_med = float(np.median(bare_times))
                else:
                    bare_tput, _ = bare_torch(predictor.model, batch, args.round_time)
                    ref_med = torch_timer_median_ns(predictor.model, batch, args.round_time)
                ratios.append(ours_tput / bare_tput)
                truth.append(ours_med / ref_med)
            reference = "plain perf_counter loop" if fw == "onnxruntime" else "torch.utils.benchmark.Timer"
            rows.append((fw, b, spread(ratios), spread(truth), reference))
        predictor.close()

    print(f"EfficientNet-Lite0, CPU, {args.threads} threads, {args.rounds} interleaved rounds of {args.round_time}s each")
    print(f"{'framework':<12} {'batch':>5}  {'throughput ratio mlms/bare':<28} {'median ratio mlms/reference':<28} reference")
    for fw, b, ratio, truth, ref in rows:
        print(f"{fw:<12} {b:>5}  {ratio:<28} {truth:<28} {ref}")
    print("ratios: median over rounds (min..max); throughput target >= 0.99, median within 0.97..1.03")


if __name__ == "__main__":
    main()
