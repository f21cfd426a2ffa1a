"""Throughput of the same evaluation through the ``process`` launcher (``isolate=True``: a worker process per
framework) and the ``inline`` one (this process), interleaved in one run, and whether their accuracy is identical.

Each round evaluates the model once per launcher (the order alternates between rounds, so a drift in the machine's
load hits both alike); the figure per launcher and batch size is the median over rounds of the evaluation's
``throughput_per_s`` (single-stream: batch size / mean latency of the timed loop), and the ratio process / inline
is reported beside the target (>= 0.95). The wall time of a whole evaluation is printed too: it includes the
worker's start (a fresh interpreter importing the framework), which the timed loops do not.

Run: ``.venv/bin/python benchmarks/launchers.py [--model efficientnet_lite0] [--framework onnxruntime]
[--rounds 5] [--batch-sizes 1,8] [--min-time 2] [--threads 1]`` (the model's converted artifact must exist:
``mlms convert efficientnet_lite0 --to onnxruntime``).
"""
from __future__ import annotations

import argparse
import statistics
import time

import pandas as pd

import mlms_nb


def main() -> None:
    args, options = parse_arguments(__doc__)
    rows, walls, accuracy = [], {"inline": [], "process": []}, {}
    for round_ in range(args.rounds):
        order = ("inline", "process") if round_ % 2 == 0 else ("process", "inline")
        for launcher in order:
            started = time.perf_counter()
            ev = mlms_nb.evaluate(args.model, isolate=launcher == "process", **options)
            walls[launcher].append(time.perf_counter() - started)
            assert ev.complete, ev.missing()
            for r in ev.latency.to_dict("records"):
                rows.append({"launcher": launcher, "round": round_, "batch_size": r["batch_size"],
                             "throughput_per_s": r["throughput_per_s"], "median_ms": r["median_ms"]})
            preds = ev.predictions[["input_id", "top1", "top1_prob"]].reset_index(drop=True)
            accuracy.setdefault(launcher, []).append((ev.accuracy[["top1", "top5"]].to_dict("records"), preds))
    summarize(args, rows, walls, accuracy, compared=("process",))


def parse_arguments(doc: str) -> tuple[argparse.Namespace, dict]:
    """The command line of a launcher benchmark, and the evaluate() options every launcher runs with."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--model", default="efficientnet_lite0")
    parser.add_argument("--framework", default="onnxruntime")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batch-sizes", default="1,8")
    parser.add_argument("--min-time", type=float, default=2.0, help="seconds per timed loop")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--limit", type=int, default=20, help="labeled photos scored for accuracy")
    args = parser.parse_args()
    options = dict(framework=args.framework, batch_sizes=args.batch_sizes, dataset="imagenet-samples",
                   limit=args.limit, min_time_s=args.min_time, threads=args.threads, warmup=5, history=False,
                   progress=False)
    return args, options


def summarize(args, rows: list[dict], walls: dict, accuracy: dict, compared: tuple[str, ...]) -> None:
    """Print the medians over rounds per batch size and launcher, each ``compared`` launcher's throughput ratio to
    inline, the spread over rounds, the wall times and whether every run's predictions were identical."""
    frame = pd.DataFrame(rows)
    table = frame.groupby(["batch_size", "launcher"])[["throughput_per_s", "median_ms"]].median().unstack("launcher")
    pd.set_option("display.width", 200)
    print(f"{args.model} in {args.framework}, {args.rounds} interleaved rounds, threads={args.threads}, "
          f"min_time_s={args.min_time}; medians over rounds")
    print(table.to_string(float_format=lambda v: f"{v:.2f}"))
    for launcher in compared:
        ratio = table[("throughput_per_s", launcher)] / table[("throughput_per_s", "inline")]
        for b, value in ratio.items():
            print(f"batch size {b}: throughput {launcher} / inline = {value:.3f} (target >= 0.95)")
    spread = frame.groupby(["batch_size", "launcher"])["throughput_per_s"].agg(lambda s: statistics.pstdev(s))
    print("throughput spread over rounds (population std, inputs/s):", spread.round(2).to_dict())
    print({k: f"evaluation wall time median {statistics.median(v):.2f} s" for k, v in walls.items()})
    first_acc, first_preds = accuracy["inline"][0]
    identical = all(acc == first_acc and preds.equals(first_preds) for runs in accuracy.values()
                    for acc, preds in runs)
    print(f"accuracy {first_acc}: identical predictions (class and probability) in every run of every launcher: "
          f"{identical}")


if __name__ == "__main__":
    main()
