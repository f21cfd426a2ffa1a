"""Timing loops for the LoadGen-style scenarios, over any ``predict(batch)`` callable.

The stopping rule and the warm-up are a :class:`mlms_nb.options.Timing`. All times come from
``time.perf_counter_ns`` (monotonic, nanoseconds). The timed loop does nothing but call, stamp and store, so what
it measures is the framework, not the harness.

- ``single-stream``: one query after another; each sample is one call's latency.
- ``offline``: back-to-back calls; throughput is inputs over the loop's wall time.
- ``server``: queries arrive as a Poisson process at a target rate; a sample is completion minus arrival
  (queueing included), so a model that cannot keep up shows it in p99.
"""
from __future__ import annotations

import time
from typing import Callable, NamedTuple

import numpy as np

from mlms_nb.data.feeds import count

from mlms_nb.errors import MlmsError
from mlms_nb.evaluation.records import Note, TimedLoop
from mlms_nb.options import Timing, spell
from mlms_nb.profilers.energy import EnergyMeter
from mlms_nb.profilers.load import LoadMeter, describe, wait_for_quiet

SCENARIOS = ("single-stream", "offline", "server")


class PartialLoop(NamedTuple):
    """What one of the loops below had measured when something stopped it (Ctrl-C, a stop signal, a timeout, an
    error): ``exception.partial``; `run_scenario` turns it into a `TimedLoop` marked incomplete."""
    samples_ns: np.ndarray
    wall_ns: int


OnCall = Callable[[], None] | None
"""Called after each call, outside the timed window (progress reports); None: nothing."""


def _nothing() -> None:
    pass


def warm_up(predict: Callable, batch: np.ndarray, cfg: Timing, on_call: OnCall = None) -> int:
    """Untimed calls until warm; returns how many were made."""
    on_call = on_call or _nothing
    if cfg.warmup != "auto":
        for _ in range(int(cfg.warmup)):
            predict(batch)
            on_call()
        return int(cfg.warmup)
    clock = time.perf_counter_ns
    times: list[int] = []
    while len(times) < cfg.max_warmup:
        t0 = clock()
        predict(batch)
        times.append(clock() - t0)
        on_call()
        if len(times) >= 10:
            recent, before = np.median(times[-5:]), np.median(times[-10:-5])
            if abs(recent - before) <= cfg.warmup_tolerance * before:
                break
    return len(times)


def time_closed_loop(predict: Callable, batch: np.ndarray, cfg: Timing, on_call: OnCall = None) -> tuple[np.ndarray, int]:
    """Back-to-back calls until the stopping rule holds; returns (per-call ns, loop wall ns)."""
    on_call = on_call or _nothing
    clock = time.perf_counter_ns
    samples = np.empty(min(cfg.max_repeats, 1024), dtype=np.int64)
    min_ns, max_ns = int(cfg.min_time_s * 1e9), int(cfg.max_time_s * 1e9)
    n = 0
    start = clock()
    try:
        while True:
            t0 = clock()
            predict(batch)
            t1 = clock()
            if n == len(samples):
                samples = np.resize(samples, min(2 * n, cfg.max_repeats))
            samples[n] = t1 - t0
            n += 1
            on_call()
            elapsed = t1 - start
            if (n >= cfg.min_repeats and elapsed >= min_ns) or n >= cfg.max_repeats or elapsed >= max_ns:
                break
    except BaseException as stop:
        stop.partial = PartialLoop(samples[:n].copy(), clock() - start)  # type: ignore[attr-defined]
        raise
    return samples[:n].copy(), clock() - start


def time_server(predict: Callable, batch: np.ndarray, cfg: Timing, on_call: OnCall = None) -> tuple[np.ndarray, int, dict]:
    """Poisson arrivals at ``cfg.target_qps`` served by one worker; samples are arrival-to-completion ns."""
    on_call = on_call or _nothing
    if not cfg.target_qps or cfg.target_qps <= 0:
        raise MlmsError(f"the server scenario needs a target rate: {spell('target_qps')} (queries per second)")
    rng = np.random.default_rng(cfg.seed)
    count = max(cfg.min_repeats, int(np.ceil(cfg.target_qps * cfg.min_time_s)))
    count = min(count, cfg.max_repeats)
    gaps_ns = rng.exponential(1e9 / cfg.target_qps, size=count)
    clock = time.perf_counter_ns
    start = clock()
    arrivals = start + np.cumsum(gaps_ns).astype(np.int64)
    samples = np.empty(count, dtype=np.int64)
    n = 0
    try:
        for n in range(count):
            arrival = int(arrivals[n])
            now = clock()
            if now < arrival:
                sleep_until(arrival, clock)
            predict(batch)
            samples[n] = clock() - arrival
            on_call()
            if clock() - start > cfg.max_time_s * 1e9:
                n += 1
                break
        else:
            n = count
    except BaseException as stop:
        stop.partial = PartialLoop(samples[:n].copy(), clock() - start)  # type: ignore[attr-defined]
        raise
    wall = clock() - start
    done = samples[:n].copy()
    extra = {"target_qps": float(cfg.target_qps), "achieved_qps": n / (wall / 1e9)}
    if cfg.latency_bound_ms is not None:
        p99_ms = float(np.percentile(done, 99)) / 1e6
        extra["latency_bound_ms"] = float(cfg.latency_bound_ms)
        extra["meets_bound"] = bool(p99_ms <= cfg.latency_bound_ms)
    return done, wall, extra


