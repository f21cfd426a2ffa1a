"""How layers of one model line up across PyTorch, ONNX (fp32 and int8) and Keras.

A *point* is one call of one PyTorch module: ``(module name, call index)`` (a shared ``ReLU6`` called
twice in a block gives ``(_blocks.1._swish, 0)`` and ``(_blocks.1._swish, 1)``), ordered by when the call
returns (forward hooks; :class:`mlms_nb.frameworks.capture.Point`). Every framework's capture
(``frameworks/<name>/capture.py``) says which points it has a tensor for:

- PyTorch: every module call (forward hooks);
- Keras: layer ``L``'s k-th call is point ``(keras_layer_to_torch_name(L), k)``; outputs NHWC -> NCHW;
- ONNX: node ``/scope/.../Op`` is point ``(onnx_node_to_torch_name(node), k)`` where ``k`` is the
  ``_N`` call suffix of its last scope; a point's tensor is the output of its last node in graph order.
  The exporter folds an eval-mode BatchNorm into the Conv before it, so a Conv point whose output
  PyTorch feeds straight into a BatchNorm is re-keyed (:func:`fold_map`) to that BatchNorm's point: the ONNX
  Conv output is compared with PyTorch's (and Keras') BatchNorm output, the conv+bn pair;
- int8 ONNX (QDQ): a ``QuantizeLinear`` of fp32 tensor ``T`` gives the int8 copy of ``T``; it is
  dequantized (``(q - zero_point) * scale``) and takes ``T``'s fp32 point.

A layer row exists for each point at least two of the compared frameworks have a tensor for; a pair's
metrics are NaN on rows one of its two frameworks lacks.

Latency (:mod:`.latency`): the self time of each layer span of the predictor's FRAMEWORK trace (ONNX Runtime:
per node, Keras: per layer call, PyTorch: per layer-module call) goes to the point the span stands for, and a
point's time is added to the first row at or after it in execution order that this framework has a tensor for
(so time spent in a fused or unaligned op lands on the layer whose output it helps produce). Time outside any
layer span, or in layers of no point, is reported as unattributed.
"""
from __future__ import annotations

from typing import Collection, Mapping, Sequence

import numpy as np

from mlms_nb.frameworks.capture import Key, Point


def fold_map(points: Sequence[Point], conv_feeds_bn: Collection[Key]) -> dict[Key, Key]:
    """conv point -> the BatchNorm point right after it, for the convs PyTorch feeds straight into a BatchNorm."""
    out = {}
    for p, nxt in zip(points, points[1:]):
        if p.key in conv_feeds_bn:
            out[p.key] = nxt.key
    return out


def build_rows(points: Sequence[Point], available: Mapping[str, Collection[Key]]) -> list[Point]:
    """The points at least two frameworks have a tensor for, in execution order."""
    rows = []
    for p in points:
        if sum(p.key in keys for keys in available.values()) >= 2:
            rows.append(p)
    return rows


def attribute_latency(points: Sequence[Point], rows: Sequence[Point], has: Collection[Key],
                      durations: Mapping[Key | None, Sequence[float]]) -> tuple[dict[int, np.ndarray], np.ndarray]:
    """Sum per-point durations (ns, one value per timed call) into layer rows for one framework.

    Returns ({row index: ns per timed call}, unattributed ns per timed call). A duration goes to the first
    row at or after its point that ``has`` a tensor; points after the last such row, and unknown keys, are
    unattributed.
    """
    position = {p.key: p.position for p in points}
    own_rows = [(r.position, i) for i, r in enumerate(rows) if r.key in has]
    row_positions = np.array([pos for pos, _ in own_rows], dtype=np.int64)
    calls = max((len(v) for v in durations.values()), default=0)
    per_row: dict[int, np.ndarray] = {}
    unattributed = np.zeros(calls)
    for key, values in durations.items():
        values = np.asarray(values, dtype=float)
        if len(values) != calls:  # a node that did not run in every call: spread what there is
            values = np.resize(values, calls) if len(values) else np.zeros(calls)
        pos = position.get(key) if key is not None else None
        if pos is None or not len(row_positions):
            unattributed += values
            continue
        j = int(np.searchsorted(row_positions, pos, side="left"))
        if j >= len(own_rows):
            unattributed += values
            continue
        row = own_rows[j][1]
        per_row[row] = per_row.get(row, np.zeros(calls)) + values
    return per_row, unattributed
