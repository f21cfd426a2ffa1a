"""Tracing: spans and counters on one monotonic clock, at MLModelScope's trace levels.

- :class:`Tracer` records (``tracer.span(...)``, ``start``/``end``, ``add_span``, ``add_counter``);
  :func:`current_tracer` / :func:`use_tracer` make one active for code that cannot be handed it.
- :class:`Trace` holds the frames (:mod:`mlms_nb.schema.spans` and :mod:`mlms_nb.schema.counters` say their
  columns and units), saves/loads Parquet, and exports/imports Chrome trace JSON (our own, PyTorch Kineto, ONNX
  Runtime profiles: :mod:`.chrome`).
- :mod:`.attribution` links activity to what caused it (containment, correlation ids); :mod:`.cuda_activity`
  turns CUPTI's records into spans.
"""
from __future__ import annotations

from mlms_nb.errors import TraceFormatError, TraceSchemaError
from mlms_nb.schema.levels import TraceLevel
from mlms_nb.schema.columns import LEVEL_DTYPE
from mlms_nb.schema.counters import COUNTER_COLUMNS, empty_counters, validate_counters
from mlms_nb.schema.spans import (ID_COLUMNS, KINDS, NO_ID, ROOT, SPAN_COLUMNS, attrs_dict, empty_spans,
                                  validate_spans)
from mlms_nb.tracing.trace import Trace, load_trace
from mlms_nb.tracing.tracer import NO_SPAN, NULL_TRACER, Tracer, current_tracer, use_tracer

__all__ = [
    "COUNTER_COLUMNS", "ID_COLUMNS", "KINDS", "LEVEL_DTYPE", "NO_ID", "NO_SPAN", "NULL_TRACER", "ROOT", "SPAN_COLUMNS",
    "Trace", "TraceFormatError", "TraceLevel", "TraceSchemaError", "Tracer", "attrs_dict", "current_tracer",
    "empty_counters", "empty_spans", "load_trace", "use_tracer", "validate_counters", "validate_spans",
]
