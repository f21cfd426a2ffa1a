"""Latency statistics against hand computations with numpy, the bootstrap CI, the instability warning;
the stack detection and its hash."""
from __future__ import annotations

import numpy as np
import pytest

from mlms_nb.errors import MlmsError
from mlms_nb.stack import comparable_part, detect_stack, stack_hash
from mlms_nb.evaluation.stats import bootstrap_median_ci, latency_stats, stability_warning
from mlms_nb.schema.evaluation import LATENCY, LATENCY_STATISTICS

MS = 1_000_000  # ns per ms


@pytest.fixture
def one_to_hundred_ms() -> np.ndarray:
    return np.arange(1, 101, dtype=np.int64) * MS


def test_stats_on_1_to_100_ms(one_to_hundred_ms):
    s = latency_stats(one_to_hundred_ms, batch_size=4)
    assert list(s) == list(LATENCY_STATISTICS)  # the schema's statistic columns, in its order
    assert all(LATENCY[k].unit for k in s if k != "unstable")  # each carries its unit
    ms = np.arange(1, 101, dtype=float)
    assert s["samples"] == 100
    assert s["mean_ms"] == pytest.approx(50.5)
    assert s["median_ms"] == pytest.approx(50.5)
    assert s["p90_ms"] == pytest.approx(np.percentile(ms, 90)) == pytest.approx(90.1)
    assert s["p99_ms"] == pytest.approx(99.01)
    assert s["min_ms"] == 1.0 and s["max_ms"] == 100.0
    assert s["std_ms"] == pytest.approx(ms.std(ddof=1))
    assert s["iqr_ms"] == pytest.approx(75.25 - 25.75)
    assert s["throughput_per_s"] == pytest.approx(4 / 0.0505)  # batch size / mean latency
    assert s["iqr_over_median"] == pytest.approx(49.5 / 50.5)
    assert s["unstable"] is True
    assert all(isinstance(s[k], float) for k in LATENCY_STATISTICS if k not in ("samples", "unstable"))


def test_throughput_from_wall_time(one_to_hundred_ms):
    s = latency_stats(one_to_hundred_ms, batch_size=8, wall_ns=10 * 10**9)
    assert s["throughput_per_s"] == pytest.approx(100 * 8 / 10.0)
    with pytest.raises(MlmsError):
        latency_stats(one_to_hundred_ms, batch_size=8, wall_ns=0)


def test_bootstrap_ci_contains_median_and_is_seeded(one_to_hundred_ms):
    a = latency_stats(one_to_hundred_ms, 1, seed=3)
    b = latency_stats(one_to_hundred_ms, 1, seed=3)
    assert a["median_ci_low_ms"] <= a["median_ms"] <= a["median_ci_high_ms"]
    assert a["median_ci_low_ms"] < a["median_ci_high_ms"]
    assert (a["median_ci_low_ms"], a["median_ci_high_ms"]) == (b["median_ci_low_ms"], b["median_ci_high_ms"])
    rng = np.random.default_rng(0)
    x = rng.lognormal(0, 0.5, size=101)
    assert bootstrap_median_ci(x, seed=1) == bootstrap_median_ci(x, seed=1)
    low, high = bootstrap_median_ci(x, seed=2)
    assert low <= np.median(x) <= high


@pytest.mark.parametrize("n", [15, 40])
def test_bootstrap_matches_plain_resampling(n):
    """The order-statistic shortcut has the distribution of literal resampling (compared with many resamples)."""
    rng = np.random.default_rng(n)
    x = rng.lognormal(0, 0.5, size=n)
    brute = np.median(x[rng.integers(0, n, size=(40_000, n))], axis=1)
    low, high = np.quantile(brute, [0.025, 0.975])
    fast_low, fast_high = bootstrap_median_ci(x, resamples=40_000, seed=0)
    spread = x.max() - x.min()
    assert fast_low == pytest.approx(low, abs=0.03 * spread)
    assert fast_high == pytest.approx(high, abs=0.03 * spread)


def test_large_loop_is_fast():
    import time

    x = np.random.default_rng(0).integers(1 * MS, 2 * MS, size=100_000)
    t0 = time.perf_counter()
    s = latency_stats(x, 1)
    assert time.perf_counter() - t0 < 1.0
    assert s["median_ci_low_ms"] <= s["median_ms"] <= s["median_ci_high_ms"]


def test_single_sample():
    s = latency_stats(np.array([5 * MS]), 1)
    assert s["std_ms"] == 0.0 and s["median_ci_low_ms"] == s["median_ci_high_ms"] == 5.0
    assert s["unstable"] is False


@pytest.mark.parametrize("bad", [np.array([], dtype=np.int64), [], np.array([1.0, np.nan]), np.array([-1, 5])])
def test_bad_samples_say_why(bad):
    with pytest.raises(MlmsError) as info:
        latency_stats(bad, 1)
    assert str(info.value) and "Traceback" not in str(info.value)


