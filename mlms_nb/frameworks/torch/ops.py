"""PyTorch op spans (ML_LIBRARY): torch.profiler's CPU ops, nested in the layer spans of :mod:`.tracing`.

``torch.profiler`` (CPU activity, ``record_shapes``; not the values of scalar arguments, see
:func:`record_concrete_inputs`) runs while tracing; on stop its Kineto events become ``kind="op"`` spans. Kineto
stamps events on the Unix clock: they are moved onto the tracer's ``perf_counter_ns`` clock with an anchor pair read
at stop, then by the one constant shift (found from the layer spans, usually a few µs) that puts every top-level op
inside the layer it ran in. An op's parent is the op that encloses it, else its layer, else the ``predict`` span it
ran in. CUDA kernels are not taken from torch.profiler (CUPTI has one subscriber; the runner's CUPTI recorder owns
it at SYSTEM_LIBRARY).
"""
from __future__ import annotations

import time
from operator import itemgetter

import numpy as np
import torch

from mlms_nb._gc import collector_off
from mlms_nb._quiet import quiet
from mlms_nb.frameworks.torch.tracing import enclosing
from mlms_nb.schema.levels import TraceLevel
from mlms_nb.tracing.attribution import containment_parents
from mlms_nb.tracing.records import SpanBlock, part_numbers

FRAMEWORK = int(TraceLevel.FRAMEWORK)
ML_LIBRARY = int(TraceLevel.ML_LIBRARY)
MODEL = int(TraceLevel.MODEL)
_OP_PART = itemgetter(3, 4)


class OpProfiler:
    """torch.profiler over the traced calls; :meth:`stop` adds its ops to the tracer as ML_LIBRARY spans."""

    def __init__(self, tracer) -> None:
        self.tracer = tracer
        self._first_record = len(tracer)
        # the Kineto profiler torch.profiler.profile drives, driven directly: torch.profiler's start asks
        # hasattr(torch, "_inductor"), which imports the compiler stack (about 1 s of CPU in each process that
        # traces) to learn whether CUDA graphs are on, and then only for CUDA activity this profiler never asks for
        self._profile = torch.autograd.profiler.profile(use_kineto=True, use_cpu=True, record_shapes=True)
        record_concrete_inputs(False)
        try:
            with quiet(label="torch.profiler start"):  # Kineto's "USDT: ... profiler_start" lines
                self._profile.__enter__()
        except BaseException:
            record_concrete_inputs(True)
            raise

    def stop(self) -> dict:
        """Stop profiling and add the ops; returns what the clock mapping found (for the trace metadata)."""
        try:
            with quiet(label="torch.profiler stop"):
                self._profile.__exit__(None, None, None)
        finally:
            record_concrete_inputs(True)
        perf, wall = time.perf_counter_ns(), time.time_ns()
        with collector_off():  # one new tuple per op
            ops = cpu_ops(self._profile.kineto_results.events())
            return add_ops(self.tracer, ops, wall - perf, self._first_record)


def record_concrete_inputs(on: bool) -> None:
    """Whether Kineto keeps the values of an op's scalar and list arguments (a convolution's stride, padding...) beside
    its input shapes: on by default, read at every op. The op spans use the shapes only; not keeping the values
    makes each profiled op cheaper (Lite0 at batch 1: the profiler's overhead +11.1% -> +8.2%, 30 interleaved
    blocks). The setting is process-wide and torch offers no way to read it: it is put back to torch's default
    (on) when profiling stops, and a torch.profiler the user runs inside a traced call meanwhile records no values."""
    setter = getattr(torch._C._profiler, "_set_record_concrete_inputs_enabled_val", None)
    if setter is not None:
        setter(on)


def cpu_ops(events) -> list[tuple]:
    """Kineto events -> ``(start Unix ns, duration ns, thread id, name, shapes of the tensor inputs)`` of the
    framework ops on the host, read in one pass (each accessor is a call into the bindings: each is called once
    per event), shapes as tuples of ints."""
    cpu = torch.autograd.DeviceType.CPU
    out = []
    append = out.append
    for e in events:
        kind = getattr(e, "activity_type", None)
        if kind is not None:
            if kind() != "cpu_op" or e.device_type() != cpu:
                continue
        elif not _is_cpu_op(e):
            continue
        append((e.start_ns(), e.duration_ns(), e.start_thread_id(), e.name(),
                tuple(tuple(shape) for shape in e.shapes() if shape)))
    return out


