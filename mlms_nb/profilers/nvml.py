"""NVIDIA GPU sampler through NVML (``nvidia-ml-py``, imported as ``pynvml`` lazily, here and nowhere else).

A background thread reads, every ``interval_ms`` (default 20), for each GPU: power (W), GPU and memory
utilisation (%), memory used (bytes), SM and memory clocks (MHz) and temperature (C). The reading itself is a
dependency of the sampler -- a callable returning ``(device, metric, value, unit)`` tuples -- so the sampling
logic can be driven by a fake reader where there is no GPU; by default it is :class:`PynvmlReader`.

Devices are named ``cuda:<NVML index>``. NVML numbers GPUs in PCI bus order, which is also CUDA's order
when ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` and ``CUDA_VISIBLE_DEVICES`` is unset.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Iterable

from mlms_nb.errors import FrameworkNotInstalledError
from mlms_nb.profilers._base import BackgroundSampler, Row, first_line

INSTALL_HINT = "pip install 'mlms-nb[gpu]'"

Reading = tuple  # (device: str, metric: str, value: float, unit: str)
Reader = Callable[[], Iterable[Reading]]


def import_pynvml():
    """The ``pynvml`` module of nvidia-ml-py; raises FrameworkNotInstalledError naming the extra to install."""
    try:
        import pynvml  # noqa: PLC0415 - the one place nvidia-ml-py is imported
    except ImportError as exc:
        raise FrameworkNotInstalledError(
            f"GPU sampling needs nvidia-ml-py, which is not installed ({first_line(exc)}): {INSTALL_HINT}"
        ) from None
    return pynvml


def nvml_error_name(pynvml, exc: BaseException) -> str:
    """``NVMLError_LibraryNotFound`` -> ``NVML_ERROR_LIBRARY_NOT_FOUND`` (by its code), else the message."""
    value = getattr(exc, "value", None)
    if value is not None:
        for name in dir(pynvml):
            if name.startswith("NVML_ERROR_") and getattr(pynvml, name) == value:
                return name
    return first_line(exc)


_init_lock = threading.Lock()
_init_count = 0


def nvml_init(pynvml) -> None:
    """nvmlInit, counted so that nested users share one initialisation."""
    global _init_count
    with _init_lock:
        if _init_count == 0:
            pynvml.nvmlInit()
        _init_count += 1


def nvml_shutdown(pynvml) -> None:
    global _init_count
    with _init_lock:
        if _init_count == 0:
            return
        _init_count -= 1
        if _init_count == 0:
            try:
                pynvml.nvmlShutdown()
            except Exception:  # noqa: BLE001
                pass


def _init_reason(pynvml, exc: BaseException) -> str:
    name = nvml_error_name(pynvml, exc)
    if name in ("NVML_ERROR_LIBRARY_NOT_FOUND", "NVML_ERROR_DRIVER_NOT_LOADED", "NVML_ERROR_FUNCTION_NOT_FOUND"):
        return f"no NVIDIA driver: NVML could not be initialised ({name})"
    if name == "NVML_ERROR_NO_PERMISSION":
        return f"NVML could not be initialised: no permission to open the NVIDIA device files ({name})"
    if name == "NVML_ERROR_INSUFFICIENT_SIZE" or name == "NVML_ERROR_LIB_RM_VERSION_MISMATCH":
        return (f"NVML could not be initialised: the NVIDIA driver and its user-space library disagree "
                f"(reboot after a driver update?) ({name})")
    return f"NVML could not be initialised ({name})"


class PynvmlReader:
    """Reads every GPU through pynvml. ``open()`` initialises NVML; ``__call__`` returns one reading per metric.

    A metric a GPU does not support (NVML_ERROR_NOT_SUPPORTED) is dropped for that GPU after the first try,
    and listed in ``unsupported``.
    """

    METRICS = ("power", "gpu_utilization", "memory_utilization", "memory_used", "sm_clock", "memory_clock",
               "temperature")

    def __init__(self, indices: Iterable[int] | None = None):
        self.indices = list(indices) if indices is not None else None
        self.pynvml = None
        self.handles: list[tuple[str, Any]] = []
        self.unsupported: dict[str, set[str]] = {}
        self.names: dict[str, str] = {}

    def open(self) -> "PynvmlReader":
        pynvml = import_pynvml()
        nvml_init(pynvml)
        self.pynvml = pynvml
        indices = self.indices if self.indices is not None else range(pynvml.nvmlDeviceGetCount())
        for i in indices:
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            device = f"cuda:{i}"
            self.handles.append((device, handle))
            self.unsupported[device] = set()
            try:
                name = pynvml.nvmlDeviceGetName(handle)
                self.names[device] = name.decode() if isinstance(name, bytes) else str(name)
            except Exception:  # noqa: BLE001
                pass
        return self

    def close(self) -> None:
        if self.pynvml is not None:
            nvml_shutdown(self.pynvml)
            self.pynvml = None
            self.handles = []

    def _metric(self, handle, metric: str) -> list[tuple[str, float, str]]:
        nv = self.pynvml
        if metric == "power":
            return [("power", nv.nvmlDeviceGetPowerUsage(handle) / 1000.0, "W")]
        if metric == "gpu_utilization" or metric == "memory_utilization":
            u = nv.nvmlDeviceGetUtilizationRates(handle)
            return [("gpu_utilization", float(u.gpu), "%"), ("memory_utilization", float(u.memory), "%")]
        if metric == "memory_used":
            return [("memory_used", float(nv.nvmlDeviceGetMemoryInfo(handle).used), "bytes")]
        if metric == "sm_clock":
            return [("sm_clock", float(nv.nvmlDeviceGetClockInfo(handle, nv.NVML_CLOCK_SM)), "MHz")]
        if metric == "memory_clock":
            return [("memory_clock", float(nv.nvmlDeviceGetClockInfo(handle, nv.NVML_CLOCK_MEM)), "MHz")]
        if metric == "temperature":
            return [("temperature", float(nv.nvmlDeviceGetTemperature(handle, nv.NVML_TEMPERATURE_GPU)), "C")]
        raise KeyError(metric)

    def __call__(self) -> list[Reading]:
        if self.pynvml is None:
            self.open()
        nv = self.pynvml
        out: list[Reading] = []
        for device, handle in self.handles:
            skip = self.unsupported[device]
            for metric in self.METRICS:
                if metric in skip or metric == "memory_utilization":  # read together with gpu_utilization
                    continue
                try:
                    for name, value, unit in self._metric(handle, metric):
                        out.append((device, name, value, unit))
                except nv.NVMLError as exc:
                    if getattr(exc, "value", None) == nv.NVML_ERROR_NOT_SUPPORTED:
                        skip.add(metric)
                    # other errors (a GPU fallen off the bus, a timeout): this sample goes without it
        return out


@dataclass
class NvmlConfig:
    """interval_ms: sampling period. devices: NVML indices to sample (None = every GPU)."""

    interval_ms: float = 20.0
    devices: tuple[int, ...] | None = None


class NvmlSampler(BackgroundSampler):
    """Samples GPU power, utilisation, memory, clocks and temperature on a background thread.

    ``reader`` is what reads the GPUs: a callable returning ``(device, metric, value, unit)`` tuples, optionally
    with ``open()``/``close()`` (called by ``start()``/``stop()``). None means :class:`PynvmlReader`.
    """

    name: ClassVar[str] = "nvml"
    source: ClassVar[str] = "nvml"
    config_class: ClassVar[type] = NvmlConfig

    def __init__(self, config: NvmlConfig | None = None, reader: Reader | None = None):
        super().__init__(config)
        self._reader_given = reader is not None
        self.reader: Reader | None = reader

    @classmethod
    def available(cls, config: NvmlConfig | None = None) -> tuple[bool, str]:
        try:
            pynvml = import_pynvml()
        except FrameworkNotInstalledError as exc:
            return False, str(exc)
        try:
            nvml_init(pynvml)
        except Exception as exc:  # noqa: BLE001 - NVMLError and friends
            return False, _init_reason(pynvml, exc)
        try:
            count = pynvml.nvmlDeviceGetCount()
            if count == 0:
                return False, "NVML found no NVIDIA GPU (the driver is loaded but no device is visible)"
            names = []
            for i in range(count):
                try:
                    name = pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(i))
                    names.append(f"cuda:{i} {name.decode() if isinstance(name, bytes) else name}")
                except Exception as exc:  # noqa: BLE001
                    names.append(f"cuda:{i} ({nvml_error_name(pynvml, exc)})")
            return True, f"NVML sees {count} GPU(s): {', '.join(names)}"
        except Exception as exc:  # noqa: BLE001
            return False, f"NVML is initialised but listing the GPUs failed ({nvml_error_name(pynvml, exc)})"
        finally:
            nvml_shutdown(pynvml)

    def _open(self) -> None:
        if self.reader is None:
            self.reader = PynvmlReader(self.config.devices)
        opener = getattr(self.reader, "open", None)
        if callable(opener):
            opener()

    def _close(self) -> None:
        closer = getattr(self.reader, "close", None)
        if callable(closer):
            closer()
        if not self._reader_given:
            self.reader = None

    def _sample(self, ts_ns: int) -> list[Row]:
        src = self.source
        return [(ts_ns, src, metric, float(value), unit, device) for device, metric, value, unit in self.reader()]
