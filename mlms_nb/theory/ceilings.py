"""Machine ceilings for a roofline: measured peak fp32 FLOP/s and memory bandwidth, cached per machine.

- Peak FLOP/s: fp32 GEMM, ``torch.matmul`` of two n x n matrices (2 n^3 FLOPs each; n >= 1024, so
  the GEMM is compute bound: 2 n^3 / (12 n^2) >= 170 FLOP/byte), median over timed repetitions after a
  warm-up. On the CPU n is picked so one GEMM takes ~0.1 s, keeping the whole measurement under ~3 s.
- Bandwidth: the STREAM triad ``a = b + s * c`` as one kernel (``torch.add(b, c, alpha=s, out=a)``) on
  float64 arrays each at least 4x the last-level cache, counting STREAM's 24 bytes per element (reads
  ``b`` and ``c``, writes ``a``). Write-allocate (reading ``a`` before writing it) is not counted, as in
  STREAM, so the DRAM traffic can be up to 4/3 of the figure.
- Ridge point: peak / bandwidth, in FLOP per byte: kernels of lower intensity are memory bound.

On a GPU (``cuda`` / ``cuda:N``) the same two kernels run on the device, timed with CUDA events, TF32 off;
NVML (``nvidia-ml-py``) and the device properties add the theoretical numbers: fp32 peak = SMs x fp32
lanes per SM x 2 x max SM clock, bandwidth = 2 (double data rate) x max memory clock x bus width / 8.

``machine_ceilings()`` measures once per machine and keeps the result in the history store, keyed by the
stack hash (hardware + software, torch included) and the device; CPU results are reused only at the same
torch thread count. ``refresh=True`` measures again.
"""
from __future__ import annotations

import dataclasses
import html
import math
import statistics
import time
from dataclasses import dataclass
from typing import Any, Protocol

import pandas as pd

from mlms_nb._clock import now_utc
from mlms_nb.errors import MlmsError
from mlms_nb.stack import detect_stack, stack_hash
from mlms_nb.theory._devices import (  # noqa: F401  (gpu_theoretical, DeviceUnavailableError: this module's API)
    DeviceUnavailableError, check_available, gpu_theoretical, last_level_cache_bytes, nvml_limits, parse_device,
    torch_module)

CPU_GEMM_TARGET_S = 0.1
CPU_GEMM_REPETITIONS = 5
CPU_TRIAD_REPETITIONS = 8
GPU_GEMM_SIZE = 8192
GPU_GEMM_REPETITIONS = 10
GPU_TRIAD_REPETITIONS = 20
MIN_TRIAD_ARRAY_BYTES = 64 * 2**20
CPU_PHASE_BUDGET_S = 1.5  # each CPU phase stops repeating past this (after MIN_REPETITIONS), on a busy machine
MIN_REPETITIONS = 3
NOISY_SPREAD = 0.2  # IQR / median above which the result carries a warning note
TRIAD_SCALAR = 3.0
TRIAD_BYTES_PER_ELEMENT = 3 * 8  # float64: read b, read c, write a


