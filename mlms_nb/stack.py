"""The hardware/software stack an evaluation ran on, and a short hash of the parts that make results comparable.

``detect_stack()`` reads the CPU (``/proc/cpuinfo`` or ``platform``), core counts and memory (psutil), NVIDIA
GPUs through NVML (:func:`mlms_nb.profilers.nvml.list_gpus`; when it cannot be used, ``hardware["gpu_note"]``
says why in words), the OS, kernel, Python, mlms-nb and numpy versions, and the installed version of each
requested framework, read from package metadata so that no framework is imported just to be named.

Detection runs once per process; later calls return copies of the cached answer.

``stack_hash()`` is the sha256 of the canonical JSON of ``hardware`` and ``software`` (not the hostname,
not the free-text GPU note), cut to 16 hex digits: two results with the same hash ran on the same kind
of machine with the same software.
"""
from __future__ import annotations

import copy
import functools
import hashlib
import json
import os
import platform
import socket
import sys
from importlib import metadata
from typing import Any, Iterable

from mlms_nb.manifest import FRAMEWORKS, canonical_framework

# The distributions that provide each framework's module, most common first.
FRAMEWORK_DISTRIBUTIONS: dict[str, tuple[str, ...]] = {
    "torch": ("torch",),
    "onnxruntime": ("onnxruntime", "onnxruntime-gpu", "onnxruntime-openvino", "onnxruntime-directml",
                    "ort-nightly", "ort-nightly-gpu"),
    "tensorflow": ("tensorflow", "tensorflow-cpu", "tensorflow-gpu", "tensorflow-intel", "tensorflow-macos",
                   "tf-nightly", "tf-nightly-cpu"),
}

HASH_EXCLUDED_HARDWARE = ("gpu_note",)
"""Hardware keys that describe detection, not the machine, and so stay out of the hash."""


# ---------------------------------------------------------------- hardware

