"""PyTorch layer spans (FRAMEWORK): timed calls of the layer modules. Op spans (ML_LIBRARY) are :mod:`.ops`'s.

Every call of a *layer module* (:mod:`mlms_nb.frameworks.torch.layers`: a module with no children, or
one holding parameters of its own, such as a Conv2d that owns a padding child; not a pass-through such as
``nn.Identity``), timed around its ``forward`` (:class:`LayerHooks` says where: torch's seam for a compiled call, or
a wrapped ``forward``), records one ``kind="layer"`` span per call on the tracer's clock: ``name`` is the module's
qualified name (the key ONNX Runtime and TensorFlow layers are mapped back to), ``layer_type`` its class,
``layer_index`` the call's position in this forward pass (a module called twice gets two indices), ``shape`` the
input tensor shapes. ``bytes`` = input + parameter/buffer + output tensor bytes (what the layer must at least read
and write); ``memory`` = bytes of the output tensors the layer allocated (0 for an in-place layer whose output
aliases its input; on CUDA, the change of ``torch.cuda.memory_allocated``). ``attrs``: ``param_bytes``,
``output_bytes``, ``out_shape``. On CUDA each call is bracketed by ``torch.cuda.synchronize()``, so a layer's span
covers its device work, not just its asynchronous launch. Containers get no span of their own: their work outside
children (a residual add) shows as ops. The calls are kept as tuples of plain values while tracing (nothing the
garbage collector has to walk) and become spans when tracing stops (see :class:`LayerHooks`).
"""
from __future__ import annotations

import inspect
import time
import weakref
from operator import itemgetter

import numpy as np
import torch

from mlms_nb._gc import collector_off
from mlms_nb.frameworks.torch import native
from mlms_nb.frameworks.torch.layers import layer_modules
from mlms_nb.tracing.attribution import containment_parents, innermost_enclosing
from mlms_nb.tracing.records import SpanBlock, shared_part_numbers
from mlms_nb.schema.levels import TraceLevel

FRAMEWORK = int(TraceLevel.FRAMEWORK)
MODEL = int(TraceLevel.MODEL)
_Tensor = torch.Tensor
_perf_ns = time.perf_counter_ns


_MODULE_HOOKS = ("_backward_pre_hooks", "_backward_hooks", "_forward_pre_hooks", "_forward_hooks")
_GLOBAL_HOOKS = tuple(getattr(torch.nn.modules.module, "_global" + k) for k in _MODULE_HOOKS)
"""The hook tables ``Module._call_impl`` looks at (a module's own, torch's global ones) before it takes its fast
path: a direct call (:class:`LayerHooks`) hands a call back to ``_call_impl`` while any of them holds a hook. Torch
fills and empties these dicts in place; a direct call reads the ones the module has when tracing starts."""


_DIRECT_CALLS: "weakref.WeakSet" = weakref.WeakSet()
"""The direct calls LayerHooks has set, so that a second session tracing the same module recognises one."""
_SEAM = hasattr(torch.nn.Module, "_compiled_call_impl")
"""Whether this torch's ``Module.__call__`` hands a call to ``_compiled_call_impl`` when it is set (since 2.2);
without it a layer's call is traced by its wrapped ``forward`` alone."""


def _tensor_bytes(t: _Tensor) -> int:
    return t.numel() * t.element_size()


