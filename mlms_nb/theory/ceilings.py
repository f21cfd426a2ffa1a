"""Machine ceilings for a roofline, per framework: the peak FLOP/s and memory bandwidth that framework's own best
kernels reach here, with their spread, cached per stack, framework, thread count and dtype.

- CPU (:mod:`.kernels`): per framework (torch, onnxruntime, tensorflow) a large fp32 GEMM and a large 3x3
  convolution, with the evaluation's intra-op threads; peak = the faster of the two (ONNX Runtime's blocked
  convolutions outrun a GEMM, so one framework's GEMM is no ceiling for another's layers); bandwidth = STREAM's
  add ``c = a + b`` on float32 arrays each at least 4x the last-level cache (12 bytes per element; write-allocate
  not counted, as in STREAM, so DRAM traffic can be up to 4/3 of the figure). About a second per framework.
- GPU (``cuda`` / ``cuda:N``, torch only): an 8192 x 8192 GEMM and the STREAM triad ``a = b + s * c`` on float64
  arrays, timed with CUDA events, TF32 off; NVML (``nvidia-ml-py``) and the device properties add the theoretical
  numbers: fp32 peak = SMs x fp32 lanes per SM x 2 x max SM clock, bandwidth = 2 x max memory clock x bus width / 8.
- Ridge point: peak / bandwidth, in FLOP per byte: kernels of lower intensity are memory bound.

``machine_ceilings()`` measures once per stack and keeps the result in the cache the caller passes (the facade
passes the history store), keyed by the framework's stack hash and ``<device>/<framework>/<threads>/<dtype>``;
``refresh=True`` measures again.
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
from mlms_nb.analyses.roofline import RoofContext
from mlms_nb.display import is_missing
from mlms_nb.errors import MlmsError
from mlms_nb.profilers.load import describe, is_busy, reading, snapshot
from mlms_nb.stack import detect_stack, stack_hash
from mlms_nb.theory.kernels import kernel_timings
from mlms_nb.theory._devices import (  # noqa: F401  (gpu_theoretical, DeviceUnavailableError: this module's API)
    DeviceUnavailableError, check_available, gpu_theoretical, last_level_cache_bytes, nvml_limits, parse_device,
    torch_module)

GPU_GEMM_SIZE = 8192
GPU_GEMM_REPETITIONS = 10
GPU_TRIAD_REPETITIONS = 20
MIN_TRIAD_ARRAY_BYTES = 64 * 2**20
MIN_REPETITIONS = 3
NOISY_SPREAD = 0.2  # IQR / median above which the result carries a warning note
TRIAD_SCALAR = 3.0
TRIAD_BYTES_PER_ELEMENT = 3 * 8  # float64: read b, read c, write a
DTYPES = ("float32",)


@dataclass(frozen=True)
class Ceilings:
    """Measured ceilings of one device for one framework, thread count and dtype. Rates in FLOP/s and bytes/s;
    ``*_iqr``: interquartile range of the per-repetition rates (same unit); ``ridge_flop_per_byte`` = peak /
    bandwidth; ``kernels``: one dict per kernel timed (kernel, unit, median, iqr, repetitions, how)."""
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
    framework: str = "torch"
    dtype: str = "float32"
    kernels: tuple = ()
    busy: str = ""  # the machine's load while a CPU's kernels ran, when it was busy (mlms_nb.profilers.load)

    def roof_context(self, run_threads: int | None = None, **more) -> RoofContext:
        """What the roofline's honesty check needs from these ceilings (:class:`RoofContext`): their spread, the
        last-level cache, the threads they and the run (``run_threads``) used, whether their repetitions spread
        widely and whether the machine was busy while they were measured; ``more``: the run's own fields
        (``hints``, ``run_notes``)."""
        on_cpu = self.device == "cpu"  # host threads bound a CPU's ceilings, not a GPU's
        noisy = any(k.get("iqr", 0) > NOISY_SPREAD * k.get("median", k.get("best", 0)) for k in self.kernels)
        return RoofContext(peak_iqr=self.peak_flops_iqr, bandwidth_iqr=self.bandwidth_iqr,
                           cache_bytes=last_level_cache_bytes(self.device),
                           ceiling_threads=self.threads if on_cpu else None,
                           run_threads=run_threads if on_cpu else None, ceilings_noisy=noisy,
                           ceilings_busy=self.busy, **more)

    @property
    def cache_key(self) -> str:
        """Where the cache keeps it: ``<device>/<framework>/<threads>/<dtype>`` (under the framework's stack hash)."""
        return ceilings_key(self.device, self.framework, self.threads, self.dtype)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Ceilings":
        names = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in data.items() if k in names}
        values["kernels"] = tuple(dict(k) for k in values.get("kernels") or ())
        return cls(**values)

    def to_frame(self) -> pd.DataFrame:
        """One row per figure: metric, value, iqr (spread over repetitions), unit, how it was obtained."""
        best = max((k for k in self.kernels if k["unit"] == "FLOP/s"), key=lambda k: k["best"], default=None)
        copy = next((k for k in self.kernels if k["unit"] == "bytes/s"), None)
        rows = [
            ("peak_flops_per_s", self.peak_flops_per_s, self.peak_flops_iqr, "FLOP/s",
             f"measured: {self.framework}'s {best['kernel']}, the faster of its GEMM and convolution" if best
             else "measured: fp32 GEMM"),
            ("bandwidth_bytes_per_s", self.bandwidth_bytes_per_s, self.bandwidth_iqr, "bytes/s",
             f"measured: {copy['how']}" if copy else "measured: STREAM triad"),
            ("ridge_flop_per_byte", self.ridge_flop_per_byte, math.nan, "FLOP/byte", "peak / bandwidth"),
        ]
        rows += [(f"{k['kernel']}_{'flops' if k['unit'] == 'FLOP/s' else 'bytes'}_per_s", k["best"], k["iqr"],
                  k["unit"], f"measured: {k['how']}, best of {k['repetitions']} (median {k['median']:.4g})")
                 for k in self.kernels]
        if self.theoretical_peak_flops_per_s:
            rows.append(("theoretical_peak_flops_per_s", self.theoretical_peak_flops_per_s, math.nan, "FLOP/s",
                         "SMs x fp32 lanes x 2 x max SM clock (NVML)"))
        if self.theoretical_bandwidth_bytes_per_s:
            rows.append(("theoretical_bandwidth_bytes_per_s", self.theoretical_bandwidth_bytes_per_s, math.nan,
                         "bytes/s", "2 x max memory clock x bus width (NVML)"))
        frame = pd.DataFrame(rows, columns=["metric", "value", "iqr", "unit", "how"])
        frame.insert(0, "framework", self.framework)
        frame.attrs.update(device=self.device, method=self.method, measured_at=self.measured_at,
                           stack_hash=self.stack_hash, framework=self.framework, threads=self.threads, dtype=self.dtype)
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
        head = (f"Ceilings of {self.device} ({self.device_name}) for {self.framework}, {self.threads or 'default'} "
                f"threads, {self.dtype}, measured {self.measured_at}, stack {self.stack_hash}")
        return "\n".join([head] + [f"  {line}" for line in self._lines()] + [f"  how: {self.method}"]
                         + ([f"  note: {self.note}"] if self.note else []))

    def _repr_html_(self) -> str:
        e = html.escape
        rows = "".join(f"<tr><td>{e(r.metric)}</td><td style='text-align:right'>{_fmt(r.value)}</td>"
                       f"<td style='text-align:right'>{_fmt(r.iqr)}</td><td>{e(r.unit)}</td><td>{e(r.how)}</td></tr>"
                       for r in self.to_frame().itertuples())
        note = f"<p><b>Note:</b> {e(self.note)}</p>" if self.note else ""
        return (f"<div><b>Ceilings of {e(self.device)}</b> ({e(self.device_name)}) for {e(self.framework)}, "
                f"{e(str(self.threads or 'default'))} threads, {e(self.dtype)}, measured {e(self.measured_at)}, "
                f"stack <code>{e(self.stack_hash)}</code>"
                "<table><tr><th>metric</th><th>value</th><th>IQR</th><th>unit</th><th>how</th></tr>"
                f"{rows}</table><p><small>{e(self.method)}</small></p>{note}</div>")