def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            info = fh.read()
    except OSError:
        info = ""
    fields: dict[str, str] = {}
    for line in info.splitlines():
        if ":" in line:
            key, _, value = line.partition(":")
            fields.setdefault(key.strip().lower(), value.strip())
    for key in ("model name", "hardware", "cpu model", "processor", "uarch"):
        value = fields.get(key, "")
        if value and not value.isdigit():
            return value
    if sys.platform == "darwin":
        import subprocess

        try:
            out = subprocess.run(["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True, text=True,
                                 timeout=5, check=False).stdout.strip()
            if out:
                return out
        except (OSError, subprocess.SubprocessError):
            pass
    return platform.processor() or platform.machine() or "unknown"


def _cores_and_memory() -> tuple[int | None, int | None, int | None]:
    try:
        import psutil
    except ImportError:
        psutil = None
    logical = os.cpu_count()
    physical = None
    memory = None
    if psutil is not None:
        physical = psutil.cpu_count(logical=False)
        logical = psutil.cpu_count(logical=True) or logical
        memory = int(psutil.virtual_memory().total)
    else:
        try:
            memory = int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
        except (ValueError, OSError, AttributeError):
            memory = None
    return physical, logical, memory


def detect_gpus() -> tuple[list[dict], str | None]:
    """NVIDIA GPUs through NVML: ``([{index, name, memory_bytes, driver, cuda_driver, cuda_capability}], None)``,
    or ``([], note)`` with a sentence saying why there is no GPU list (:func:`mlms_nb.profilers.nvml.list_gpus`)."""
    from mlms_nb.profilers.nvml import list_gpus

    return list_gpus()


# ---------------------------------------------------------------- software

def _os_name() -> str:
    system = platform.system() or sys.platform
    pretty = None
    if system == "Linux":
        try:
            pretty = platform.freedesktop_os_release().get("PRETTY_NAME")
        except (OSError, AttributeError):
            pretty = None
    elif system == "Darwin":
        pretty = f"macOS {platform.mac_ver()[0]}" if platform.mac_ver()[0] else None
    elif system == "Windows":
        pretty = f"Windows {platform.version()}"
    return f"{system} ({pretty})" if pretty else system


def _dist_version(names: Iterable[str]) -> str | None:
    for name in names:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


@functools.lru_cache(maxsize=None)
def framework_version(framework: str) -> str | None:
    """The installed version of a framework from package metadata (no import); None when not installed."""
    fw = canonical_framework(framework)
    version = _dist_version(FRAMEWORK_DISTRIBUTIONS.get(fw, (fw,)))
    if version is None and fw in sys.modules:  # e.g. a source build without metadata, already imported
        version = getattr(sys.modules[fw], "__version__", None)
    return None if version is None else str(version)


@functools.lru_cache(maxsize=1)
def _base_stack() -> dict:
    physical, logical, memory = _cores_and_memory()
    gpus, note = detect_gpus()
    hardware: dict[str, Any] = {
        "cpu_model": _cpu_model(),
        "cpu_arch": platform.machine() or "unknown",
        "physical_cores": physical,
        "logical_cores": logical,
        "memory_bytes": memory,
        "gpus": gpus,
    }
    if note:
        hardware["gpu_note"] = note
    from mlms_nb._version import __version__ as mlms_version
    import numpy

    software = {
        "os": _os_name(),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "python_implementation": platform.python_implementation(),
        "mlms_nb": mlms_version,
        "numpy": numpy.__version__,
    }
    return {"hardware": hardware, "software": software, "hostname": socket.gethostname()}


def detect_stack(frameworks: Iterable[str] = (), refresh: bool = False) -> dict:
    """``{"hardware": {...}, "software": {..., <framework>: version}, "hostname"}`` for this process.

    ``frameworks`` name the frameworks whose versions to record (aliases such as ``pytorch`` are
    accepted; an uninstalled one records None). ``refresh=True`` detects again instead of using the cache.
    """
    if refresh:
        _base_stack.cache_clear()
        framework_version.cache_clear()
    stack = copy.deepcopy(_base_stack())
    for name in frameworks:
        fw = canonical_framework(name)
        stack["software"][fw] = framework_version(fw)
    return stack


# ---------------------------------------------------------------- comparability

def comparable_part(stack: dict, framework: str | None = None) -> dict:
    """The part of a stack that defines comparability: hardware (less the GPU note) and software.

    With ``framework``, the software keeps only that framework's version among the known frameworks, so
    one framework's results hash the same whichever other frameworks shared its evaluation.
    """
    hardware = {k: v for k, v in (stack.get("hardware") or {}).items() if k not in HASH_EXCLUDED_HARDWARE}
    software = dict(stack.get("software") or {})
    if framework is not None:
        fw = canonical_framework(framework)
        software = {k: v for k, v in software.items() if k == fw or k not in FRAMEWORKS}
    return {"hardware": hardware, "software": software}


def stack_hash(stack: dict, framework: str | None = None) -> str:
    """16 hex digits of the sha256 of the canonical JSON of ``stack``'s hardware and software.

    The hostname (and the GPU detection note) are left out: the same model of machine with the same
    software gives the same hash. See :func:`comparable_part` for ``framework``.
    """
    canonical = json.dumps(comparable_part(stack, framework), sort_keys=True, separators=(",", ":"),
                           ensure_ascii=True, default=str)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:16]


def describe_stack(stack: dict, threads: int | None = None) -> str:
    """One line for people: ``AMD EPYC (x86_64, 8 cores / 16 threads, 64 GiB), no GPU, Linux (...), Python 3.11.7``."""
    hw = stack.get("hardware") or {}
    sw = stack.get("software") or {}
    cores = []
    if hw.get("physical_cores"):
        cores.append(f"{hw['physical_cores']} cores")
    if hw.get("logical_cores"):
        cores.append(f"{hw['logical_cores']} logical CPUs")
    parts = [hw.get("cpu_arch")] + [" / ".join(cores) if cores else None]
    if hw.get("memory_bytes"):
        parts.append(f"{hw['memory_bytes'] / 2**30:.0f} GiB")
    cpu = f"{hw.get('cpu_model', 'unknown CPU')} ({', '.join(p for p in parts if p)})"
    gpus = hw.get("gpus") or []
    gpu = ", ".join(f"{g.get('name')} ({g.get('memory_bytes', 0) / 2**30:.0f} GiB)" for g in gpus) or "no GPU"
    text = f"{cpu}, {gpu}, {sw.get('os', '?')}, Python {sw.get('python', '?')}"
    versions = [f"{fw} {sw[fw]}" for fw in FRAMEWORKS if sw.get(fw)]
    if versions:
        text += ", " + ", ".join(versions)
    if threads:
        text += f"; {threads} threads"
    return text
