"""The tracer: spans and counters recorded on one monotonic clock, for well under a microsecond a span.

Recording appends one plain tuple per span to a list (its layout: :mod:`mlms_nb.tracing.records`); the pandas
frames are built only at the end (:meth:`Tracer.trace`). Times come from :func:`time.perf_counter_ns`; an anchor pair
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

import numpy as np

from mlms_nb.schema.levels import TraceLevel
from mlms_nb.tracing.records import END_NS, KIND, LEVEL, NAME, SPAN_ID, START_NS, THREAD, SpanBlock, SpanRecord

_perf_ns = time.perf_counter_ns
_native_id = threading.get_native_id
_OPEN_FIELDS = 5  # position of the fields dict in an open span's frame (see _ThreadCtx)


class _ThreadCtx:
    """One thread's recording state for one tracer, and the context manager ``tracer.span()`` returns.

    ``stack`` holds the open spans of this thread: a tuple ``(span_id, parent_id, name, level, kind, fields,
    start_ns)`` per ``with`` span, a list (the token) ``[..., start_ns, ctx]`` per :meth:`Tracer.start` span
    (``ctx`` becomes None once recorded). Closed spans go to ``spans`` as record tuples
    (:mod:`mlms_nb.tracing.records`).
    """

    __slots__ = ("stack", "tid", "spans", "next_id", "pending")

    def __init__(self, spans: list, next_id) -> None:
        self.stack: list = []
        self.tid: int = _native_id()
        self.spans = spans
        self.next_id = next_id
        self.pending = None

    def __enter__(self) -> int:
        name, level, kind, fields = self.pending
        stack = self.stack
        sid = self.next_id()
        stack.append((sid, stack[-1][0] if stack else 0, name, level, kind, fields, _perf_ns()))
        return sid

    def __exit__(self, exc_type, exc, tb):
        end = _perf_ns()
        frame = self.stack.pop()
        if frame.__class__ is not tuple:
            frame = self._unwind(frame, end)
        sid, parent, name, level, kind, f, start = frame
        if exc_type is not None:
            f = {**f, "error": exc_type.__name__}
        if f:
            self.spans.append((sid, parent, name, level, kind, start, end, self.tid, *f, *f.values()))
        else:
            self.spans.append((sid, parent, name, level, kind, start, end, self.tid))
        return False

    def _unwind(self, frame, end: int):
        """Hook spans (tokens) opened inside a ``with`` span and never ended: record them as unfinished
        (``attrs["error"] = "unfinished"``) and return the ``with`` span's own frame."""
        while frame.__class__ is not tuple:
            sid, parent, name, level, kind, f, start, _ = frame
            frame[7] = None
            f = {**f, "error": "unfinished"} if f else {"error": "unfinished"}
            self.spans.append((sid, parent, name, level, kind, start, end, self.tid, *f, *f.values()))
            frame = self.stack.pop()
        return frame


class _Local(threading.local):
    """Per-thread state of one tracer (``threading.local`` calls ``__init__`` again in every thread)."""

    def __init__(self, spans: list, next_id) -> None:
        self.ctx = _ThreadCtx(spans, next_id)


class _NoSpan:
    """The shared context a disabled span returns: does nothing (``as`` gives span id 0)."""

    __slots__ = ()

    def __enter__(self) -> int:
        return 0

    def __exit__(self, *exc):
        return False


NO_SPAN = _NoSpan()