def _is_cpu_op(event) -> bool:
    """A framework op on the host (not a user annotation, a Python frame or device activity); torch < 2.13 has
    no ``activity_type()``."""
    if event.device_type() != torch.autograd.DeviceType.CPU:
        return False
    kind = getattr(event, "activity_type", None)
    if kind is not None:
        return kind() == "cpu_op"
    return not any(getattr(event, test, lambda: False)() for test in ("is_user_annotation", "is_python_function"))


def add_ops(tracer, ops: list[tuple], wall_offset_ns: int, first_record: int = 0) -> dict:
    """Add CPU ops (:func:`cpu_ops` rows) to ``tracer`` (see the module docstring for the clock and the parents).

    ``wall_offset_ns``: Unix ns - perf_counter ns, read at one instant; ``first_record``: where in the tracer's
    records the layer / predict spans of this profiling session begin.
    """
    if not ops:
        return {"ops": 0}
    start = np.fromiter((o[0] for o in ops), np.int64, len(ops)) - wall_offset_ns
    end = start + np.fromiter((o[1] for o in ops), np.int64, len(ops))
    tids = np.fromiter((o[2] for o in ops), np.int64, len(ops))
    layers = tracer.intervals(FRAMEWORK, "layer", since=first_record)[:, :3]
    models = tracer.intervals(MODEL, name="predict", since=first_record)[:, :3]

    op_parent = containment_parents(tids, start, end)
    shift, residual = _clock_shift(start, end, op_parent, layers)
    start += shift
    end += shift
    layer_of = enclosing(layers, start, end)
    model_of = enclosing(models, start, end)
    main_tid = np.bincount(tids).argmax() if len(tids) else 0
    native = tracer.thread_id()

    order = np.lexsort((-end, start))
    # parent when no op encloses the op: its layer, else its predict call, else none
    outer = np.where(layer_of >= 0, layers[np.maximum(layer_of, 0), 2] if len(layers) else 0,
                     np.where(model_of >= 0, models[np.maximum(model_of, 0), 2] if len(models) else 0, 0))
    threads = np.where(tids == main_tid, native, tids)
    span_id = np.empty(len(ops), np.int64)
    span_id[order] = tracer.new_span_ids(len(ops))  # in start order, as one add_span per op gave them
    parent = np.where(op_parent >= 0, span_id[np.maximum(op_parent, 0)], outer)
    part, distinct = part_numbers(map(_OP_PART, ops), len(ops))  # part: (name, input shapes)
    parts = tuple((name, {"shape": shapes, "layer_type": name}) for name, shapes in distinct)
    tracer.add_block(SpanBlock(ML_LIBRARY, "op", span_id[order], parent[order], start[order], end[order],
                               threads[order], part[order], parts))
    return {"ops": len(ops), "clock_shift_ns": int(shift), "unnested_ns": int(residual),
            "clock": "Kineto Unix ns -> perf_counter_ns by an anchor pair read at stop, plus clock_shift_ns"}


def _clock_shift(start, end, op_parent, layers) -> tuple[int, int]:
    """The constant shift (ns) that puts top-level ops inside their layers, and what still sticks out (ns).

    Each top-level op assigned to a layer by its midpoint bounds the shift: ``layer.start - op.start <= d <=
    layer.end - op.end``; the shift closest to 0 within all bounds is taken (or the bounds' midpoint when they
    cannot all hold)."""
    top = np.flatnonzero(op_parent < 0)
    if not len(layers) or not len(top):
        return 0, 0
    mid = (start[top] + end[top]) // 2
    i = enclosing(layers, mid, mid)
    inside = i >= 0
    top, i = top[inside], i[inside]
    if not len(top):
        return 0, 0
    lo = int((layers[i, 0] - start[top]).max())
    hi = int((layers[i, 1] - end[top]).min())
    if lo <= hi:
        return min(max(0, lo), hi), 0
    return (lo + hi) // 2, (lo - hi + 1) // 2
