"""Latency statistics: what one timed loop's samples say, with their spread and how sure we are.

Every key carries its unit in its name (``_ms``, ``_per_s``). Percentiles use numpy's default linear
interpolation. The median's 95% confidence interval is a percentile bootstrap (2000 resamples, seeded, so
the same samples always give the same interval). ``unstable`` flags loops whose interquartile range is
more than 10% of the median: such numbers move between runs and comparisons on them need care.

Per-input scores (metrics against targets): :func:`summarize` gives their mean, standard deviation and the 95%
confidence interval of the mean (Student's t, :func:`t975`).
"""
from __future__ import annotations

import math
from typing import Any, Mapping

import numpy as np

from mlms_nb._bootstrap import CI_LEVEL, median_ci
from mlms_nb._bootstrap import RESAMPLES as BOOTSTRAP_RESAMPLES
from mlms_nb.display import is_missing, is_set
from mlms_nb.errors import MlmsError
from mlms_nb.options import spell
from mlms_nb.profilers.load import LoadReading, describe, threads_suggestion

UNSTABLE_IQR_OVER_MEDIAN = 0.1
QUIET_WAIT_SUGGESTED_S = 60


class MeasurementError(MlmsError, ValueError):
    """Latency samples that cannot be summarised (none at all, negative or not finite)."""


def _as_ns(samples_ns: Any, what: str = "latency samples") -> np.ndarray:
    arr = np.asarray(samples_ns)
    if arr.ndim != 1:
        arr = arr.reshape(-1)
    if arr.size == 0:
        raise MeasurementError(f"no {what}: the timed loop recorded no calls, so there is nothing to summarise")
    if not np.issubdtype(arr.dtype, np.number) or np.issubdtype(arr.dtype, np.complexfloating):
        raise MeasurementError(f"{what} must be numbers of nanoseconds, got dtype {arr.dtype}")
    arr = arr.astype(np.float64)
    if not np.all(np.isfinite(arr)):
        raise MeasurementError(f"{what} contain NaN or infinite values; expected nanoseconds from a clock")
    if np.any(arr < 0):
        raise MeasurementError(f"{what} contain negative durations ({arr.min():.0f} ns); expected nanoseconds >= 0")
    return arr


def bootstrap_median_ci(samples: np.ndarray, resamples: int = BOOTSTRAP_RESAMPLES, level: float = CI_LEVEL,
                        seed: int = 0) -> tuple[float, float]:
    """Percentile-bootstrap confidence interval of the median, in the samples' unit (order statistics drawn
    directly, in O(resamples): see :mod:`mlms_nb._bootstrap`). Seeded: the same samples give the same interval."""
    if np.asarray(samples).size == 0:
        raise MeasurementError("no samples to bootstrap")
    return median_ci(samples, resamples=resamples, level=level, seed=seed)


