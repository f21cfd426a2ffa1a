"""Streaming at dataset scale (issue 11): peak memory and full-pass throughput of ``mlms eval`` on a folder of N
real-photo-derived images, against a bare ONNX Runtime loop over the same images already preprocessed.

The images are crops (50-100 % of each side), mirror flips and resizes (shorter side 160-320 px) of the 20 labeled
ImageNet photos that the foolbox wheel ships (``imagenet-samples``), written as JPEG into ``CLASS/`` subfolders, so
the run also scores top-1/top-5. Then, interleaved for ``--rounds`` rounds in this one run:

- ``mlms eval efficientnet_lite0 --framework onnxruntime --batch-sizes 32 --dataset DIR --json`` in a child process
  under ``/usr/bin/time -v``: its peak RSS (``Maximum resident set size``) and the full pass's ``inputs_per_s``
  (decode + preprocess in the pipeline's worker threads, overlapped with inference);
- a bare loop in this process: ``onnxruntime.InferenceSession(model.onnx).run`` at batch 32 over all N inputs,
  preprocessed beforehand (by the same preprocessing) into an on-disk ``.npy`` read through a memory map.

The ratio is full-pass inputs/s over bare-loop inputs/s (the bare loop does no decoding at all: decoding JPEGs shares
the cores with inference, so the JPEG case's target is >= 0.75, about its bound on 2 cores; the .npz case's is >= 0.9).
Both use ONNX Runtime's default thread count.

``--reader threads,processes`` runs ``mlms eval`` once per reader in each round (``--reader`` of ``mlms eval``), and
adds, in this process, the same ONNX Runtime loop fed by the pipeline itself (``Stream`` over the folder, decoding
overlapped with inference) with threads, with processes returning batches through shared memory, and with
processes returning them through the pipe: the cost of each reader and transport without the rest of ``mlms eval``.

``--cases npz`` (issue 25; ``--cases jpeg,npz`` runs both) is the small-model case, where per-input work in the
harness shows: a small CNN (two 3x3 convolutions, 10 classes; random weights) the benchmark writes and exports to
ONNX with its manifest, and ``--count`` already-preprocessed 28x28 inputs in an uncompressed ``.npz`` (``x``
float32 N x 1 x 28 x 28, ``y`` labels). Each round: ``mlms eval small-cnn --framework onnxruntime --batch-sizes
64 --dataset data.npz`` (child process, as above) between two bare ``session.run`` loops at batch 64 over the same
inputs held in memory, each in a child process that imports only ONNX Runtime and numpy (in this process, which
imported torch to write the model, the loop ran about 20% slower than the pass's own calls); the bare time is the
two loops' mean (one loop alone drifted by half its time from one second to the next). The ratio (median of the
per-round ratios) targets >= 0.9.

What each side times, so the comparison stays honest: the bare loop is ``InferenceSession(small_cnn.onnx)`` with
ONNX Runtime's default session options (the predictor's are the same: default threads, graph optimisation ``all``,
arena on) computing every output, after one untimed warm-up batch, from its first call to its last (157 calls,
the last of 16 inputs). The full pass is the record's ``wall_s``: from opening the stream over the file (memory
mapped; each batch a view of the map, read in the consumer) to the last batch scored, with the NaN/Inf check of
every batch's data and outputs, the top-1/top-5 scoring and the per-input output summaries inside it; it runs
after the timed loops, so the model is warm. Not inside it: the predictions and outputs frames, built once after
the pass. Per round the line also gives the pass's inference (``inference_s``: its ``session.run`` calls alone)
over the bare loop's time, and the pass's own cost (``wall_s - inference_s``), so a ratio short of the target says
whether ONNX Runtime ran slower inside ``mlms eval`` or the harness cost more. The inputs differ in one way: the
``.npz`` stores ``x`` at an offset that is not a multiple of 4 (``np.savez``'s zip headers), so the pass's views
are unaligned float32 read through the memory map, where the bare loop's copy in memory is aligned. Measured
apart (one ONNX Runtime thread, CPU time, 9 interleaved rounds): unaligned arrays in memory ran as fast as aligned
ones (1.000), views of the map 0.8 % slower (its pages mapped on first touch). The NaN/Inf check of a batch's data
is first its sum of squares (``np.vdot``: about 4 us for 64 x 784 floats, aligned or not, where ``isfinite`` + ``all``
took 10-11 us); after the model's call the batch is out of cache, so it costs about twice that in the pass.

Run: ``.venv/bin/python benchmarks/streaming.py [--count 10000] [--rounds 2] [--keep DIR] [--reader
threads,processes] [--cases jpeg,npz]``; MLMS_HOME is used as it is (the ONNX copy of the model is built first,
untimed).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

MODEL, FRAMEWORK, BATCH = "efficientnet_lite0", "onnxruntime", 32
MLMS = str(Path(sys.executable).with_name("mlms"))


def make_images(folder: Path, count: int, seed: int = 0) -> None:
    """``count`` JPEGs derived from the 20 imagenet-samples photos, in ``CLASS/`` subfolders."""
    from PIL import Image

    from mlms_nb.data.datasets import ImageNetSamples

    photos = ImageNetSamples()
    sources = [(Image.open(p).convert("RGB"), int(label)) for p, label in zip(photos.paths, photos.labels)]

    def one(k: int) -> None:
        rng = np.random.default_rng([seed, k])
        image, label = sources[k % len(sources)]
        w, h = image.size
        cw, ch = int(w * rng.uniform(0.5, 1.0)), int(h * rng.uniform(0.5, 1.0))
        left, top = int(rng.integers(0, w - cw + 1)), int(rng.integers(0, h - ch + 1))
        out = image.crop((left, top, left + cw, top + ch))
        if rng.random() < 0.5:
            out = out.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        short = int(rng.integers(160, 321))
        scale = short / min(out.size)
        out = out.resize((max(1, round(out.size[0] * scale)), max(1, round(out.size[1] * scale))), Image.BILINEAR)
        target = folder / str(label)
        target.mkdir(parents=True, exist_ok=True)
        out.save(target / f"img_{k:05d}.jpg", quality=90)

    with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
        list(pool.map(one, range(count)))


def preprocess_to_disk(folder: Path, path: Path) -> np.ndarray:
    """Every image of ``folder`` preprocessed as the model's manifest says, in an on-disk ``.npy`` (memory-mapped)."""
    from mlms_nb.data.datasets import ImageFolder
    from mlms_nb.data.transforms import Preprocessor
    from mlms_nb.manifest import find_manifest

    manifest = find_manifest(MODEL, framework=FRAMEWORK)
    dataset = ImageFolder(folder)
    out = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(len(dataset), *manifest.inputs[0].dimensions))
    start = 0
    for batch in dataset.iter_batches(256, Preprocessor(manifest)):
        out[start:start + len(batch)] = batch.data
        start += len(batch)
    out.flush()
    return np.load(path, mmap_mode="r")