def test_empty_samples_sentence():
    with pytest.raises(MlmsError, match="no latency samples"):
        latency_stats(np.array([], dtype=np.int64), 1)
    with pytest.raises(MlmsError, match="batch_size"):
        latency_stats(np.array([1, 2]), 0)


def test_stability_warning():
    steady = np.full(50, 10 * MS) + np.arange(50) * 1000  # IQR 0.025 ms of 10 ms
    row = {"framework": "torch", "batch_size": 8, "scenario": "single-stream", **latency_stats(steady, 8)}
    assert row["unstable"] is False and stability_warning(row) is None
    noisy = np.concatenate([np.full(25, 10 * MS), np.full(25, 14 * MS)])
    row = {"framework": "onnxruntime", "batch_size": 1, "scenario": "single-stream", **latency_stats(noisy, 1)}
    assert row["unstable"] is True
    text = stability_warning(row)
    assert text.startswith("onnxruntime, batch size 1: latency is unstable")
    assert "33%" in text and "ms" in text and "50 calls" in text
    import pandas as pd

    assert stability_warning(pd.DataFrame([row]).iloc[0]) == text


@pytest.mark.parametrize("n", [2, 8, 40])
def test_bootstrap_medians_of_even_counts_match_plain_resampling(n):
    """For even n the median of a resample is the mean of its two middle values: the order-statistic draw
    matches literal resampling in location and spread (taking the lower middle, as compare.py once did, does not)."""
    from mlms_nb._bootstrap import bootstrap_medians

    rng = np.random.default_rng(n)
    x = rng.lognormal(0, 0.8, size=n)
    brute = np.median(x[rng.integers(0, n, size=(40_000, n))], axis=1)
    fast = bootstrap_medians(x, 40_000, np.random.default_rng(1))
    spread = x.max() - x.min()
    assert fast.mean() == pytest.approx(brute.mean(), abs=0.01 * spread)
    points = np.union1d(fast, brute)  # the largest gap between the two distribution functions (KS distance)
    cdf_fast = np.searchsorted(np.sort(fast), points, side="right") / fast.size
    cdf_brute = np.searchsorted(np.sort(brute), points, side="right") / brute.size
    assert np.abs(cdf_fast - cdf_brute).max() < 0.015


def test_one_bootstrap_for_the_evaluation_and_the_comparison():
    from mlms_nb import _bootstrap
    from mlms_nb.analyses import compare

    assert compare.bootstrap_medians is _bootstrap.bootstrap_medians
    x = np.random.default_rng(0).lognormal(0, 0.5, size=40)
    low, high = bootstrap_median_ci(x, seed=4)
    medians = _bootstrap.bootstrap_medians(x, 2000, np.random.default_rng(4))
    assert (low, high) == tuple(np.quantile(medians, [0.025, 0.975]))


# ---------------------------------------------------------------- stack

def test_stack_has_the_keys():
    stack = detect_stack(["pytorch", "onnxruntime"])
    hw, sw = stack["hardware"], stack["software"]
    for key in ("cpu_model", "cpu_arch", "physical_cores", "logical_cores", "memory_bytes", "gpus"):
        assert key in hw
    assert isinstance(hw["gpus"], list)
    if not hw["gpus"]:
        assert isinstance(hw["gpu_note"], str) and hw["gpu_note"]
    assert hw["logical_cores"] >= 1 and hw["memory_bytes"] > 0
    for key in ("os", "kernel", "python", "mlms_nb", "numpy"):
        assert sw[key]
    assert "torch" in sw and "onnxruntime" in sw and "tensorflow" not in sw
    assert isinstance(stack["hostname"], str)


def test_stack_is_cached_and_copied():
    a = detect_stack(["torch"])
    a["hardware"]["cpu_model"] = "changed"
    assert detect_stack(["torch"])["hardware"]["cpu_model"] != "changed"


def test_stack_hash_stable_and_ignores_hostname():
    stack = detect_stack(["torch"])
    h = stack_hash(stack)
    assert len(h) == 16 and int(h, 16) >= 0
    assert stack_hash(detect_stack(["torch"])) == h
    other = {**stack, "hostname": "somewhere-else"}
    assert stack_hash(other) == h
    noted = {**stack, "hardware": {**stack["hardware"], "gpu_note": "a different reason"}}
    assert stack_hash(noted) == h
    changed = {**stack, "software": {**stack["software"], "torch": "0.0.1"}}
    assert stack_hash(changed) != h
    # one framework's hash ignores the other frameworks of the evaluation
    both = detect_stack(["torch", "onnxruntime"])
    assert stack_hash(both, framework="torch") == stack_hash(detect_stack(["torch"]), framework="torch")
    assert "onnxruntime" not in comparable_part(both, "torch")["software"]
