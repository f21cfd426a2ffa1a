"""The tracer: spans and counters recorded on one monotonic clock, for well under a microsecond a span.

Recording appends one plain tuple per span to a list; the pandas frames are built only at the end
(:meth:`Tracer.trace`). Times come from :func:`time.perf_counter_ns`; an anchor pair
``(perf_counter_ns, time_ns)`` taken at construction places the trace on wall-clock time
(``metadata["clock"]["wall_offset_ns"]``).

Nesting: every thread keeps its own stack of open spans, so a span's parent is the innermost span open on
the same thread when it started. A span whose level is above the tracer's level costs one comparison and
records nothing.

A module-level *current tracer* (a :mod:`contextvars` variable) lets code deep in a predictor emit into
whatever tracer the caller made active::

    tracer = Tracer(TraceLevel.FRAMEWORK)
    with use_tracer(tracer):
        with current_tracer().span("predict", TraceLevel.MODEL, "model", batch=8):
            ...
    trace = tracer.trace()
"""
from __future__ import annotations

import contextvars
import itertools
import os
import threading
import time
import uuid
from contextlib import contextmanager
from typing import Any, Iterable, Iterator

from .levels import TraceLevel

_perf_ns = time.perf_counter_ns
_native_id = threading.get_native_id


class _Local(threading.local):
    """Per-thread state of one tracer: the stack of open span ids and the thread's native id."""

    def __init__(self) -> None:
        self.stack: list[int] = []
        self.tid: int = _native_id()


class _NoSpan:
    """The shared context a disabled span returns: does nothing."""

    __slots__ = ()
    span_id = 0

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def set(self, **fields) -> None:
        pass


NO_SPAN = _NoSpan()


class _Span:
    """Context of one enabled span (transient: the record is a tuple appended at exit)."""

    __slots__ = ("_t", "_name", "_level", "_kind", "_fields", "_loc", "span_id", "_parent", "_start")

    def __init__(self, tracer: "Tracer", name: str, level: int, kind: str | None, fields: dict | None):
        self._t = tracer
        self._name = name
        self._level = level
        self._kind = kind
        self._fields = fields

    def __enter__(self):
        t = self._t
        loc = t._local
        stack = loc.stack
        self._loc = loc
        self._parent = stack[-1] if stack else 0
        self.span_id = sid = t._next_id()
        stack.append(sid)
        self._start = _perf_ns()
        return self

    def __exit__(self, exc_type, exc, tb):
        end = _perf_ns()
        loc = self._loc
        stack = loc.stack
        sid = self.span_id
        if stack and stack[-1] == sid:
            stack.pop()
        elif sid in stack:
            stack.remove(sid)
        fields = self._fields
        if exc_type is not None:
            fields = dict(fields or ())
            fields["error"] = exc_type.__name__
        self._t._spans.append((sid, self._parent, self._name, self._level, self._kind, self._start, end,
                               loc.tid, fields))
        return False

    def set(self, **fields) -> None:
        """Add fields (columns such as ``shape``/``flops`` or free attributes) to this span before it ends."""
        if self._fields is None:
            self._fields = fields
        else:
            self._fields = {**self._fields, **fields}


