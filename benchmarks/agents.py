"""Throughput of the same evaluation through the ``inline`` launcher (this process), the ``process`` one (a worker
process per framework, ``isolate=True``) and a local ``dask`` agent (``mlms agent`` on this machine, reached
through ``mlms scheduler`` on loopback), interleaved in one run, and whether their accuracy is identical.

The benchmark starts the scheduler and one agent as subprocesses (the real commands) and stops them at the end.
Each round evaluates the model once per launcher, in a rotating order (so a drift in the machine's load hits all
alike); the figure per launcher and batch size is the median over rounds of the evaluation's ``throughput_per_s``
(single-stream: batch size / mean latency of the timed loop), and the ratio to inline is reported beside the target
(>= 0.95). The wall time of a whole evaluation is printed too: it includes, for process, the worker's start and, for
the agent, the round trips through the scheduler, which the timed loops do not.

Run: ``.venv/bin/python benchmarks/agents.py [--model efficientnet_lite0] [--framework onnxruntime] [--rounds 5]
[--batch-sizes 1,8] [--min-time 2] [--threads 1]`` (an ONNX Runtime run needs the converted artifact: ``mlms convert
efficientnet_lite0 --to onnxruntime``).
"""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import mlms_nb

sys.path.insert(0, str(Path(__file__).resolve().parent))
from launchers import parse_arguments, summarize  # noqa: E402  (the same command line and summary)

LAUNCHERS = ("inline", "process", "dask")


def start(*args: str) -> tuple[subprocess.Popen, str]:
    """``mlms ARGS`` in the background; the process and the address it printed when ready."""
    proc = subprocess.Popen([sys.executable, "-m", "mlms_nb.cli", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    for line in proc.stdout:
        if line.startswith("mlms "):
            return proc, line.split(" at ")[1].split()[0]
    raise RuntimeError(f"mlms {args[0]} ended before it was ready")


def main() -> None:
    args, options = parse_arguments(__doc__)
    scheduler, address = start("scheduler", "--port", "0")
    agent, _ = start("agent", "--scheduler", address, "--name", "bench", "--nthreads", str(args.threads))
    try:
        where = {"inline": {}, "process": {"isolate": True}, "dask": {"on": address, "where": "name=bench"}}
        rows, walls, accuracy = [], {k: [] for k in LAUNCHERS}, {}
        for round_ in range(args.rounds):
            order = LAUNCHERS[round_ % 3:] + LAUNCHERS[:round_ % 3]
            for launcher in order:
                started = time.perf_counter()
                ev = mlms_nb.evaluate(args.model, **where[launcher], **options)
                walls[launcher].append(time.perf_counter() - started)
                assert ev.complete, ev.missing()
                for r in ev.latency.to_dict("records"):
                    rows.append({"launcher": launcher, "round": round_, "batch_size": r["batch_size"],
                                 "throughput_per_s": r["throughput_per_s"], "median_ms": r["median_ms"]})
                preds = ev.predictions[["input_id", "top1", "top1_prob"]].reset_index(drop=True)
                accuracy.setdefault(launcher, []).append((ev.accuracy[["top1", "top5"]].to_dict("records"), preds))
    finally:
        from mlms_nb.fleet.connect import close_all

        close_all()
        for proc in (agent, scheduler):
            proc.terminate()
        for proc in (agent, scheduler):
            proc.wait(timeout=60)
    summarize(args, rows, walls, accuracy, compared=("process", "dask"))


if __name__ == "__main__":
    main()