def _fmt(value: float) -> str:
    if is_missing(value):
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


def _gemm(torch, device: str, timer, size: int, repetitions: int) -> tuple[list[float], int]:
    """Per-repetition FLOP/s of an n x n fp32 GEMM on a GPU, and n."""
    a = torch.rand(size, size, device=device)
    b = torch.rand(size, size, device=device)
    c = torch.empty(size, size, device=device)
    timer(lambda: torch.matmul(a, b, out=c))  # warm-up
    return [2.0 * size**3 / timer(lambda: torch.matmul(a, b, out=c)) for _ in range(repetitions)], size


def _triad(torch, device: str, timer, array_bytes: int, repetitions: int) -> list[float]:
    """Per-repetition bytes/s of a = b + s*c on float64 arrays of ``array_bytes`` each (24 bytes per element)."""
    n = array_bytes // 8
    a = torch.zeros(n, dtype=torch.float64, device=device)  # zeros/full touch every page before timing
    b = torch.full((n,), 1.0, dtype=torch.float64, device=device)
    c = torch.full((n,), 2.0, dtype=torch.float64, device=device)
    timer(lambda: torch.add(b, c, alpha=TRIAD_SCALAR, out=a))  # warm-up
    return [TRIAD_BYTES_PER_ELEMENT * n / timer(lambda: torch.add(b, c, alpha=TRIAD_SCALAR, out=a))
            for _ in range(repetitions)]


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


