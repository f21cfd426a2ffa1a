"""Load-aware measurement (issue 37, item 2): a timed loop on a busy machine says so by name (the load, the cores,
other processes' CPU against the framework's threads, a thread count that fits), a quiet machine raises no alarm,
``--wait-for-quiet`` waits within its bound and says when it gave up, and the analyses that draw conclusions
(trace overhead, roof check, across, compare) carry the busy flag through."""
from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pandas as pd
import pytest

from mlms_nb.evaluation.stats import latency_stats, load_warning, machine_note, stability_warning
from mlms_nb.options import Timing, spelling
from mlms_nb.profilers.load import LoadReading, describe, is_busy, reading, snapshot, threads_suggestion
from tests.helpers import MS


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


def _spinners(count: int) -> list[int]:
    """Busy processes, a Python loop each (the artificial load), started through a shell that exits at once: they
    are other programs, not this process's children (whose CPU counts as its own, like the reader processes')."""
    shell = subprocess.run(["sh", "-c", f'for i in $(seq {count}); do "$0" -c "while True: pass" >/dev/null 2>&1 & '
                                        'echo $!; done', sys.executable], capture_output=True, text=True, check=True)
    return [int(pid) for pid in shell.stdout.split()]


def _stop(pids: list[int]) -> None:
    import psutil

    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    psutil.wait_procs([p for p in map(_process, pids) if p is not None], timeout=30)


def _process(pid: int):
    import psutil

    try:
        return psutil.Process(pid)
    except psutil.NoSuchProcess:
        return None


def _row(reading: LoadReading, **stats) -> dict:
    """A latency row with a load reading, as the assembler makes it."""
    return {"framework": "torch", "batch_size": 1, "scenario": "single-stream", **stats,
            "load_avg_1m": reading.load_avg_1m, "cores": reading.cores,
            "threads": float(reading.threads) if reading.threads else math.nan,
            "other_cpu_cores": reading.other_cpu_cores, "own_cpu_cores": reading.own_cpu_cores,
            "steal_fraction": reading.steal_fraction, "busy": is_busy(reading)}


# ------------------------------------------------------------------------------------------ the classifier

QUIET = LoadReading(cores=2, seconds=1.0, load_avg_1m=2.1, other_cpu_cores=0.06, own_cpu_cores=1.9,
                    steal_fraction=0.0, threads=2)
"""A quiet 2-core machine running torch on 2 threads: the load average reads about 2 (torch's own threads)."""
BUSY = LoadReading(cores=2, seconds=1.0, load_avg_1m=9.3, other_cpu_cores=1.7, own_cpu_cores=0.3,
                   steal_fraction=0.0, threads=2)
"""The review's machine: load 7-13 on 2 cores, torch on 2 threads got a fraction of a core."""


def test_a_quiet_machine_raises_no_alarm():
    assert not is_busy(QUIET)
    stable = np.full(50, 10 * MS) + np.arange(50) * 1000
    assert load_warning(_row(QUIET, **latency_stats(stable, 1))) is None
    assert machine_note(pd.DataFrame([_row(QUIET)])).startswith("machine quiet during every timed loop")
    # a spread on a quiet machine is the framework's own: the warning says so instead of "close other programs"
    noisy = np.concatenate([np.full(25, 10 * MS), np.full(25, 14 * MS)])
    text = stability_warning(_row(QUIET, **latency_stats(noisy, 1)))
    assert "the machine was quiet (other processes used 6% CPU)" in text and "close other programs" not in text
    # a big machine with cores to spare for both is not busy; nor is one other core's worth beside one thread
    assert not is_busy(LoadReading(64, 1.0, 20.0, 20.0, 8.0, 0.0, threads=8))
    assert not is_busy(LoadReading(2, 1.0, 2.0, 1.1, 0.9, 0.0, threads=1))  # exactly shared out, within the slack
    assert is_busy(LoadReading(2, 1.0, 3.0, 1.4, 0.6, 0.0, threads=1))
    assert not is_busy(None)


