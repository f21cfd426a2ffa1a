"""Linux perf events for this process, through ``perf_event_open`` via ctypes (no ``perf`` binary).

Hardware events (cycles, instructions, cache references/misses, branch misses) count when the CPU exposes a
PMU; software events (task-clock in ns, page faults, context switches, CPU migrations) count everywhere perf
events exist. Each event is opened on its own terms: the ones that cannot be opened are listed in
``unavailable_events`` with the errno name and what to do about it.

What is counted: every thread of this process that exists at ``start()`` (``attach_existing_threads``) and,
through ``inherit``, every thread or child process they start afterwards. Events are read as groups
(``PERF_FORMAT_GROUP | TOTAL_TIME_ENABLED | TOTAL_TIME_RUNNING``), one ``read(2)`` per group per attached
thread, and scaled by enabled/running time when the kernel multiplexed the PMU. ``read()`` gives the
counts accumulated since ``start()``.

What a ``read()`` costs: about 4 µs for one thread, plus about 1 µs (one syscall) per thread attached at
``start()`` -- some 40 µs for a 48-thread PyTorch pool. Threads started *after* ``start()`` cost nothing
extra (the kernel folds inherited counts into their parent's read), so start the counters before the
framework creates its thread pools, or set ``attach_existing_threads=False`` to count only the calling
thread and the threads it starts.

The syscall, the event table and the errno explanations are in :mod:`mlms_nb.profilers.perf_abi`.
"""
from __future__ import annotations

import os
import platform
import struct
import sys
import threading
import time
from dataclasses import dataclass
from typing import ClassVar

from mlms_nb.errors import MlmsError
from mlms_nb.profilers._base import Profiler, Row
from mlms_nb.profilers.perf_abi import (DEFAULT_HARDWARE, DEFAULT_SOFTWARE, EVENTS, PARANOID_PATH,
                                        PERF_EVENT_IOC_DISABLE, PERF_EVENT_IOC_ENABLE, PERF_EVENT_IOC_RESET,
                                        PERF_IOC_FLAG_GROUP, EventSpec, explain_failure, ioctl, perf_event_open,
                                        probe_event, read_paranoid, summarise_failures, syscall_number)


@dataclass
class PerfEventsConfig:
    """What to count and how.

    events: event names from ``EVENTS`` (hardware first, then software, by default).
    inherit: count threads/processes started after ``start()`` by the counted threads.
    attach_existing_threads: also count the threads already running at ``start()`` (thread pools); each
        adds about 1 µs to ``read()``.
    include_kernel: None = count kernel-mode work when allowed, else fall back to user space only;
        True = require it; False = user space only.
    interval_ms: when set, a background thread also records the counts every interval into ``counters()``;
        None = rows only at start, stop and each ``read(record=True)``.
    """

    events: tuple[str, ...] = DEFAULT_HARDWARE + DEFAULT_SOFTWARE
    inherit: bool = True
    attach_existing_threads: bool = True
    include_kernel: bool | None = None
    interval_ms: float | None = None


# --- the profiler --------------------------------------------------------------------------------------------


class _Group:
    """One perf group on one thread: a leader fd, its events, the struct to unpack a group read."""

    __slots__ = ("tid", "leader", "fds", "names", "struct", "size", "last")

    def __init__(self, tid: int, leader: int, fds: list[int], names: list[str]):
        self.tid, self.leader, self.fds, self.names = tid, leader, fds, names
        self.struct = struct.Struct(f"={3 + len(names)}Q")
        self.size = self.struct.size
        self.last: tuple[int, ...] | None = None

    def read_raw(self) -> tuple[int, ...]:
        try:
            data = os.read(self.leader, self.size)
            if len(data) == self.size:
                self.last = self.struct.unpack(data)
        except OSError:
            pass  # a thread that exited keeps its last values
        return self.last if self.last is not None else (len(self.names), 0, 0) + (0,) * len(self.names)


