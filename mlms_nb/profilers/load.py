"""The machine's load around a timed loop: did other programs take the CPU the model's threads needed?

A loop timed while other programs run measures the contention, not the model: with more runnable threads than
cores a framework's threads wait for each other at every parallel region (OpenMP's spin-waiting makes it worse),
so torch at 2 threads on 2 busy cores can run 5x slower than at 1 thread. The spread of such a loop may even look
tight. What this module reads, from two snapshots around a window (the warm-up, the timed loop; nothing runs on
the loop's hot path: no thread, no sampling during it):

- the 1-minute **load average** (``os.getloadavg``) at the window's edges: reported, not used to decide, since it
  lags a minute and counts this process's own threads (a quiet 2-core machine running torch on 2 threads reads
  about 2);
- **other processes' CPU use**: the busy CPU time of the cores this process may run on (``psutil.cpu_times``, i.e.
  /proc/stat: user, nice, system, irq, softirq) minus this process's own and its children's (the reader
  processes), over the window, in cores (1.7 = 170% of one core, as ``top`` writes it);
- **steal**: the share of those cores' time a hypervisor gave to other guests;
- this process's own CPU use in cores, and the framework's intra-op **threads** (None: its default, taken as one
  per core).

**Busy** (:func:`is_busy`) when either holds:

- other processes used at least ``MIN_OTHER_CORES`` (half a core) on average AND that plus the framework's
  threads is more than the cores by at least ``SLACK_CORES`` (a quarter core): some of its threads had no core of
  their own. A quiet machine (a shell, a notebook server, a browser: a few percent of a core) never reaches half a
  core; a big machine with cores to spare for both is not busy either, nor one whose cores are exactly shared out
  (two test workers of one thread each on two cores: the slack absorbs the kernel's 10 ms ticks and a shell);
- steal was at least ``STEAL_BUSY`` (10%) of the cores' time: the virtual machine's CPUs were not all its own.

:func:`threads_suggestion` is the thread count that fits in the cores the others left free, where it is below the
framework's. :func:`wait_for_quiet` samples the machine in ``QUIET_SAMPLE_S`` windows until it is quiet or a bound
passes (``--wait-for-quiet``).
"""
from __future__ import annotations

import math
import os
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable, Mapping

MIN_OTHER_CORES = 0.5
SLACK_CORES = 0.25
STEAL_BUSY = 0.10
MIN_WINDOW_S = 0.2
"""A timed loop shorter than this is read together with its warm-up (/proc/stat counts in 10 ms ticks)."""
QUIET_SAMPLE_S = 0.5

LOAD_COLUMNS = ("load_avg_1m_before", "load_avg_1m", "cores", "threads", "other_cpu_cores_before",
                "other_cpu_cores", "own_cpu_cores", "steal_fraction", "busy")
"""The latency row's columns of a timed loop's load (declared in :data:`mlms_nb.schema.evaluation.LATENCY`)."""


@dataclass(frozen=True)
class Snapshot:
    """CPU seconds since boot on this process's cores (busy, stolen, all) and this process's own (children
    included), the load average and the monotonic time, at one instant."""
    at_s: float
    busy_s: float
    steal_s: float
    total_s: float
    own_s: float
    load_avg_1m: float
    cores: int


@dataclass(frozen=True)
class LoadReading:
    """The machine over one window: see the module. ``threads``: the framework's intra-op threads (None: its
    default, one per core)."""
    cores: int
    seconds: float
    load_avg_1m: float
    other_cpu_cores: float
    own_cpu_cores: float
    steal_fraction: float
    threads: int | None = None

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> "LoadReading | None":
        """The reading a latency row holds (its :data:`LOAD_COLUMNS`), or None when it has none."""
        def number(name: str) -> float:
            value = row.get(name) if hasattr(row, "get") else None
            try:
                return float(value)
            except (TypeError, ValueError):
                return math.nan
        cores, others = number("cores"), number("other_cpu_cores")
        if math.isnan(cores) or math.isnan(others):
            return None
        threads = number("threads")
        return cls(int(cores), math.nan, number("load_avg_1m"), others, number("own_cpu_cores"),
                   number("steal_fraction"), None if math.isnan(threads) else int(threads))


def _cores() -> list[int]:
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return list(range(os.cpu_count() or 1))


def _own_cpu_s(psutil) -> float:
    """CPU seconds of this process, its waited-for children and its live descendants (the reader processes)."""
    me = psutil.Process()
    t = me.cpu_times()
    total = t.user + t.system + t.children_user + t.children_system
    for child in me.children(recursive=True):
        try:
            c = child.cpu_times()
            total += c.user + c.system
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return total


def snapshot() -> Snapshot | None:
    """The machine now (about a millisecond: /proc/stat and this process's tree); None where psutil cannot read
    the CPU times (not Linux, a restricted /proc)."""
    try:
        import psutil  # noqa: PLC0415 - a core dependency, imported when first read
    except ImportError:
        return None
    try:
        cores = _cores()
        per = psutil.cpu_times(percpu=True)
        if len(cores) == len(per) or max(cores) >= len(per):
            per = [psutil.cpu_times()]
        else:
            per = [per[i] for i in cores]
        busy = sum(t.user + t.nice + t.system + getattr(t, "irq", 0.0) + getattr(t, "softirq", 0.0) for t in per)
        steal = sum(getattr(t, "steal", 0.0) for t in per)
        total = sum(t.user + t.nice + t.system + t.idle + getattr(t, "iowait", 0.0) + getattr(t, "irq", 0.0)
                    + getattr(t, "softirq", 0.0) + getattr(t, "steal", 0.0) for t in per)
        load = os.getloadavg()[0] if hasattr(os, "getloadavg") else math.nan
        return Snapshot(time.monotonic(), busy, steal, total, _own_cpu_s(psutil), load, len(cores))
    except (OSError, AttributeError, ValueError, psutil.Error):
        return None