def test_a_busy_machine_is_named_with_a_thread_count_that_fits():
    assert is_busy(BUSY)
    assert threads_suggestion(BUSY) == 1
    noisy = np.concatenate([np.full(25, 1500 * MS), np.full(25, 2100 * MS)])
    row = _row(BUSY, **latency_stats(noisy, 1))
    text = load_warning(row)
    assert text.startswith("torch, batch size 1: the machine was busy: load 9.3 on 2 cores, other processes used "
                           "170% CPU while torch ran 2 threads and got 0.3 cores; latencies are inflated")
    assert "the interquartile range is 33% of the median" in text and "threads=1" in text
    with spelling("cli"):
        cli = load_warning(row)
    assert "--wait-for-quiet 60" in cli and "--threads 1" in cli
    assert load_warning(pd.DataFrame([row]).iloc[0]) == text  # a stored frame's row says the same
    assert "machine busy during 1 of 2 timed loops (load 9.3, other processes up to 170% CPU of 2 cores)" in \
        machine_note(pd.DataFrame([row, _row(QUIET)]))
    # steal alone: the virtual machine's CPUs were not its own
    stolen = LoadReading(4, 1.0, 1.0, 0.1, 4.0, 0.25, threads=4)
    assert is_busy(stolen) and "the hypervisor took 25% of the CPU time (steal)" in describe(stolen, "onnxruntime")
    # threads already within the free cores: no suggestion
    assert threads_suggestion(LoadReading(8, 1.0, 6.0, 5.5, 1.0, 0.0, threads=1)) is None


# ------------------------------------------------------------------------------------------ under a real load

@pytest.mark.slow  # ~5 s: busy processes on every core slow the tiny model's evaluation down, as they should
def test_the_timed_loop_under_artificial_load_names_the_load_and_wait_for_quiet_gives_up_within_its_bound(mlms_home):
    """Busy processes on every core (two per core), then a tiny model's timed loop: its warning names the load,
    the cores and the others' CPU; --wait-for-quiet 1 gives up after about a second with its sentence."""
    torch = pytest.importorskip("torch")
    import mlms_nb
    from mlms_nb.evaluation import codec
    from mlms_nb.evaluation.result import Evaluation
    from mlms_nb.evaluation.scenarios import wait_for_quiet_first

    cores = _cores()
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    spinners = _spinners(2 * cores)
    try:
        time.sleep(0.3)
        notes = []
        started = time.monotonic()
        with spelling("cli"):
            column = wait_for_quiet_first("torch", 1, Timing(wait_for_quiet_s=0.5), 1, notes.append)
        assert 0.5 <= column["quiet_wait_s"] < 2.0 and time.monotonic() - started < 2.5 and len(notes) == 1
        assert notes[0].text.startswith("torch, batch size 1: waited ") and "(--wait-for-quiet 0.5), but it stayed " \
            f"busy (load " in notes[0].text and f"on {cores} core" in notes[0].text and notes[0].text.endswith(
            "timed anyway")

        ev = mlms_nb.evaluate(model, inputs=torch.randn(1, 16), outputs={"type": "classification", "classes": 4},
                              threads=1, warmup=2, min_repeats=5, min_time_s=0.3, limit=4, wait_for_quiet_s=1,
                              progress=False, history=False)
    finally:
        _stop(spinners)
    row = ev.latency.iloc[0]
    assert bool(row["busy"]) and row["cores"] == cores and row["threads"] == 1
    assert row["other_cpu_cores"] >= 0.5 and 1.0 <= row["quiet_wait_s"] < 5.0
    busy = [w for w in ev.warnings if "the machine was busy" in w]
    assert len(busy) == 1, ev.warnings
    assert busy[0].startswith("torch, batch size 1: the machine was busy: load ")
    assert f"on {cores} core" in busy[0] and "other processes used " in busy[0] and "latencies are inflated" in busy[0]
    assert any("waited 1 s for a quiet machine (wait_for_quiet_s=1), but it stayed busy" in w for w in ev.warnings)
    assert "busy" in ev.to_text() and "machine busy during 1 of 1 timed loops" in ev.measurement_note()
    back = Evaluation(**codec.from_json(codec.to_json(ev)))  # the readings round-trip with the evaluation
    pd.testing.assert_frame_equal(pd.DataFrame(back.latency), pd.DataFrame(ev.latency))