def model_path() -> str:
    done = subprocess.run([MLMS, "convert", MODEL, "--to", FRAMEWORK, "--json"], capture_output=True, text=True,
                          check=True)
    return json.loads(done.stdout)["path"]


def bare_loop(session, arrays: np.ndarray, batch: int = BATCH) -> float:
    """Inputs/s of ``session.run`` at ``batch`` over every input (one untimed warm-up batch first)."""
    name = session.get_inputs()[0].name
    session.run(None, {name: np.ascontiguousarray(arrays[:batch])})
    t0 = time.perf_counter()
    for start in range(0, len(arrays), batch):
        session.run(None, {name: np.ascontiguousarray(arrays[start:start + batch])})
    return len(arrays) / (time.perf_counter() - t0)


BARE_PROCESS = """
import sys, time
import numpy as np
import onnxruntime as ort
model, data, batch = sys.argv[1], sys.argv[2], int(sys.argv[3])
session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
with np.load(data) as npz:
    arrays = npz["x"]
name = session.get_inputs()[0].name
session.run(None, {name: np.ascontiguousarray(arrays[:batch])})
t0 = time.perf_counter()
for start in range(0, len(arrays), batch):
    session.run(None, {name: np.ascontiguousarray(arrays[start:start + batch])})
print(len(arrays) / (time.perf_counter() - t0))
"""


