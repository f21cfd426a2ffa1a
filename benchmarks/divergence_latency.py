"""The layer latency table of a divergence run (EfficientNet-Lite0 in PyTorch, ONNX Runtime, TensorFlow and the
INT8 ONNX copy), and how each framework's numbers were measured.

Prints ``Divergence.latency`` (per framework: median ms of the layers aligned to rows, of the rest, of the whole
call, the call's IQR), the ``latency ...`` notes, the first rows of the per-layer ``latency_ms[...]`` columns, the
column sums and how many rows have a latency. Run before and after a change to the way layers are timed, in one
quiet moment, and compare (the numbers are medians of few calls at batch 1: read them as such).

Run: ``.venv/bin/python benchmarks/divergence_latency.py [--repeats 5] [--limit 8] [--rows 12]``.
"""
from __future__ import annotations

import argparse
import time

import pandas as pd

from mlms_nb.divergence import diverge


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5, help="timed calls per framework (latency_repeats)")
    parser.add_argument("--limit", type=int, default=None, help="photos compared (default: all 20)")
    parser.add_argument("--rows", type=int, default=12, help="layer rows to print")
    args = parser.parse_args()
    pd.set_option("display.width", 200)
    pd.set_option("display.max_columns", 20)
    started = time.perf_counter()
    d = diverge("efficientnet_lite0", frameworks="torch,onnxruntime,tensorflow", quantized=True, limit=args.limit,
                latency_repeats=args.repeats)
    print(f"diverge took {time.perf_counter() - started:.1f} s (wall)")
    print(d.latency.drop(columns=["how"]).to_string(float_format=lambda v: f"{v:.3f}"))
    for key, text in d.notes.items():
        if key.startswith("latency"):
            print(f"{key}: {text}")
    cols = ["layer", "layer_type"] + [c for c in d.layers.columns if c.startswith("latency_ms")]
    table = d.layers[cols]
    print(table.head(args.rows).to_string(float_format=lambda v: f"{v:.3f}"))
    print("column sums (ms):", {c: round(float(table[c].sum()), 3) for c in cols[2:]})
    print("rows with a latency:", {c: int(table[c].notna().sum()) for c in cols[2:]}, "of", len(table))


if __name__ == "__main__":
    main()