@dataclass(frozen=True)
class Ceilings:
    """Measured ceilings of one device. Rates in FLOP/s and bytes/s; ``*_iqr``: interquartile range of the
    per-repetition rates (same unit); ``ridge_flop_per_byte`` = peak / bandwidth."""
    device: str
    peak_flops_per_s: float
    peak_flops_iqr: float
    bandwidth_bytes_per_s: float
    bandwidth_iqr: float
    ridge_flop_per_byte: float
    method: str
    measured_at: str
    stack_hash: str
    device_name: str = ""
    threads: int | None = None
    theoretical_peak_flops_per_s: float | None = None
    theoretical_bandwidth_bytes_per_s: float | None = None
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Ceilings":
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})

    def to_frame(self) -> pd.DataFrame:
        """One row per figure: metric, value, iqr (spread over repetitions), unit, how it was obtained."""
        rows = [
            ("peak_flops_per_s", self.peak_flops_per_s, self.peak_flops_iqr, "FLOP/s", "measured: fp32 GEMM"),
            ("bandwidth_bytes_per_s", self.bandwidth_bytes_per_s, self.bandwidth_iqr, "bytes/s",
             "measured: STREAM triad"),
            ("ridge_flop_per_byte", self.ridge_flop_per_byte, math.nan, "FLOP/byte", "peak / bandwidth"),
        ]
        if self.theoretical_peak_flops_per_s:
            rows.append(("theoretical_peak_flops_per_s", self.theoretical_peak_flops_per_s, math.nan, "FLOP/s",
                         "SMs x fp32 lanes x 2 x max SM clock (NVML)"))
        if self.theoretical_bandwidth_bytes_per_s:
            rows.append(("theoretical_bandwidth_bytes_per_s", self.theoretical_bandwidth_bytes_per_s, math.nan,
                         "bytes/s", "2 x max memory clock x bus width (NVML)"))
        frame = pd.DataFrame(rows, columns=["metric", "value", "iqr", "unit", "how"])
        frame.attrs.update(device=self.device, method=self.method, measured_at=self.measured_at,
                           stack_hash=self.stack_hash)
        return frame

    def _lines(self) -> list[str]:
        lines = [
            f"peak fp32: {self.peak_flops_per_s / 1e9:,.1f} GFLOP/s (IQR {self.peak_flops_iqr / 1e9:,.1f})",
            f"memory bandwidth: {self.bandwidth_bytes_per_s / 1e9:,.1f} GB/s (IQR {self.bandwidth_iqr / 1e9:,.1f})",
            f"ridge point: {self.ridge_flop_per_byte:,.2f} FLOP/byte (peak / bandwidth)",
        ]
        if self.theoretical_peak_flops_per_s:
            lines.append(f"theoretical peak fp32: {self.theoretical_peak_flops_per_s / 1e9:,.1f} GFLOP/s")
        if self.theoretical_bandwidth_bytes_per_s:
            lines.append(f"theoretical bandwidth: {self.theoretical_bandwidth_bytes_per_s / 1e9:,.1f} GB/s")
        return lines

    def __str__(self) -> str:
        head = f"Ceilings of {self.device} ({self.device_name}), measured {self.measured_at}, stack {self.stack_hash}"
        return "\n".join([head] + [f"  {line}" for line in self._lines()] + [f"  how: {self.method}"]
                         + ([f"  note: {self.note}"] if self.note else []))

    def _repr_html_(self) -> str:
        e = html.escape
        rows = "".join(f"<tr><td>{e(r.metric)}</td><td style='text-align:right'>{_fmt(r.value)}</td>"
                       f"<td style='text-align:right'>{_fmt(r.iqr)}</td><td>{e(r.unit)}</td><td>{e(r.how)}</td></tr>"
                       for r in self.to_frame().itertuples())
        note = f"<p><b>Note:</b> {e(self.note)}</p>" if self.note else ""
        return (f"<div><b>Ceilings of {e(self.device)}</b> ({e(self.device_name)}), measured {e(self.measured_at)}, "
                f"stack <code>{e(self.stack_hash)}</code>"
                "<table><tr><th>metric</th><th>value</th><th>IQR</th><th>unit</th><th>how</th></tr>"
                f"{rows}</table><p><small>{e(self.method)}</small></p>{note}</div>")


def _fmt(value: float) -> str:
    if value is None or value != value:
        return ""
    return f"{value:.4g}" if abs(value) < 1e3 else f"{value:.4e}"


# ---------------------------------------------------------------- measuring

def _median_iqr(values: list[float]) -> tuple[float, float]:
    q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive") if len(values) > 1 else (values[0],) * 3
    return float(statistics.median(values)), float(q3 - q1)


def _timer(torch, device: str):
    """``run(fn) -> seconds`` for one call: CUDA events on a GPU, perf_counter on the CPU."""
    if device == "cpu":
        def run(fn) -> float:
            start = time.perf_counter()
            fn()
            return time.perf_counter() - start
        return run

    def run_cuda(fn) -> float:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3
    return run_cuda


def _repeat(measure, repetitions: int, budget_s: float | None) -> list[float]:
    """Up to ``repetitions`` results of ``measure()``, fewer (not under MIN_REPETITIONS) once ``budget_s`` is spent."""
    started, out = time.perf_counter(), []
    for _ in range(repetitions):
        out.append(measure())
        if budget_s is not None and len(out) >= MIN_REPETITIONS and time.perf_counter() - started > budget_s:
            break
    return out