class LayerHooks:
    """Record one FRAMEWORK ``layer`` span per layer-module call into ``tracer``.

    **Where.** A layer module's call is taken over at ``Module._compiled_call_impl``, the seam torch gives a
    compiled module: ``Module.__call__`` hands the call to it instead of ``Module._call_impl``, so the traced call
    runs no Python frame more than the untraced one (a wrapper around ``forward`` under ``_call_impl`` ran one
    more). A direct call that only passes the call on costs nothing measurable (Lite0 at batch 1, paired calls, 12
    rounds: -0.1%); what tracing costs is the clock reads and the record. The direct call checks the hook tables
    ``_call_impl`` checks (the module's own and torch's global ones) and torch.jit tracing; while any is in use it
    hands the call to ``_call_impl``, which runs the hooks around ``forward``, itself wrapped (:meth:`_wrap`) -- so
    a hook registered while tracing (a layer capture) runs, and stays out of the layer's span, as before. A module
    already compiled keeps its own call and gets only the wrapped ``forward``. torch's global module hooks are not
    used: they would put every module, containers too, on ``_call_impl``'s slow path (about 2 µs a module more,
    measured in benchmarks/recording_costs.py).

    **Compiled.** Where :mod:`.native` can give one, a layer of one tensor argument gets the compiled call of
    ``_recorder.cpp`` instead of :meth:`_direct`'s Python one: the same checks and the same record, the sizes and
    item sizes read from the ATen tensor instead of through ``tensor.shape`` (a new ``torch.Size`` per read, about
    0.6% of a Lite0 forward per read in place). Lite0 at batch 1, paired calls, 9 rounds: the Python call +3.5%, the
    compiled one +0.6% (what passing the call on alone costs: +0.3%); on a module that runs nothing it is cheaper
    than the untraced call, whose ``Module._call_impl`` is Python (benchmarks/recording_costs.py: -270 ns a
    call). A call it cannot read (not a plain dense tensor of at most 8 dimensions in and out) it hands to the
    Python record; a call by keyword goes to ``_call_impl`` and the wrapped forward.
    ``tracer.metadata["torch.layer_calls"]`` says which one timed the calls.

    **What.** The call reads the clock around ``forward`` and appends ``(part, start_ns, end_ns)``
    (:data:`PART_FIELDS`). The part holds plain values: shapes as tuples of ints and item sizes, never
    ``torch.Size`` or ``torch.dtype`` objects, so that the garbage collector untracks it at its first pass (a tuple
    holding a ``torch.Size`` stays tracked, and every full collection of a long traced run walks all of them: that
    cost more than the wrapper itself). A layer hands on its previous call's part while the shapes, item sizes and
    aliasing it reads stay equal (one comparison instead of two new shape tuples to keep), so the session's end
    numbers the parts by identity and hashes only the few distinct ones (Lite0, 43 calls at batch 1: 160 parts
    for 6.5k calls; the session's end 5.5 ms -> about 3.5 ms). Appending the values to one flat ``array('q')`` instead
    (nothing for the collector at all) cost more per call than the young-generation collections it saved (+2.9%
    against +2.2% per call, Lite0 at batch 1, paired calls). Nothing else happens per call: parents, layer
    indices, names, bytes and memory are worked out when :meth:`remove` flushes the calls into the tracer (once
    per distinct part)."""

    def __init__(self, model: torch.nn.Module, tracer, cuda: bool = False, compiled: bool = True) -> None:
        self.tracer = tracer
        # the compiled call (native.py) where it can be had; on CUDA each call synchronizes, which costs far more
        self._compiled = native.recorder() if compiled and not cuda else None
        tracer.metadata["torch.layer_calls"] = ("compiled" if self._compiled is not None else
                                                "python (CUDA: each call synchronizes)" if cuda else
                                                "python (asked for)" if not compiled else native.status())
        self._first_record = len(tracer)
        self._calls: list[tuple] = []  # (part, start_ns, end_ns) per call, see PART_FIELDS
        self._layers: list[tuple[str, str, int]] = []  # per layer number: name, type, parameter+buffer bytes
        self._patched: list[tuple] = []  # (module, its own forward or None, the wrapped one, direct call or None)
        for number, (name, module) in enumerate(layer_modules(model)):
            state = sum(_tensor_bytes(p) for p in module.parameters(recurse=False))
            state += sum(_tensor_bytes(b) for b in module.buffers(recurse=False))
            self._layers.append((name, type(module).__name__, state))
            own = module.__dict__.get("forward")
            forward = module.forward
            traced = module.forward = self._wrap(number, forward, cuda)
            direct = None
            if _SEAM and module.__dict__.get("_compiled_call_impl") in _DIRECT_CALLS:
                # another session traces this module too: its direct call would skip this session's wrapped
                # forward, so both go through _call_impl and the chain of wrapped forwards (each records)
                del module.__dict__["_compiled_call_impl"]
            elif _SEAM and module._compiled_call_impl is None:
                direct = module._compiled_call_impl = self._direct(number, module, forward, traced, cuda)
                _DIRECT_CALLS.add(direct)
            self._patched.append((module, own, traced, direct))

    def _direct(self, number: int, module: torch.nn.Module, forward, traced, cuda: bool):
        """Layer ``number``'s call, in place of ``module._call_impl`` (see the class docstring): ``forward``
        (the module's own) timed as ``traced`` (its wrapped forward) times it, or ``_call_impl`` while a hook is
        registered, torch.jit is tracing or ``module.forward`` is no longer ``traced`` (something set its own
        meanwhile: torch calls that one). A forward of one tensor (most layers: Conv2d, BatchNorm2d,
        activations...) is timed here, with no argument tuple or keyword dict to build and unpack."""
        call_impl = module._call_impl
        set_forward = module.__dict__.get
        bp, b, fp, f = (module.__dict__[k] for k in _MODULE_HOOKS)
        gbp, gb, gfp, gf = _GLOBAL_HOOKS
        tracing_state = torch._C._get_tracing_state
        one = None if cuda else _one_parameter(forward)
        if one is not None and self._compiled is not None:
            calls = self._calls

            def other(number, input, output, t0, t1):  # a call the compiled one cannot read the tensors of
                calls.append((_general_part(number, (input,), output), t0, t1))

            return self._compiled.LayerCall(forward, number, calls, module.__dict__, traced, call_impl,
                                            tracing_state, other, (bp, b, fp, f, gbp, gb, gfp, gf))
        if one is None:
            def direct_call(*args, **kwargs):
                if bp or b or fp or f or gbp or gb or gfp or gf or set_forward("forward") is not traced \
                        or tracing_state():
                    return call_impl(*args, **kwargs)
                return traced(*args, **kwargs)

            return direct_call
        record = self._calls.append
        perf = _perf_ns
        Tensor = _Tensor
        part = None  # the last call's part (PART_FIELDS)

        def direct_input(input):
            nonlocal part
            if bp or b or fp or f or gbp or gb or gfp or gf or set_forward("forward") is not traced \
                    or tracing_state():
                return call_impl(input)
            t0 = perf()
            output = forward(input)
            t1 = perf()
            if output.__class__ is Tensor and input.__class__ is Tensor:
                now = (number, input.shape, input.itemsize, output.shape, output.itemsize, output is input)
                p = part  # read once: another thread calling this layer may set its own meanwhile
                if now != p:
                    p = part = (number, tuple(now[1]), now[2], tuple(now[3]), now[4], now[5])
                record((p, t0, t1))
            else:
                record((_general_part(number, (input,), output), t0, t1))
            return output

        return direct_input if one == "input" else _with_parameter_name(direct_input, one)

    def _wrap(self, number: int, forward, cuda: bool):
        """Layer ``number``'s ``forward`` wrapped: two clock reads and one tuple of plain values per call (on CUDA,
        between two synchronizes). It runs under ``Module._call_impl`` (hooks registered, a compiled module)
        and inside a direct call of a layer whose forward takes more than one tensor."""
        record = self._calls.append
        perf = _perf_ns
        Tensor = _Tensor

        if cuda:
            allocated = torch.cuda.memory_allocated
            sync = torch.cuda.synchronize

            def traced_forward_cuda(*args, **kwargs):
                # CUDA launches return before the device has run them: without a synchronize at both edges a
                # layer's span would be its launch time on the host (a roofline far above its roof, on an H200);
                # with them it is the layer's device time plus its launch, and the trace's overhead row shows
                # what the serialisation costs
                sync()
                mem0 = allocated()
                t0 = perf()
                output = forward(*args, **kwargs)
                sync()
                t1 = perf()
                given = (*args, *kwargs.values()) if kwargs else args
                record(((*_general_part(number, given, output), allocated() - mem0), t0, t1))
                return output

            return traced_forward_cuda

        part = None  # as in _direct's call

        def traced_forward(*args, **kwargs):
            nonlocal part
            t0 = perf()
            output = forward(*args, **kwargs)
            t1 = perf()
            if output.__class__ is Tensor and len(args) == 1 and args[0].__class__ is Tensor:
                a = args[0]
                now = (number, a.shape, a.itemsize, output.shape, output.itemsize, output is a)
                p = part
                if now != p:
                    p = part = (number, tuple(now[1]), now[2], tuple(now[3]), now[4], now[5])
                record((p, t0, t1))
            else:  # tensors given by keyword are inputs too (a layer called as layer(input=x))
                record((_general_part(number, (*args, *kwargs.values()) if kwargs else args, output), t0, t1))
            return output

        return traced_forward

    def remove(self) -> None:
        """Put every module's own ``forward`` and call back and add the recorded calls to the tracer. A forward or
        call something else set meanwhile is left as it is."""
        for module, own, traced, direct in self._patched:
            if direct is not None and module.__dict__.get("_compiled_call_impl") is direct:
                del module.__dict__["_compiled_call_impl"]
            if module.__dict__.get("forward") is traced:
                if own is None:
                    del module.__dict__["forward"]
                else:
                    module.forward = own
        self._patched = []
        calls, self._calls = self._calls, []
        if calls:
            with collector_off():  # one new tuple per call
                self._flush(calls)

    def _flush(self, calls: list[tuple]) -> None:
        """Calls -> one block of layer spans (:class:`~mlms_nb.tracing.records.SpanBlock`): parent = the innermost
        enclosing layer call, else the ``predict`` span the call ran in; ``layer_index`` = rank of the call's start
        within its predict call. Everything is worked out as columns; the one loop left finds each call's *part*
        (its layer and shapes), whose name and fields are worked out once."""
        n = len(calls)
        starts = np.fromiter(map(_START, calls), np.int64, n)
        ends = np.fromiter(map(_END, calls), np.int64, n)
        outer = containment_parents(np.zeros(n, np.int64), starts, ends)
        models = self.tracer.intervals(MODEL, name="predict", since=self._first_record)
        model_of = enclosing(models[:, :3], starts, ends)
        order = np.lexsort((-ends, starts))
        index = np.empty(n, np.int64)
        group = model_of[order]
        first = np.r_[True, group[1:] != group[:-1]] if n else np.zeros(0, bool)
        run_start = np.maximum.accumulate(np.where(first, np.arange(n), 0))
        index[order] = np.arange(n) - run_start
        span_id = np.empty(n, np.int64)
        span_id[order] = self.tracer.new_span_ids(n)  # in start order, as one add_span per call gave them
        in_model = model_of >= 0
        if len(models):
            row = models[np.maximum(model_of, 0)]
            model_parent = np.where(in_model, row[:, 2], 0)
            thread = np.where(in_model, row[:, 3], self.tracer.thread_id())
        else:
            model_parent, thread = np.zeros(n, np.int64), np.full(n, self.tracer.thread_id(), np.int64)
        parent = np.where(outer >= 0, span_id[np.maximum(outer, 0)], model_parent)
        part, distinct = shared_part_numbers(list(map(_PART, calls)))
        parts = tuple(self._fields(key) for key in distinct)
        self.tracer.add_block(SpanBlock(FRAMEWORK, "layer", span_id[order], parent[order], starts[order],
                                        ends[order], thread[order], part[order], parts,
                                        {"layer_index": index[order]}))

    def _fields(self, part: tuple) -> tuple[str, dict]:
        """A recorded call's layer name and the keyword fields of its span (all but ``layer_index``), from its
        part (the call without its times)."""
        name, layer_type, state = self._layers[part[0]]
        if len(part) == len(PART_FIELDS):
            inputs, outputs, delta = ((part[1], part[2]),), ((part[3], part[4], part[5]),), None
        else:
            inputs, outputs, delta = part[1], part[2], (part[3] if len(part) > 3 else None)
        in_bytes = sum(_size(shape, itemsize) for shape, itemsize in inputs)
        out_bytes = sum(_size(shape, itemsize) for shape, itemsize, _ in outputs)
        memory = delta if delta is not None else sum(_size(shape, itemsize) for shape, itemsize, alias in outputs
                                                      if not alias)
        return name, dict(layer_type=layer_type, shape=tuple(shape for shape, _ in inputs),
                          bytes=float(in_bytes + state + out_bytes), memory=float(memory), param_bytes=state,
                          output_bytes=out_bytes, out_shape=tuple(shape for shape, _, _ in outputs))


