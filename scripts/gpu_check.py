"""The GPU stack, checked in one go (issue 26): run by ``scripts/gpu_check.sh`` on a GPU machine, and in CI with
``--dry-run`` on a CPU machine, where every step that can run runs (on the CPU, at small sizes) and every other
step says why it was skipped. Writes ``gpu_check.json`` and ``gpu_check.md`` into the folder it is given.

Steps (each records its status ``ok`` / ``skipped`` / ``failed``, why, its figures and its seconds; one step's
failure never stops the others):

1. ``environment``: CUDA device, driver and NVML's GPU list, ONNX Runtime's providers, CUPTI bindings.
2. ``gpu_tests``: the test suite's GPU tests (CUPTI, device ceilings), which skip on a CPU machine.
3. ``batch_sweep``: MLModelScope's Figure 4: EfficientNet-Lite0 and ResNet-50 in torch at batch sizes 1..1024
   (powers of two), latency and throughput per batch size with spread; each call ends with the outputs copied to
   the host, so the clock stamps finished device work; energy per inference from NVML (its method named).
4. ``kernels``: a SYSTEM_LIBRARY trace (CUPTI, beside torch.profiler's CPU ops) of EfficientNet-Lite0; CUDA kernels
   attributed to layers, the attributed share of GPU time (goal >= 95%).
5. ``cupti``: scripts/cupti_probe.py's cases, each in its own process: the clock mapping of CUPTI's records
   alone and after torch.profiler has started, the share of device time attributed with it, the exit status.
6. ``roofline``: measured device ceilings (a large GEMM in the model's dtype, a device-to-device copy) and the
   per-layer roofline of a FRAMEWORK trace against them: points above 100% of attainable, flagged or not.
7. ``timeline``: the traced GPU spans tiled to ``--timeline-spans`` (1M on a GPU run) and drawn by the timeline's
   level-of-detail plot; the time it took and the page's size.

Run: ``bash scripts/gpu_check.sh [--dry-run] [--steps a,b] OUT_DIR``.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SWEEP = [2 ** k for k in range(11)]  # 1 .. 1024
MODELS = ("efficientnet_lite0", "resnet50")
GPU_TESTS = ["tests/test_cupti.py", "tests/test_theory.py"]


class Skip(Exception):
    """A step that cannot run here; its message says why."""


def _gpu() -> tuple[bool, str]:
    try:
        import torch
    except ImportError as err:
        return False, f"PyTorch is not installed ({err})"
    if not torch.cuda.is_available():
        return False, "no CUDA device is visible to PyTorch (a CPU machine, or no NVIDIA driver)"
    return True, torch.cuda.get_device_name(0)


def step_environment(ctx: dict) -> dict:
    import mlms_nb
    from mlms_nb.profilers.nvml import list_gpus
    from mlms_nb.profilers.energy import energy_meter

    figures: dict = {"python": platform.python_version(), "mlms_nb": mlms_nb.__version__, "host": platform.node()}
    try:
        import torch
        figures.update(torch=torch.__version__, cuda=torch.version.cuda,
                       device=torch.cuda.get_device_name(0) if torch.cuda.is_available() else None)
    except ImportError:
        figures["torch"] = None
    gpus, why = list_gpus()
    figures["nvml_gpus"] = gpus
    figures["nvml_why_not"] = why
    try:
        import onnxruntime
        figures["onnxruntime_providers"] = onnxruntime.get_available_providers()
    except ImportError:
        figures["onnxruntime_providers"] = None
    try:
        import cupti  # noqa: F401 - NVIDIA's cupti-python
        figures["cupti_python"] = True
    except ImportError as err:
        figures["cupti_python"] = f"not importable ({err})"
    import importlib.util

    figures["missing_modules"] = [m for m in ("pandas", "pyarrow", "scipy", "bokeh", "pynvml", "sqlalchemy", "pydantic")
                                  if importlib.util.find_spec(m) is None]
    meter = energy_meter(ctx["device"])
    figures["energy"] = meter.available()[1]
    return {"figures": figures}


def step_gpu_tests(ctx: dict) -> dict:
    if not ctx["gpu"]:
        raise Skip(f"the GPU tests need a GPU ({ctx['why']}); on a CPU machine the suite runs them and they skip")
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", *GPU_TESTS], cwd=REPO,
                            capture_output=True, text=True, timeout=300)
    tail = result.stdout.strip().splitlines()[-15:]
    if result.returncode != 0:
        raise RuntimeError("GPU tests failed:\n" + "\n".join(tail))
    return {"figures": {"pytest": tail[-1] if tail else ""}, "detail": "\n".join(tail)}


def _evaluate(model: str, ctx: dict, **kwargs):
    import mlms_nb

    options = dict(framework="torch", device=ctx["device"], dataset=ctx["dataset"], warmup=ctx["warmup"],
                   min_repeats=ctx["repeats"], min_time_s=ctx["min_time_s"], progress=False, history=False)
    options.update(kwargs)
    return mlms_nb.evaluate(model, **options)


def _bare_torch(model: str, ctx: dict) -> dict[int, tuple[float, float]]:
    """The bare framework beside mlms-nb: per batch size, the median ms of a plain loop (host batch to the device,
    forward, output back to the host) on the host clock and, on CUDA, between two CUDA events around the same
    work; the same warm-up and at least as many calls as mlms-nb's timed loop."""
    import numpy as np
    import torch

    from mlms_nb.zoo.registry import build_torch_model

    device = ctx["device"]
    net = build_torch_model(model).to(device).eval()
    cuda = device.startswith("cuda")
    medians = {}
    with torch.inference_mode():
        for batch_size in ctx["sweep"]:
            x = torch.randn(batch_size, 3, 224, 224)
            for _ in range(ctx["warmup"]):
                net(x.to(device)).cpu()
            host, events = [], []
            t_end = time.perf_counter() + ctx["min_time_s"]
            while len(host) < ctx["repeats"] or time.perf_counter() < t_end:
                if cuda:
                    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    t0 = time.perf_counter_ns()
                    start.record()
                    y = net(x.to(device))
                    end.record()
                    y.cpu()
                    host.append((time.perf_counter_ns() - t0) / 1e6)
                    events.append((start, end))
                else:
                    t0 = time.perf_counter_ns()
                    net(x.to(device)).cpu()
                    host.append((time.perf_counter_ns() - t0) / 1e6)
            if cuda:
                torch.cuda.synchronize()
            event_ms = [a.elapsed_time(b) for a, b in events]
            medians[batch_size] = (float(np.median(host)), float(np.median(event_ms)) if event_ms else float("nan"))
    del net
    if cuda:
        torch.cuda.empty_cache()
    return medians


