"""Where mlms-nb's per-call floor on CUDA comes from (GPU check run 2: ResNet-50 batch 1 at 5.9 ms against 3.2 ms for
a bare torch loop). One process, interleaved: the bare loop alone, beside the NVML energy sampler, mlms-nb's timed
loop, and mlms-nb's timed loop with a 0.1 ms GIL switch interval."""
import sys
import time

import numpy as np
import torch

import mlms_nb
from mlms_nb.profilers.energy import energy_meter
from mlms_nb.zoo.registry import build_torch_model

net = build_torch_model("resnet50").cuda().eval()
x = torch.randn(1, 3, 224, 224)


def bare(n=300):
    out = []
    with torch.inference_mode():
        for _ in range(20):
            net(x.to("cuda")).cpu()
        for _ in range(n):
            t0 = time.perf_counter_ns()
            net(x.to("cuda")).cpu()
            out.append(time.perf_counter_ns() - t0)
    return np.median(out) / 1e6


def energy_bare():
    meter = energy_meter("cuda")
    meter.start()
    try:
        return bare()
    finally:
        print("  energy:", meter.stop().as_columns(300), flush=True)


def mlms():
    ev = mlms_nb.evaluate("resnet50", framework="torch", device="cuda", dataset="synthetic:8", batch_sizes=[1],
                          warmup=20, min_repeats=300, min_time_s=0.0, progress=False, history=False)
    return float(ev.latency["median_ms"].iloc[0])


for rnd in range(2):
    for name, f in (("bare", bare), ("bare + energy sampler", energy_bare), ("mlms", mlms)):
        print(f"round {rnd} {name}: {f():.3f} ms", flush=True)
    sys.setswitchinterval(1e-4)
    print(f"round {rnd} mlms, switch interval 0.1 ms: {mlms():.3f} ms", flush=True)
    print(f"round {rnd} bare, switch interval 0.1 ms: {bare():.3f} ms", flush=True)
    sys.setswitchinterval(5e-3)
