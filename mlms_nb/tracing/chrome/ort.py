"""The ONNX Runtime profile dialect (a top-level array of events, as ``InferenceSession.end_profiling()`` writes).

``cat`` ``"Session"`` -> MODEL / ``model``; ``"Node"`` -> FRAMEWORK / ``layer`` with ``op_name`` ->
``layer_type``, ``node_index`` -> ``layer_index``, ``input_type_shape`` -> ``shape``, ``activation_size +
parameter_size + output_size`` -> ``bytes``, ``mem_in_use_delta`` (else ``output_size``) -> ``memory``, the
execution provider -> ``device``; the ``_kernel_time`` suffix is dropped from node names. Times are µs since
profiling started (``session.get_profiling_start_time_ns()`` gives its wall-clock start).
"""
from __future__ import annotations

import orjson

from mlms_nb.schema.levels import TraceLevel as _L
from mlms_nb.tracing.chrome._common import ARGS_AS_ATTRS, ARGS_OF_ORT_NODE, to_int

CATEGORIES: dict[str, tuple[_L, str, int]] = {
    "Session": (_L.MODEL, "model", ARGS_AS_ATTRS),
    "Node": (_L.FRAMEWORK, "layer", ARGS_OF_ORT_NODE),
}
"""ONNX Runtime event category -> (level, kind, how its args are read)."""

CLOCK = {"name": "onnxruntime profiler (since profiling started; session.get_profiling_start_time_ns() gives the "
                 "wall-clock start)", "wall_offset_ns": None}


def is_ort(categories) -> bool:
    """Whether the categories seen in a top-level array make an ONNX Runtime profile."""
    return bool(set(CATEGORIES) & set(categories))


def device_of_provider(provider) -> str:
    """``"CUDAExecutionProvider"`` -> ``"cuda"``; the CPU provider (or none) -> ``"cpu"``."""
    if not provider:
        return "cpu"
    p = str(provider)
    if p.endswith("ExecutionProvider"):
        p = p[: -len("ExecutionProvider")]
    p = p.lower()
    return "cpu" if p in ("cpu", "") else p


def node(cols, row: int, name: str, args) -> str:
    """One graph node's args into ``cols``' sparse columns (their keys leave ``args``); returns its name."""
    if isinstance(name, str) and name.endswith("_kernel_time"):
        name = name[: -len("_kernel_time")]
    if not args:
        return name
    op = args.pop("op_name", None)
    if op is not None:
        code = cols.layer_types.get(op)
        if code is None:
            code = cols.layer_types[op] = len(cols.layer_types)
        cols.lt_rows.append(row)
        cols.lt_codes.append(code)
    idx = args.pop("node_index", None)
    if idx is not None:
        cols.li_rows.append(row)
        cols.li_vals.append(to_int(idx))
    shape = args.pop("input_type_shape", None)
    if shape is not None:
        key = orjson.dumps(shape)
        sc = cols.shapes.get(key)
        if sc is None:
            sc = cols.shapes[key] = len(cols.shapes)
        cols.shape_rows.append(row)
        cols.shape_codes.append(sc)
    sizes = [args.get(k) for k in ("activation_size", "parameter_size", "output_size")]
    if any(s is not None for s in sizes):
        cols.bytes_rows.append(row)
        cols.bytes_vals.append(float(sum(to_int(s, 0) for s in sizes)))
    mem = args.get("mem_in_use_delta", args.get("output_size"))
    if mem is not None:
        cols.mem_rows.append(row)
        cols.mem_vals.append(float(to_int(mem, 0)))
    dev = device_of_provider(args.get("provider"))
    if dev != "cpu":
        code = cols.devices.get(dev)
        if code is None:
            code = cols.devices[dev] = len(cols.devices)
        cols.dev_rows.append(row)
        cols.dev_codes.append(code)
    return name