def bare_loop_process(model: Path, data: Path, batch: int) -> float:
    """:func:`bare_loop` in a child process of its own that imports nothing but ONNX Runtime and numpy, as ``mlms
    eval`` runs in one: in this process, which has imported torch to write the model, the same loop ran about 20%
    slower than the pass's own ``session.run`` calls."""
    done = subprocess.run([sys.executable, "-c", BARE_PROCESS, str(model), str(data), str(batch)], capture_output=True,
                          text=True, check=True)
    return float(done.stdout.split()[-1])


def streamed_loop(session, folder: Path, reader: str, transport: str = "shm") -> dict:
    """Inputs/s of ``session.run`` at batch 32 fed by the pipeline over ``folder`` (``reader`` workers, the default
    count), from opening the stream (readers started) to the last batch; with the stream's stats."""
    from mlms_nb.data.datasets import ImageFolder
    from mlms_nb.data.pipeline import Stream
    from mlms_nb.data.transforms import Preprocessor
    from mlms_nb.manifest import find_manifest

    name = session.get_inputs()[0].name
    preprocess = Preprocessor(find_manifest(MODEL, framework=FRAMEWORK))
    t0 = time.perf_counter()
    with Stream(ImageFolder(folder), preprocess, BATCH, reader=reader, transport=transport) as stream:
        for batch in stream:
            session.run(None, {name: batch.data})
    wall = time.perf_counter() - t0
    stats = stream.stats
    return {"inputs_per_s": stats.inputs / wall, "wait_s": stats.wait_ns / 1e9, "read_s": stats.read_ns / 1e9,
            "transfer_ms_per_batch": stats.transfer_ns / 1e6 / max(1, stats.batches), "workers": stats.workers}


def mlms_eval(folder: Path, reader: str = "threads", model: str = MODEL, batch: int = BATCH,
              env: dict | None = None) -> dict:
    """One ``mlms eval`` under ``/usr/bin/time -v``: its full pass, accuracy and peak RSS."""
    cmd = ["/usr/bin/time", "-v", MLMS, "eval", model, "--framework", FRAMEWORK, "--batch-sizes", str(batch),
           "--dataset", str(folder), "--warmup", "2", "--min-repeats", "3", "--min-time", "0", "--no-history",
           "--reader", reader, "--json"]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise SystemExit(f"mlms eval failed ({done.returncode}):\n{done.stderr[-3000:]}")
    rss_kib = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", done.stderr).group(1))
    wall = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): ([\d:.]+)", done.stderr).group(1)
    result = json.loads(done.stdout)["results"][0]
    return {"rss_gib": rss_kib * 1024 / 2**30, "process_wall": wall, **result["full_pass"],
            "top1": (result["accuracy"] or {}).get("top1")}


SMALL_MODEL, SMALL_BATCH = "small-cnn", 64


def write_small_model(root: Path, count: int) -> Path:
    """The small CNN (ONNX, random weights), its manifest and ``count`` inputs with labels in ``data.npz``
    (uncompressed, so ``x`` is memory-mapped); returns the ``.npz``."""
    import torch
    import yaml

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(1, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(8, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2), torch.nn.Flatten(),
        torch.nn.Linear(16 * 7 * 7, 10)).eval()
    torch.onnx.export(model, (torch.zeros(1, 1, 28, 28),), str(root / "small_cnn.onnx"), input_names=["x"],
                      output_names=["logits"], dynamic_axes={"x": {0: "n"}, "logits": {0: "n"}}, dynamo=False)
    manifest = {"name": SMALL_MODEL, "framework": {"name": FRAMEWORK},
                "inputs": [{"name": "x", "type": "tensor", "dimensions": [1, 28, 28]}],
                "outputs": [{"name": "logits", "type": "classification"}], "model": {"graph_path": "small_cnn.onnx"}}
    (root / f"{SMALL_MODEL}.yaml").write_text(yaml.safe_dump(manifest))
    rng = np.random.default_rng(0)
    path = root / "data.npz"
    np.savez(path, x=rng.standard_normal((count, 1, 28, 28), dtype=np.float32), y=rng.integers(0, 10, count))
    return path