def _stack_hash(framework: str = "torch") -> str:
    return stack_hash(detect_stack([framework]), framework=framework)


def _check_dtype(dtype: str) -> str:
    if str(dtype) not in DTYPES:
        raise MlmsError(f"dtype {dtype!r}: ceilings are measured for {', '.join(DTYPES)} only")
    return str(dtype)


def _cpu_figures(framework: str, threads: int | None):
    """CPU: the framework's GEMM, convolution and copy (:mod:`.kernels`). Each kernel's figure is its best
    repetition (other work only ever slows a kernel down; STREAM reports its best rate too), with the median and
    IQR of the repetitions beside it; peak = the faster of GEMM and conv."""
    array_bytes, why = _cpu_triad_bytes()
    timings, where = kernel_timings(framework, threads, array_bytes)
    rows = []
    for t in timings:
        median, iqr = _median_iqr(list(t.rates))
        rows.append({"kernel": t.kernel, "unit": t.unit, "best": max(t.rates), "median": median, "iqr": iqr,
                     "repetitions": len(t.rates), "how": t.how})
    best = max((r for r in rows if r["unit"] == "FLOP/s"), key=lambda r: r["best"])
    copy = next(r for r in rows if r["kernel"] == "copy")
    method = (f"{framework}'s own kernels on the CPU, fp32: peak = the faster of " + " and ".join(
        f"{r['kernel']} ({r['how']}: best {r['best'] / 1e9:,.1f}, median {r['median'] / 1e9:,.1f} GFLOP/s)"
        for r in rows if r["unit"] == "FLOP/s")
        + f", here {best['kernel']}; bandwidth: {copy['how']} ({why}); each the best of its timed repetitions "
        f"after a warm-up (other work only slows a kernel down), IQR = 75th - 25th percentile of the per-repetition "
        f"rates; {where}.")
    return best, copy, rows, method


def measure_ceilings(device: str = "cpu", framework: str = "torch", threads: int | None = None,
                     dtype: str = "float32") -> Ceilings:
    """Measure the peak FLOP/s and memory bandwidth that ``framework``'s own kernels reach on ``device`` now, with
    ``threads`` intra-op threads (None: the framework's default) in ``dtype`` (no cache; see ``machine_ceilings``).
    On a CUDA device the torch GEMM and triad are measured (the other frameworks' GPU kernels are not)."""
    device = parse_device(device)
    dtype = _check_dtype(dtype)
    check_available(device)
    note, theoretical_flops, theoretical_bw, kernels = "", None, None, ()
    if device == "cpu":
        torch = torch_module() if framework == "torch" else None
        previous = torch.get_num_threads() if torch is not None else None
        if torch is not None and threads:
            torch.set_num_threads(int(threads))
        try:
            used = torch.get_num_threads() if torch is not None else threads
            before = snapshot()
            best, copy, kernels, method = _cpu_figures(framework, used)
            load = reading(before, snapshot(), used)
        finally:
            if torch is not None:
                torch.set_num_threads(previous)
        busy = describe(load, f"{framework}'s kernels") if is_busy(load) else ""
        name = detect_stack()["hardware"].get("cpu_model", "CPU")
        peak, peak_iqr, bandwidth, bandwidth_iqr = best["best"], best["iqr"], copy["best"], copy["iqr"]
        noisy = [r["kernel"] for r in kernels if r["iqr"] > NOISY_SPREAD * r["median"]]
        threads = used
    else:
        if framework != "torch":
            raise DeviceUnavailableError(f"ceilings of {framework} on {device} are not measured: on a GPU only "
                                         "torch's GEMM and triad are")
        peak, peak_iqr, bandwidth, bandwidth_iqr, method, name, note, theoretical_flops, theoretical_bw = \
            _gpu_figures(device)
        noisy = [what for what, iqr, median in (("GEMM", peak_iqr, peak), ("triad", bandwidth_iqr, bandwidth))
                 if iqr > NOISY_SPREAD * median]
        threads, busy = None, ""
    if busy:
        note = " ".join(filter(None, [note, (
            f"The machine was busy while they were measured ({busy}): the roof is too low; measure again on a quiet "
            "machine (refresh=True; a busy measurement is measured again at the next call).")]))
    elif noisy:
        note = " ".join(filter(None, [note, (
            f"The {' and '.join(noisy)} rates spread by more than {NOISY_SPREAD:.0%} of their median: other work was "
            "probably running; measure again on a quiet machine (refresh=True).")]))
    return Ceilings(device=device, peak_flops_per_s=peak, peak_flops_iqr=peak_iqr, bandwidth_bytes_per_s=bandwidth,
                    bandwidth_iqr=bandwidth_iqr, ridge_flop_per_byte=peak / bandwidth, method=method,
                    measured_at=now_utc(), stack_hash=_stack_hash(framework), device_name=str(name), threads=threads,
                    theoretical_peak_flops_per_s=theoretical_flops,
                    theoretical_bandwidth_bytes_per_s=theoretical_bw, note=note, framework=framework, dtype=dtype,
                    kernels=tuple(kernels), busy=busy)


