"""ONNX Runtime session profiles -> FRAMEWORK ``layer`` spans on the tracer's clock, one per node execution.

The profile (``SessionOptions.enable_profiling``) is read with the ONNX Runtime dialect of
:func:`mlms_nb.tracing.chrome.read_chrome`: ``Session`` events (``model_run`` per ``InferenceSession.run``) and
``Node`` events (``<node>_kernel_time`` per node execution). Each node becomes one span:

- ``name``: the PyTorch module the node was exported from (:func:`~mlms_nb.naming.onnx_layer_name`; a node under
  the root, ``/Add``, by its own name, ``Add``). With the graph map (``covers``: which original nodes each node of
  the optimised graph stands for), a fused node is named for the first original node it fused (a ``Conv`` + ``Clip``
  fused into one NCHWc ``Conv`` is the convolution's module, not the activation's) and a node ONNX Runtime inserted
  (``ReorderInput`` / ``ReorderOutput`` of its NCHWc layout: it stands for no node of the model) is named
  ``<op> (inserted by onnxruntime)`` and marked ``attrs["inserted"]``;
- ``layer_type``: the ONNX op type; a fused node's lists the ops it fused (``Conv+Clip``; past three, ``<op> (N ops
  fused)``), ``attrs["fused_ops"]`` all of them; ``layer_index``: the node's position within its run (execution
  order);
- ``shape``: the input shapes; ``bytes``: ``activation_size + parameter_size + output_size`` (the bytes the
  node reads and writes at least); ``memory``: ``output_size`` (bytes of the outputs it allocated);
- ``attrs``: ``onnx_node`` (the optimized graph's node name), ``node_index`` (in that graph), ``provider``,
  ``thread`` (ONNX Runtime's thread id), ``param_bytes``, ``output_bytes``, ``out_shape``, ``original_nodes`` (with
  the graph map), ``fused_ops``, ``inserted``.

Clock: ``ts`` is µs since the session's profiling start, and ``InferenceSession.get_profiling_start_time_ns()``
is that start on the **Unix clock** (``std::chrono::system_clock``; measured: it falls between ``time.time_ns()``
read before and after the session is created, and is ~1.8e18 ns away from ``perf_counter_ns``). A node's tracer
time is ``start_time_ns + ts * 1000 - wall_offset_ns``, then each ``model_run`` (with its nodes) is moved into the
``perf_counter_ns`` window of the ``predict`` call it ran in (:mod:`mlms_nb.tracing.align`) and parented to
that call's span. Profile timestamps have 1 µs resolution.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np
import orjson

from mlms_nb.naming import onnx_layer_name
from mlms_nb.tracing.align import match_windows, run_shifts
from mlms_nb.schema.levels import TraceLevel

_FRAMEWORK = TraceLevel.FRAMEWORK + 0


@dataclass
class OrtNodeRun:
    """One node execution from the profile (times in ns on the profile's own clock, since its start)."""
    node: str
    op_type: str
    start_ns: int
    end_ns: int
    node_index: int
    thread: int
    shapes: tuple = ()
    out_shapes: tuple = ()
    provider: str = ""
    activation_bytes: int | None = None
    param_bytes: int | None = None
    output_bytes: int | None = None


@dataclass
class OrtRun:
    """One ``InferenceSession.run`` (``model_run``) and the nodes it executed, in execution order."""
    start_ns: int
    end_ns: int
    nodes: list[OrtNodeRun] = field(default_factory=list)


def _dims(shapes) -> tuple:
    """``[{"float": [1, 3, 224, 224]}, ...]`` -> ``((1, 3, 224, 224), ...)``."""
    out = []
    for s in shapes or ():
        dims = next(iter(s.values()), []) if isinstance(s, dict) else s
        out.append(tuple(int(d) for d in dims))
    return tuple(out)


def _int(value) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def read_ort_profile(path) -> list[OrtRun]:
    """The runs of an ONNX Runtime profile JSON file and their node executions (in execution order); nodes
    outside every ``model_run`` are left out. Raises :class:`~mlms_nb.tracing.TraceFormatError` on a bad file."""
    from mlms_nb.tracing.chrome import read_chrome

    spans, _, _ = read_chrome(path)
    level = spans["level"].astype(str).to_numpy()
    names = spans["name"].astype(str).to_numpy()
    start = spans["start_ns"].to_numpy()
    end = spans["end_ns"].to_numpy()
    run_rows = np.flatnonzero((level == "MODEL") & (names == "model_run"))
    runs = [OrtRun(int(start[i]), int(end[i])) for i in run_rows]
    runs.sort(key=lambda r: r.start_ns)
    if not runs:
        return runs
    run_starts = np.array([r.start_ns for r in runs], np.int64)
    node_rows = np.flatnonzero(level == "FRAMEWORK")
    op_types = spans["layer_type"].astype(str).to_numpy()
    node_index = spans["layer_index"].to_numpy()
    threads = spans["thread"].to_numpy()
    shape_text = spans["shape"].astype(str).to_numpy()
    attrs = spans["attrs"].to_numpy()
    for i in node_rows:  # rows are sorted by start time: nodes come in execution order
        k = int(np.searchsorted(run_starts, start[i], side="right")) - 1
        if k < 0 or end[i] > runs[k].end_ns:
            continue
        a = orjson.loads(attrs[i]) if attrs[i] else {}
        runs[k].nodes.append(OrtNodeRun(
            node=str(names[i]), op_type=str(op_types[i]), start_ns=int(start[i]), end_ns=int(end[i]),
            node_index=int(node_index[i]), thread=int(threads[i]),
            shapes=_dims(orjson.loads(shape_text[i])) if shape_text[i] else (),
            out_shapes=_dims(a.get("output_type_shape")), provider=str(a.get("provider", "")),
            activation_bytes=_int(a.get("activation_size")), param_bytes=_int(a.get("parameter_size")),
            output_bytes=_int(a.get("output_size"))))
    return runs


#: how a node ONNX Runtime inserted (it stands for no node of the model) is named: ``ReorderOutput (inserted by ...)``
INSERTED = "{op} (inserted by onnxruntime)"
#: a fused node's layer type lists the ops it fused up to this many (``Conv+Clip``), then counts them
MAX_LISTED_OPS = 3


def node_layer(node: str, op_type: str, covers=None, op_types=None, module_names=None) -> tuple[str, str, dict]:
    """The layer name, layer type and extra attrs of the span of optimised node ``node`` (see the module docstring);
    ``covers``/``op_types``: the graph map's optimised node -> original nodes, and original node -> op type."""
    if covers is None:
        return onnx_layer_name(node, op_type, module_names), op_type, {}
    op_types = op_types or {}
    originals = [o for o in covers.get(node, []) if op_types.get(o) != "Constant"]
    if not originals and not node.startswith("/"):  # no scope, and no node of the model behind it
        return INSERTED.format(op=op_type), op_type, {"inserted": True}
    name = onnx_layer_name(originals[0] if originals else node, op_type, module_names)
    if len(originals) < 2:
        return name, op_type, {}
    fused = [op_types.get(o, "?") for o in originals]
    listed = "+".join(fused) if len(fused) <= MAX_LISTED_OPS else f"{op_type} ({len(fused)} ops fused)"
    return name, listed, {"fused_ops": fused}


def add_ort_profile(tracer, path, profile_start_ns: int, wall_offset_ns: int,
                    windows: list[tuple[int, int, int]], module_names=None, remove: bool = True,
                    covers=None, op_types=None) -> dict:
    """Add the node executions of the profile at ``path`` to ``tracer`` as FRAMEWORK ``layer`` spans.

    ``profile_start_ns``: ``session.get_profiling_start_time_ns()`` (Unix ns); ``wall_offset_ns``:
    ``time.time_ns() - time.perf_counter_ns()``; ``windows``: ``(start_ns, end_ns, predict_span_id)`` per traced
    ``predict`` call (``perf_counter_ns`` around ``session.run``); ``module_names``: the PyTorch model's module
    names, when known (exact name mapping). ``covers`` / ``op_types``: the graph map's optimised node -> original
    nodes and original node -> op type (fused and inserted nodes named as the module docstring says). ``remove``:
    delete the file after reading. Returns a summary:
    runs, runs matched to a predict call, spans added, the largest clock shift applied (ns).
    """
    try:
        runs = read_ort_profile(path)
    finally:
        if remove:
            try:
                os.remove(path)
            except OSError:
                pass
    summary = {"runs": len(runs), "matched_runs": 0, "layer_spans": 0, "clipped_spans": 0, "max_shift_ns": 0,
               "clock": "onnxruntime profile: Unix ns (get_profiling_start_time_ns) -> perf_counter_ns, "
                        "each model_run then moved into its predict call"}
    if not runs or not windows:
        return summary
    base = int(profile_start_ns) - int(wall_offset_ns)
    r0 = np.array([r.start_ns for r in runs], np.int64) + base
    r1 = np.array([r.end_ns for r in runs], np.int64) + base
    w = np.asarray(windows, np.int64).reshape(-1, 3)
    which = match_windows(r0, r1, w[:, 0], w[:, 1])
    matched = np.flatnonzero(which >= 0)
    shifts = run_shifts(r0[matched], r1[matched], w[which[matched], 0], w[which[matched], 1])
    layers: dict[str, tuple[str, str, dict]] = {}
    add = tracer.add_span
    for k, shift in zip(matched, shifts):
        lo, hi, parent = (int(v) for v in w[which[k]])
        offset = base + int(shift)
        for index, n in enumerate(runs[k].nodes):
            layer = layers.get(n.node)
            if layer is None:
                layer = layers[n.node] = node_layer(n.node, n.op_type, covers, op_types, module_names)
            name, layer_type, marks = layer
            sizes = (n.activation_bytes, n.param_bytes, n.output_bytes)
            fields = dict(marks)
            if any(s is not None for s in sizes):
                fields["bytes"] = float(sum(s or 0 for s in sizes))
            if n.output_bytes is not None:
                fields["memory"] = float(n.output_bytes)
            if covers is not None:
                fields["original_nodes"] = covers.get(n.node, [])
            start, end = n.start_ns + offset, n.end_ns + offset
            if start < lo or end > hi:  # only when a node sticks out of its model_run
                summary["clipped_spans"] += 1
                start = min(max(start, lo), hi)
                end = min(max(end, start), hi)
            add(name, _FRAMEWORK, "layer", start, end, parent, thread=n.thread, layer_index=index,
                layer_type=layer_type, shape=n.shapes, onnx_node=n.node, node_index=n.node_index,
                provider=n.provider, param_bytes=n.param_bytes, output_bytes=n.output_bytes,
                out_shape=n.out_shapes, **fields)
        summary["layer_spans"] += len(runs[k].nodes)
    summary["matched_runs"] = int(len(matched))
    summary["max_shift_ns"] = int(np.abs(shifts).max()) if len(shifts) else 0
    return summary
