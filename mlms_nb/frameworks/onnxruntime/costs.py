"""Per-node theoretical costs of an ONNX graph, from shape inference and per-op formulas.

Shapes come from ``onnx.shape_inference.infer_shapes`` (with data propagation, so ``Reshape`` targets
computed from ``Shape`` resolve) after the graph inputs are given fixed shapes: ``input_shapes`` names
them; any other symbolic dimension becomes ``batch_size``. Formulas follow the convention in ``mlms_nb.theory.flops``;
``flops_matmul_conv`` holds the multiply-add FLOPs of Conv/ConvTranspose/Gemm/MatMul and attention
products, the part comparable with PyTorch's FlopCounterMode. Weights are the node's floating-point
initializers of rank >= 1 (a Clip's scalar bounds and a Pad's integer pads are attributes, not weights).
The PyTorch exporter folds BatchNorm into the preceding Conv, so a Conv node there carries a bias
(1 FLOP per output element, ``Cout`` more parameters) and BatchNorm has no node.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pandas as pd

from mlms_nb._optional import require
from mlms_nb.errors import MlmsError
from mlms_nb.theory.flops import (
    AFFINE_FLOPS_PER_ELEMENT, COMMON_COLUMNS, INFERENCE_BATCHNORM_FLOPS_PER_ELEMENT, NORM_FLOPS_PER_ELEMENT,
    SOFTMAX_FLOPS_PER_ELEMENT, attention_flops, finish_frame, numel, shape_json,
)

COLUMNS = ("layer_index", "node_name", "op_type", "torch_name") + COMMON_COLUMNS

ELEMENTWISE = frozenset({
    "Add", "Sub", "Mul", "Div", "Pow", "Sqrt", "Reciprocal", "Relu", "LeakyRelu", "PRelu", "Elu", "Selu", "Celu",
    "Gelu", "FastGelu", "BiasGelu", "QuickGelu", "Sigmoid", "HardSigmoid", "HardSwish", "Tanh", "Softplus",
    "Softsign", "Exp", "Log", "Erf", "Abs", "Neg", "Clip", "Max", "Min", "Mean", "Sum", "Where", "Equal", "Less",
    "Greater", "LessOrEqual", "GreaterOrEqual", "Not", "And", "Or", "Xor", "Sin", "Cos", "Floor", "Ceil", "Round",
    "Sign", "Mish", "ThresholdedRelu", "Shrink", "Mod", "IsNaN", "IsInf",
})
DATA_MOVEMENT = frozenset({
    "Pad", "Concat", "Split", "Slice", "Gather", "GatherElements", "GatherND", "ScatterElements", "ScatterND",
    "Transpose", "Cast", "CastLike", "Tile", "Expand", "Resize", "Upsample", "DepthToSpace", "SpaceToDepth",
    "Range", "ConstantOfShape", "Trilu", "OneHot", "NonZero", "Compress",
})
VIEWS = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Shape", "Size", "Constant", "Dropout"})
NORMS = frozenset({"LayerNormalization", "GroupNormalization", "InstanceNormalization", "RMSNormalization",
                   "SimplifiedLayerNormalization", "SkipLayerNormalization", "SkipSimplifiedLayerNormalization"})
REDUCTIONS = frozenset({"ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
                        "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare", "ArgMax", "ArgMin"})


# ---------------------------------------------------------------- loading and shapes

def load_onnx_model(model: Any):
    """A copy of ``model`` (an onnx.ModelProto, or the path of a .onnx file), or one sentence saying why not."""
    onnx = require("onnx")
    if isinstance(model, onnx.ModelProto):
        copy = onnx.ModelProto()
        copy.CopyFrom(model)
        return copy
    if isinstance(model, (str, Path)):
        path = Path(model)
        if not path.is_file():
            raise MlmsError(f"ONNX model {str(path)!r} does not exist")
        try:
            return onnx.load(str(path))
        except Exception as err:  # DecodeError and friends
            raise MlmsError(f"{str(path)!r} is not a readable ONNX model ({type(err).__name__}: {err})") from None
    raise MlmsError(f"onnx_node_costs needs a path or an onnx.ModelProto, got {type(model).__name__}")


def _fix_input_shapes(model, input_shapes: dict[str, list[int]] | None, batch_size: int) -> dict[str, list[int]]:
    """Give every graph input a fixed shape in place; returns them."""
    initializers = {t.name for t in model.graph.initializer}
    inputs = [i for i in model.graph.input if i.name not in initializers]
    given = dict(input_shapes or {})
    unknown = sorted(set(given) - {i.name for i in inputs})
    if unknown:
        raise MlmsError(f"input_shapes names {', '.join(map(repr, unknown))}, not an input of this graph; "
                        f"its inputs: {', '.join(i.name for i in inputs)}")
    fixed = {}
    for value in inputs:
        dims = value.type.tensor_type.shape.dim
        if value.name in given:
            shape = [int(d) for d in given[value.name]]
            if len(shape) != len(dims) or any(d <= 0 for d in shape):
                raise MlmsError(f"input_shapes[{value.name!r}]: expected {len(dims)} positive sizes, got {shape}")
        else:
            shape = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else int(batch_size) for d in dims]
        for dim, size in zip(dims, shape):
            dim.Clear()
            dim.dim_value = size
        fixed[value.name] = shape
    return fixed


def _value_shapes(model) -> tuple[dict[str, list[int] | None], dict[str, int]]:
    """Shapes (None where unknown) and element types of every named value after shape inference."""
    onnx = require("onnx")
    try:
        inferred = onnx.shape_inference.infer_shapes(model, check_type=False, strict_mode=False, data_prop=True)
    except Exception as err:  # InferenceError on malformed graphs
        raise MlmsError(f"ONNX shape inference failed: {str(err).splitlines()[0]}") from None
    shapes: dict[str, list[int] | None] = {}
    types: dict[str, int] = {}
    graph = inferred.graph
    for value in list(graph.input) + list(graph.value_info) + list(graph.output):
        tensor = value.type.tensor_type
        types[value.name] = tensor.elem_type
        if not tensor.HasField("shape"):
            shapes.setdefault(value.name, None)
            continue
        dims = [d.dim_value if d.HasField("dim_value") else None for d in tensor.shape.dim]
        shapes[value.name] = None if any(d is None for d in dims) else dims
    for t in graph.initializer:
        shapes[t.name], types[t.name] = list(t.dims), t.data_type
    for node in graph.node:  # Constant nodes that were not folded into initializers
        if node.op_type == "Constant":
            for attr in node.attribute:
                if attr.name == "value":
                    shapes[node.output[0]], types[node.output[0]] = list(attr.t.dims), attr.t.data_type
    return shapes, types


def _itemsize(elem_type: int | None) -> int:
    onnx = require("onnx")
    if not elem_type:
        return 0
    try:
        return int(onnx.helper.tensor_dtype_to_np_dtype(elem_type).itemsize)
    except Exception:  # a type numpy cannot name here (bfloat16, float8): its size by type id
        return {16: 2, 17: 1, 18: 1, 19: 1, 20: 1}.get(int(elem_type), 0)


def _attrs(node) -> dict[str, Any]:
    onnx = require("onnx")
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


# ---------------------------------------------------------------- formulas

def _attention(node, shape, attrs) -> tuple[float, float, list[int] | None]:
    """(flops, matmul flops, output shape) of ai.onnx Attention (opset 23) and com.microsoft (MultiHead)Attention."""
    q = shape(node.input[0])
    k = shape(node.input[1]) if len(node.input) > 1 else None
    v = shape(node.input[2]) if len(node.input) > 2 else None
    if node.op_type == "Attention" and node.domain == "com.microsoft":  # packed input x weights [in, 3*hidden]
        w = shape(node.input[1])
        heads = int(attrs.get("num_heads", 1))
        if not q or not w or len(q) != 3:
            return math.nan, math.nan, None
        sizes = list(attrs.get("qkv_hidden_sizes") or [w[1] // 3] * 3)
        b, s, d_in = q
        projection = 2.0 * b * s * d_in * w[1]
        bias = float(b * s * w[1]) if len(node.input) > 2 and node.input[2] else 0.0
        flops, products = attention_flops(b * heads, s, s, sizes[0] // heads, sizes[2] // heads)
        return flops + projection + bias, products + projection, [b, s, sizes[2]]
    if not q or not k or not v:
        return math.nan, math.nan, None
    if len(q) == 4:  # [B, heads, seq, head_size]
        b, heads, q_len, d = q
        kv_len, dv = k[-2], v[-1]
    elif len(q) == 3:  # [B, seq, heads * head_size]
        heads = int(attrs.get("q_num_heads", attrs.get("num_heads", 1)))
        kv_heads = int(attrs.get("kv_num_heads", heads))
        b, q_len, hidden = q
        d, kv_len, dv = hidden // heads, k[1], v[-1] // kv_heads
    else:
        return math.nan, math.nan, None
    past = shape(node.input[4]) if node.domain != "com.microsoft" and len(node.input) > 4 and node.input[4] else None
    kv_len += past[-2] if past else 0
    flops, products = attention_flops(b * heads, q_len, kv_len, d, dv)
    return flops, products, ([b, heads, q_len, dv] if len(q) == 4 else [b, q_len, heads * dv])


def node_flops(node, shape, attrs: dict) -> tuple[str, float, float, list[int] | None]:
    """``(kind, flops, flops_matmul_conv, computed output shape or None)`` of one node.

    ``shape(name)`` gives a value's shape (None when unknown); kind: compute | data | view | unknown.
    """
    op = node.op_type
    ins = [shape(name) if name else None for name in node.input]
    out = shape(node.output[0]) if node.output else None
    if op in ("Conv", "ConvTranspose"):
        x, w = ins[0], ins[1]
        if x is None or w is None or out is None:
            return "compute", math.nan, math.nan, None
        if op == "Conv":  # W: [M, C/group, k...]: the group count is in W's second dimension
            macs = numel(out) * w[1] * numel(w[2:])
        else:  # W: [C, M/group, k...]: each input element meets M/group x kernel weights
            macs = numel(x) * w[1] * numel(w[2:])
        bias = numel(out) if len(ins) > 2 and ins[2] is not None else 0
        return "compute", 2.0 * macs + bias, 2.0 * macs, None
    if op == "Gemm":
        a, b = ins[0], ins[1]
        if a is None or b is None:
            return "compute", math.nan, math.nan, None
        k = a[0] if attrs.get("transA", 0) else a[1]
        m = a[1] if attrs.get("transA", 0) else a[0]
        n = b[0] if attrs.get("transB", 0) else b[1]
        bias = m * n if len(ins) > 2 and ins[2] is not None and attrs.get("beta", 1.0) != 0 else 0
        return "compute", 2.0 * m * n * k + bias, 2.0 * m * n * k, None
    if op == "MatMul":
        a = ins[0]
        if a is None or out is None:
            return "compute", math.nan, math.nan, None
        k = a[-1]
        return "compute", 2.0 * numel(out) * k, 2.0 * numel(out) * k, None
    if op in ("Attention", "MultiHeadAttention"):
        flops, products, computed = _attention(node, shape, attrs)
        return "compute", flops, products, computed
    if op in VIEWS:
        return "view", 0.0, 0.0, None
    if op in DATA_MOVEMENT:
        return "data", 0.0, 0.0, None
    if out is None and op not in ("GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool") and op not in REDUCTIONS:
        return "compute", math.nan, 0.0, None
    if op in ELEMENTWISE:
        return "compute", float(numel(out)), 0.0, None
    if op in ("MaxPool", "AveragePool", "LpPool"):
        return "compute", float(numel(out) * numel(attrs.get("kernel_shape", []))), 0.0, None
    if op in ("GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool") or op in REDUCTIONS:
        return "compute", float(numel(ins[0])) if ins[0] is not None else math.nan, 0.0, None
    if op == "BatchNormalization":
        if attrs.get("training_mode", 0):
            return "compute", float((NORM_FLOPS_PER_ELEMENT + AFFINE_FLOPS_PER_ELEMENT) * numel(out)), 0.0, None
        return "compute", float(INFERENCE_BATCHNORM_FLOPS_PER_ELEMENT * numel(out)), 0.0, None
    if op in NORMS:
        affine = AFFINE_FLOPS_PER_ELEMENT if len(ins) > 1 and ins[1] is not None else 0
        skip = 1 if op.startswith("Skip") else 0
        return "compute", float((NORM_FLOPS_PER_ELEMENT + affine + skip) * numel(out)), 0.0, None
    if op in ("Softmax", "LogSoftmax"):
        return "compute", float(SOFTMAX_FLOPS_PER_ELEMENT * numel(out)), 0.0, None
    return "unknown", 0.0, 0.0, None


# ---------------------------------------------------------------- the table

def onnx_node_costs(model: str | Path | Any, input_shapes: dict[str, list[int]] | None = None, *,
                    batch_size: int = 1, module_names=None) -> pd.DataFrame:
    """One row per node, in graph order: FLOPs, parameters, bytes and intensity (see ``attrs["convention"]``).

    ``model``: a path or an ``onnx.ModelProto`` (not modified); ``input_shapes``: full shapes of graph
    inputs by name; other symbolic dimensions (the batch) become ``batch_size``. ``torch_name`` is the
    PyTorch module the node was exported from (``porting.onnx_node_to_torch_name``; exact with
    ``module_names``, e.g. ``dict(torch_model.named_modules())``).
    """
    from mlms_nb.naming import onnx_node_to_torch_name

    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise MlmsError(f"batch_size: expected an integer >= 1, got {batch_size!r}")
    proto = load_onnx_model(model)
    fixed = _fix_input_shapes(proto, input_shapes, batch_size)
    shapes, types = _value_shapes(proto)
    float_types = {1, 10, 11, 16}  # FLOAT, FLOAT16, DOUBLE, BFLOAT16
    initializers = {t.name for t in proto.graph.initializer}
    constants = {n.output[0] for n in proto.graph.node if n.op_type == "Constant"}

    def nbytes(name: str) -> int:
        s = shapes.get(name)
        return 0 if s is None else numel(s) * _itemsize(types.get(name))

    rows, unknown, unshaped = [], set(), []
    for index, node in enumerate(proto.graph.node):
        attrs = _attrs(node)
        kind, flops, counted, computed_out = node_flops(node, shapes.get, attrs)
        if computed_out is not None and shapes.get(node.output[0]) is None:
            shapes[node.output[0]] = computed_out
            types.setdefault(node.output[0], types.get(node.input[0], 1))
        if kind == "unknown":
            unknown.add(f"{node.domain + '.' if node.domain else ''}{node.op_type}")
        if flops != flops:
            unshaped.append(node.name or f"#{index}")
        named = [n for n in node.input if n]
        weights = [n for n in named if (n in initializers or n in constants) and types.get(n) in float_types
                   and len(shapes.get(n) or []) >= 1]
        activations = [n for n in named if n not in initializers and n not in constants]
        outputs = [n for n in node.output if n]
        moves = kind != "view"
        rows.append({
            "layer_index": index, "node_name": node.name, "op_type": node.op_type,
            "torch_name": onnx_node_to_torch_name(node.name, module_names) if node.name else None,
            "input_shape": shape_json([shapes.get(n) for n in activations]),
            "output_shape": shape_json([shapes.get(n) for n in outputs]),
            "flops": flops, "flops_matmul_conv": counted,
            "params": sum(numel(shapes.get(n)) for n in weights),
            "weight_bytes": sum(nbytes(n) for n in weights) if moves else 0,
            "input_bytes": sum(nbytes(n) for n in activations) if moves else 0,
            "output_bytes": sum(nbytes(n) for n in outputs) if moves else 0,
        })
    frame = finish_frame(rows, COLUMNS, convention_extra=(
        "Rows: one per ONNX node in graph order; weights = floating-point initializers of rank >= 1; "
        "shapes from onnx.shape_inference. The PyTorch exporter folds BatchNorm into Conv: such a Conv has a "
        "bias (+1 FLOP per output element, +Cout parameters) and BatchNorm has no node."))
    frame.attrs["framework"] = "onnx"
    frame.attrs["input_shapes"] = fixed
    frame.attrs["uncounted_ops"] = sorted(unknown)
    frame.attrs["nodes_without_shapes"] = unshaped
    return frame