def test_snapshots_read_this_process_apart_from_the_others():
    """Our own CPU use is not 'other processes': a busy loop in this process reads as own CPU."""
    before = snapshot()
    if before is None:
        pytest.skip("psutil cannot read the CPU times here")
    end = time.thread_time() + 0.4
    while time.thread_time() < end:
        pass
    r = reading(before, snapshot(), threads=1)
    assert r is not None and r.cores == _cores()
    assert r.own_cpu_cores * r.seconds >= 0.35  # the 0.4 CPU seconds spent here are ours (a tick either side)


# ------------------------------------------------------------------------------------------ the conclusions

def test_roof_check_blames_ceilings_measured_on_a_busy_machine():
    from mlms_nb.analyses import roofline

    costs = pd.DataFrame({"layer_index": [0, 1], "layer_name": ["fast", "slow"], "layer_type": ["Conv2d"] * 2,
                          "flops": [2e8, 1e9], "bytes": [1e8, 1e7]})
    latency = pd.DataFrame({"framework": "torch", "batch_size": 1, "layer_index": [0, 1], "name": ["fast", "slow"],
                            "median_ms": [2.0, 100.0], "p25_ms": [1.9, 99.0], "p75_ms": [2.1, 101.0]})
    busy = roofline.RoofContext(ceilings_busy="load 9.3 on 2 cores, other processes used 170% CPU")
    table = roofline.compute(costs, latency, 1e11, 1e10, roof=busy).set_index("layer_name")
    assert table.loc["fast", "roof_check"] == "above roof"
    assert table.loc["fast", "roof_check_why"].startswith("machine busy: ")
    assert "the ceilings were measured while the machine was busy (load 9.3 on 2 cores" in \
        table.loc["fast", "roof_check_why"]
    assert "1 point(s) above a roof measured while the machine was busy" in table.attrs["note"]
    assert "measurement problems" not in table.attrs["note"]
    quiet = roofline.compute(costs, latency, 1e11, 1e10).set_index("layer_name")
    assert quiet.loc["fast", "roof_check_why"].startswith("measurement problem: ")


def test_across_and_compare_say_when_a_side_ran_on_a_busy_machine():
    from mlms_nb.analyses import compare, normalized

    rng = np.random.default_rng(0)
    one = pd.DataFrame({"framework": "torch", "batch_size": [1], "scenario": "single-stream", "median_ms": [394.0],
                        "median_ci_low_ms": [380.0], "median_ci_high_ms": [410.0], "busy": [False]})
    two = one.assign(median_ms=2466.0, median_ci_low_ms=2300.0, median_ci_high_ms=2600.0, busy=True)
    samples = {key: (rng.normal(ms, ms / 20, 20) * 1e6).astype(np.int64)
               for key, ms in ((("torch", 1, "single-stream"), 394.0),)}
    samples_two = {k: (v * 6.3).astype(np.int64) for k, v in samples.items()}
    ab = compare.compute((one, samples), (two, samples_two), labels=("one-thread", "two-threads"))
    assert ab.loc[0, "faster"] == "one-thread (machine busy)" and ab.loc[0, "machine_busy"] == "two-threads"
    assert "machine busy" in ab.attrs["note"]
    table = normalized.compute({"one-thread": one, "two-threads": two}, baseline="one-thread")
    assert table["machine_busy"].tolist() == [False, True]  # the baseline against itself; the busy run against it
    assert "1 row(s) timed on a busy machine" in table.attrs["note"]
    # runs that did not read the machine keep their verdict and gain no column
    old = compare.compute((one.drop(columns="busy"), samples), (two.drop(columns="busy"), samples_two))
    assert old.loc[0, "faster"] == "A" and "machine_busy" not in old
