"""OpenTelemetry interop, never on the hot path: join the user's trace, and replay a finished Trace as OTel spans.

- :func:`parent_from_otel` reads the user's active OTel span context (trace id, span id) when
  ``opentelemetry-api`` is installed and a span is active; :func:`record_otel_parent` stores it in a tracer's
  (or a metadata dict's) ``metadata["otel_parent"]``, once, before recording starts.
- :func:`export_trace` replays a finished :class:`~mlms_nb.tracing.Trace` -- after the run, from its frames
  -- as OTel spans: parent/child links as in the spans frame, start/end times in ns since the epoch (the
  trace's clock + ``metadata["clock"]["wall_offset_ns"]``), the span columns as ``mlms.*`` attributes, all
  under the user's span when ``metadata["otel_parent"]`` names one.

``opentelemetry-api`` / ``-sdk`` are imported lazily, here only (:func:`import_otel`); without them the
functions that need them raise :class:`~mlms_nb.errors.FrameworkNotInstalledError` whose message names the
``otel`` extra, and :func:`parent_from_otel` returns None (nobody can have an active OTel span then).

Attributes of an exported span (only those with a value): ``mlms.trace_id``, ``mlms.span_id``,
``mlms.parent_id``, ``mlms.level``, ``mlms.kind``, ``thread.id``, ``mlms.device``, ``mlms.stream``,
``mlms.layer_index``, ``mlms.layer_type``, ``mlms.shape``, ``mlms.flops``, ``mlms.bytes``, ``mlms.memory``,
``mlms.<id column>`` for each id column a span has a value in (``mlms.external_id``, ``mlms.correlation``...)
and one ``mlms.attrs.<key>`` per key of the ``attrs`` column. A span whose ``attrs`` has ``error`` gets
status ERROR.
"""
from __future__ import annotations

import math
from typing import Any, Mapping

import orjson

from mlms_nb.errors import FrameworkNotInstalledError, MlmsError
from mlms_nb.schema.spans import ID_COLUMNS, NO_ID

INSTALL_HINT = "pip install 'mlms-nb[otel]'"
INSTRUMENTATION_NAME = "mlms_nb"
SYNTHETIC_ROOT = "mlms-nb trace"


def import_otel(sdk: bool = False):
    """The ``opentelemetry.trace`` module (and, with ``sdk=True``, check the SDK is there too); raises
    FrameworkNotInstalledError naming the ``otel`` extra when it is missing."""
    try:
        from opentelemetry import trace  # noqa: PLC0415 - the one place opentelemetry is imported
    except ImportError as exc:
        raise FrameworkNotInstalledError(
            f"OpenTelemetry interop needs opentelemetry-api and opentelemetry-sdk, which are not installed "
            f"({_first_line(exc)}): {INSTALL_HINT}") from None
    if sdk:
        try:
            import opentelemetry.sdk.trace  # noqa: F401,PLC0415
        except ImportError as exc:
            raise FrameworkNotInstalledError(
                f"exporting to OpenTelemetry needs opentelemetry-sdk, which is not installed "
                f"({_first_line(exc)}): {INSTALL_HINT}") from None
    return trace


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def otel_available() -> tuple[bool, str]:
    """Whether OTel export can run here, and a sentence saying so (or why not)."""
    try:
        import_otel(sdk=True)
    except FrameworkNotInstalledError as exc:
        return False, str(exc)
    try:
        from importlib.metadata import version  # noqa: PLC0415

        v = version("opentelemetry-api")
    except Exception:  # noqa: BLE001
        v = "?"
    return True, f"OpenTelemetry {v} is installed: traces can join the active span and be exported"


# --------------------------------------------------------------------------------------------- the user's span