class Tracer:
    """Records spans (and counters) at or below ``level``.

    ``level``: the deepest :class:`TraceLevel` recorded (``TraceLevel.FRAMEWORK`` records APPLICATION, MODEL
    and FRAMEWORK spans). ``trace_id``: a string; a random hex id when not given.

    Hot-path methods take ``level`` as a :class:`TraceLevel` (or its int value), not a string.
    Keyword fields of :meth:`span`, :meth:`start` and :meth:`add_span` named like a span column
    (:data:`~mlms_nb.tracing.schema.FIELD_COLUMNS`: ``device, stream, layer_index, layer_type, shape, flops,
    bytes, memory``) fill that column; any other keyword goes into ``attrs``.
    """

    def __init__(self, level: TraceLevel | int | str = TraceLevel.MODEL, trace_id: str | None = None):
        self.level = TraceLevel.parse(level)
        self._max = int(self.level)
        self.trace_id = str(trace_id) if trace_id is not None else uuid.uuid4().hex
        self._spans: list[tuple] = []
        self._counters: list[tuple] = []
        self._next_id = itertools.count(1).__next__
        self._local = _Local()
        perf = _perf_ns()
        wall = time.time_ns()
        self.anchor: tuple[int, int] = (perf, wall)
        self.metadata: dict[str, Any] = {
            "trace_id": self.trace_id,
            "source": "mlms_nb.tracer",
            "level": self.level.name,
            "clock": {"name": "time.perf_counter_ns", "anchor_perf_ns": perf, "anchor_wall_ns": wall,
                      "wall_offset_ns": wall - perf},
            "pid": os.getpid(),
        }

    # ------------------------------------------------------------------------------------------- recording

    def enabled(self, level: TraceLevel | int) -> bool:
        """Whether spans of ``level`` are recorded."""
        return 0 < level <= self._max

    def span(self, name: str, level: TraceLevel | int, kind: str | None = None, **fields):
        """``with tracer.span("predict", TraceLevel.MODEL, "model", batch=8) as sp:`` -- times the block.

        ``kind``: one of :data:`~mlms_nb.tracing.schema.KINDS` (default by level: MODEL -> "model",
        FRAMEWORK -> "layer", ML_LIBRARY -> "op"...). ``sp.set(**fields)`` adds fields before the block
        ends; ``sp.span_id`` is the new span's id. A disabled level returns a shared no-op context.
        """
        if level > self._max or level <= 0:
            return NO_SPAN
        return _Span(self, name, level, kind, fields or None)

    def start(self, name: str, level: TraceLevel | int, kind: str | None = None, **fields):
        """Open a span and return its token (``None`` when the level is disabled); close it with
        :meth:`end`. For hook-style code (a forward pre-hook starts, the forward hook ends)."""
        if level > self._max or level <= 0:
            return None
        loc = self._local
        stack = loc.stack
        parent = stack[-1] if stack else 0
        sid = self._next_id()
        stack.append(sid)
        return (sid, parent, name, level, kind, fields or None, loc, _perf_ns())

    def end(self, token, **fields) -> int:
        """Close the span ``token`` came from (``None`` is ignored); ``fields`` are added to it.
        Returns the span id (0 for ``None``)."""
        end = _perf_ns()
        if token is None:
            return 0
        sid, parent, name, level, kind, f, loc, start = token
        stack = loc.stack
        if stack and stack[-1] == sid:
            stack.pop()
        elif sid in stack:
            stack.remove(sid)
        if fields:
            f = {**f, **fields} if f else fields
        self._spans.append((sid, parent, name, level, kind, start, end, loc.tid, f))
        return sid

    def add_span(self, name: str, level: TraceLevel | int, kind: str | None, start_ns: int, end_ns: int,
                 parent_id: int | None = None, *, thread: int | None = None, **fields) -> int:
        """Record a span whose times are already known (importers, profilers); returns its id (0 when the
        level is disabled). ``parent_id=None``: the innermost span open on this thread (or none)."""
        if level > self._max or level <= 0:
            return 0
        loc = self._local
        if parent_id is None:
            stack = loc.stack
            parent_id = stack[-1] if stack else 0
        sid = self._next_id()
        self._spans.append((sid, int(parent_id), name, level, kind, int(start_ns), int(end_ns),
                            loc.tid if thread is None else int(thread), fields or None))
        return sid

    def add_counter(self, ts_ns: int, source: str, metric: str, value: float, unit: str, device: str = "") -> None:
        """Record one counter sample (``ts_ns`` on the :func:`time.perf_counter_ns` clock). Counters are kept
        at every level but ``NONE``."""
        if self._max:
            self._counters.append((ts_ns, source, metric, value, unit, device))

    def add_counters(self, rows: Iterable[tuple]) -> None:
        """Record rows ``(ts_ns, source, metric, value, unit, device)`` (e.g. a profiler's ``counters()``)."""
        if self._max:
            self._counters.extend(rows)

    def current_span_id(self) -> int:
        """Id of the innermost span open on this thread (0 when none)."""
        stack = self._local.stack
        return stack[-1] if stack else 0

    def now(self) -> int:
        """The tracer's clock, ns."""
        return _perf_ns()

    def __len__(self) -> int:
        return len(self._spans)

    def clear(self) -> None:
        """Forget the spans and counters recorded so far (open spans stay open)."""
        self._spans = []
        self._counters = []

    def __repr__(self) -> str:
        return f"Tracer(level={self.level.name}, trace_id={self.trace_id!r}, spans={len(self._spans)})"

    # ------------------------------------------------------------------------------------------- building

    def trace(self):
        """The spans and counters recorded so far, as a :class:`~mlms_nb.tracing.Trace` (columnar build; spans
        still open are left out and counted in ``metadata["open_spans"]``)."""
        from .trace import Trace
        from ._build import spans_from_records
        from .schema import counters_frame

        spans = spans_from_records(list(self._spans), self.trace_id)
        counters = counters_frame(list(self._counters))
        meta = dict(self.metadata)
        meta["open_spans"] = len(self._local.stack)  # this thread's; other threads' are not visible
        return Trace(spans, counters, meta)


NULL_TRACER = Tracer(TraceLevel.NONE, trace_id="null")
"""The tracer :func:`current_tracer` gives when none is active: records nothing."""

_CURRENT: contextvars.ContextVar[Tracer] = contextvars.ContextVar("mlms_nb_current_tracer", default=NULL_TRACER)


def current_tracer() -> Tracer:
    """The tracer made active by :func:`use_tracer` in this context, or :data:`NULL_TRACER` (records nothing),
    so callers can always write ``current_tracer().span(...)``."""
    return _CURRENT.get()


@contextmanager
def use_tracer(tracer: Tracer) -> Iterator[Tracer]:
    """``with use_tracer(tracer):`` makes ``tracer`` the current one in this context and restores the previous
    one after. asyncio tasks inherit it; a new ``threading.Thread`` starts with an empty context (hand it
    the tracer, or run it under ``contextvars.copy_context().run``)."""
    token = _CURRENT.set(tracer)
    try:
        yield tracer
    finally:
        _CURRENT.reset(token)
