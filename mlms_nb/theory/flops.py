"""What the PyTorch and ONNX cost tables share: the FLOP convention, the per-element formulas, the frame layout.

FLOP convention (both frameworks):

- one multiply-add is 2 FLOPs; convolutions, matrix products and attention products count 2 FLOPs per
  multiply-add (``flops_matmul_conv``, with no bias), and a bias adds 1 FLOP per output element;
- element-wise ops (add, mul, ReLU, ReLU6/Clip, sigmoid, ...): 1 FLOP per output element, transcendental or not;
- BatchNorm at inference: 2 FLOPs per element (one multiply-add with the folded scale and shift); with
  batch statistics, and LayerNorm/GroupNorm/InstanceNorm: 5 per element (mean 1, variance 2, normalise 2),
  plus 2 per element for an affine scale and shift;
- Softmax/LogSoftmax: 5 FLOPs per element (max, subtract, exp, sum, divide);
- pooling: output elements x window size (max: comparisons; average: adds and the divide); global and
  adaptive pooling: one FLOP per input element; reductions (sum, mean, ...): one per input element;
- data movement (pad, concat, copy, cast, gather): 0 FLOPs; views/reshapes: 0 FLOPs and 0 bytes.

Bytes: the least a layer can move: its weights (parameters and floating-point buffers such as BatchNorm
running statistics) read once, its input activations read once, its outputs written once -- nothing for
intermediates inside the layer, caches or write-allocate traffic. Intensity = flops / bytes (FLOP per byte).
"""
from __future__ import annotations

import json
import math
from typing import Iterable, Sequence

import pandas as pd

FLOP_CONVENTION = (
    "FLOPs: 1 multiply-add = 2 FLOPs (convolution, matmul, attention products; flops_matmul_conv counts only "
    "these, without bias); bias, element-wise ops and activations 1 FLOP per output element; inference "
    "BatchNorm 2 per element; Layer/Group/InstanceNorm 5 per element (+2 with affine); Softmax 5 per element; "
    "pooling output elements x window; global/adaptive pooling and reductions 1 per input element; "
    "pad/concat/copy/cast 0. Bytes: the minimum moved = weights (parameters + float buffers) + inputs read "
    "once + outputs written once (no intermediates, no caches, no write-allocate); views/reshapes move 0 bytes. "
    "intensity_flop_per_byte = flops / bytes."
)

NORM_FLOPS_PER_ELEMENT = 5
AFFINE_FLOPS_PER_ELEMENT = 2
INFERENCE_BATCHNORM_FLOPS_PER_ELEMENT = 2
SOFTMAX_FLOPS_PER_ELEMENT = 5

COMMON_COLUMNS = ("input_shape", "output_shape", "flops", "flops_matmul_conv", "params", "weight_bytes",
                  "input_bytes", "output_bytes", "bytes", "intensity_flop_per_byte")


def shape_json(shapes: Sequence[Sequence[int] | None]) -> str:
    """One shape -> ``"[1,3,224,224]"``; several -> ``"[[1,16],[1,16]]"``; none -> ``"[]"``; unknown -> ``null``."""
    shapes = list(shapes)
    if len(shapes) == 1:
        return json.dumps(None if shapes[0] is None else [int(d) for d in shapes[0]], separators=(",", ":"))
    return json.dumps([None if s is None else [int(d) for d in s] for s in shapes], separators=(",", ":"))


def numel(shape: Iterable[int] | None) -> int:
    return 0 if shape is None else math.prod(int(d) for d in shape)


def attention_flops(batch_heads: int, q_len: int, kv_len: int, head_dim: int, value_dim: int) -> tuple[float, float]:
    """(all FLOPs, matmul FLOPs) of softmax(Q K^T / sqrt(d)) V for ``batch_heads`` heads: 2 products + softmax."""
    products = 2.0 * batch_heads * q_len * kv_len * (head_dim + value_dim)
    return products + SOFTMAX_FLOPS_PER_ELEMENT * batch_heads * q_len * kv_len, products


def finish_frame(rows: list[dict], columns: Sequence[str], convention_extra: str = "") -> pd.DataFrame:
    """Rows -> a typed frame with ``bytes`` and ``intensity_flop_per_byte`` filled in and the convention in attrs."""
    frame = pd.DataFrame(rows, columns=list(columns))
    for name in ("flops", "flops_matmul_conv"):
        frame[name] = frame[name].astype("float64")
    for name in ("layer_index", "params", "weight_bytes", "input_bytes", "output_bytes"):
        frame[name] = frame[name].astype("int64")
    frame["bytes"] = frame["weight_bytes"] + frame["input_bytes"] + frame["output_bytes"]
    frame["intensity_flop_per_byte"] = (frame["flops"] / frame["bytes"].where(frame["bytes"] > 0)).astype("float64")
    frame.attrs["convention"] = FLOP_CONVENTION + (" " + convention_extra if convention_extra else "")
    return frame