def parent_from_otel(required: bool = False) -> dict | None:
    """The user's active OpenTelemetry span context as a plain dict, or None.

    ``{"trace_id": 32 hex digits, "span_id": 16 hex digits, "trace_flags": int, "trace_state": W3C header text,
    "is_remote": bool}`` when opentelemetry-api is installed and the current context holds a valid span that
    is recording (or was propagated from another process). None otherwise -- also when OpenTelemetry is not
    installed, unless ``required=True``, which raises FrameworkNotInstalledError naming the extra.
    """
    try:
        trace = import_otel()
    except FrameworkNotInstalledError:
        if required:
            raise
        return None
    span = trace.get_current_span()
    ctx = span.get_span_context()
    if not ctx.is_valid or not (span.is_recording() or ctx.is_remote):
        return None
    return {
        "trace_id": trace.format_trace_id(ctx.trace_id),
        "span_id": trace.format_span_id(ctx.span_id),
        "trace_flags": int(ctx.trace_flags),
        "trace_state": ctx.trace_state.to_header() if ctx.trace_state else "",
        "is_remote": bool(ctx.is_remote),
    }


def record_otel_parent(target) -> dict | None:
    """Store :func:`parent_from_otel` in ``target.metadata["otel_parent"]`` (a Tracer, a Trace) or in
    ``target["otel_parent"]`` (a metadata dict), when there is an active span; returns it (or None)."""
    parent = parent_from_otel()
    if parent is not None:
        meta = target if isinstance(target, dict) else target.metadata
        meta["otel_parent"] = parent
    return parent


def _span_context(trace, parent: Mapping[str, Any]):
    """A dict from :func:`parent_from_otel` -> an OTel SpanContext (remote: it lives in the user's process)."""
    try:
        trace_id = int(str(parent["trace_id"]), 16)
        span_id = int(str(parent["span_id"]), 16)
    except (KeyError, TypeError, ValueError):
        raise MlmsError(f"otel_parent must hold hex 'trace_id' and 'span_id', not {dict(parent)!r}") from None
    state = parent.get("trace_state") or ""
    ctx = trace.SpanContext(
        trace_id=trace_id, span_id=span_id, is_remote=True,
        trace_flags=trace.TraceFlags(int(parent.get("trace_flags", trace.TraceFlags.SAMPLED))),
        trace_state=trace.TraceState.from_header([state]) if state else trace.TraceState(),
    )
    if not ctx.is_valid:
        raise MlmsError(f"otel_parent is not a valid span context: {dict(parent)!r}")
    return ctx


# --------------------------------------------------------------------------------------------- export


def _attr_value(v):
    """An ``attrs`` value -> an OTel attribute value (str, bool, int, float or a homogeneous list), or None."""
    if v is None:
        return None
    if isinstance(v, (str, bool)):
        return v
    if isinstance(v, int):
        return v if -(1 << 63) <= v < (1 << 63) else str(v)
    if isinstance(v, float):
        return None if math.isnan(v) else v
    if isinstance(v, (list, tuple)) and v and all(type(x) is type(v[0]) for x in v) and \
            isinstance(v[0], (str, bool, int, float)):
        return list(v)
    return orjson.dumps(v, default=str).decode()


def _columns(spans, name: str, default):
    return spans[name].tolist() if name in spans.columns else [default] * len(spans)