class _Batch:
    """The groups counting the same events on different threads; read one after another and summed."""

    __slots__ = ("groups", "leaders", "idx", "struct", "size", "base", "base_sums")

    def __init__(self, groups: list[_Group], idx: list[int]):
        self.groups = groups
        self.leaders = [g.leader for g in groups]
        self.idx = idx  # positions of the group's events in PerfEvents.events
        self.struct, self.size = groups[0].struct, groups[0].size
        self.base: list[tuple[int, ...]] = []
        self.base_sums: list[int] = []

    def set_baseline(self) -> None:
        self.base = [g.read_raw() for g in self.groups]
        self.base_sums = [sum(col) for col in zip(*self.base)]


class PerfEvents(Profiler):
    """Counts perf events for this process; ``read()`` returns the counts since ``start()``."""

    name: ClassVar[str] = "perf"
    source: ClassVar[str] = "perf"
    kind: ClassVar[str] = "counter"
    config_class: ClassVar[type] = PerfEventsConfig
    device: ClassVar[str] = "cpu"

    def __init__(self, config: PerfEventsConfig | None = None):
        super().__init__(config)
        unknown = [e for e in self.config.events if e not in EVENTS]
        if unknown:
            raise MlmsError(f"unknown perf event(s) {', '.join(unknown)}; known: {', '.join(EVENTS)}")
        self.events: list[str] = []                 # events being counted, in read() order
        self.units: dict[str, str] = {}
        self.unavailable_events: dict[str, str] = {}
        self.user_space_only: list[str] = []        # events counted without kernel-mode work
        self.threads: list[int] = []                # thread ids attached at start()
        self.inherit_used = False
        self._groups: list[_Group] = []
        self._batches: list[_Batch] = []            # groups of the same events across threads, read together
        self._samples: list[tuple[int, tuple[float, ...]]] = []
        self._final: dict[str, float] | None = None
        self._sampler: threading.Thread | None = None
        self._stop_event = threading.Event()

    # availability ------------------------------------------------------------------------------------------

    @classmethod
    def probe(cls, config: PerfEventsConfig | None = None) -> dict[str, str]:
        """``{event: ""}`` for each event that opens here, ``{event: reason}`` for each that does not."""
        config = config or PerfEventsConfig()
        paranoid = read_paranoid()
        out = {}
        for name in config.events:
            spec = EVENTS[name]
            _, reason = probe_event(spec, config.include_kernel, paranoid, config.inherit)
            out[name] = reason
        return out

    @classmethod
    def available(cls, config: PerfEventsConfig | None = None) -> tuple[bool, str]:
        if not sys.platform.startswith("linux"):
            return False, f"perf events need Linux; this is {platform.system() or sys.platform}"
        if syscall_number() is None:
            return False, f"perf_event_open's syscall number is not known for the {platform.machine()} architecture"
        paranoid = read_paranoid()
        if paranoid is None:
            return False, (f"this kernel has no perf events ({PARANOID_PATH} is missing: CONFIG_PERF_EVENTS is "
                           f"off, or /proc is not mounted)")
        config = config or PerfEventsConfig()
        probe = cls.probe(config)
        ok = [n for n, r in probe.items() if not r]
        failed = {n: r for n, r in probe.items() if r}
        if not ok:
            return False, f"no perf event could be opened -- {summarise_failures(failed)}"
        priv = f"perf_event_paranoid={paranoid}" + (", running as root" if os.geteuid() == 0 else "")
        text = f"counting {', '.join(ok)} for this process and its threads ({priv})"
        if failed:
            text += f"; unavailable -- {summarise_failures(failed)}"
        return True, text

    # lifecycle ---------------------------------------------------------------------------------------------

    def _open_groups(self, tid: int, layout: list[list[tuple[EventSpec, bool]]]) -> list[_Group]:
        """Open ``layout`` (groups of (event, exclude_kernel)) on thread ``tid``; skip what fails."""
        groups = []
        for members in layout:
            fds: list[int] = []
            for spec, excl in members:
                fd = perf_event_open(spec, tid, fds[0] if fds else -1, exclude_kernel=excl,
                                     inherit=self.inherit_used)
                if fd < 0:
                    break
                fds.append(fd)
            if len(fds) != len(members):  # thread exited (ESRCH) or lost permission: do not count it half
                for fd in fds:
                    os.close(fd)
                continue
            groups.append(_Group(tid, fds[0], fds, [s.name for s, _ in members]))
        return groups

    def start(self) -> "PerfEvents":
        """Open every event that can count here on every thread of the process, enable them, take the baseline."""
        if self.running:
            return self
        paranoid = read_paranoid()
        my_tid = threading.get_native_id()
        exclude_kernel = self._probe_events(paranoid)
        groups, layout = self._open_groups_on_self(exclude_kernel, my_tid, paranoid)
        self.threads = [my_tid]
        if self.config.attach_existing_threads and layout:
            groups += self._attach_threads(layout, my_tid)
        if not groups:
            raise MlmsError(f"no perf event could be opened -- {summarise_failures(self.unavailable_events)}")
        self._index(groups)
        try:
            self._enable()
        except BaseException:
            self.close()
            raise
        self.running = True
        self._samples.append((time.perf_counter_ns(), (0.0,) * len(self.events)))
        if self.config.interval_ms:
            self._stop_event.clear()
            self._sampler = threading.Thread(target=self._sample_loop, name="mlms-perf-sampler", daemon=True)
            self._sampler.start()
        return self

    def _probe_events(self, paranoid: int | None) -> dict[str, bool]:
        """Step 1, per configured event: can it open here, and must it leave kernel-mode work out? Returns
        ``{event: exclude_kernel}`` for those that can; the others go to ``unavailable_events`` with the reason."""
        cfg = self.config
        self.inherit_used = cfg.inherit
        exclude_kernel: dict[str, bool] = {}
        for name in cfg.events:
            spec = EVENTS[name]
            excl, reason = probe_event(spec, cfg.include_kernel, paranoid, self.inherit_used)
            if excl is None and self.inherit_used and "EINVAL" in reason:
                excl2, _ = probe_event(spec, cfg.include_kernel, paranoid, False)
                if excl2 is not None:  # an old kernel that refuses inherit: count the calling threads only
                    self.inherit_used, excl, reason = False, excl2, ""
            if excl is None:
                self.unavailable_events[name] = reason
            else:
                exclude_kernel[name] = excl
                if excl:
                    self.user_space_only.append(name)
        return exclude_kernel

    def _open_groups_on_self(self, exclude_kernel: dict[str, bool], my_tid: int, paranoid: int | None
                             ) -> tuple[list[_Group], list[list[tuple[EventSpec, bool]]]]:
        """Step 2, on the calling thread: hardware events in one group, software ones in another; a member the
        kernel will not add to its group (too many for the PMU) becomes the leader of a new one. Returns the
        groups and their layout (to open the same groups on other threads)."""
        layout: list[list[tuple[EventSpec, bool]]] = []
        groups: list[_Group] = []
        for hardware in (True, False):
            current: list[int] = []
            members: list[tuple[EventSpec, bool]] = []
            for name in self.config.events:
                spec = EVENTS[name]
                if name not in exclude_kernel or spec.hardware != hardware:
                    continue
                excl = exclude_kernel[name]
                fd = perf_event_open(spec, my_tid, current[0] if current else -1, exclude_kernel=excl,
                                     inherit=self.inherit_used)
                if fd < 0 and current:
                    groups.append(_Group(my_tid, current[0], current, [s.name for s, _ in members]))
                    layout.append(members)
                    current, members = [], []
                    fd = perf_event_open(spec, my_tid, -1, exclude_kernel=excl, inherit=self.inherit_used)
                if fd < 0:
                    self.unavailable_events[name] = explain_failure(-fd, spec, paranoid)
                    continue
                current.append(fd)
                members.append((spec, excl))
            if current:
                groups.append(_Group(my_tid, current[0], current, [s.name for s, _ in members]))
                layout.append(members)
        return groups, layout

    def _attach_threads(self, layout: list[list[tuple[EventSpec, bool]]], my_tid: int) -> list[_Group]:
        """Step 3: the same groups on every other thread already running (thread pools); each one attached is
        added to ``threads``."""
        try:
            tids = sorted(int(t) for t in os.listdir("/proc/self/task"))
        except OSError:
            tids = []
        groups: list[_Group] = []
        for tid in tids:
            if tid == my_tid:
                continue
            opened = self._open_groups(tid, layout)
            if opened:
                groups.extend(opened)
                self.threads.append(tid)
        return groups

    def _index(self, groups: list[_Group]) -> None:
        """The events counted, in read() order, and the batches of groups that count the same events."""
        self.events = [n for n in self.config.events if any(n in g.names for g in groups)]
        self.units = {n: EVENTS[n].unit for n in self.events}
        pos = {n: i for i, n in enumerate(self.events)}
        self._groups = groups
        by_names: dict[tuple[str, ...], list[_Group]] = {}
        for g in groups:
            by_names.setdefault(tuple(g.names), []).append(g)
        self._batches = [_Batch(gs, [pos[n] for n in names]) for names, gs in by_names.items()]
        self._final = None
        self._samples = []

    def _enable(self) -> None:
        """Step 4, go: reset and enable every group leader, then take the baseline that read() subtracts."""
        for g in self._groups:
            ioctl(g.leader, PERF_EVENT_IOC_RESET, PERF_IOC_FLAG_GROUP)
            ioctl(g.leader, PERF_EVENT_IOC_ENABLE, PERF_IOC_FLAG_GROUP)
        for b in self._batches:
            b.set_baseline()

    def _sample_loop(self) -> None:
        interval = max(float(self.config.interval_ms), 0.1) / 1000.0
        while not self._stop_event.wait(interval):
            self.read(record=True)

    def _values(self) -> tuple[float, ...]:
        n = len(self.events)
        totals = [0.0] * n
        enabled = [0] * n
        running = [0] * n
        for b in self._batches:
            unpack, size = b.struct.unpack, b.size
            try:  # fast path: one read(2) per thread, summed column-wise in C
                raws = [unpack(os.read(fd, size)) for fd in b.leaders]
            except (OSError, struct.error):
                raws = [g.read_raw() for g in b.groups]
            sums = [sum(col) for col in zip(*raws)]
            base = b.base_sums
            d_en, d_run = sums[1] - base[1], sums[2] - base[2]
            if d_en == d_run:  # never multiplexed (always so for software events): no scaling needed
                for k, i in enumerate(b.idx):
                    totals[i] += sums[3 + k] - base[3 + k]
                    enabled[i] += d_en
                    running[i] += d_run
                continue
            for raw, row0 in zip(raws, b.base):  # multiplexed: scale each thread by its enabled/running
                r_en, r_run = raw[1] - row0[1], raw[2] - row0[2]
                for k, i in enumerate(b.idx):
                    enabled[i] += r_en
                    if r_run > 0:
                        totals[i] += (raw[3 + k] - row0[3 + k]) * (r_en / r_run if r_en > r_run else 1.0)
                        running[i] += r_run
        # enabled but never on the PMU (a group too large, the PMU taken): the count is unknown, not zero
        return tuple(float("nan") if running[i] == 0 and enabled[i] > 0 else totals[i] for i in range(n))

    def read(self, record: bool = False) -> dict[str, float]:
        """Counts since ``start()`` (scaled for multiplexing), by event name; after ``stop()``, the final counts.

        ``record=True`` also keeps them, stamped with ``perf_counter_ns()``, as rows of ``counters()``.
        """
        if not self.running:
            return dict(self._final) if self._final is not None else {}
        values = self._values()
        if record:
            self._samples.append((time.perf_counter_ns(), values))
        return dict(zip(self.events, values))

    def stop(self) -> "PerfEvents":
        if not self.running:
            return self
        if self._sampler is not None:
            self._stop_event.set()
            self._sampler.join()
            self._sampler = None
        values = self._values()
        self._samples.append((time.perf_counter_ns(), values))
        self._final = dict(zip(self.events, values))
        self.close()
        self.running = False
        return self

    def close(self) -> None:
        """Disable and close every event (stop() does it; safe to call twice)."""
        for g in self._groups:
            try:
                ioctl(g.leader, PERF_EVENT_IOC_DISABLE, PERF_IOC_FLAG_GROUP)
            except OSError:
                pass
            for fd in g.fds:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self._groups = []
        self._batches = []

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

    def counters(self) -> list[Row]:
        rows = []
        src, dev = self.source, self.device
        for ts, values in list(self._samples):
            for name, value in zip(self.events, values):
                rows.append((ts, src, name, value, self.units[name], dev))
        return rows
