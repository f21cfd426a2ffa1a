"""TensorFlow profiler XSpace (``.xplane.pb``) -> FRAMEWORK ``layer`` spans per Keras layer call and ML_LIBRARY
``op`` spans per TensorFlow op, on the tracer's clock.

What the XSpace holds (TF 2.21; read with the ``XSpace`` message of :mod:`.xspace_proto`, no TensorFlow needed): a ``/host:CPU`` plane with one line per thread. The line
``python`` has the caller's events (our ``mlms_nb.predict`` markers, ``EagerLocalExecute: __inference_...``);
the lines ``tf_Compute/...`` (the inter-op pool) have one event per executed op, its metadata named
``<op name>:<op type>`` with ``display_name`` = the op type. Op names carry the Keras name scopes of the
``tf.function`` graph: ``<model>_1/<layer>_<n>/<op>`` (``efficientnet_lite0_1/_blocks__3___depthwise_conv_1/
depthwise``); a layer called twice gets two scopes (``_swish_1``, ``_swish_3``); grappler's rewrites keep the
scope (``_blocks__10_1/ArithmeticOptimizer/AddOpsRewrite_Add``). A ``Task Environment`` plane holds
``profile_start_time`` (Unix ns); event times are ``profile_start_time + line.timestamp_ns + offset_ps / 1000``
(measured: a marker around a call lands within ~0.1 ms of ``perf_counter_ns + (time_ns - perf_counter_ns)`` read
around it), so the clock is the Unix clock, re-based on the profile start.

Layer spans. Inside a ``tf.function`` the executor runs every op as soon as its inputs are ready, so ops that
depend only on a layer's weights (``ReadVariableOp``, the ``rsqrt(var + eps) * gamma`` half of an inference
BatchNorm) run early, in parallel with other layers. A layer call's span is therefore the envelope of its
**data-path** ops (those reachable from the function's input in the traced graph); its weights-only ops are
kept as op spans parented to the ``predict`` span, with ``attrs["weights_only"] = true``. Layer spans are
named after the PyTorch module (:func:`~mlms_nb.naming.keras_layer_to_torch_name`), ``layer_type`` =
the Keras class, ``layer_index`` = the call's position by start time in its run, ``attrs``: ``keras_layer``,
``keras_call`` (the name scope), ``ops``. Op spans: ``name`` = ``layer_type`` = the standard op type (:func:`standard_op_type`: oneDNN's
``_MklNativeConv2D`` and grappler's ``_FusedMatMul`` are ``Conv2D`` and ``MatMul``), ``attrs``: ``tf_op`` (full
op name), ``tf_op_type`` (the kernel's own spelling, where it differs), ``keras_layer``. Each run (one ``predict`` call, found by its marker) is moved into
the ``perf_counter_ns`` window of that call (:mod:`mlms_nb.tracing.align`).

Fused layers. The graph optimizer may fold a layer's ops into an op of the layer that consumes its output: on
oneDNN builds the remapper turns ``Pad`` (a ``ZeroPadding2D`` layer) + ``Conv2D`` into one
``_MklNativePadWithConv2D`` op named after the convolution, so the padding layer runs no op of its own. The
layer calls to expect come from the traced graph (:class:`ModelGraph`, before optimization); a call that ran no
op gets a zero-length layer span at the start of the call it was fused into (the first downstream call that ran
ops), with ``attrs["fused_into"]`` (that call's layer name) and ``ops`` = 0, and is listed in the summary's
``fused_layers``: a trace never silently loses a layer.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Collection, Mapping

import numpy as np

from mlms_nb.naming import keras_layer_to_torch_name
from mlms_nb.tracing.align import run_shifts
from mlms_nb.errors import TraceFormatError
from mlms_nb.schema.levels import TraceLevel

MARKER = "mlms_nb.predict"
"""Name of the profiler event (``tf.profiler.experimental.Trace``) wrapped around each traced call."""
PROFILER_OPTIONS = {"host_tracer_level": 1, "python_tracer_level": 0, "device_tracer_level": 0}
"""``tf.profiler.experimental.ProfilerOptions``: host events at level 1 (ops are level-1 events; level 2 adds
executor internals), no Python tracer, no device tracer (CUPTI is left to the runner's kernel recorder: it takes
one subscriber)."""
_FRAMEWORK = TraceLevel.FRAMEWORK + 0
_ML_LIBRARY = TraceLevel.ML_LIBRARY + 0
_CALL_SUFFIX = re.compile(r"^(.+)_\d+$")


def find_xplane(logdir) -> Path:
    """The newest ``*.xplane.pb`` under ``logdir`` (``tf.profiler.experimental.stop`` writes
    ``plugins/profile/<run>/<host>.xplane.pb``)."""
    files = sorted(Path(logdir).glob("plugins/profile/*/*.xplane.pb"), key=lambda p: p.stat().st_mtime)
    if not files:
        raise TraceFormatError(f"the TensorFlow profiler wrote no .xplane.pb under {logdir}")
    return files[-1]


def load_xspace(path):
    """Parse an ``.xplane.pb`` file into an ``XSpace`` message."""
    from mlms_nb.frameworks.tensorflow.xspace_proto import xspace_class

    space = xspace_class()()
    try:
        space.ParseFromString(Path(path).read_bytes())
    except Exception as err:  # protobuf's DecodeError
        raise TraceFormatError(f"{path} is not a TensorFlow XSpace file: {err}") from None
    return space


@dataclass
class ModelGraph:
    """What importing a profile needs to know of the model and the graphs its ``tf.function`` ran (JSON-able).

    ``layer_types``: Keras layer name -> class name; ``model_name``: the Keras model's name (its ops' first
    scope); ``weights_only``: op names that depend on weights only (else only ``ReadVariableOp`` counts as
    such); ``calls``: the layer-call scopes that have data-path ops, in graph order; ``consumers``: call scope ->
    the call scopes that read its outputs."""
    layer_types: dict[str, str] = field(default_factory=dict)
    model_name: str = ""
    weights_only: set[str] = field(default_factory=set)
    calls: list[str] = field(default_factory=list)
    consumers: dict[str, list[str]] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"layer_types": self.layer_types, "model_name": self.model_name,
                "weights_only": sorted(self.weights_only), "calls": self.calls, "consumers": self.consumers}

    @classmethod
    def from_dict(cls, data: Mapping) -> "ModelGraph":
        return cls(dict(data["layer_types"]), data["model_name"], set(data["weights_only"]), list(data["calls"]),
                   {k: list(v) for k, v in data["consumers"].items()})


_KERNEL_PREFIXES = ("_MklNative", "_Mkl")
_FUSABLE = frozenset({"Conv2D", "Conv3D", "DepthwiseConv2dNative", "MatMul", "BatchMatMul", "BatchMatMulV2"})


def standard_op_type(op_type: str) -> str:
    """The TensorFlow op a kernel's op type stands for: ``_MklNativeConv2D`` -> ``Conv2D``,
    ``_MklNativePadWithConv2D`` -> ``Conv2D``, ``_FusedMatMul`` / ``_MklNativeFusedMatMul`` -> ``MatMul``; other
    types as they are (``FusedBatchNormV3`` is an op of its own)."""
    t = op_type
    for prefix in _KERNEL_PREFIXES:
        if t.startswith(prefix):
            t = t[len(prefix):]
            break
    if t.startswith("_Fused") or (t.startswith("Fused") and t[5:] in _FUSABLE):
        t = t[t.index("Fused") + 5:]
    if t.startswith("PadWith"):
        t = t[7:]
    return t or op_type


@dataclass
class HostEvents:
    """Host-plane events as arrays (times: Unix ns). ``op_type`` is "" for events that are not TF ops."""
    name: list[str]
    op_type: list[str]
    start_ns: np.ndarray
    end_ns: np.ndarray
    line: np.ndarray       # index into line_names
    step: np.ndarray       # the marker's step_num, -1 elsewhere
    line_names: list[str]
    line_ids: list[int]


def host_events(space) -> HostEvents:
    """Every event of the ``/host:CPU`` plane (see the module doc for the clock)."""
    start_time = 0
    planes = list(space.planes)
    for plane in planes:
        if plane.name == "Task Environment":
            for stat in plane.stats:
                if plane.stat_metadata[stat.metadata_id].name == "profile_start_time":
                    start_time = int(stat.uint64_value or stat.int64_value)
    host = next((p for p in planes if p.name == "/host:CPU"), None)
    if host is None:
        raise TraceFormatError("the TensorFlow profile has no /host:CPU plane")
    meta = host.event_metadata
    step_stat = next((k for k, m in host.stat_metadata.items() if m.name == "step_num"), None)
    names, types, start, dur, lines, steps = [], [], [], [], [], []
    line_names, line_ids = [], []
    kinds: dict[int, tuple[str, str]] = {}
    for li, line in enumerate(host.lines):
        line_names.append(line.name)
        line_ids.append(int(line.id))
        # line times are ns since the profile start (as TF 2.21 writes them), or Unix ns (older files)
        base = (int(line.timestamp_ns) if line.timestamp_ns < start_time // 2 else
                int(line.timestamp_ns) - start_time) * 1000
        for ev in line.events:
            kind = kinds.get(ev.metadata_id)
            if kind is None:
                m = meta[ev.metadata_id]
                op_name, sep, op_type = m.name.rpartition(":")
                kind = kinds[ev.metadata_id] = ((op_name, m.display_name) if sep and m.display_name == op_type
                                                else (m.name, ""))
            names.append(kind[0])
            types.append(kind[1])
            start.append(base + ev.offset_ps)
            dur.append(ev.duration_ps)
            lines.append(li)
            step = -1
            if kind[0] == MARKER and step_stat is not None:
                step = next((_stat_int(s) for s in ev.stats if s.metadata_id == step_stat), -1)
            steps.append(step)
    start_ps = np.asarray(start, np.int64)  # since the profile start: ps fit int64 for 106 days
    end_ps = start_ps + np.asarray(dur, np.int64)
    return HostEvents(names, types, start_time + start_ps // 1000, start_time - (-end_ps // 1000),
                      np.asarray(lines, np.int64), np.asarray(steps, np.int64), line_names, line_ids)


def _stat_int(stat) -> int:
    kind = stat.WhichOneof("value")
    try:
        return int(getattr(stat, kind)) if kind in ("int64_value", "uint64_value", "str_value") else -1
    except ValueError:
        return -1


def scope_layer(op_name: str, layers: Collection[str], model_name: str = "") -> tuple[str, str] | None:
    """``(keras layer, call scope)`` of a TF op, from its name scopes; None when it is in no layer.

    ``efficientnet_lite0_1/_blocks__3___depthwise_conv_1/depthwise`` -> ``("_blocks__3___depthwise_conv",
    "efficientnet_lite0_1/_blocks__3___depthwise_conv_1")``. The first scope is the model's (``model_name`` with
    an optional ``_<n>``); a scope's trailing ``_<n>`` (the call count tf.function adds) is dropped when what
    remains is a layer name, else the scope must be a layer name itself.
    """
    parts = op_name.split("/")
    if len(parts) < 3:
        return None
    head, scope = parts[0], parts[1]
    if model_name and model_name not in (head, _uncalled(head)):
        return None
    layer = _uncalled(scope)
    if layer not in layers:
        layer = scope if scope in layers else None
    return None if layer is None else (layer, f"{head}/{scope}")


def _uncalled(scope: str) -> str | None:
    """``_swish_3`` -> ``_swish``; None when the scope has no ``_<n>`` suffix."""
    called = _CALL_SUFFIX.match(scope)
    return called.group(1) if called else None


def add_tf_profile(tracer, events: HostEvents, wall_offset_ns: int,
                   windows: Mapping[int, tuple[int, int, int, int]], graph: ModelGraph) -> dict:
    """Add the layer and op spans of the profiled runs to ``tracer``.

    ``windows``: marker step -> ``(start_ns, end_ns, predict_span_id, thread)`` (``perf_counter_ns`` around the
    marked call, and the native id of the thread that made it: layer spans and the ``python`` line's ops are
    filed under it); ``graph``: the model's layers and traced graphs (:class:`ModelGraph`). Returns a summary
    (runs, spans, spans clipped to their call's window -- 0 unless an op sticks out of its marker --, the
    largest clock shift, and the layer calls that ran no op of their own, with the call they were fused into).
    """
    summary = {"runs": 0, "layer_spans": 0, "op_spans": 0, "ops_outside_layers": 0, "clipped_spans": 0,
               "max_shift_ns": 0, "fused_layers": {},
               "clock": "TensorFlow profiler: Unix ns (profile_start_time + offsets) -> perf_counter_ns, each "
                        "marked predict call then moved into its window"}
    marks = np.flatnonzero(events.step >= 0)
    marks = marks[np.isin(events.step[marks], np.fromiter(windows, np.int64, len(windows)))]
    if not len(marks):
        return summary
    is_op = np.fromiter((bool(t) for t in events.op_type), bool, len(events.op_type))
    op_rows = np.flatnonzero(is_op)
    op_rows = op_rows[np.argsort(events.start_ns[op_rows], kind="stable")]
    op_start = events.start_ns[op_rows]
    scope_cache: dict[str, tuple[str, str] | None] = {}
    layers = set(graph.layer_types)
    graph_order = {scope: i for i, scope in enumerate(graph.calls)}
    python_line = events.line_names.index("python") if "python" in events.line_names else -1
    shifts = []
    add = tracer.add_span
    for m in marks[np.argsort(events.start_ns[marks], kind="stable")]:
        lo, hi, predict_id, caller_thread = windows[int(events.step[m])]
        m0, m1 = int(events.start_ns[m]) - wall_offset_ns, int(events.end_ns[m]) - wall_offset_ns
        shift = int(run_shifts([m0], [m1], [lo], [hi])[0]) - wall_offset_ns
        shifts.append(shift + wall_offset_ns)
        a, b = np.searchsorted(op_start, [events.start_ns[m], events.end_ns[m]], side="left")
        rows = [r for r in op_rows[a:b] if events.end_ns[r] <= events.end_ns[m]]
        summary["runs"] += 1
        op_layer = []
        for r in rows:
            name = events.name[r]
            found = scope_cache.get(name, False)
            if found is False:
                found = scope_cache[name] = scope_layer(name, layers, graph.model_name)
            weights = name in graph.weights_only if graph.weights_only else events.op_type[r] == "ReadVariableOp"
            op_layer.append((found, weights))
        calls = _layer_calls(events, rows, op_layer)
        fused = fused_calls(graph, calls)
        summary["fused_layers"].update(fused)
        entries = [((s, 1, graph_order.get(scope, len(graph_order)), scope), scope, layer, s, e, n, None)
                   for scope, (layer, s, e, n) in calls.items()]
        last_end = max((c[2] for c in calls.values()), default=int(events.start_ns[m]))
        for scope, into in fused.items():
            at = calls[into][1] if into is not None else last_end
            layer = scope_layer(f"{scope}/op", layers, graph.model_name)[0]
            entries.append(((at, 0, graph_order[scope], scope), scope, layer, at, at, 0, into))
        call_ids: dict[str, int] = {}
        for index, (_, scope, layer, s, e, n, into) in enumerate(sorted(entries, key=lambda entry: entry[0])):
            start, end = _clip(s + shift, e + shift, lo, hi, summary)
            extra = {}
            if scope in fused:
                extra["fused"] = True
                if into is not None:
                    extra["fused_into"] = keras_layer_to_torch_name(calls[into][0])
            call_ids[scope] = add(keras_layer_to_torch_name(layer), _FRAMEWORK, "layer", start, end, predict_id,
                                  thread=caller_thread, layer_index=index, layer_type=graph.layer_types.get(layer, ""),
                                  keras_layer=layer, keras_call=scope, ops=n, **extra)
        summary["layer_spans"] += len(entries)
        if not tracer.enabled(_ML_LIBRARY):
            continue
        for r, (found, weights) in zip(rows, op_layer):
            start, end = _clip(int(events.start_ns[r]) + shift, int(events.end_ns[r]) + shift, lo, hi, summary)
            parent = predict_id if found is None or weights else call_ids.get(found[1], predict_id)
            if parent == predict_id:
                summary["ops_outside_layers"] += 1
            li = int(events.line[r])
            kernel = events.op_type[r]
            op = standard_op_type(kernel)
            fields = {"keras_layer": found[0]} if found is not None else {}
            if weights:
                fields["weights_only"] = True
            if op != kernel:
                fields["tf_op_type"] = kernel
            add(op, _ML_LIBRARY, "op", start, end, parent,
                thread=caller_thread if li == python_line else events.line_ids[li],
                layer_type=op, tf_op=events.name[r], **fields)
        summary["op_spans"] += len(rows)
    summary["max_shift_ns"] = int(np.abs(shifts).max()) if shifts else 0
    if summary["fused_layers"]:
        summary["note"] = ("layer calls listed in fused_layers ran no TensorFlow op of their own: the graph optimizer "
                           "fused their ops into an op of the call named beside them (None: no later call ran); each "
                           "has a zero-length layer span at that call's start, with attrs fused_into")
    return summary


def fused_calls(graph: ModelGraph, ran: Collection[str]) -> dict[str, str | None]:
    """Call scope -> the call it was fused into, for each call of ``graph.calls`` that is not in ``ran`` (the
    scopes that ran ops): the first call downstream of it (through ``graph.consumers``, breadth first) that ran."""
    out: dict[str, str | None] = {}
    for scope in graph.calls:
        if scope in ran:
            continue
        into, seen, frontier = None, {scope}, list(graph.consumers.get(scope, ()))
        while frontier and into is None:
            nxt = []
            for c in frontier:
                if c in seen:
                    continue
                seen.add(c)
                if c in ran:
                    into = c
                    break
                nxt.extend(graph.consumers.get(c, ()))
            frontier = nxt
        out[scope] = into
    return out


def _layer_calls(events: HostEvents, rows: list[int], op_layer: list) -> dict[str, list]:
    """Call scope -> ``[layer, start_ns, end_ns, ops]``: the envelope of each layer call's data-path ops."""
    calls: dict[str, list] = {}
    for r, (found, weights) in zip(rows, op_layer):
        if found is None or weights:
            continue
        c = calls.get(found[1])
        if c is None:
            c = calls[found[1]] = [found[0], int(events.start_ns[r]), int(events.end_ns[r]), 0]
        c[1] = min(c[1], int(events.start_ns[r]))
        c[2] = max(c[2], int(events.end_ns[r]))
        c[3] += 1
    return calls


def _clip(start: int, end: int, lo: int, hi: int, summary: dict) -> tuple[int, int]:
    """``[start, end]`` inside ``[lo, hi]`` (counted in ``summary["clipped_spans"]`` when it was not)."""
    if lo <= start and end <= hi:
        return start, end
    summary["clipped_spans"] += 1
    start = min(max(start, lo), hi)
    return start, min(max(end, start), hi)