def export_trace(trace, tracer_provider=None, exporter=None, *, parent: Any = "auto",
                 wall_offset_ns: int | None = None, service_name: str = "mlms-nb") -> dict:
    """Replay a finished Trace's spans as OpenTelemetry spans. Returns ``{"spans": count, "trace_id": OTel trace
    id (hex), "span_ids": {mlms span_id: OTel span id (hex)}}``.

    Where they go: ``exporter`` (any OTel ``SpanExporter``: OTLP, console, in-memory) through a private SDK
    TracerProvider (resource ``service.name = service_name``, every span sampled) that is flushed, not shut
    down, at the end; or ``tracer_provider`` (the user's); or, with neither, the global one
    (``opentelemetry.trace.set_tracer_provider``) -- an error when none is set.

    ``parent``: ``"auto"`` (default) puts the root spans under ``trace.metadata["otel_parent"]`` when present
    (see :func:`record_otel_parent`); a dict like :func:`parent_from_otel`'s names another parent; None: no
    parent. Without a parent, a trace with several root spans is wrapped in one synthetic root span (named
    ``"mlms-nb trace"``, covering them all) so that it stays one OTel trace.

    Times: span times + ``wall_offset_ns`` (default ``trace.metadata["clock"]["wall_offset_ns"]``) = ns
    since the epoch.
    """
    otrace = import_otel(sdk=exporter is not None)
    if exporter is not None and tracer_provider is not None:
        raise MlmsError("export_trace takes tracer_provider or exporter, not both")
    spans = trace.spans
    meta = getattr(trace, "metadata", {}) or {}
    if wall_offset_ns is None:
        wall_offset_ns = (meta.get("clock") or {}).get("wall_offset_ns")
        if wall_offset_ns is None:
            raise MlmsError("cannot export to OpenTelemetry: the trace's clock has no known wall-clock offset "
                            "(metadata['clock']['wall_offset_ns'] is not set); pass wall_offset_ns=")
    offset_ns = int(wall_offset_ns)
    if parent == "auto":
        parent = meta.get("otel_parent")

    own = None
    if exporter is not None:
        from opentelemetry.sdk.resources import Resource  # noqa: PLC0415
        from opentelemetry.sdk.trace import TracerProvider  # noqa: PLC0415
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: PLC0415
        from opentelemetry.sdk.trace.sampling import ALWAYS_ON  # noqa: PLC0415

        own = TracerProvider(sampler=ALWAYS_ON, resource=Resource.create({"service.name": service_name}),
                             shutdown_on_exit=False)
        own.add_span_processor(SimpleSpanProcessor(exporter))
        tracer_provider = own
    if tracer_provider is None:
        tracer_provider = otrace.get_tracer_provider()
        if isinstance(tracer_provider, (otrace.ProxyTracerProvider, otrace.NoOpTracerProvider)):
            raise MlmsError("no OpenTelemetry tracer provider is set: call opentelemetry.trace."
                            "set_tracer_provider(...) or pass tracer_provider= or exporter= to export_trace")
    from mlms_nb._version import __version__  # noqa: PLC0415

    otracer = tracer_provider.get_tracer(INSTRUMENTATION_NAME, __version__)
    from opentelemetry import context as ocontext  # noqa: PLC0415

    try:
        return _replay(otrace, ocontext, otracer, spans, meta, offset_ns, parent)
    finally:
        if own is not None:
            own.force_flush()


class _SpanRows:
    """The spans frame as Python lists (one per column), and the OTel attributes of a row."""

    def __init__(self, spans, trace_id: str):
        self.trace_id = trace_id
        self.sid = [int(v) for v in _columns(spans, "span_id", 0)]
        self.pid = [int(v) for v in _columns(spans, "parent_id", 0)]
        self.start = [int(v) for v in _columns(spans, "start_ns", 0)]
        self.end = [int(v) for v in _columns(spans, "end_ns", 0)]
        self.names = [str(v) for v in _columns(spans, "name", "")]
        self.levels = [str(v) for v in _columns(spans, "level", "")]
        self.kinds = [str(v) for v in _columns(spans, "kind", "")]
        self.threads = _columns(spans, "thread", 0)
        self.devices = _columns(spans, "device", "")
        self.streams = _columns(spans, "stream", -1)
        self.layer_index = _columns(spans, "layer_index", -1)
        self.layer_type = _columns(spans, "layer_type", "")
        self.shapes = _columns(spans, "shape", "")
        self.floats = [(k, _columns(spans, c, float("nan"))) for k, c in (("mlms.flops", "flops"),
                                                                           ("mlms.bytes", "bytes"),
                                                                           ("mlms.memory", "memory"))]
        self.attrs = _columns(spans, "attrs", "{}")
        self.ids = [(f"mlms.{c}", spans[c].tolist()) for c in ID_COLUMNS if c in spans.columns]

    def tree(self) -> tuple[list[int], dict[int, list[int]]]:
        """Root rows and, per row, its child rows (a parent id not in the frame makes a root)."""
        row_of = {s: i for i, s in enumerate(self.sid)}
        children: dict[int, list[int]] = {}
        roots: list[int] = []
        for i, p in enumerate(self.pid):
            if p and p in row_of and p != self.sid[i]:
                children.setdefault(row_of[p], []).append(i)
            else:
                roots.append(i)
        return roots, children

    def key(self, i: int) -> tuple[int, int]:
        return (self.start[i], self.sid[i])

    def attributes(self, i: int) -> tuple[dict, str | None]:
        """Row ``i``'s OTel attributes (see the module doc), and its ``attrs["error"]`` (None when none)."""
        a: dict[str, Any] = {"mlms.trace_id": self.trace_id, "mlms.span_id": self.sid[i],
                             "mlms.parent_id": self.pid[i], "mlms.level": self.levels[i], "mlms.kind": self.kinds[i]}
        if self.threads[i]:
            a["thread.id"] = int(self.threads[i])
        if self.devices[i]:
            a["mlms.device"] = str(self.devices[i])
        if int(self.streams[i]) != -1:
            a["mlms.stream"] = int(self.streams[i])
        if int(self.layer_index[i]) != -1:
            a["mlms.layer_index"] = int(self.layer_index[i])
        if self.layer_type[i]:
            a["mlms.layer_type"] = str(self.layer_type[i])
        if self.shapes[i]:
            a["mlms.shape"] = str(self.shapes[i])
        for k, vals in self.floats:
            v = vals[i]
            if v is not None and v == v:
                a[k] = float(v)
        for k, vals in self.ids:
            if vals[i] != NO_ID:
                a[k] = int(vals[i])
        err = None
        extra = self.attrs[i]
        if extra and extra != "{}":
            try:
                d = orjson.loads(extra)
            except orjson.JSONDecodeError:
                d = {"attrs": extra}
            for k, v in d.items():
                if k == "error":
                    err = str(v)
                val = _attr_value(v)
                if val is not None:
                    a[f"mlms.attrs.{k}"] = val
        return a, err