def _gemm(torch, device: str, timer, size: int | None, repetitions: int,
          budget_s: float | None = None) -> tuple[list[float], int]:
    """Per-repetition FLOP/s of an n x n fp32 GEMM, and n."""
    if size is None:  # CPU: calibrate at n = 1024, then aim at CPU_GEMM_TARGET_S per GEMM
        a = torch.rand(1024, 1024, device=device)
        timer(lambda: torch.matmul(a, a))
        rate = 2 * 1024**3 / max(timer(lambda: torch.matmul(a, a)), 1e-9)
        size = int(min(max(round((CPU_GEMM_TARGET_S * rate / 2) ** (1 / 3) / 256) * 256, 1024), 4096))
    a = torch.rand(size, size, device=device)
    b = torch.rand(size, size, device=device)
    c = torch.empty(size, size, device=device)
    timer(lambda: torch.matmul(a, b, out=c))  # warm-up
    return _repeat(lambda: 2.0 * size**3 / timer(lambda: torch.matmul(a, b, out=c)), repetitions, budget_s), size


def _triad(torch, device: str, timer, array_bytes: int, repetitions: int, budget_s: float | None = None) -> list[float]:
    """Per-repetition bytes/s of a = b + s*c on float64 arrays of ``array_bytes`` each (24 bytes per element)."""
    n = array_bytes // 8
    a = torch.zeros(n, dtype=torch.float64, device=device)  # zeros/full touch every page before timing
    b = torch.full((n,), 1.0, dtype=torch.float64, device=device)
    c = torch.full((n,), 2.0, dtype=torch.float64, device=device)
    timer(lambda: torch.add(b, c, alpha=TRIAD_SCALAR, out=a))  # warm-up
    rates = _repeat(lambda: TRIAD_BYTES_PER_ELEMENT * n / timer(lambda: torch.add(b, c, alpha=TRIAD_SCALAR, out=a)),
                    repetitions, budget_s)
    if device == "cpu" and float(a[n // 2]) != 1.0 + TRIAD_SCALAR * 2.0:
        raise MlmsError("the triad kernel computed a wrong value; the bandwidth measurement is void")
    return rates


def _cpu_triad_bytes() -> tuple[int, str]:
    cache = last_level_cache_bytes()
    size = max(4 * (cache or 0), MIN_TRIAD_ARRAY_BYTES)
    why = (f"4x the {cache / 2**20:.0f} MiB last-level cache" if cache and 4 * cache >= MIN_TRIAD_ARRAY_BYTES
           else f"at least {MIN_TRIAD_ARRAY_BYTES // 2**20} MiB" + ("" if cache else " (cache size unknown)"))
    try:
        import psutil

        size = min(size, psutil.virtual_memory().available // 12)  # all three arrays in a quarter of free memory
    except ImportError:
        pass
    return int(size), why


def _stack_hash() -> str:
    return stack_hash(detect_stack(["torch"]), framework="torch")


def measure_ceilings(device: str = "cpu") -> Ceilings:
    """Measure peak fp32 FLOP/s and triad bandwidth of ``device`` now (no cache; see ``machine_ceilings``)."""
    device = parse_device(device)
    check_available(device)
    torch = torch_module()
    timer = _timer(torch, device)
    note, theoretical_flops, theoretical_bw = "", None, None
    if device == "cpu":
        threads = torch.get_num_threads()
        name = detect_stack()["hardware"].get("cpu_model", "CPU")
        array_bytes, why = _cpu_triad_bytes()
        with torch.inference_mode():
            gemm_rates, n = _gemm(torch, device, timer, None, CPU_GEMM_REPETITIONS, CPU_PHASE_BUDGET_S)
            triad_rates = _triad(torch, device, timer, array_bytes, CPU_TRIAD_REPETITIONS, CPU_PHASE_BUDGET_S)
        where = f"{threads} torch threads"
    else:
        index = int(device.split(":")[1])
        props = torch.cuda.get_device_properties(index)
        name, threads = props.name, None
        l2 = int(getattr(props, "L2_cache_size", 0) or 0)
        array_bytes = max(4 * l2, 4 * MIN_TRIAD_ARRAY_BYTES)
        why = f"4x the {l2 / 2**20:.0f} MiB L2 cache or 256 MiB, whichever is larger"
        previous = (torch.backends.cuda.matmul.allow_tf32, torch.get_float32_matmul_precision())
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.set_float32_matmul_precision("highest")
        try:
            with torch.cuda.device(index), torch.inference_mode():
                gemm_rates, n = _gemm(torch, device, timer, GPU_GEMM_SIZE, GPU_GEMM_REPETITIONS)
                triad_rates = _triad(torch, device, timer, array_bytes, GPU_TRIAD_REPETITIONS)
                torch.cuda.empty_cache()
        finally:
            torch.backends.cuda.matmul.allow_tf32 = previous[0]
            torch.set_float32_matmul_precision(previous[1])
        limits, note = nvml_limits(str(getattr(props, "uuid", "") or ""), index)
        theoretical_flops, theoretical_bw = gpu_theoretical(
            props.multi_processor_count, (props.major, props.minor), limits.get("sm_clock_mhz"),
            limits.get("memory_clock_mhz"), limits.get("bus_width_bits"))
        if limits and theoretical_flops is None:
            note = f"fp32 lanes per SM unknown for compute capability {props.major}.{props.minor}: no theoretical peak"
        where = "CUDA events, TF32 off"
    peak, peak_iqr = _median_iqr(gemm_rates)
    bandwidth, bandwidth_iqr = _median_iqr(triad_rates)
    gemm_reps, triad_reps = len(gemm_rates), len(triad_rates)
    noisy = [what for what, iqr, median in (("GEMM", peak_iqr, peak), ("triad", bandwidth_iqr, bandwidth))
             if iqr > NOISY_SPREAD * median]
    if noisy:
        note = " ".join(filter(None, [note, (
            f"The {' and '.join(noisy)} rates spread by more than {NOISY_SPREAD:.0%} of their median: other work was "
            "probably running; measure again on a quiet machine (refresh=True).")]))
    method = (
        f"fp32 GEMM: torch.matmul of two {n} x {n} matrices (2*{n}^3 FLOPs), median of {gemm_reps} timed "
        f"repetitions after a warm-up; bandwidth: STREAM triad a = b + {TRIAD_SCALAR:g}*c in one kernel "
        f"(torch.add(b, c, alpha, out=a)) on float64 arrays of {array_bytes / 2**20:.0f} MiB each ({why}), "
        f"24 bytes per element counted (reads b and c, writes a; write-allocate of a not counted), median of "
        f"{triad_reps} repetitions after a warm-up; {where}; IQR = 75th - 25th percentile of the per-repetition "
        f"rates; torch {torch.__version__} on {device}.")
    return Ceilings(device=device, peak_flops_per_s=peak, peak_flops_iqr=peak_iqr, bandwidth_bytes_per_s=bandwidth,
                    bandwidth_iqr=bandwidth_iqr, ridge_flop_per_byte=peak / bandwidth, method=method,
                    measured_at=now_utc(), stack_hash=_stack_hash(), device_name=str(name), threads=threads,
                    theoretical_peak_flops_per_s=theoretical_flops,
                    theoretical_bandwidth_bytes_per_s=theoretical_bw, note=note)


# ---------------------------------------------------------------- cached

_memo: dict[tuple, Ceilings] = {}


class CeilingsCache(Protocol):
    """Where measured ceilings are kept between processes (the history store is one)."""

    url: str

    def load_ceilings(self, stack_hash: str, device: str) -> dict | None: ...

    def save_ceilings(self, record: dict) -> int: ...


def machine_ceilings(device: str = "cpu", refresh: bool = False, cache: CeilingsCache | None = None) -> Ceilings:
    """This machine's ceilings for ``device``: from this process's memo, else ``cache`` (the facade passes the
    history store), else measured now (~3 s on a CPU) and saved to ``cache``. ``refresh=True`` always measures
    anew."""
    device = parse_device(device)
    check_available(device)
    threads = torch_module().get_num_threads() if device == "cpu" else None
    key = (getattr(cache, "url", None), _stack_hash(), device, threads)
    if not refresh:
        if key in _memo:
            return _memo[key]
        record = cache.load_ceilings(key[1], device) if cache is not None else None
        if record is not None and record.get("threads") == threads:
            _memo[key] = Ceilings.from_dict(record)
            return _memo[key]
    ceilings = measure_ceilings(device)
    if cache is not None:
        cache.save_ceilings(ceilings.to_dict())
    _memo[key] = ceilings
    return ceilings
