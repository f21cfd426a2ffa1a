"""Tracing: spans and counters on one monotonic clock, at MLModelScope's trace levels.

- :class:`Tracer` records (``tracer.span(...)``, ``start``/``end``, ``add_span``, ``add_counter``);
  :func:`current_tracer` / :func:`use_tracer` make one active for code that cannot be handed it.
- :class:`Trace` holds the frames (:mod:`.schema` says their columns and units), saves/loads Parquet, and
  exports/imports Chrome trace JSON (our own, PyTorch Kineto, ONNX Runtime profiles).
"""
from __future__ import annotations

from mlms_nb.errors import TraceFormatError, TraceSchemaError
from mlms_nb.schema.levels import TraceLevel
from mlms_nb.schema.trace import (COUNTER_COLUMNS, ID_COLUMNS, KINDS, LEVEL_DTYPE, NO_ID, ROOT, SPAN_COLUMNS, attrs_dict,
                     empty_counters, empty_spans, validate_counters, validate_spans)
from mlms_nb.tracing.trace import Trace, load_trace
from mlms_nb.tracing.tracer import NO_SPAN, NULL_TRACER, Tracer, current_tracer, use_tracer

__all__ = [
    "COUNTER_COLUMNS", "ID_COLUMNS", "KINDS", "LEVEL_DTYPE", "NO_ID", "NO_SPAN", "NULL_TRACER", "ROOT", "SPAN_COLUMNS", "Trace",
    "TraceFormatError", "TraceLevel", "TraceSchemaError", "Tracer", "attrs_dict", "current_tracer",
    "empty_counters", "empty_spans", "load_trace", "use_tracer", "validate_counters", "validate_spans",
]