PART_FIELDS = ("layer number", "input shape", "input itemsize", "output shape", "output itemsize",
               "output is the input")
"""A call's *part*, the key its span's name and fields are worked out once for, for a layer with one tensor in and
one out (every value a plain int, bool or a tuple of ints). Each call records ``(part, start_ns, end_ns)``; a
layer's call hands on the part tuple of its previous call while the shapes, item sizes and aliasing stay the same
(compared, not rebuilt: no new tuple to keep, and the session's end numbers the parts by identity, see
:func:`~mlms_nb.tracing.records.shared_part_numbers`). Other calls' part is ``(layer number, inputs, outputs[,
memory delta])``, new each call: ``inputs`` a tuple of ``(shape, itemsize)``, ``outputs`` of ``(shape, itemsize,
aliases an input)``, and on CUDA the change of ``torch.cuda.memory_allocated`` over the call."""
_PART, _START, _END = itemgetter(0), itemgetter(1), itemgetter(2)


def _one_parameter(forward) -> str | None:
    """The name of ``forward``'s one parameter (a bound method's, such as ``input`` of torch's own layers), when it
    takes exactly one argument, positional or by that keyword, with no default; else None."""
    try:
        params = list(inspect.signature(forward).parameters.values())
    except (TypeError, ValueError):
        return None
    if len(params) == 1 and params[0].default is inspect.Parameter.empty and \
            params[0].kind is inspect.Parameter.POSITIONAL_OR_KEYWORD:
        return params[0].name
    return None


