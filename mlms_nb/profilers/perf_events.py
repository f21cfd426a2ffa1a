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
"""
from __future__ import annotations

import ctypes
import errno as _errno
import os
import platform
import struct
import sys
import threading
import time
from dataclasses import dataclass
from typing import ClassVar

from mlms_nb.profilers._base import Profiler, Row

# --- the ABI -------------------------------------------------------------------------------------------------

SYSCALL_NUMBERS = {
    "x86_64": 298, "amd64": 298,
    "aarch64": 241, "arm64": 241, "riscv64": 241, "loongarch64": 241,
    "i386": 336, "i686": 336,
    "armv7l": 364, "armv6l": 364,
    "ppc64le": 319, "ppc64": 319,
    "s390x": 331,
}

PERF_TYPE_HARDWARE = 0
PERF_TYPE_SOFTWARE = 1

PERF_FORMAT_TOTAL_TIME_ENABLED = 1 << 0
PERF_FORMAT_TOTAL_TIME_RUNNING = 1 << 1
PERF_FORMAT_GROUP = 1 << 3
READ_FORMAT = PERF_FORMAT_TOTAL_TIME_ENABLED | PERF_FORMAT_TOTAL_TIME_RUNNING | PERF_FORMAT_GROUP

# attr.flags bit positions
_DISABLED = 1 << 0
_INHERIT = 1 << 1
_EXCLUDE_KERNEL = 1 << 5
_EXCLUDE_HV = 1 << 6

PERF_FLAG_FD_CLOEXEC = 1 << 3
PERF_EVENT_IOC_ENABLE = 0x2400
PERF_EVENT_IOC_DISABLE = 0x2401
PERF_EVENT_IOC_RESET = 0x2403
PERF_IOC_FLAG_GROUP = 1

PARANOID_PATH = "/proc/sys/kernel/perf_event_paranoid"


class PerfEventAttr(ctypes.Structure):
    """``struct perf_event_attr`` up to PERF_ATTR_SIZE_VER5 (112 bytes); the bitfield word is ``flags``."""

    _fields_ = [
        ("type", ctypes.c_uint32),
        ("size", ctypes.c_uint32),
        ("config", ctypes.c_uint64),
        ("sample_period", ctypes.c_uint64),
        ("sample_type", ctypes.c_uint64),
        ("read_format", ctypes.c_uint64),
        ("flags", ctypes.c_uint64),
        ("wakeup_events", ctypes.c_uint32),
        ("bp_type", ctypes.c_uint32),
        ("config1", ctypes.c_uint64),
        ("config2", ctypes.c_uint64),
        ("branch_sample_type", ctypes.c_uint64),
        ("sample_regs_user", ctypes.c_uint64),
        ("sample_stack_user", ctypes.c_uint32),
        ("clockid", ctypes.c_int32),
        ("sample_regs_intr", ctypes.c_uint64),
        ("aux_watermark", ctypes.c_uint32),
        ("sample_max_stack", ctypes.c_uint16),
        ("_reserved_2", ctypes.c_uint16),
    ]


@dataclass(frozen=True)
class EventSpec:
    name: str
    type: int
    config: int
    c_name: str
    unit: str = "count"
    kernel_only: bool = False  # happens only in kernel context: counts 0 when kernel events are excluded

    @property
    def hardware(self) -> bool:
        return self.type == PERF_TYPE_HARDWARE


EVENTS: dict[str, EventSpec] = {e.name: e for e in (
    EventSpec("cycles", PERF_TYPE_HARDWARE, 0, "PERF_COUNT_HW_CPU_CYCLES"),
    EventSpec("instructions", PERF_TYPE_HARDWARE, 1, "PERF_COUNT_HW_INSTRUCTIONS"),
    EventSpec("cache-references", PERF_TYPE_HARDWARE, 2, "PERF_COUNT_HW_CACHE_REFERENCES"),
    EventSpec("cache-misses", PERF_TYPE_HARDWARE, 3, "PERF_COUNT_HW_CACHE_MISSES"),
    EventSpec("branch-instructions", PERF_TYPE_HARDWARE, 4, "PERF_COUNT_HW_BRANCH_INSTRUCTIONS"),
    EventSpec("branch-misses", PERF_TYPE_HARDWARE, 5, "PERF_COUNT_HW_BRANCH_MISSES"),
    EventSpec("stalled-cycles-frontend", PERF_TYPE_HARDWARE, 7, "PERF_COUNT_HW_STALLED_CYCLES_FRONTEND"),
    EventSpec("stalled-cycles-backend", PERF_TYPE_HARDWARE, 8, "PERF_COUNT_HW_STALLED_CYCLES_BACKEND"),
    EventSpec("ref-cycles", PERF_TYPE_HARDWARE, 9, "PERF_COUNT_HW_REF_CPU_CYCLES"),
    EventSpec("cpu-clock", PERF_TYPE_SOFTWARE, 0, "PERF_COUNT_SW_CPU_CLOCK", unit="ns"),
    EventSpec("task-clock", PERF_TYPE_SOFTWARE, 1, "PERF_COUNT_SW_TASK_CLOCK", unit="ns"),
    EventSpec("page-faults", PERF_TYPE_SOFTWARE, 2, "PERF_COUNT_SW_PAGE_FAULTS"),
    EventSpec("context-switches", PERF_TYPE_SOFTWARE, 3, "PERF_COUNT_SW_CONTEXT_SWITCHES", kernel_only=True),
    EventSpec("cpu-migrations", PERF_TYPE_SOFTWARE, 4, "PERF_COUNT_SW_CPU_MIGRATIONS", kernel_only=True),
    EventSpec("minor-faults", PERF_TYPE_SOFTWARE, 5, "PERF_COUNT_SW_PAGE_FAULTS_MIN"),
    EventSpec("major-faults", PERF_TYPE_SOFTWARE, 6, "PERF_COUNT_SW_PAGE_FAULTS_MAJ"),
)}

DEFAULT_HARDWARE = ("cycles", "instructions", "cache-references", "cache-misses", "branch-misses")
DEFAULT_SOFTWARE = ("task-clock", "page-faults", "context-switches", "cpu-migrations")


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


# --- the syscall ---------------------------------------------------------------------------------------------

_libc = None


def _syscall():
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
        _libc.syscall.restype = ctypes.c_long
    return _libc.syscall


def _syscall_number() -> int | None:
    return SYSCALL_NUMBERS.get(platform.machine().lower())


def perf_event_open(spec: EventSpec, tid: int = 0, group_fd: int = -1, *, exclude_kernel: bool = False,
                    inherit: bool = True, disabled: bool | None = None) -> int:
    """Open one counting event on thread ``tid`` (0 = the calling thread), any CPU. Returns the fd, or -errno."""
    nr = _syscall_number()
    if nr is None or not sys.platform.startswith("linux"):
        return -_errno.ENOSYS
    attr = PerfEventAttr()
    attr.type = spec.type
    attr.size = ctypes.sizeof(PerfEventAttr)
    attr.config = spec.config
    attr.read_format = READ_FORMAT
    if disabled is None:
        disabled = group_fd == -1  # leaders start disabled; members follow their leader
    flags = 0
    if disabled:
        flags |= _DISABLED
    if inherit:
        flags |= _INHERIT
    if exclude_kernel:
        flags |= _EXCLUDE_KERNEL | _EXCLUDE_HV
    attr.flags = flags
    fd = _syscall()(ctypes.c_long(nr), ctypes.byref(attr), ctypes.c_int(tid), ctypes.c_int(-1),
                    ctypes.c_int(group_fd), ctypes.c_ulong(PERF_FLAG_FD_CLOEXEC))
    if fd < 0:
        return -(ctypes.get_errno() or _errno.EINVAL)
    return int(fd)


def _ioctl(fd: int, request: int, arg: int = 0) -> None:
    import fcntl

    fcntl.ioctl(fd, request, arg)


def read_paranoid() -> int | None:
    try:
        with open(PARANOID_PATH) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def _errno_name(err: int) -> str:
    return _errno.errorcode.get(err, f"errno {err}")


def _explain(err: int, spec: EventSpec, paranoid: int | None) -> str:
    """Why ``perf_event_open(spec)`` failed with ``err``, as a sentence a user can act on."""
    call = f"perf_event_open({spec.c_name}) failed with {_errno_name(err)}"
    par = f"/proc/sys/kernel/perf_event_paranoid is {paranoid}" if paranoid is not None else \
        f"{PARANOID_PATH} is missing"
    if err == _errno.ENOENT:
        if spec.hardware:
            return f"the CPU has no PMU exposed (typical of a VM without virtual performance counters): {call}"
        return f"this kernel does not know the event: {call}"
    if err in (_errno.EOPNOTSUPP, getattr(_errno, "ENOTSUP", _errno.EOPNOTSUPP)):
        return f"the PMU does not support this event: {call}"
    if err == _errno.ENODEV:
        return f"no PMU device handles this event: {call}"
    if err in (_errno.EACCES, _errno.EPERM):
        return (f"not permitted: {par} (2 allows an unprivileged process user-space counting only, 3 or more "
                f"forbids it); lower it with `sudo sysctl kernel.perf_event_paranoid=1` or grant CAP_PERFMON "
                f"-- in a container the seccomp profile may block it too (--cap-add PERFMON): {call}")
    if err == _errno.ENOSYS:
        return (f"this kernel or sandbox has no perf_event_open (CONFIG_PERF_EVENTS off, or a seccomp filter "
                f"blocks it): {call}")
    if err == _errno.EBUSY:
        return f"another user holds the PMU exclusively: {call}"
    if err in (_errno.EMFILE, _errno.ENFILE):
        return f"out of file descriptors (one per event per thread; raise `ulimit -n`): {call}"
    if err == _errno.EINVAL:
        return f"the kernel rejected the event's attributes: {call}"
    return call


def _kernel_only_reason(spec: EventSpec, paranoid: int | None) -> str:
    return (f"{spec.name} happens only in the kernel and this process may count user space only "
            f"(/proc/sys/kernel/perf_event_paranoid is {paranoid}); lower it with "
            f"`sudo sysctl kernel.perf_event_paranoid=1` or grant CAP_PERFMON")


def _probe_event(spec: EventSpec, include_kernel: bool | None, paranoid: int | None,
                 inherit: bool = True) -> tuple[bool | None, str]:
    """Try to open ``spec`` on the calling thread. Returns (exclude_kernel to use, "") or (None, reason)."""
    attempts = [False, True] if include_kernel is None else [not include_kernel]
    err = 0
    for exclude_kernel in attempts:
        fd = perf_event_open(spec, 0, -1, exclude_kernel=exclude_kernel, inherit=inherit)
        if fd >= 0:
            os.close(fd)
            if exclude_kernel and spec.kernel_only:
                return None, _kernel_only_reason(spec, paranoid)
            return exclude_kernel, ""
        err = -fd
        if err not in (_errno.EACCES, _errno.EPERM):
            break
    return None, _explain(err, spec, paranoid)


def _summarise(failed: dict[str, str]) -> str:
    """``{event: reason}`` -> "cycles, instructions: <reason>; ..." grouping events that failed alike."""
    by_reason: dict[str, list[str]] = {}
    for name, reason in failed.items():
        spec = EVENTS.get(name)
        key = reason.replace(spec.c_name, "{}") if spec else reason
        by_reason.setdefault(key, []).append(name)
    parts = []
    for key, names in by_reason.items():
        specs = [EVENTS[n] for n in names if n in EVENTS]
        c_names = ", ".join(s.c_name for s in specs) if specs else ""
        parts.append(f"{', '.join(names)}: {key.replace('{}', c_names) if c_names else key}")
    return "; ".join(parts)


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
            from mlms_nb.errors import MlmsError

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
            _, reason = _probe_event(spec, config.include_kernel, paranoid, config.inherit)
            out[name] = reason
        return out

    @classmethod
    def available(cls, config: PerfEventsConfig | None = None) -> tuple[bool, str]:
        if not sys.platform.startswith("linux"):
            return False, f"perf events need Linux; this is {platform.system() or sys.platform}"
        if _syscall_number() is None:
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
            return False, f"no perf event could be opened -- {_summarise(failed)}"
        priv = f"perf_event_paranoid={paranoid}" + (", running as root" if os.geteuid() == 0 else "")
        text = f"counting {', '.join(ok)} for this process and its threads ({priv})"
        if failed:
            text += f"; unavailable -- {_summarise(failed)}"
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
        if self.running:
            return self
        cfg = self.config
        paranoid = read_paranoid()
        my_tid = threading.get_native_id()
        self.inherit_used = cfg.inherit
        # 1. per event: can it open here, with or without kernel-mode counting?
        mode: dict[str, bool] = {}
        for name in cfg.events:
            spec = EVENTS[name]
            excl, reason = _probe_event(spec, cfg.include_kernel, paranoid, self.inherit_used)
            if excl is None and self.inherit_used and "EINVAL" in reason:
                excl2, _ = _probe_event(spec, cfg.include_kernel, paranoid, False)
                if excl2 is not None:  # an old kernel that refuses inherit: count the calling threads only
                    self.inherit_used, excl, reason = False, excl2, ""
            if excl is None:
                self.unavailable_events[name] = reason
            else:
                mode[name] = excl
                if excl:
                    self.user_space_only.append(name)
        # 2. groups on the calling thread: hardware in one group, software in another; a member the kernel
        #    will not add to its group (too many for the PMU) becomes the leader of a new one.
        layout: list[list[tuple[EventSpec, bool]]] = []
        groups: list[_Group] = []
        for hardware in (True, False):
            current: list[int] = []
            members: list[tuple[EventSpec, bool]] = []
            for name in cfg.events:
                spec = EVENTS[name]
                if name not in mode or spec.hardware != hardware:
                    continue
                fd = perf_event_open(spec, my_tid, current[0] if current else -1, exclude_kernel=mode[name],
                                     inherit=self.inherit_used)
                if fd < 0 and current:
                    groups.append(_Group(my_tid, current[0], current, [s.name for s, _ in members]))
                    layout.append(members)
                    current, members = [], []
                    fd = perf_event_open(spec, my_tid, -1, exclude_kernel=mode[name], inherit=self.inherit_used)
                if fd < 0:
                    self.unavailable_events[name] = _explain(-fd, spec, paranoid)
                    continue
                current.append(fd)
                members.append((spec, mode[name]))
            if current:
                groups.append(_Group(my_tid, current[0], current, [s.name for s, _ in members]))
                layout.append(members)
        # 3. the other threads already running
        self.threads = [my_tid]
        if cfg.attach_existing_threads and layout:
            try:
                tids = sorted(int(t) for t in os.listdir("/proc/self/task"))
            except OSError:
                tids = []
            for tid in tids:
                if tid == my_tid:
                    continue
                opened = self._open_groups(tid, layout)
                if opened:
                    groups.extend(opened)
                    self.threads.append(tid)
        if not groups:
            from mlms_nb.errors import MlmsError

            raise MlmsError(f"no perf event could be opened -- {_summarise(self.unavailable_events)}")
        self.events = [n for n in cfg.events if any(n in g.names for g in groups)]
        self.units = {n: EVENTS[n].unit for n in self.events}
        pos = {n: i for i, n in enumerate(self.events)}
        self._groups = groups
        by_names: dict[tuple[str, ...], list[_Group]] = {}
        for g in groups:
            by_names.setdefault(tuple(g.names), []).append(g)
        self._batches = [_Batch(gs, [pos[n] for n in names]) for names, gs in by_names.items()]
        self._final = None
        self._samples = []
        # 4. go: reset and enable every leader, then take the baseline
        try:
            for g in groups:
                _ioctl(g.leader, PERF_EVENT_IOC_RESET, PERF_IOC_FLAG_GROUP)
                _ioctl(g.leader, PERF_EVENT_IOC_ENABLE, PERF_IOC_FLAG_GROUP)
            for b in self._batches:
                b.set_baseline()
        except BaseException:
            self.close()
            raise
        self.running = True
        self._samples.append((time.perf_counter_ns(), (0.0,) * len(self.events)))
        if cfg.interval_ms:
            self._stop_event.clear()
            self._sampler = threading.Thread(target=self._sample_loop, name="mlms-perf-sampler", daemon=True)
            self._sampler.start()
        return self

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
                _ioctl(g.leader, PERF_EVENT_IOC_DISABLE, PERF_IOC_FLAG_GROUP)
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
