"""NVIDIA GPUs through NVML (``nvidia-ml-py``, imported as ``pynvml`` lazily, through :func:`import_pynvml`): the
GPU list (:func:`list_gpus`, which :mod:`mlms_nb.stack` records) and a sampler.

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
    """The ``pynvml`` module of nvidia-ml-py; raises FrameworkNotInstalledError naming the extra to install.
    Every user of NVML in mlms_nb (the sampler, :mod:`mlms_nb.stack`, :mod:`mlms_nb.theory.ceilings`) gets it
    here."""
    try:
        import pynvml  # noqa: PLC0415
    except ImportError as exc:
        raise FrameworkNotInstalledError(
            f"NVIDIA GPU detection and sampling need nvidia-ml-py, which is not installed ({first_line(exc)}): "
            f"{INSTALL_HINT}") from None
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


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _optional(read: Callable[[], Any]) -> Any:
    """``read()``, or None when this GPU or driver cannot say (NVML_ERROR_NOT_SUPPORTED and friends)."""
    try:
        return read()
    except Exception:  # noqa: BLE001
        return None


def list_gpus() -> tuple[list[dict], str | None]:
    """The NVIDIA GPUs NVML sees: ``([{index, name, memory_bytes, driver, cuda_driver, cuda_capability}], None)``,
    or ``([], why)`` with a sentence saying why there is no list (nvidia-ml-py missing, no driver, no GPU).

    ``memory_bytes``: total device memory; ``driver``: the NVIDIA driver version; ``cuda_driver``: the CUDA
    version the driver supports (``"12.4"``); ``cuda_capability``: ``"major.minor"``. A field a GPU cannot report
    is None.
    """
    try:
        pynvml = import_pynvml()
    except FrameworkNotInstalledError as exc:
        return [], str(exc)
    try:
        nvml_init(pynvml)
    except Exception as exc:  # noqa: BLE001 - NVMLError_LibraryNotFound, _DriverNotLoaded, ...
        return [], _init_reason(pynvml, exc)
    try:
        driver = _optional(lambda: _text(pynvml.nvmlSystemGetDriverVersion()))
        cuda = _optional(pynvml.nvmlSystemGetCudaDriverVersion_v2)
        cuda_driver = f"{cuda // 1000}.{(cuda % 1000) // 10}" if cuda else None
        gpus = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            capability = _optional(lambda: pynvml.nvmlDeviceGetCudaComputeCapability(handle))
            memory = _optional(lambda: pynvml.nvmlDeviceGetMemoryInfo(handle).total)
            gpus.append({
                "index": i,
                "name": _optional(lambda: _text(pynvml.nvmlDeviceGetName(handle))) or f"cuda:{i}",
                "memory_bytes": int(memory) if memory is not None else None,
                "driver": driver,
                "cuda_driver": cuda_driver,
                "cuda_capability": f"{capability[0]}.{capability[1]}" if capability else None,
            })
    except Exception as exc:  # noqa: BLE001
        return [], f"NVML is initialised but listing the GPUs failed ({nvml_error_name(pynvml, exc)})"
    finally:
        nvml_shutdown(pynvml)
    if not gpus:
        return [], "NVML found no NVIDIA GPU (the driver is loaded but no device is visible)"
    return gpus, None


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
        gpus, why = list_gpus()
        if not gpus:
            return False, why
        names = ", ".join(f"cuda:{g['index']} {g['name']}" for g in gpus)
        return True, f"NVML sees {len(gpus)} GPU(s): {names}"

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