class Tracer:
    """Records spans (and counters) at or below ``level``.

    ``level``: the deepest :class:`TraceLevel` recorded (``TraceLevel.FRAMEWORK`` records APPLICATION, MODEL
    and FRAMEWORK spans). ``trace_id``: a string; a random hex id when not given.

    ``max_level``: ``level`` as a plain int (0 records nothing), cheap to compare on a hot path.
    Hot-path methods take ``level`` as a :class:`TraceLevel` (or its int value), not a string.
    Keyword fields of :meth:`span`, :meth:`start` and :meth:`add_span` named like a span column
    (:data:`~mlms_nb.schema.spans.FIELD_COLUMNS`: ``device, stream, layer_index, layer_type, shape, flops,
    bytes, memory``, and the id columns of :data:`~mlms_nb.schema.spans.ID_COLUMNS`: ``correlation``,
    ``external_id``...) fill that column; any other keyword goes into ``attrs``.
    """

    def __init__(self, level: TraceLevel | int | str = TraceLevel.MODEL, trace_id: str | None = None):
        self.level = TraceLevel.parse(level)
        self.max_level = int(self.level)
        self.trace_id = str(trace_id) if trace_id is not None else uuid.uuid4().hex
        self._spans: list[tuple] = []
        self._blocks: list[tuple[int, SpanBlock]] = []  # (len(self._spans) when it was added, the block)
        self._counters: list[tuple] = []
        self._ids = itertools.count(1)
        self._next_id = self._ids.__next__
        self._local = _Local(self._spans, self._next_id)
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
        return 0 < level <= self.max_level

    # Records are flat tuples holding only atomic values (``level + 0`` turns a TraceLevel into a plain int); see
    # mlms_nb.tracing.records for their layout and why.

    def span(self, name: str, level: TraceLevel | int, kind: str | None = None, **fields):
        """``with tracer.span("predict", TraceLevel.MODEL, "model", batch=8) as span_id:`` -- times the block.

        ``kind``: one of :data:`~mlms_nb.schema.spans.KINDS` (default by level: MODEL -> "model",
        FRAMEWORK -> "layer", ML_LIBRARY -> "op"...). Use it directly in a ``with`` statement. A disabled
        level returns a shared no-op context (``as`` gives 0). :meth:`annotate` adds fields while the
        block runs. Field values are cheapest as numbers, strings or tuples.
        """
        if level > self.max_level or level <= 0:
            return NO_SPAN
        ctx = self._local.ctx
        ctx.pending = (name, level + 0, kind, fields)
        return ctx

    def start(self, name: str, level: TraceLevel | int, kind: str | None = None, **fields):
        """Open a span and return its token (``None`` when the level is disabled); close it with
        :meth:`end`. For hook-style code (a forward pre-hook starts, the forward hook ends). A token left
        open when an enclosing ``with`` span ends is recorded then, with ``attrs["error"] = "unfinished"``."""
        if level > self.max_level or level <= 0:
            return None
        ctx = self._local.ctx
        stack = ctx.stack
        token = [self._next_id(), stack[-1][0] if stack else 0, name, level + 0, kind, fields, 0, ctx]
        stack.append(token)
        token[6] = _perf_ns()
        return token

    def end(self, token, end_ns: int | None = None, **fields) -> int:
        """Close the span ``token`` came from (``None`` and already-closed tokens are ignored); ``fields``
        are added to it. ``end_ns``: the end time when it was read earlier (so that computing ``fields`` stays
        outside the span). Returns the span id (0 for ``None``)."""
        end = _perf_ns() if end_ns is None else end_ns
        if token is None:
            return 0
        sid, parent, name, level, kind, f, start, ctx = token
        if ctx is None:
            return sid
        token[7] = None
        stack = ctx.stack
        if stack and stack[-1] is token:
            stack.pop()
        else:
            for i in range(len(stack) - 1, -1, -1):
                if stack[i] is token:
                    del stack[i]
                    break
        if fields:
            f = {**f, **fields} if f else fields
        if f:
            ctx.spans.append((sid, parent, name, level, kind, start, end, ctx.tid, *f, *f.values()))
        else:
            ctx.spans.append((sid, parent, name, level, kind, start, end, ctx.tid))
        return sid

    def annotate(self, **fields) -> int:
        """Add fields (columns such as ``shape``/``flops``, or free attributes) to the innermost span open on
        this thread; returns its id (0 when none is open -- then nothing is recorded)."""
        stack = self._local.ctx.stack
        if not stack:
            return 0
        frame = stack[-1]
        f = frame[_OPEN_FIELDS]
        merged = {**f, **fields} if f else fields
        if frame.__class__ is tuple:
            stack[-1] = frame[:_OPEN_FIELDS] + (merged,) + frame[_OPEN_FIELDS + 1:]
        else:
            frame[_OPEN_FIELDS] = merged
        return frame[0]

    def add_span(self, name: str, level: TraceLevel | int, kind: str | None, start_ns: int, end_ns: int,
                 parent_id: int | None = None, *, thread: int | None = None, **fields) -> int:
        """Record a span whose times are already known (importers, profilers); returns its id (0 when the
        level is disabled). ``parent_id=None``: the innermost span open on this thread (or none);
        ``thread``: the OS thread id to file it under (default: this thread)."""
        if level > self.max_level or level <= 0:
            return 0
        ctx = self._local.ctx
        if parent_id is None:
            stack = ctx.stack
            parent_id = stack[-1][0] if stack else 0
        sid = self._next_id()
        self._spans.append((sid, int(parent_id), name, level + 0, kind, int(start_ns), int(end_ns),
                            ctx.tid if thread is None else int(thread), *fields, *fields.values()))
        return sid

    def new_span_ids(self, count: int) -> np.ndarray:
        """``count`` fresh span ids (int64), in order, for spans recorded in bulk (:meth:`add_block`): drawn from
        the one counter in a single C-level pass (no Python loop or call per id)."""
        return np.fromiter(itertools.islice(self._ids, count), np.int64, count)

    def add_block(self, block: SpanBlock) -> None:
        """Append spans recorded in bulk as columns (:class:`~mlms_nb.tracing.records.SpanBlock`; ids from
        :meth:`new_span_ids`): for a recorder's thousands of spans of a few names and shapes, no tuple per span
        here or when the frames are built. The caller leaves out levels this tracer does not record."""
        if self.max_level and len(block):
            self._blocks.append((len(self._spans), block))

    def add_counter(self, ts_ns: int, source: str, metric: str, value: float, unit: str, device: str = "") -> None:
        """Record one counter sample (``ts_ns`` on the :func:`time.perf_counter_ns` clock). Counters are kept
        at every level but ``NONE``."""
        if self.max_level:
            self._counters.append((ts_ns, source, metric, value, unit, device))

    def add_counters(self, rows: Iterable[tuple]) -> None:
        """Record rows ``(ts_ns, source, metric, value, unit, device)`` (e.g. a profiler's ``counters()``)."""
        if self.max_level:
            self._counters.extend(rows)

    def records(self, since: int = 0) -> list[SpanRecord]:
        """The spans closed so far, from position ``since`` on (a ``len(tracer)`` read earlier: the spans
        recorded after that moment), as :class:`~mlms_nb.tracing.records.SpanRecord` in recording order.
        :meth:`clear` starts the positions again at 0."""
        of = SpanRecord.of
        out: list[SpanRecord] = []
        for tuples, block, first in self._pieces(since):
            out.extend(map(of, tuples) if block is None else (block.record(i) for i in range(first, len(block))))
        return out

    def intervals(self, level: TraceLevel | int, kind: str | None = None, name: str | None = None,
                  since: int = 0) -> np.ndarray:
        """``(start_ns, end_ns, span_id, thread)`` rows, int64, of the spans recorded from position ``since`` on
        (as :meth:`records`) at ``level`` (and of ``kind`` / named ``name`` when given), in recording order: what
        a recorder needs to nest its spans in those already recorded, read from the columns of a block rather
        than a record per span."""
        level = int(level)
        rows: list[np.ndarray] = []
        for tuples, block, first in self._pieces(since):
            if block is None:
                picked = [(r[START_NS], r[END_NS], r[SPAN_ID], r[THREAD]) for r in tuples if r[LEVEL] == level
                          and (kind is None or r[KIND] == kind) and (name is None or r[NAME] == name)]
                if picked:
                    rows.append(np.array(picked, np.int64))
            elif block.level == level and (kind is None or block.kind == kind):
                keep = np.arange(first, len(block))
                if name is not None:
                    named = np.array([n == name for n, _ in block.parts], bool)
                    keep = keep[named[block.part[keep]]]
                rows.append(np.stack([block.start_ns[keep], block.end_ns[keep], block.span_id[keep],
                                      block.thread[keep]], axis=1).astype(np.int64, copy=False))
        return np.concatenate(rows) if rows else np.zeros((0, 4), np.int64)

    def _pieces(self, since: int) -> Iterator[tuple[list, SpanBlock | None, int]]:
        """The spans from position ``since`` on, in recording order, as pieces ``(record tuples, None, 0)`` and
        ``((), block, its first row)``: positions count the tuples and the blocks' rows in the order they came."""
        done = position = 0  # tuples of self._spans passed; records (tuples and block rows) passed
        for at, block in self._blocks:
            tuples = self._spans[done:at]
            yield tuples[max(0, since - position):], None, 0
            position += len(tuples)
            yield (), block, max(0, since - position)
            position += len(block)
            done = at
        yield self._spans[done:][max(0, since - position):], None, 0

    def thread_id(self) -> int:
        """The OS thread id this tracer files the calling thread's spans under."""
        return self._local.ctx.tid

    def current_span_id(self) -> int:
        """Id of the innermost span open on this thread (0 when none)."""
        stack = self._local.ctx.stack
        return stack[-1][0] if stack else 0

    def now(self) -> int:
        """The tracer's clock, ns."""
        return _perf_ns()

    def __len__(self) -> int:
        return len(self._spans) + sum(len(block) for _, block in self._blocks)

    def clear(self) -> None:
        """Forget the spans and counters recorded so far (open spans stay open)."""
        del self._spans[:]
        del self._blocks[:]
        del self._counters[:]

    def __repr__(self) -> str:
        return f"Tracer(level={self.level.name}, trace_id={self.trace_id!r}, spans={len(self)})"

    # ------------------------------------------------------------------------------------------- building

    def trace(self):
        """The spans and counters recorded so far, as a :class:`~mlms_nb.tracing.Trace` (columnar build; spans
        still open are left out and counted in ``metadata["open_spans"]``)."""
        from mlms_nb.schema.counters import counters_frame
        from mlms_nb.tracing._build import spans_from_records
        from mlms_nb.tracing.trace import Trace

        spans = spans_from_records(list(self._spans), self.trace_id, [block for _, block in self._blocks])
        counters = counters_frame(list(self._counters))
        meta = dict(self.metadata)
        meta["open_spans"] = len(self._local.ctx.stack)  # this thread's; other threads' are not visible
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
