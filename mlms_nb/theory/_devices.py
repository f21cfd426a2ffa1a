"""The devices a roofline's ceilings are measured on: naming and checking them (``cpu``, ``cuda:N``), the CPU's
last-level cache size (sysfs) and a GPU's theoretical fp32 peak and bandwidth from its data-sheet numbers (NVML).
PyTorch and NVML are imported on first use."""
from __future__ import annotations

import glob
import os
from typing import Any

from mlms_nb.errors import FrameworkNotInstalledError, MlmsError

# fp32 lanes (CUDA cores) per SM by compute capability, from NVIDIA's CUDA programming guide.
FP32_LANES_PER_SM = {(5, 0): 128, (5, 2): 128, (5, 3): 128, (6, 0): 64, (6, 1): 128, (6, 2): 128, (7, 0): 64,
                     (7, 2): 64, (7, 5): 64, (8, 0): 64, (8, 6): 128, (8, 7): 128, (8, 9): 128, (9, 0): 128,
                     (10, 0): 128, (10, 3): 128, (12, 0): 128, (12, 1): 128}


class DeviceUnavailableError(MlmsError):
    """The requested device cannot be measured here (no CUDA build of PyTorch, no GPU, index out of range)."""


def torch_module():
    try:
        import torch  # noqa: PLC0415 - imported on first use
    except ImportError:
        raise FrameworkNotInstalledError("measuring machine ceilings needs PyTorch: pip install 'mlms-nb[torch]'") from None
    return torch


def parse_device(device: Any) -> str:
    """``"cpu"``, ``"cuda"`` (-> ``cuda:0``) or ``"cuda:N"``, checked for form only; anything else is an MlmsError."""
    text = str(device).strip().lower()
    if text == "cpu":
        return "cpu"
    if text in ("cuda", "gpu"):
        return "cuda:0"
    kind, _, index = text.partition(":")
    if kind in ("cuda", "gpu") and index.isdigit():
        return f"cuda:{int(index)}"
    raise MlmsError(f"device {device!r}: expected 'cpu', 'cuda' or 'cuda:N' (N a GPU index)")


def check_available(device: str) -> None:
    """Raise DeviceUnavailableError, saying why, when ``device`` (from :func:`parse_device`) cannot run here."""
    if device == "cpu":
        return
    torch = torch_module()
    if torch.version.cuda is None:
        raise DeviceUnavailableError(f"device {device!r}: PyTorch {torch.__version__} here is a CPU-only build, so "
                                     "nothing can run on a GPU; install a CUDA build of torch on a machine with an "
                                     "NVIDIA GPU")
    if not torch.cuda.is_available():
        raise DeviceUnavailableError(f"device {device!r}: no CUDA device is visible (torch.cuda.is_available() is "
                                     "False: no NVIDIA GPU or driver, or CUDA_VISIBLE_DEVICES hides them)")
    index = int(device.split(":")[1])
    if index >= torch.cuda.device_count():
        raise DeviceUnavailableError(f"device {device!r}: only {torch.cuda.device_count()} CUDA device(s) visible")


def last_level_cache_bytes(device: str = "cpu") -> int | None:
    """Total size of the highest-level CPU cache over its instances (Linux sysfs); on a CUDA device its L2 cache
    (as PyTorch reports it); None where unknown."""
    if device.startswith("cuda"):
        import sys

        torch = sys.modules.get("torch")  # a CUDA run has torch loaded; nothing is imported for this
        try:
            index = int(device.split(":")[1]) if ":" in device else 0
            return int(getattr(torch.cuda.get_device_properties(index), "L2_cache_size", 0) or 0) or None
        except Exception:  # noqa: BLE001 - no torch, no CUDA: unknown
            return None
    best: dict[str, tuple[int, int]] = {}  # shared_cpu_list -> (level, bytes)
    for folder in glob.glob("/sys/devices/system/cpu/cpu[0-9]*/cache/index[0-9]*"):
        try:
            with open(os.path.join(folder, "level")) as f:
                level = int(f.read())
            with open(os.path.join(folder, "size")) as f:
                size = f.read().strip().upper()
            with open(os.path.join(folder, "shared_cpu_list")) as f:
                shared = f.read().strip()
            with open(os.path.join(folder, "type")) as f:
                kind = f.read().strip()
        except (OSError, ValueError):
            continue
        if kind == "Instruction":
            continue
        factor = {"K": 2**10, "M": 2**20, "G": 2**30}.get(size[-1:], 1)
        value = int(size.rstrip("KMG")) * factor
        best[f"{level}:{shared}"] = (level, value)
    if not best:
        return None
    top = max(level for level, _ in best.values())
    return sum(value for level, value in best.values() if level == top)


def gpu_theoretical(sm_count: int, capability: tuple[int, int], sm_clock_mhz: float | None,
                    memory_clock_mhz: float | None, bus_width_bits: int | None) -> tuple[float | None, float | None]:
    """(fp32 FLOP/s, bytes/s) from the data sheet formula; None for a part that cannot be computed."""
    lanes = FP32_LANES_PER_SM.get(tuple(capability))
    flops = 2.0 * sm_count * lanes * sm_clock_mhz * 1e6 if lanes and sm_clock_mhz else None
    bandwidth = 2.0 * memory_clock_mhz * 1e6 * bus_width_bits / 8 if memory_clock_mhz and bus_width_bits else None
    return flops, bandwidth


def nvml_limits(uuid: str | None, index: int) -> tuple[dict[str, float], str]:
    """Max SM and memory clocks (MHz) and the memory bus width (bits) from NVML, and a note when it failed."""
    from mlms_nb.profilers.nvml import import_pynvml, nvml_error_name, nvml_init, nvml_shutdown

    try:
        pynvml = import_pynvml()
    except FrameworkNotInstalledError as err:
        return {}, str(err)
    try:
        nvml_init(pynvml)
    except Exception as err:  # noqa: BLE001 - NVMLError_*
        return {}, f"NVML could not start ({nvml_error_name(pynvml, err)}): no theoretical numbers"
    try:
        handle = None
        if uuid:
            try:
                handle = pynvml.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith("GPU-") else f"GPU-{uuid}")
            except Exception:  # noqa: BLE001 - fall back to the index
                handle = None
        handle = handle or pynvml.nvmlDeviceGetHandleByIndex(index)
        return {
            "sm_clock_mhz": float(pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_SM)),
            "memory_clock_mhz": float(pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_MEM)),
            "bus_width_bits": int(pynvml.nvmlDeviceGetMemoryBusWidth(handle)),
        }, ""
    except Exception as err:  # noqa: BLE001
        return {}, f"NVML could not read clocks or bus width ({nvml_error_name(pynvml, err)})"
    finally:
        nvml_shutdown(pynvml)