def _gpu_figures(device: str):
    torch = torch_module()
    timer = _timer(torch, device)
    index = int(device.split(":")[1])
    props = torch.cuda.get_device_properties(index)
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
    peak, peak_iqr = _median_iqr(gemm_rates)
    bandwidth, bandwidth_iqr = _median_iqr(triad_rates)
    method = (
        f"fp32 GEMM: torch.matmul of two {n} x {n} matrices (2*{n}^3 FLOPs), median of {len(gemm_rates)} timed "
        f"repetitions after a warm-up; bandwidth: STREAM triad a = b + {TRIAD_SCALAR:g}*c in one kernel "
        f"(torch.add(b, c, alpha, out=a)) on float64 arrays of {array_bytes / 2**20:.0f} MiB each ({why}), "
        f"24 bytes per element counted (reads b and c, writes a; write-allocate of a not counted), median of "
        f"{len(triad_rates)} repetitions after a warm-up; CUDA events, TF32 off; IQR = 75th - 25th percentile of "
        f"the per-repetition rates; torch {torch.__version__} on {device}.")
    return (peak, peak_iqr, bandwidth, bandwidth_iqr, method, props.name, note, theoretical_flops, theoretical_bw)


# ---------------------------------------------------------------- cached

_memo: dict[tuple, Ceilings] = {}


def ceilings_key(device: str, framework: str, threads: int | None, dtype: str) -> str:
    return f"{device}/{framework}/{threads or 'default'}/{dtype}"


class CeilingsCache(Protocol):
    """Where measured ceilings are kept between processes (the history store is one)."""

    url: str

    def load_ceilings(self, stack_hash: str, device: str) -> dict | None: ...

    def save_ceilings(self, record: dict) -> int: ...


def _threads(device: str, framework: str, threads: int | None) -> int | None:
    """The thread count the ceilings are measured and keyed with: torch's current count unless given; the
    framework's default (None) for the others."""
    if device != "cpu":
        return None
    if threads is None and framework == "torch":
        return torch_module().get_num_threads()
    return int(threads) if threads else None


def machine_ceilings(device: str = "cpu", refresh: bool = False, cache: CeilingsCache | None = None, *,
                     framework: str = "torch", threads: int | None = None, dtype: str = "float32") -> Ceilings:
    """This machine's ceilings for ``framework`` on ``device`` with ``threads`` intra-op threads (None: the
    framework's default) in ``dtype``: from this process's memo, else ``cache`` (the facade passes the history
    store) unless the machine was busy when they were measured, else measured now (about a second per framework on
    a CPU) and saved to ``cache``. ``refresh=True`` always measures anew."""
    device = parse_device(device)
    dtype = _check_dtype(dtype)
    check_available(device)
    threads = _threads(device, framework, threads)
    key = ceilings_key(device, framework, threads, dtype)
    memo_key = (getattr(cache, "url", None), _stack_hash(framework), key)
    if not refresh:
        if memo_key in _memo:
            return _memo[memo_key]
        record = cache.load_ceilings(memo_key[1], key) if cache is not None else None
        if record is not None and not record.get("busy"):  # one measured on a busy machine is measured again
            _memo[memo_key] = Ceilings.from_dict({**record, "device": device})
            return _memo[memo_key]
    ceilings = measure_ceilings(device, framework=framework, threads=threads, dtype=dtype)
    if cache is not None:
        cache.save_ceilings({**ceilings.to_dict(), "device": key})
    _memo[memo_key] = ceilings
    return ceilings