def reading(before: Snapshot | None, after: Snapshot | None, threads: int | None = None) -> LoadReading | None:
    """What happened between two snapshots; None when either is missing or no CPU time passed between them."""
    if before is None or after is None or after.total_s <= before.total_s:
        return None
    wall = (after.total_s - before.total_s) / after.cores  # seconds, in the kernel's own ticks
    own = max(0.0, after.own_s - before.own_s)
    others = max(0.0, (after.busy_s - before.busy_s) - own)
    return LoadReading(after.cores, wall, after.load_avg_1m, others / wall, own / wall,
                       (after.steal_s - before.steal_s) / (after.total_s - before.total_s),
                       int(threads) if threads else None)


def is_busy(r: LoadReading | None) -> bool:
    """Whether other programs took CPU the framework's threads needed (see the module for the two rules)."""
    if r is None or math.isnan(r.other_cpu_cores):
        return False
    threads = r.threads or r.cores
    oversubscribed = (r.other_cpu_cores >= MIN_OTHER_CORES
                      and r.other_cpu_cores + threads >= r.cores + SLACK_CORES)
    stolen = not math.isnan(r.steal_fraction) and r.steal_fraction >= STEAL_BUSY
    return bool(oversubscribed or stolen)


def threads_suggestion(r: LoadReading) -> int | None:
    """The threads that fit in the cores the other processes left free, where fewer than the framework ran."""
    free = max(1, int(r.cores - r.other_cpu_cores))
    return free if free < (r.threads or r.cores) else None


def describe(r: LoadReading, who: str | None = None) -> str:
    """The load in words: ``load 9.3 on 2 cores, other processes used 170% CPU while torch ran 2 threads and got
    0.4 cores``, with the steal when it counts; ``who`` None: a reading taken while this process idled."""
    load = "" if math.isnan(r.load_avg_1m) else f"load {r.load_avg_1m:.1f} on "
    text = f"{load}{r.cores} core{'s' if r.cores != 1 else ''}, other processes used {100 * r.other_cpu_cores:.0f}% CPU"
    wanted = r.threads or r.cores
    if who:
        text += f" while {who} ran " + (f"{r.threads} thread{'s' if r.threads != 1 else ''}" if r.threads
                                       else "its default threads (one per core)")
    if who and not math.isnan(r.own_cpu_cores) and r.own_cpu_cores < 0.75 * wanted:
        text += f" and got {r.own_cpu_cores:.1f} core{'s' if round(r.own_cpu_cores, 1) != 1 else ''}"
    if not math.isnan(r.steal_fraction) and r.steal_fraction >= STEAL_BUSY:
        text += f"; the hypervisor took {r.steal_fraction:.0%} of the CPU time (steal)"
    return text


class LoadMeter:
    """Snapshots at the edges of a timed loop's phases, read into a latency row's :data:`LOAD_COLUMNS`:
    ``mark()`` before the warm-up, before the timed loop and after it."""

    def __init__(self, threads: int | None = None):
        self.threads = threads
        self.marks: list[Snapshot | None] = []

    def mark(self) -> None:
        self.marks.append(snapshot())

    def columns(self) -> dict:
        """``before``: over the warm-up (load average at its start); during: over the timed loop (with its warm-up
        when the loop lasted under ``MIN_WINDOW_S``); empty when the machine could not be read."""
        if len(self.marks) < 3 or self.marks[0] is None or self.marks[2] is None:
            return {}
        start, loop, end = self.marks[:3]
        before = reading(start, loop, self.threads)
        during = reading(loop, end, self.threads)
        if during is None or during.seconds < MIN_WINDOW_S:
            during = reading(start, end, self.threads)
        if during is None:
            return {}
        return {"load_avg_1m_before": start.load_avg_1m, "load_avg_1m": during.load_avg_1m,
                "cores": during.cores, "threads": float(self.threads) if self.threads else math.nan,
                "other_cpu_cores_before": before.other_cpu_cores if before else math.nan,
                "other_cpu_cores": during.other_cpu_cores, "own_cpu_cores": during.own_cpu_cores,
                "steal_fraction": during.steal_fraction, "busy": is_busy(during)}


@dataclass(frozen=True)
class QuietWait:
    """How a wait for a quiet machine ended: the seconds waited, whether it found the machine quiet (None: the
    load cannot be read here, so it did not wait) and the last reading."""
    seconds: float
    quiet: bool | None
    last: LoadReading | None = None

    def as_dict(self) -> dict:
        return asdict(self)


def wait_for_quiet(max_s: float, threads: int | None = None, sample_s: float = QUIET_SAMPLE_S,
                   sleep: Callable[[float], None] = time.sleep) -> QuietWait:
    """Sample the machine in ``sample_s`` windows (this process idle) until one is quiet (:func:`is_busy` false
    for ``threads``) or ``max_s`` seconds have passed; at least one window is read."""
    start = time.monotonic()
    last = None
    while True:
        before = snapshot()
        if before is None:
            return QuietWait(time.monotonic() - start, None)
        sleep(max(0.05, min(sample_s, max_s - (time.monotonic() - start))))
        last = reading(before, snapshot(), threads)
        waited = time.monotonic() - start
        if last is not None and not is_busy(last):
            return QuietWait(waited, True, last)
        if waited >= max_s:
            return QuietWait(waited, False, last)