def step_batch_sweep(ctx: dict) -> dict:
    rows = []
    notes = []
    for model in MODELS:
        ev = _evaluate(model, ctx, batch_sizes=ctx["sweep"])
        bare = _bare_torch(model, ctx)
        lat = ev.latency
        for r in lat.to_dict("records"):
            bare_ms, event_ms = bare.get(int(r["batch_size"]), (float("nan"), float("nan")))
            rows.append({"model": model, "batch_size": int(r["batch_size"]), "median_ms": r["median_ms"],
                         "iqr_ms": r["iqr_ms"],
                         "ci_low_ms": r["median_ci_low_ms"], "ci_high_ms": r["median_ci_high_ms"],
                         "throughput_per_s": r["throughput_per_s"], "calls": int(r["samples"]),
                         "bare_median_ms": bare_ms, "bare_cuda_event_median_ms": event_ms,
                         "mlms_over_bare": r["median_ms"] / bare_ms if bare_ms else float("nan"),
                         "energy_j_per_input": r.get("energy_j_per_input"),
                         "energy_method": r.get("energy_method")})
        notes += [f"{model}: {m}" for m in ev.missing()]
    return {"figures": {"rows": rows, "not_measured": notes,
                        "clock": "mlms-nb: time.perf_counter_ns around each call, outputs copied to the host end "
                                 "each call; bare: a plain torch loop timed the same way and, on CUDA, by two CUDA "
                                 "events around the same call (host-to-device copy and forward)"}}