def _replay(otrace, ocontext, otracer, spans, meta: dict, offset_ns: int, parent) -> dict:
    """Start and end one OTel span per row, parents first; ``offset_ns``: trace clock -> ns since the epoch."""
    rows = _SpanRows(spans, str(meta.get("trace_id") or ""))
    roots, children = rows.tree()
    base = ocontext.Context()  # never the caller's current context: parents are explicit
    if parent:
        base = otrace.set_span_in_context(otrace.NonRecordingSpan(_span_context(otrace, parent)), base)
    Status, StatusCode = otrace.Status, otrace.StatusCode

    synthetic = None
    if not parent and len(roots) > 1:
        synthetic = otracer.start_span(SYNTHETIC_ROOT, context=base, start_time=min(rows.start) + offset_ns,
                                       attributes={"mlms.trace_id": rows.trace_id, "mlms.kind": "application",
                                                   "mlms.synthetic": True})
        base = otrace.set_span_in_context(synthetic, base)

    out_ids: dict[int, str] = {}
    otel_trace_id = ""
    stack = [(i, base) for i in sorted(roots, key=rows.key, reverse=True)]
    count = 0
    while stack:
        i, pctx = stack.pop()
        a, err = rows.attributes(i)
        start, end = rows.start[i], rows.end[i]
        span = otracer.start_span(rows.names[i], context=pctx, start_time=start + offset_ns, attributes=a)
        if err is not None:
            span.set_status(Status(StatusCode.ERROR, err))
        span.end(end_time=max(end, start) + offset_ns)
        sc = span.get_span_context()
        out_ids[rows.sid[i]] = otrace.format_span_id(sc.span_id)
        if not otel_trace_id:
            otel_trace_id = otrace.format_trace_id(sc.trace_id)
        count += 1
        kids = children.get(i)
        if kids:
            cctx = otrace.set_span_in_context(span, ocontext.Context())
            stack.extend((c, cctx) for c in sorted(kids, key=rows.key, reverse=True))
    if synthetic is not None:
        synthetic.end(end_time=max(rows.end) + offset_ns)
        count += 1
    return {"spans": count, "trace_id": otel_trace_id, "span_ids": out_ids}


__all__ = ["export_trace", "import_otel", "otel_available", "parent_from_otel", "record_otel_parent"]
