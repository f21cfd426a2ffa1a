"""Generation metrics with MLPerf Inference's definitions, from the loop's per-token stamps.

Per request (arrival = when its batch started in the offline scenario, its Poisson arrival in the server one):

- ``ttft_ms``: time to first token, first token's arrival - request arrival.
- ``latency_ms``: request latency, last token's arrival - request arrival.
- ``tpot_ms``: time per output token, ``(latency - TTFT) / (output tokens - 1)`` (MLPerf); NaN for one token.
  Both terms are stamps of one monotonic clock, so it is never negative (decode is never "generate minus a separately
  timed prefill", optimum-benchmark's negative-throughput bug).
- ``itl_ms``: the inter-token latencies, each token's arrival minus the previous one's.
- ``tokens_per_s``: output tokens / request latency.

Per loop (one row of the ``generation`` frame): each of those as ``median``, ``mean``, ``std``, ``p90`` and ``p99`` by
**nearest rank** (MLPerf's rule: the smallest value with at least p% of the values at or below it) and ``p90_linear``,
``p99_linear`` by linear interpolation (numpy's default, vLLM's benchmark's), and the 95% bootstrap CI of the median
(:func:`mlms_nb.evaluation.stats.bootstrap_median_ci`); total output tokens/s over the loop's wall time; prefill
tokens/s (real prompt tokens, padding excluded, over the prefill's time, per batch); goodput against the TTFT/TPOT
limits the user sets (MLPerf-style: a request counts when it meets every limit set).
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from mlms_nb.evaluation.stats import UNSTABLE_IQR_OVER_MEDIAN, bootstrap_median_ci
from mlms_nb.generation.loop import GenerateTiming
from mlms_nb.options import Timing
from mlms_nb.schema.evaluation import GENERATION_STATISTICS as STATISTICS
from mlms_nb.schema.evaluation import generation_column as column


def nearest_rank(values: np.ndarray, pct: float) -> float:
    """The ``pct`` percentile by nearest rank: the ``ceil(pct/100 * n)``-th smallest value (MLPerf's rule)."""
    x = np.sort(np.asarray(values, dtype=np.float64))
    if x.size == 0:
        return float("nan")
    rank = max(1, math.ceil(pct / 100.0 * x.size))
    return float(x[min(rank, x.size) - 1])


def request_records(timing: GenerateTiming) -> list[dict]:
    """One record per request of a loop: ids, sizes, times (ms from the loop's first arrival) and the metrics."""
    out: list[dict] = []
    if not timing.batches:
        return out
    origin = min(int(arrivals.min()) for _, arrivals in timing.batches)
    for index, (run, arrivals) in enumerate(timing.batches):
        for row, arrival in enumerate(arrivals):
            stamps = run.stamps_ns[row]
            n = int(len(stamps))
            ttft = (int(stamps[0]) - int(arrival)) / 1e6
            latency = (int(stamps[-1]) - int(arrival)) / 1e6
            out.append({
                "request": len(out), "batch": index, "batch_rows": len(arrivals),
                "prompt_tokens": int(run.prompt_tokens[row]), "output_tokens": n,
                "arrival_ms": (int(arrival) - origin) / 1e6, "queue_ms": (run.start_ns - int(arrival)) / 1e6,
                "ttft_ms": ttft, "latency_ms": latency,
                "tpot_ms": (latency - ttft) / (n - 1) if n > 1 else float("nan"),
                "tokens_per_s": n / (latency / 1e3) if latency > 0 else float("nan"),
                "itl_ms": (np.diff(stamps) / 1e6).tolist(),
                "output_ids": run.tokens[row].tolist(),
            })
    return out


def summarize_metric(values, seed: int = 0) -> dict[str, float]:
    """The statistics of one metric's values (NaNs dropped): see :data:`STATISTICS`."""
    x = np.asarray(values, dtype=np.float64)
    x = x[np.isfinite(x)]
    if x.size == 0:
        return {stat: float("nan") for stat in STATISTICS} | {"count": 0}
    low, high = bootstrap_median_ci(x, seed=seed)
    p90l, p99l = np.percentile(x, [90, 99])
    return {"median": float(np.median(x)), "mean": float(x.mean()), "std": float(x.std(ddof=1)) if x.size > 1 else 0.0,
            "p90": nearest_rank(x, 90), "p99": nearest_rank(x, 99), "p90_linear": float(p90l),
            "p99_linear": float(p99l), "ci_low": low, "ci_high": high, "count": int(x.size)}


def generation_row(timing: GenerateTiming, records: list[dict], ttft_limit_ms: float | None = None,
                   tpot_limit_ms: float | None = None, num_layers: int | None = None) -> dict:
    """The generation frame's statistics of one loop (see the module docstring); the caller adds its keys."""
    row: dict = {"requests": len(records), "batches": len(timing.batches), "warmup_calls": int(timing.warmup_calls),
                 "wall_s": timing.wall_ns / 1e9}
    per = {"ttft": [r["ttft_ms"] for r in records], "tpot": [r["tpot_ms"] for r in records],
           "itl": [v for r in records for v in r["itl_ms"]], "latency": [r["latency_ms"] for r in records],
           "tokens_per_s": [r["tokens_per_s"] for r in records]}
    for metric, values in per.items():
        stats = summarize_metric(values)
        for stat in STATISTICS:
            row[column(metric, stat)] = stats[stat]
    itl = np.asarray(per["itl"], dtype=np.float64)
    row["itl_count"] = int(itl.size)
    tpot = np.asarray([v for v in per["tpot"] if math.isfinite(v)], dtype=np.float64)
    if tpot.size:
        q25, q50, q75 = np.percentile(tpot, [25, 50, 75])
        row["tpot_iqr_over_median"] = float((q75 - q25) / q50) if q50 > 0 else float("nan")
    else:
        row["tpot_iqr_over_median"] = float("nan")
    row["unstable"] = bool(row["tpot_iqr_over_median"] > UNSTABLE_IQR_OVER_MEDIAN)
    output_tokens = sum(r["output_tokens"] for r in records)
    row["output_tokens_mean"] = output_tokens / len(records) if records else float("nan")
    row["prompt_tokens_mean"] = float(np.mean([r["prompt_tokens"] for r in records])) if records else float("nan")
    row["output_tokens_per_s"] = output_tokens / (timing.wall_ns / 1e9) if timing.wall_ns > 0 else float("nan")
    prefill = [int(run.prompt_tokens.sum()) / ((run.prefill_end_ns - run.start_ns) / 1e9)
               for run, _ in timing.batches if run.prefill_end_ns > run.start_ns]
    row["prefill_tokens_per_s_median"] = float(np.median(prefill)) if prefill else float("nan")
    peak = max((run.kv_cache_bytes for run, _ in timing.batches), default=0)
    row["kv_cache_peak_bytes"] = int(peak)
    slots = max((len(run.tokens) * run.positions for run, _ in timing.batches if run.kv_cache_bytes == peak),
                default=0)
    row["kv_cache_bytes_per_token_per_layer"] = (peak / slots / num_layers if peak and slots and num_layers
                                                 else float("nan"))
    row["ttft_limit_ms"] = ttft_limit_ms
    row["tpot_limit_ms"] = tpot_limit_ms
    if ttft_limit_ms is not None or tpot_limit_ms is not None:
        good = [r for r in records
                if (ttft_limit_ms is None or r["ttft_ms"] <= ttft_limit_ms)
                and (tpot_limit_ms is None or math.isnan(r["tpot_ms"]) or r["tpot_ms"] <= tpot_limit_ms)]
        row["goodput_fraction"] = len(good) / len(records) if records else float("nan")
        row["goodput_per_s"] = len(good) / (timing.wall_ns / 1e9) if timing.wall_ns > 0 else float("nan")
    else:
        row["goodput_fraction"] = row["goodput_per_s"] = float("nan")
    return row


def generation_note(opts: dict, gen: pd.DataFrame) -> str:
    """How a generate evaluation was measured, in one paragraph (the `Evaluation`'s "Measured" line)."""
    parts = [f"generation: mlms-nb's generate loop, {opts.get('scenario', 'generate')} scenario, at most "
             f"{opts.get('max_new_tokens')} new tokens per request, {opts.get('sampling', 'greedy')}"
             + (f", stop tokens {opts['stop_tokens']}" if opts.get("stop_tokens") else "")]
    if not gen.empty and "requests" in gen:
        lo, hi = int(gen["requests"].min()), int(gen["requests"].max())
        parts.append(f"{lo if lo == hi else f'{lo} to {hi}'} requests per loop")
    rule = Timing.rule(opts)
    if rule:
        parts.append(f"each loop ran {rule.replace('calls', 'batches')}")
    if not gen.empty and "warmup_calls" in gen:
        lo, hi = int(gen["warmup_calls"].min()), int(gen["warmup_calls"].max())
        parts.append(f"after {lo if lo == hi else f'{lo} to {hi}'} untimed batch{'' if hi == 1 else 'es'}")
    threads = opts.get("threads")
    parts.append(f"{threads} threads" if threads else "threads: the framework's default")
    parts.append("TTFT, TPOT = (latency - TTFT) / (output tokens - 1), inter-token latency and request latency "
                 "per request (MLPerf); p90/p99 by nearest rank (MLPerf), *_linear columns interpolated; 95% CI of "
                 "the median by bootstrap; tokens/s total: output tokens / loop wall time; clock "
                 f"{opts.get('clock', 'time.perf_counter_ns')}")
    return "; ".join(parts)