def step_kernels(ctx: dict) -> dict:
    import mlms_nb

    level = "SYSTEM_LIBRARY" if ctx["gpu"] else "ML_LIBRARY"
    ev = _evaluate("efficientnet_lite0", ctx, batch_sizes=[ctx["sweep"][0]], trace_level=level,
                   trace_repeats=2 if ctx["gpu"] else 1)
    ctx["traced"] = ev
    table = mlms_nb.kernels(ev).table
    spans = ev.trace.spans
    device = spans[spans["kind"].isin(["kernel", "memcpy", "memset"]) & ~spans["device"].isin(["cpu", ""])]
    figures = {"trace_level": level, "spans": int(len(spans)), "device_spans": int(len(device))}
    if device.empty:
        unavailable = (getattr(ev.trace, "metadata", None) or {}).get("unavailable") or {}
        why = ctx["why"] if not ctx["gpu"] else ("; ".join(f"{k}: {v}" for k, v in unavailable.items())
                                                 or "CUPTI gave none")
        raise Skip(f"no device kernels in the trace ({why}); "
                   f"the {level} trace itself was made ({len(spans):,} spans) and the kernel analysis ran")
    total = float(device["duration_ns"].sum())
    in_layer = _under_a_layer(spans, device)
    outside = device[~in_layer]
    figures.update(kernels=int(len(device)), gpu_time_ms=total / 1e6, layers=int(len(table)),
                   attributed_share=float(device.loc[in_layer, "duration_ns"].sum()) / total if total else float("nan"),
                   attributed_share_how="device time of the kernels, copies and memsets whose launch lies in a layer "
                                        "span (CUPTI correlation, else time), over all device time in the trace",
                   launches=_launch_placement(spans), cupti=_short((getattr(ev.trace, "metadata", None) or {})
                                                                   .get("cupti")),
                   not_in_a_layer_ms=outside.groupby(outside["name"].astype(str).str[:60])["duration_ns"].sum()
                   .div(1e6).sort_values(ascending=False).head(5).to_dict())
    return {"figures": figures}


def _short(value, limit: int = 600):
    text = json.dumps(value, default=str)
    return text if len(text) <= limit else text[:limit] + "..."


def _launch_placement(spans) -> dict:
    """Where CUPTI's API calls fell on the tracer's clock: in a layer span, in a predict span but no layer, or in
    no predict span at all (a clock mapping that is off); and for the last, how far from the nearest predict."""
    import numpy as np

    runtime = spans[spans["kind"] == "runtime"]
    predicts = spans[(spans["kind"] == "model") & (spans["name"] == "predict")]
    starts, ends = predicts["start_ns"].to_numpy(np.int64), predicts["end_ns"].to_numpy(np.int64)
    kind = dict(zip(spans["span_id"].tolist(), spans["kind"].astype(str).tolist()))
    in_layer = np.array([kind.get(p) == "layer" for p in runtime["parent_id"].tolist()], bool)
    mid = ((runtime["start_ns"].to_numpy(np.int64) + runtime["end_ns"].to_numpy(np.int64)) // 2)
    inside = ((mid[:, None] >= starts[None, :]) & (mid[:, None] <= ends[None, :])).any(axis=1) if len(starts) else \
        np.zeros(len(mid), bool)
    gaps = np.array([min(np.min(np.abs(starts - m)), np.min(np.abs(ends - m))) for m in mid[~inside]]) \
        if len(starts) and (~inside).any() else np.zeros(0)
    return {"api_calls": int(len(runtime)), "in_a_layer": int(in_layer.sum()),
            "in_predict_not_layer": int((inside & ~in_layer).sum()), "outside_every_predict": int((~inside).sum()),
            "outside_median_distance_us": float(np.median(gaps) / 1e3) if len(gaps) else None,
            "predict_calls": int(len(predicts))}


def _under_a_layer(spans, device):
    """Per device span: whether a layer span is among its ancestors (the launch's parent is the layer)."""
    import numpy as np

    parent = dict(zip(spans["span_id"].tolist(), spans["parent_id"].tolist()))
    kind = dict(zip(spans["span_id"].tolist(), spans["kind"].astype(str).tolist()))
    found = []
    for span_id in device["span_id"].tolist():
        node, hit = parent.get(span_id), False
        for _ in range(8):
            if node is None or node <= 0:
                break
            if kind.get(node) == "layer":
                hit = True
                break
            node = parent.get(node)
        found.append(hit)
    return np.asarray(found, bool)


def step_cupti(ctx: dict) -> dict:
    """scripts/cupti_probe.py, each case in its own process: the clock mapping CUPTI's records got, the device
    time attributed with it and with the get_timestamp anchor alone, and the process's exit status (a crash at
    interpreter exit shows as a negative one)."""
    if not ctx["gpu"]:
        raise Skip(f"CUPTI records nothing without a GPU ({ctx['why']})")
    from scripts.cupti_probe import CASES

    figures = {}
    env = {**os.environ, "PYTHONFAULTHANDLER": "1"}  # a crash prints every thread's Python stack
    for case in CASES:
        command = [sys.executable, str(REPO / "scripts" / "cupti_probe.py"), "--case", case]
        proc = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=REPO, env=env)
        lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
        figures[case] = {
            "exit_status": proc.returncode, **(json.loads(lines[-1]) if lines else {}),
            "stderr_tail": proc.stderr[-1500:]}
    gdb = shutil.which("gdb")
    if gdb:  # the native stack of the crash at exit, where the image has a debugger
        command = [gdb, "-q", "-batch", "-ex", "run", "-ex", "bt 40", "-ex", "info threads", "--args", sys.executable,
                   str(REPO / "scripts" / "cupti_probe.py"), "--case", "after_profiler"]
        proc = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=REPO)
        figures["gdb_backtrace"] = proc.stdout[-4000:]
    else:
        figures["gdb_backtrace"] = "no gdb on this machine"
    return {"figures": figures}


