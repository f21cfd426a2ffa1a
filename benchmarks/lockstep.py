"""State in lockstep (issue 11): full-pass throughput of a streaming model over a folder of audio files of different
lengths, one file at a time (batch 1) against B files side by side (each row its own state, a finished file's row
refilled by the next file), interleaved in one process.

The model is a GRU cell over 10 ms chunks (160 samples at 16 kHz, 80 of left context): ``forward(x, state) ->
(logits, new_state)``, x (N, 240), state (N, 256), written here with fixed random weights and exported to ONNX.
The folder holds ``--files`` WAV files (tones and noise, 0.2 to 2 s, uniformly drawn: 20 to 200 chunks each). Each
round runs ``mlms_nb.evaluate`` once per batch size (``batch_sizes=[B]``, so the full pass runs at B; history off)
in the order 1, B, then B, 1, and reads the full pass's ``inputs_per_s`` (files/s, decoding and resampling
included) and ``batches`` (model calls). It also prints the calls the other choice -- B files to the end of the
longest, then B more -- would make, counted from the files' chunk counts.

Run: ``.venv/bin/python benchmarks/lockstep.py [--files 48] [--batch 8] [--rounds 2] [--framework onnxruntime]``.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import yaml

RATE, HOP, CONTEXT, HIDDEN, CLASSES = 16000, 160, 80, 256, 32


def build():
    import torch

    class Cell(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.cell = torch.nn.GRUCell(HOP + CONTEXT, HIDDEN)
            self.head = torch.nn.Linear(HIDDEN, CLASSES)

        def forward(self, x, state):
            new_state = self.cell(x, state)
            return self.head(new_state), new_state

    torch.manual_seed(0)
    return Cell().eval()


def make_folder(root: Path, files: int, framework: str) -> list[int]:
    """WAV files, the model (.pth and .onnx) and its manifest; returns each file's chunk count."""
    import soundfile
    import torch

    rng = np.random.default_rng(0)
    (root / "audio").mkdir(parents=True)
    chunks = []
    for i in range(files):
        n = int(rng.integers(20, 201))
        t = np.arange(n * HOP) / RATE
        signal = 0.3 * np.sin(2 * np.pi * rng.uniform(100, 2000) * t) + 0.05 * rng.standard_normal(t.size)
        soundfile.write(root / "audio" / f"clip{i:03d}.wav", signal.astype(np.float32), RATE)
        chunks.append(n)
    module = build()
    torch.save(module.state_dict(), root / "cell.pth")
    torch.onnx.export(module, (torch.zeros(1, HOP + CONTEXT), torch.zeros(1, HIDDEN)), str(root / "cell.onnx"),
                      input_names=["x", "state"], output_names=["logits", "new_state"],
                      dynamic_axes={"x": {0: "n"}, "state": {0: "n"}, "logits": {0: "n"}, "new_state": {0: "n"}},
                      dynamo=False)
    model = {"graph_path": "cell.onnx"} if framework == "onnxruntime" else {
        "entrypoint": "benchmarks.lockstep:build", "weights_path": "cell.pth"}
    manifest = {"name": "gru-cell", "framework": {"name": framework},
                "inputs": [{"name": "x", "type": "audio", "dimensions": [HOP + CONTEXT]},
                           {"name": "state", "type": "tensor", "dimensions": [HIDDEN]}],
                "outputs": [{"name": "logits", "type": "tensor"}, {"name": "new_state", "type": "tensor"}],
                "state": {"new_state": "state"},
                "preprocess": [{"decode_audio": {"sample_rate": RATE}}, {"chunk": {"size": HOP, "context": CONTEXT}}],
                "model": model}
    (root / "gru-cell.yaml").write_text(yaml.safe_dump(manifest))
    return chunks


def grouped_calls(chunks: list[int], batch: int) -> int:
    """Calls when B files run to the end of the longest before the next B start."""
    return sum(max(chunks[i:i + batch]) for i in range(0, len(chunks), batch))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=48)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--framework", default="onnxruntime", choices=["onnxruntime", "torch"])
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # benchmarks.lockstep:build for torch

    import os

    import mlms_nb

    with tempfile.TemporaryDirectory(prefix="mlms-lockstep-") as tmp:
        root = Path(tmp)
        chunks = make_folder(root, args.files, args.framework)
        os.environ["MLMS_MANIFEST_PATH"] = str(root)
        print(f"{args.files} files, {sum(chunks)} chunks of {HOP} samples ({min(chunks)} to {max(chunks)} a file); "
              f"{args.framework}, {os.cpu_count()} CPUs", flush=True)
        rates: dict[int, list[float]] = {1: [], args.batch: []}
        calls: dict[int, int] = {}
        for r in range(args.rounds):
            for b in ((1, args.batch) if r % 2 == 0 else (args.batch, 1)):
                t0 = time.perf_counter()
                ev = mlms_nb.evaluate("gru-cell", framework=args.framework, trust=True, batch_sizes=[b],
                                      dataset=str(root / "audio"), warmup=1, min_repeats=3, min_time_s=0,
                                      progress=False, history=False, capture_outputs="none")
                row = ev.full_pass.iloc[0]
                rates[b].append(float(row["inputs_per_s"]))
                calls[b] = int(row["batches"])
                print(f"round {r + 1}, B={b}: {int(row['inputs'])} files in {row['wall_s']:.2f} s = "
                      f"{row['inputs_per_s']:.1f} files/s ({calls[b]} calls; inference {row['inference_s']:.2f} s, "
                      f"lockstep bookkeeping {row['postprocess_s']:.2f} s; evaluate {time.perf_counter() - t0:.1f} s)",
                      flush=True)
        one, many = statistics.median(rates[1]), statistics.median(rates[args.batch])
        print(f"\nfull pass, median of {args.rounds} interleaved rounds: B=1 {one:.1f} files/s, B={args.batch} "
              f"{many:.1f} files/s ({many / one:.2f}x); calls: B=1 {calls[1]}, B={args.batch} refilled "
              f"{calls[args.batch]} (the chunks allow {-(-sum(chunks) // args.batch)} at least), grouped "
              f"{grouped_calls(chunks, args.batch)}")


if __name__ == "__main__":
    main()
