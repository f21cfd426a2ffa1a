"""Linux ``perf_event_open(2)`` through ctypes (no ``perf`` binary): the ABI, the event table, and why an event
cannot be opened, as a sentence a user can act on. :mod:`mlms_nb.profilers.perf_events` builds the profiler on it.
"""
from __future__ import annotations

import ctypes
import errno as _errno
import os
import platform
import sys
from dataclasses import dataclass

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


# --- the syscall ---------------------------------------------------------------------------------------------

_libc = None


def _syscall():
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
        _libc.syscall.restype = ctypes.c_long
    return _libc.syscall


def syscall_number() -> int | None:
    return SYSCALL_NUMBERS.get(platform.machine().lower())


def perf_event_open(spec: EventSpec, tid: int = 0, group_fd: int = -1, *, exclude_kernel: bool = False,
                    inherit: bool = True, disabled: bool | None = None) -> int:
    """Open one counting event on thread ``tid`` (0 = the calling thread), any CPU. Returns the fd, or -errno."""
    nr = syscall_number()
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


def ioctl(fd: int, request: int, arg: int = 0) -> None:
    import fcntl

    fcntl.ioctl(fd, request, arg)


def read_paranoid() -> int | None:
    try:
        with open(PARANOID_PATH) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def errno_name(err: int) -> str:
    return _errno.errorcode.get(err, f"errno {err}")


def explain_failure(err: int, spec: EventSpec, paranoid: int | None) -> str:
    """Why ``perf_event_open(spec)`` failed with ``err``, as a sentence a user can act on."""
    call = f"perf_event_open({spec.c_name}) failed with {errno_name(err)}"
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


def kernel_only_reason(spec: EventSpec, paranoid: int | None) -> str:
    return (f"{spec.name} happens only in the kernel and this process may count user space only "
            f"(/proc/sys/kernel/perf_event_paranoid is {paranoid}); lower it with "
            f"`sudo sysctl kernel.perf_event_paranoid=1` or grant CAP_PERFMON")


def probe_event(spec: EventSpec, include_kernel: bool | None, paranoid: int | None,
                 inherit: bool = True) -> tuple[bool | None, str]:
    """Try to open ``spec`` on the calling thread. Returns (exclude_kernel to use, "") or (None, reason)."""
    attempts = [False, True] if include_kernel is None else [not include_kernel]
    err = 0
    for exclude_kernel in attempts:
        fd = perf_event_open(spec, 0, -1, exclude_kernel=exclude_kernel, inherit=inherit)
        if fd >= 0:
            os.close(fd)
            if exclude_kernel and spec.kernel_only:
                return None, kernel_only_reason(spec, paranoid)
            return exclude_kernel, ""
        err = -fd
        if err not in (_errno.EACCES, _errno.EPERM):
            break
    return None, explain_failure(err, spec, paranoid)


def summarise_failures(failed: dict[str, str]) -> str:
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
