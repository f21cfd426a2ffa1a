"""How CUPTI's records line up with a traced torch model, one case per process (a GPU machine; the GPU check's
``cupti`` step runs every case).

    python scripts/cupti_probe.py --case alone|after_profiler|after_profiler_twice|profiler_only|recorder_first

A small conv net on ``cuda`` runs three predict calls under mlms-nb's layer wrapper (FRAMEWORK spans, each call
bracketed by synchronisation) and a :class:`~mlms_nb.profilers.cupti.CuptiActivity`; ``after_profiler`` first
starts torch.profiler (CPU activity only), as a SYSTEM_LIBRARY evaluation does, which registers Kineto's own
timestamp callback with CUPTI. Prints one JSON object: the clock mapping the recorder measured and its check, the
share of device time whose launching call lies in a layer span with that mapping and with the ``get_timestamp``
anchor alone, and the raw clocks side by side. The exit status is the process's own: a crash at interpreter exit
(after the JSON) shows as a negative status in the step's report.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

CASES = ("alone", "after_profiler", "after_profiler_twice", "profiler_only", "recorder_first")
"""alone: the recorder only; after_profiler(_twice): torch.profiler started first (as an evaluation does), once or
twice; profiler_only: torch.profiler and the layer wrapper, no recorder (is a crash at exit ours?);
recorder_first: the recorder started before torch.profiler and stopped after it."""


def _model(torch):
    layers = []
    channels = 3
    for width in (32, 64, 64, 128, 128, 256):
        layers += [torch.nn.Conv2d(channels, width, 3, padding=1), torch.nn.BatchNorm2d(width), torch.nn.ReLU()]
        channels = width
    layers += [torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(channels, 10)]
    return torch.nn.Sequential(*layers).cuda().eval()


def _share(records, layers) -> dict:
    from mlms_nb.tracing.cuda_activity import attribute_records

    att = attribute_records(records, layers)
    device = att[att["kind"].isin(["kernel", "memcpy", "memset"])]
    dur = (device["end_ns"] - device["start_ns"]).astype(float)
    api = att[att["kind"] == "runtime"]
    return {"device_records": int(len(device)),
            "attributed_share": float(dur[device["layer_span_id"] != 0].sum() / dur.sum()) if dur.sum() else None,
            "by": device["attribution"].value_counts().to_dict(),
            "api_calls_in_a_layer": f"{int((api['layer_span_id'] != 0).sum())} of {len(api)}"}


def one_pass(torch, model, x, record: bool = True, profiler_inside=None) -> dict:
    from mlms_nb.frameworks.torch.tracing import LayerHooks
    from mlms_nb.profilers.cupti import CuptiActivity, CuptiConfig, import_cupti
    from mlms_nb.profilers.cupti_convert import raw_to_record
    from mlms_nb.tracing import TraceLevel, Tracer

    tracer = Tracer(TraceLevel.SYSTEM_LIBRARY)
    hooks = LayerHooks(model, tracer, cuda=True)
    prof = CuptiActivity(CuptiConfig(kinds=("kernel", "memcpy", "memset", "runtime"))).start() if record else None
    if profiler_inside is not None:
        profiler_inside.start()
    try:
        with torch.no_grad():
            for _ in range(3):
                with tracer.span("predict", TraceLevel.MODEL, "model"):
                    model(x)
    finally:
        if profiler_inside is not None:
            profiler_inside.stop()
        if prof is not None:
            prof.stop()
        hooks.remove()
    if prof is None:
        spans = tracer.trace().spans
        return {"layers": int((spans["kind"] == "layer").sum())}
    cupti = import_cupti()
    clocks = {"cupti.get_timestamp": int(cupti.get_timestamp()), "time.time_ns": time.time_ns(),
              "time.perf_counter_ns": time.perf_counter_ns(), "time.monotonic_ns": time.monotonic_ns()}
    with prof._raw_lock:
        raw = list(prof._raw)
    spans = tracer.trace().spans
    layers = spans[spans["kind"] == "layer"]
    records = prof.records()
    anchor_records = [raw_to_record(r, prof.offset_ns) for r in raw if r[0] != "driver"]
    meta = prof.metadata
    return {"clock": meta.get("clock"), "clock_check": meta.get("clock_check"), "errors": prof.errors,
            "raw_first_start": min(r[2] for r in raw) if raw else None, "clocks_after": clocks,
            "layers": int(len(layers)), "calibrated": _share(records, layers),
            "anchor_only": _share(anchor_records, layers)}


def run_case(case: str) -> dict:
    import torch

    model = _model(torch)
    x = torch.randn(8, 3, 64, 64, device="cuda")
    with torch.no_grad():
        model(x)  # warm up: cuDNN handles, lazy modules
    torch.cuda.synchronize()
    out: dict = {"case": case, "torch": torch.__version__}
    from torch.profiler import ProfilerActivity, profile

    for k in range(2 if case == "after_profiler_twice" else 1):
        profiler = None if case == "alone" else profile(activities=[ProfilerActivity.CPU], record_shapes=True)
        if case == "recorder_first":
            out[f"pass{k + 1}"] = one_pass(torch, model, x, profiler_inside=profiler)
            continue
        if profiler is not None:
            profiler.start()
        try:
            out[f"pass{k + 1}"] = one_pass(torch, model, x, record=case != "profiler_only")
        finally:
            if profiler is not None:
                profiler.stop()
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", choices=CASES, required=True)
    args = parser.parse_args()
    print(json.dumps(run_case(args.case), default=str), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