def _with_parameter_name(function, name: str):
    """``function`` (of one parameter) with that parameter renamed ``name``, so a call by keyword that the wrapped
    forward accepts (``layer(x=t)``) is accepted by its wrapper too."""
    code = function.__code__
    code = code.replace(co_varnames=(name, *code.co_varnames[1:]))
    return type(function)(code, function.__globals__, function.__name__, function.__defaults__,
                          function.__closure__)


def _general_part(number: int, args: tuple, output) -> tuple:
    """The part of a call that is not one tensor in and one out: ``(layer number, inputs, outputs)``
    (:data:`PART_FIELDS`)."""
    return number, _in_info(args), _out_info(output, args)


def _in_info(args: tuple) -> tuple:
    """(shape, itemsize) of each tensor argument, as plain values."""
    return tuple((tuple(a.shape), a.itemsize) for a in args if isinstance(a, _Tensor))


def _out_info(output, args: tuple) -> tuple:
    """(shape, itemsize, aliases an input) of each tensor in ``output``, as plain values."""
    if output.__class__ is _Tensor:
        return ((tuple(output.shape), output.itemsize, any(output is a for a in args)),)
    return tuple((tuple(o.shape), o.itemsize, any(o is a for a in args)) for o in _flatten(output)
                 if isinstance(o, _Tensor))


def _size(shape: tuple, itemsize: int) -> int:
    """Bytes of a tensor of ``shape`` with ``itemsize``-byte elements."""
    n = itemsize
    for d in shape:
        n *= d
    return n


def _flatten(value):
    if isinstance(value, (list, tuple)):
        for v in value:
            yield from _flatten(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _flatten(v)
    else:
        yield value


def enclosing(spans: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Index into ``spans`` (rows ``start, end, id``, properly nested, one thread, in any order) of the innermost span
    containing each interval ``[start, end]``, or -1 (:func:`~mlms_nb.tracing.attribution.innermost_enclosing`)."""
    return innermost_enclosing(np.zeros(len(spans), np.int64), spans[:, 0], spans[:, 1],
                               np.zeros(len(start), np.int64), start, end)