def step_roofline(ctx: dict) -> dict:
    import mlms_nb.api

    ceilings = mlms_nb.api.machine_ceilings(ctx["device"])
    ev = _evaluate("efficientnet_lite0", ctx, batch_sizes=[ctx["sweep"][-1] if ctx["gpu"] else 1],
                   trace_level="FRAMEWORK", trace_repeats=2 if ctx["gpu"] else 1)
    frame = ev.roofline().table
    pct = frame["pct_of_attainable"].astype(float)
    above = pct > 100.0
    unflagged = above & ~frame["roof_check"].isin(["above roof", "at roof, within spread"])
    causes = frame.loc[frame["roof_check"] == "above roof", "roof_check_why"].value_counts().head(5).to_dict()
    return {"figures": {"ceilings": ceilings.to_dict(), "layers": int(len(frame)), "above_100pct": int(above.sum()),
                        "above_100pct_unflagged": int(unflagged.sum()), "flagged_causes": causes,
                        "max_pct_of_attainable": float(pct.max()) if len(pct) else float("nan")}}


def step_timeline(ctx: dict) -> dict:
    import numpy as np
    import pandas as pd

    from mlms_nb.analyses import timeline

    ev = ctx.get("traced")
    if ev is None:
        raise Skip("the kernels step made no trace to draw")
    spans = ev.trace.spans
    width = int(spans["end_ns"].max() - spans["start_ns"].min()) + 1
    copies = max(1, -(-ctx["timeline_spans"] // len(spans)))
    shift = np.repeat(np.arange(copies, dtype=np.int64) * width, len(spans))
    big = pd.concat([spans] * copies, ignore_index=True).iloc[:ctx["timeline_spans"]]
    big["start_ns"] = big["start_ns"].to_numpy() + shift[:len(big)]
    big["end_ns"] = big["end_ns"].to_numpy() + shift[:len(big)]
    big["span_id"] = np.arange(len(big), dtype=np.int64)
    big["parent_id"] = -1
    t0 = time.perf_counter()
    figure = timeline.plot(big, backend="bokeh")
    seconds = time.perf_counter() - t0
    from bokeh.embed import file_html
    from bokeh.resources import INLINE

    page = ctx["out"] / "timeline.html"
    page.write_text(file_html(getattr(figure, "figure", figure), INLINE, "mlms GPU timeline"), encoding="utf-8")
    return {"figures": {"spans": int(len(big)), "tiled_from": int(len(spans)), "plot_s": seconds,
                        "page_mib": page.stat().st_size / 2 ** 20}}


STEPS = [("environment", step_environment), ("gpu_tests", step_gpu_tests), ("batch_sweep", step_batch_sweep),
         ("kernels", step_kernels), ("cupti", step_cupti), ("roofline", step_roofline), ("timeline", step_timeline)]


def run(out: Path, dry_run: bool, steps: frozenset[str] = frozenset()) -> dict:
    gpu, why = _gpu()
    if not gpu and not dry_run:
        raise SystemExit(f"gpu_check: {why}; run with --dry-run on a machine without a GPU")
    if dry_run:  # the CPU path at small sizes, wherever it runs
        gpu, why = False, "a dry run uses the CPU only" if gpu else why
    out.mkdir(parents=True, exist_ok=True)
    ctx = {"gpu": gpu, "why": why, "out": out, "device": "cuda" if gpu else "cpu",
           "sweep": SWEEP if gpu else [1, 2], "dataset": "synthetic:8" if gpu else "synthetic:2", "warmup": 3 if gpu else 1, "repeats": 10 if gpu else 2,
           "min_time_s": 0.3 if gpu else 0.0, "timeline_spans": 1_000_000 if gpu else 20_000}
    report = {"dry_run": dry_run, "device": why if gpu else "cpu (dry run)", "started": time.strftime(
        "%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "steps": {}}
    for name, step in STEPS:
        if steps and name not in steps:
            continue
        t0 = time.perf_counter()
        try:
            entry = {"status": "ok", **step(ctx)}
        except Skip as skip:
            entry = {"status": "skipped", "why": str(skip)}
        except Exception as err:  # noqa: BLE001 - one step's failure is that step's outcome
            entry = {"status": "failed", "why": f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}",
                     "detail": traceback.format_exc()[-3000:]}
        entry["seconds"] = round(time.perf_counter() - t0, 2)
        report["steps"][name] = entry
        print(f"gpu_check: {name}: {entry['status']}" + (f" ({entry['why']})" if entry.get("why") else ""),
              flush=True)
        # written after every step, so a run cut short by its time limit still leaves what it measured
        (out / "gpu_check.json").write_text(json.dumps(report, indent=2, default=_plain), encoding="utf-8")
        (out / "gpu_check.md").write_text(markdown(report), encoding="utf-8")
    return report


def _plain(value):
    try:
        return value.item()
    except AttributeError:
        return str(value)


def _num(value, digits: int = 3) -> str:
    try:
        value = float(value)
    except (TypeError, ValueError):
        return "-"
    return "-" if value != value else f"{value:,.{digits}g}"


def markdown(report: dict) -> str:
    lines = [f"# GPU check ({'dry run, ' if report['dry_run'] else ''}{report['device']}, {report['started']})", "",
             "| step | status | seconds | why |", "|---|---|---|---|"]
    for name, entry in report["steps"].items():
        lines.append(f"| {name} | {entry['status']} | {entry['seconds']} | {entry.get('why', '')} |")
    sweep = report["steps"].get("batch_sweep", {}).get("figures", {}).get("rows", [])
    if sweep:
        lines += ["", "## Latency per batch size (torch; median, 95% CI of the median, IQR)", "",
                  "| model | batch | median (ms) | 95% CI (ms) | IQR (ms) | throughput (inputs/s) | bare torch (ms) "
                  "| bare, CUDA events (ms) | mlms / bare | energy (J/input) |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for r in sweep:
            lines.append(f"| {r['model']} | {r['batch_size']} | {_num(r['median_ms'])} | {_num(r['ci_low_ms'])} to "
                         f"{_num(r['ci_high_ms'])} | {_num(r['iqr_ms'])} | {_num(r['throughput_per_s'])} | "
                         f"{_num(r.get('bare_median_ms'))} | {_num(r.get('bare_cuda_event_median_ms'))} | "
                         f"{_num(r.get('mlms_over_bare'))} | {_num(r['energy_j_per_input'])} |")
        methods = {r.get("energy_method") for r in sweep}
        lines += ["", "Energy: " + "; ".join(sorted(str(m) for m in methods))]
    for name in ("environment", "kernels", "roofline", "timeline"):
        figures = report["steps"].get(name, {}).get("figures")
        if figures:
            lines += ["", f"## {name}", "", "```json", json.dumps(figures, indent=1, default=_plain)[:4000], "```"]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="the folder for gpu_check.json and gpu_check.md")
    parser.add_argument("--dry-run", action="store_true",
                        help="on a machine without a GPU: run what can run on the CPU, say why the rest is skipped")
    parser.add_argument("--steps", default="", help="comma-separated step names to run (a rerun of the ones that "
                        f"failed); all when empty: {', '.join(n for n, _ in STEPS)}")
    args = parser.parse_args()
    steps = frozenset(s for s in args.steps.split(",") if s)
    unknown = steps - {n for n, _ in STEPS}
    if unknown:
        parser.error(f"--steps: no step named {', '.join(sorted(unknown))}")
    # outside OUT_DIR: the folder the GPU machine sends back holds the reports, not converted models and caches
    os.environ.setdefault("MLMS_HOME", tempfile.mkdtemp(prefix="mlms-gpu-check-"))
    report = run(args.out, args.dry_run, steps)
    failed = [n for n, e in report["steps"].items() if e["status"] == "failed"]
    if failed:
        print(f"gpu_check: failed: {', '.join(failed)} (see {args.out / 'gpu_check.md'})", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