def wait_for_quiet_first(framework: str, batch_size: int, cfg: Timing, threads: int | None,
                         emit: Callable) -> dict:
    """Before a timed loop (and its warm-up): wait up to ``cfg.wait_for_quiet_s`` for a quiet machine
    (:func:`mlms_nb.profilers.load.wait_for_quiet`); returns the loop's ``quiet_wait_s`` column ({} when not asked).
    A wait that gave up, or could not read the load, emits a `Note` that says so: the loop is timed anyway."""
    bound = float(cfg.wait_for_quiet_s or 0)
    if bound <= 0:
        return {}
    waited = wait_for_quiet(bound, threads)
    asked = spell("wait_for_quiet_s", int(bound) if bound.is_integer() else bound)
    where = f"{framework}, batch size {batch_size}"
    if waited.quiet is None:
        emit(Note(framework, f"{where}: did not wait for a quiet machine ({asked}): the CPU times cannot be read "
                             "here (psutil.cpu_times)"))
    elif not waited.quiet:
        busy = f" ({describe(waited.last)})" if waited.last is not None else ""
        emit(Note(framework, f"{where}: waited {waited.seconds:.0f} s for a quiet machine ({asked}), but it stayed "
                             f"busy{busy}; timed anyway"))
    return {"quiet_wait_s": float(waited.seconds)}


def sleep_until(deadline_ns: int, clock: Callable[[], int]) -> None:
    """Sleep most of the way, then spin the last ~200 µs for an accurate arrival time."""
    remaining = deadline_ns - clock()
    if remaining > 300_000:
        time.sleep((remaining - 200_000) / 1e9)
    while clock() < deadline_ns:
        pass


def run_scenario(scenario: str, predict: Callable, batch: np.ndarray, cfg: Timing, progress=None,
                 energy: EnergyMeter | None = None, framework: str = "", batch_size: int | None = None,
                 load: LoadMeter | None = None) -> TimedLoop:
    """Warm up, then time one scenario at the batch's size; returns the loop as the record a framework's work
    emits (``framework`` filled in as given). ``batch_size``: the inputs in ``batch`` (default: its first axis;
    give it for a batch on another axis). ``progress``: an object with ``warm_up()`` and ``timed(scenario)``, each
    returning the `OnCall` of that phase and ``done()`` (see :mod:`mlms_nb.evaluation.reporter`); None: no
    reports. ``energy``: a meter read around the timed loop (not the warm-up); its joules, per input and how they
    were measured (or why not) join the record's ``extra``. ``load``: the machine's load read before the warm-up,
    before the timed loop and after it (:mod:`mlms_nb.profilers.load`: snapshots outside the loop, nothing on its
    hot path); its columns join ``extra``. Stopped part-way, the exception's ``partial`` is the
    record of what was measured, marked incomplete (its ``reason`` for the caller to fill in)."""
    if scenario not in SCENARIOS:
        raise MlmsError(f"unknown scenario {scenario!r}; expected one of {', '.join(SCENARIOS)}")
    size = count(batch) if batch_size is None else int(batch_size)
    if load is not None:
        load.mark()
    warm = warm_up(predict, batch, cfg, progress.warm_up() if progress else None)
    if load is not None:
        load.mark()
    try:
        if energy is not None:
            energy.start()
        if scenario == "server":
            samples, wall, extra = time_server(predict, batch, cfg, progress.timed(scenario) if progress else None)
        else:
            samples, wall = time_closed_loop(predict, batch, cfg, progress.timed(scenario) if progress else None)
            extra = {}
        if energy is not None:
            extra.update(energy.stop().as_columns(len(samples) * size))
        if load is not None:
            load.mark()
            extra.update(load.columns())
    except BaseException as stop:  # what the loop measured, with its warm-up count
        partial = getattr(stop, "partial", None)
        if isinstance(partial, PartialLoop):
            stop.partial = TimedLoop(framework, size, scenario, partial.samples_ns, partial.wall_ns, warm,  # type: ignore[attr-defined]
                                     complete=False)
        raise
    finally:
        if progress:
            progress.done()
    return TimedLoop(framework, size, scenario, samples, wall, warm, extra)