def latency_stats(samples_ns: np.ndarray, batch_size: int, wall_ns: int | None = None, seed: int = 0) -> dict:
    """Summarise one timed loop's per-call latencies (nanoseconds) at ``batch_size`` inputs per call.

    Returns ``samples`` (calls timed), ``mean_ms``, ``median_ms``, ``p90_ms``, ``p99_ms``, ``min_ms``,
    ``max_ms``, ``std_ms`` (sample standard deviation, ddof=1; 0 for one sample), ``iqr_ms`` (p75 - p25),
    ``median_ci_low_ms`` / ``median_ci_high_ms`` (95% bootstrap CI of the median, 2000 resamples, seeded),
    ``throughput_per_s``, ``iqr_over_median`` and ``unstable`` (``iqr_over_median > 0.1``).

    ``throughput_per_s`` is inputs per second: ``batch_size / mean latency`` for closed loops
    (single-stream, server), or, when ``wall_ns`` (the loop's wall time) is given, ``samples * batch_size /
    wall time``, which also counts the harness's time between calls (the offline scenario passes it).
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
        raise MeasurementError(f"batch_size: expected a positive integer, got {batch_size!r}")
    ns = _as_ns(samples_ns)
    ms = ns / 1e6
    n = int(ms.size)
    p25, median, p75, p90, p99 = np.percentile(ms, [25, 50, 75, 90, 99])
    mean = float(ms.mean())
    iqr = float(p75 - p25)
    ci_low, ci_high = bootstrap_median_ci(ms, seed=seed)
    if wall_ns is not None:
        if wall_ns <= 0:
            raise MeasurementError(f"wall_ns: expected the loop's positive wall time in nanoseconds, got {wall_ns}")
        throughput = n * int(batch_size) / (wall_ns / 1e9)
    else:
        throughput = int(batch_size) / (mean / 1e3) if mean > 0 else float("inf")
    if median > 0:
        ratio = iqr / float(median)
    else:
        ratio = 0.0 if iqr == 0 else float("inf")
    return {
        "samples": n,
        "mean_ms": mean,
        "median_ms": float(median),
        "p90_ms": float(p90),
        "p99_ms": float(p99),
        "min_ms": float(ms.min()),
        "max_ms": float(ms.max()),
        "std_ms": float(ms.std(ddof=1)) if n > 1 else 0.0,
        "iqr_ms": iqr,
        "median_ci_low_ms": ci_low,
        "median_ci_high_ms": ci_high,
        "throughput_per_s": float(throughput),
        "iqr_over_median": float(ratio),
        "unstable": bool(ratio > UNSTABLE_IQR_OVER_MEDIAN),
    }


def _getter(row: Mapping[str, Any]):
    return row.get if hasattr(row, "get") else (lambda key, default=None: getattr(row, key, default))


def _where(get) -> str:
    """``"<framework>, batch size <b>[, <scenario> scenario]: "`` as far as the row names them."""
    where = []
    if not is_missing(get("framework", None)):
        where.append(str(get("framework")))
    if not is_missing(get("batch_size", None)):
        where.append(f"batch size {int(get('batch_size'))}")
    scenario = get("scenario", None)
    if not is_missing(scenario) and scenario != "single-stream":
        where.append(f"{scenario} scenario")
    return (", ".join(where) + ": ") if where else ""


def _spread(get, ratio, over: str = "calls") -> str:
    median = get("median_ms", None)
    samples = get("samples", None)
    detail = f"the interquartile range is {float(ratio):.0%} of the median"
    if not is_missing(median):
        m = float(median)
        detail += f" ({m:,.0f} ms)" if m >= 100 else f" ({m:.3g} ms)"
    if not is_missing(samples):
        detail += f" over {int(samples)} {over}"
    return detail


def stability_warning(row: Mapping[str, Any], what: str = "latency", over: str = "calls") -> str | None:
    """A sentence for a latency row (a dict or a frame row) whose spread is too wide to trust; else None.

    It starts with ``"<framework>, batch size <b>:"`` when the row names them, so warnings can be told
    apart per framework. ``what``: the statistic the row's ``iqr_over_median`` and ``median_ms`` are of (a
    generate loop's ``TPOT``); ``over``: what its ``samples`` count (``requests``). A row that read the machine quiet (:mod:`mlms_nb.profilers.load`) says so: the spread is
    then not other programs'. A row timed on a busy machine gets :func:`load_warning` instead.
    """
    get = _getter(row)
    unstable = get("unstable", None)
    ratio = get("iqr_over_median", None)
    if unstable is None and ratio is not None:
        unstable = float(ratio) > UNSTABLE_IQR_OVER_MEDIAN
    if not unstable or is_missing(ratio):
        return None
    reading = LoadReading.from_row(row)
    advice = "close other programs, fix the thread count"
    if reading is not None and not is_set(get("busy", None)):
        advice = (f"the machine was quiet (other processes used {100 * reading.other_cpu_cores:.0f}% CPU), so the "
                  "spread is the framework's own: fix the thread count")
    return (f"{_where(get)}{what} is unstable: {_spread(get, ratio, over)}, above the {UNSTABLE_IQR_OVER_MEDIAN:.0%} "
            f"threshold; {advice} ({spell('threads')}) or time longer ({spell('min_time_s')}) before comparing "
            "these numbers")


def load_warning(row: Mapping[str, Any]) -> str | None:
    """A sentence for a latency row timed while the machine was busy (its ``busy`` column, decided by
    :func:`mlms_nb.profilers.load.is_busy`), naming the load: ``torch, batch size 1: the machine was busy: load 9.3
    on 2 cores, other processes used 170% CPU while torch ran 2 threads and got 0.4 cores; latencies are inflated
    ...``, with the spread when it is also unstable, and what to do: time on a quiet machine, wait for one
    (``--wait-for-quiet``), or fewer threads (``--threads N``, N the cores the others left free, where that is
    fewer than the framework ran). None on a quiet machine or a row without a reading."""
    get = _getter(row)
    reading = LoadReading.from_row(row)
    if reading is None or not is_set(get("busy", None)):
        return None
    framework = get("framework", None)
    who = "the model" if is_missing(framework) else str(framework)
    ratio = get("iqr_over_median", None)
    queueing = str(get("scenario", "")).startswith("generate-server")  # its spread is the scenario's, not noise
    spread = f" ({_spread(get, ratio)})" if is_set(get("unstable", None)) and not is_missing(ratio) and not queueing else ""
    threads = threads_suggestion(reading)
    fewer = f" or run {spell('threads', threads)} (the cores the others left free)" if threads else ""
    return (f"{_where(get)}the machine was busy: {describe(reading, who)}; latencies are inflated{spread}; time "
            f"again on a quiet machine, wait for one ({spell('wait_for_quiet_s', QUIET_WAIT_SUGGESTED_S)}){fewer} "
            "before comparing or drawing conclusions from these numbers")


def machine_note(latency) -> str:
    """The machine's load over an evaluation's timed loops, as a clause of its "Measured" note: busy during k of n
    loops, with the worst reading, or quiet during every loop; "" when no loop read it (older runs)."""
    if latency is None or latency.empty or not {"busy", "other_cpu_cores", "cores"} <= set(latency.columns):
        return ""
    read = latency[latency["other_cpu_cores"].notna()]
    if read.empty:
        return ""
    cores = int(read["cores"].max())
    busy = read[[is_set(b) for b in read["busy"]]]
    if busy.empty:
        return (f"machine quiet during every timed loop (other processes used at most "
                f"{100 * float(read['other_cpu_cores'].max()):.0f}% CPU of {cores} cores)")
    worst = busy.loc[busy["other_cpu_cores"].astype(float).idxmax()]
    load = "" if is_missing(worst.get("load_avg_1m")) else f"load {float(worst['load_avg_1m']):.1f}, "
    return (f"machine busy during {len(busy)} of {len(read)} timed loops ({load}other processes up to "
            f"{100 * float(worst['other_cpu_cores']):.0f}% CPU of {cores} cores): those latencies are inflated, see "
            "the warnings")


_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
         2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)
"""Student's t 0.975 quantile for 1..30 degrees of freedom."""


def t975(df: int) -> float:
    """Student's t 0.975 quantile (two-sided 95%): the table to 30 degrees of freedom, then the Cornish-Fisher
    expansion around the normal's 1.95996 (error below 1e-3)."""
    if df < 1:
        return float("nan")
    if df <= len(_T975):
        return _T975[df - 1]
    z = 1.959964
    return z + (z ** 3 + z) / (4 * df) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * df ** 2)


def summarize(values: list[float]) -> dict[str, float]:
    """Mean, sample standard deviation and the 95% CI of the mean of per-input values (NaN spread for one)."""
    x = np.asarray(values, dtype=np.float64)
    n = int(x.size)
    mean = float(x.mean()) if n else float("nan")
    std = float(x.std(ddof=1)) if n > 1 else float("nan")
    half = t975(n - 1) * std / math.sqrt(n) if n > 1 else float("nan")
    return {"value": mean, "std": std, "ci95_low": mean - half, "ci95_high": mean + half, "inputs": n}