def pass_cost(root: Path, data: Path, session, arrays: np.ndarray, repeats: int = 7) -> dict:
    """The full pass's own cost, apart from the model: `run_full_pass` as `mlms eval` calls it (NaN/Inf checks,
    scoring, output summaries, progress) over the same ``.npz``, with a model whose outputs ``session`` computed
    beforehand (each call reads its batch, as a model does, and returns its rows), in this process: the record's
    ``wall_s - inference_s`` (ms; short, so little exposed to other load), median of ``repeats``; and the thread's
    CPU time of the whole call (the pass, then its predictions frame)."""
    from mlms_nb.data.datasets import open_dataset
    from mlms_nb.data.transforms import Preprocessor
    from mlms_nb.evaluation.full_pass import run_full_pass
    from mlms_nb.evaluation.outputs import OutputRecorder
    from mlms_nb.evaluation.reporter import Reporter
    from mlms_nb.manifest import load_manifest

    manifest = load_manifest(root / f"{SMALL_MODEL}.yaml")
    preprocess = Preprocessor(manifest)
    logits = session.run(None, {session.get_inputs()[0].name: arrays})[0]
    done = [0]

    def model(batch):
        x = next(iter(batch.values())) if isinstance(batch, dict) else batch
        np.add.reduce(x, axis=None)  # its pages mapped and its rows in cache, as after a real model's call
        out = logits[done[0]:done[0] + len(x)].copy()
        done[0] += len(x)
        return {"logits": out} if isinstance(batch, dict) else out

    own, cpu = [], []
    for i in range(repeats + 1):
        done[0] = 0
        dataset = open_dataset(str(data), manifest)
        t0 = time.thread_time()
        full, _ = run_full_pass(model, manifest, dataset, preprocess, SMALL_BATCH, limit=None, keep_probabilities=False,
                                trust=False, reporter=Reporter(lambda record: None, FRAMEWORK),
                                recorder=OutputRecorder(manifest, FRAMEWORK, "summary"), note=lambda text: None)
        if i:  # the first is a warm-up
            cpu.append(time.thread_time() - t0)
            own.append(full.row["wall_s"] - full.row["inference_s"])
    return {"ms": statistics.median(own) * 1e3, "us_per_input": statistics.median(own) * 1e6 / len(arrays),
            "min_ms": min(own) * 1e3, "max_ms": max(own) * 1e3, "cpu_ms": statistics.median(cpu) * 1e3}


def npz_case(root: Path, count: int, rounds: int) -> None:
    """The small-model ``.npz`` case (see the module doc): interleaved rounds, then the medians."""
    import onnxruntime as ort

    root.mkdir(parents=True, exist_ok=True)
    data = write_small_model(root, count)
    env = dict(os.environ, MLMS_MANIFEST_PATH=str(root))
    session = ort.InferenceSession(str(root / "small_cnn.onnx"), providers=["CPUExecutionProvider"])
    with np.load(data) as npz:
        arrays = npz["x"]
    ratios, fulls, bares, inference, own = [], [], [], [], []
    for r in range(rounds):
        # the bare loop right before and right after the eval, their mean: on this shared machine the speed of a
        # ~70 ms loop drifts from one second to the next (56 to 88 ms in one run), and one side alone compared
        # the eval with whichever moment it happened to fall on
        before = bare_loop_process(root / "small_cnn.onnx", data, SMALL_BATCH)
        e = mlms_eval(data, model=SMALL_MODEL, batch=SMALL_BATCH, env=env)
        after = bare_loop_process(root / "small_cnn.onnx", data, SMALL_BATCH)
        bare = 2 / (1 / before + 1 / after)  # inputs/s of the mean time
        fulls.append(e["inputs_per_s"])
        bares.append(bare)
        ratios.append(e["inputs_per_s"] / bare)
        bare_s = count / bare
        inference.append(e["inference_s"] / bare_s)
        own.append((e["wall_s"] - e["inference_s"]) * 1e3)
        print(f"round {r + 1}: .npz small CNN: full pass {e['inputs']} inputs in {e['wall_s'] * 1e3:.1f} ms = "
              f"{e['inputs_per_s']:.0f} inputs/s (inference {e['inference_s'] * 1e3:.1f} ms = "
              f"{e['inference_s'] / bare_s:.2f} x the bare loop's time; the pass's own cost "
              f"{(e['wall_s'] - e['inference_s']) * 1e3:.1f} ms: postprocess {e['postprocess_s'] * 1e3:.1f} ms, "
              f"waited {e['wait_s'] * 1e3:.1f} ms); bare loop {bare_s * 1e3:.1f} ms = {bare:.0f} inputs/s (before "
              f"{count / before * 1e3:.1f} ms, after {count / after * 1e3:.1f} ms); ratio "
              f"{ratios[-1]:.2f}; top-1 {e['top1']}; load {open('/proc/loadavg').read().split()[0]}", flush=True)
    print(f"\n.npz small CNN, N={count}, batch {SMALL_BATCH}, {os.cpu_count()} CPUs; medians of {rounds} interleaved "
          f"rounds: full pass {statistics.median(fulls):.0f} inputs/s, bare loop {statistics.median(bares):.0f} "
          f"inputs/s; full pass / bare loop {statistics.median(ratios):.3f} (min {min(ratios):.2f}, max "
          f"{max(ratios):.2f}; target >= 0.9); the pass's inference {statistics.median(inference):.2f} x the bare "
          f"loop's time, its own cost {statistics.median(own):.1f} ms; load average "
          f"{open('/proc/loadavg').read().split()[0]}", flush=True)
    cost = pass_cost(root, data, session, arrays)
    print(f"the pass's own cost apart from the model (run_full_pass in this process, the model's outputs computed "
          f"beforehand; median of 7): {cost['ms']:.1f} ms = {cost['us_per_input']:.2f} us per input (min "
          f"{cost['min_ms']:.1f}, max {cost['max_ms']:.1f} ms); the whole call with its predictions frame "
          f"{cost['cpu_ms']:.1f} ms of CPU\n", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=10_000, help="images to generate (default 10000)")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds of eval + bare loop (default 2)")
    parser.add_argument("--keep", type=Path, default=None, help="generate into (or reuse) this folder")
    parser.add_argument("--reader", default="threads",
                        help="mlms eval's reader(s), comma-separated: threads, processes (default threads); with "
                             "processes, also the in-process streamed loops of each reader and transport")
    parser.add_argument("--cases", default="jpeg",
                        help="which cases, comma-separated: jpeg (EfficientNet-Lite0 on JPEGs), npz (a small CNN on "
                             "an .npz; issue 25); default jpeg")
    args = parser.parse_args()
    cases = {c.strip() for c in args.cases.split(",") if c.strip()}
    if not cases or cases - {"jpeg", "npz"}:
        parser.error(f"--cases {args.cases}: expected jpeg, npz or jpeg,npz")
    if "npz" in cases:
        with tempfile.TemporaryDirectory(prefix="mlms-streaming-npz-") as tmp:
            npz_case(Path(tmp), args.count, max(args.rounds, 3))
    if "jpeg" not in cases:
        return
    readers = [r.strip() for r in args.reader.split(",") if r.strip()]
    if not readers or set(readers) - {"threads", "processes"}:
        parser.error(f"--reader {args.reader}: expected threads, processes or threads,processes")

    import onnxruntime as ort

    with tempfile.TemporaryDirectory(prefix="mlms-streaming-") as tmp:
        folder = args.keep or Path(tmp) / "images"
        t0 = time.perf_counter()
        if not folder.exists() or not any(folder.rglob("*.jpg")):
            make_images(folder, args.count)
        n = sum(1 for _ in folder.rglob("*.jpg"))
        print(f"{n} images in {folder} ({time.perf_counter() - t0:.0f} s to generate)", flush=True)
        session = ort.InferenceSession(model_path(), providers=["CPUExecutionProvider"])
        t0 = time.perf_counter()
        arrays = preprocess_to_disk(folder, Path(tmp) / "preprocessed.npy")
        print(f"preprocessed for the bare loop in {time.perf_counter() - t0:.0f} s "
              f"({arrays.nbytes / 2**30:.2f} GiB on disk)", flush=True)
        loops = [("threads", "shm"), ("processes", "shm"), ("processes", "pipe")] if "processes" in readers else []
        evals: dict[str, list] = {reader: [] for reader in readers}
        streamed: dict[tuple, list] = {loop: [] for loop in loops}
        bares = []
        for r in range(args.rounds):
            order = readers if r % 2 == 0 else readers[::-1]  # alternate who goes first: drift on a shared machine
            for reader in order:
                e = mlms_eval(folder, reader)
                evals[reader].append(e)
                print(f"round {r + 1}: mlms eval --reader {reader}: full pass {e['inputs']} inputs in "
                      f"{e['wall_s']:.1f} s = {e['inputs_per_s']:.1f} inputs/s (preprocess {e['preprocess_s']:.1f} s "
                      f"in {e['workers']} workers, inference {e['inference_s']:.1f} s, waited {e['wait_s']:.1f} s); "
                      f"peak RSS {e['rss_gib']:.2f} GiB; top-1 {e['top1']}", flush=True)
            bares.append(bare_loop(session, arrays))
            print(f"round {r + 1}: bare onnxruntime loop {bares[-1]:.1f} inputs/s", flush=True)
            for loop in (loops if r % 2 == 0 else loops[::-1]):
                s = streamed_loop(session, folder, *loop)
                streamed[loop].append(s)
                print(f"round {r + 1}: onnxruntime fed by Stream(reader={loop[0]}"
                      f"{', transport=' + loop[1] if loop[0] == 'processes' else ''}): {s['inputs_per_s']:.1f} inputs/s "
                      f"(waited {s['wait_s']:.1f} s, read {s['read_s']:.1f} s in {s['workers']} workers, taking "
                      f"batches in {s['transfer_ms_per_batch']:.1f} ms/batch)", flush=True)
        bare = statistics.median(bares)
        print(f"\nN={n}, batch {BATCH}, {os.cpu_count()} CPUs; medians of {args.rounds} interleaved rounds; "
              f"bare loop {bare:.1f} inputs/s")
        for reader, runs in evals.items():
            full = statistics.median(e["inputs_per_s"] for e in runs)
            peak = max(e["rss_gib"] for e in runs)
            against_threads = ""
            if reader != "threads" and "threads" in evals:
                ratios = [e["inputs_per_s"] / t["inputs_per_s"] for e, t in zip(runs, evals["threads"])]
                against_threads = f", {statistics.median(ratios):.2f} of threads (median of per-round ratios)"
            print(f"mlms eval --reader {reader}: full pass {full:.1f} inputs/s, ratio to the bare loop "
                  f"{full / bare:.2f} (target >= 0.75: decoding shares the cores){against_threads}; peak RSS {peak:.2f} GiB "
                  f"(limit 2 GiB: {'met' if peak < 2 else 'MISSED'}; the largest single process, readers apart)")
        if loops:
            for loop, runs in streamed.items():
                rate = statistics.median(s["inputs_per_s"] for s in runs)
                copy = statistics.median(s["transfer_ms_per_batch"] for s in runs)
                vs_bare = statistics.median(s["inputs_per_s"] / b for s, b in zip(runs, bares))
                vs_threads = statistics.median(s["inputs_per_s"] / t["inputs_per_s"]
                                               for s, t in zip(runs, streamed[loops[0]]))
                print(f"Stream-fed loop, reader={loop[0]}{'/' + loop[1] if loop[0] == 'processes' else ''}: "
                      f"{rate:.1f} inputs/s; {vs_bare:.2f} of the bare loop, {vs_threads:.2f} of threads (medians of "
                      f"per-round ratios); {copy:.1f} ms/batch taking batches in")


if __name__ == "__main__":
    main()
