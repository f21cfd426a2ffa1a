"""The trace frames' schemas, under the name they had before they were split: :mod:`mlms_nb.schema.spans` (the
spans frame, the id columns, the clock) and :mod:`mlms_nb.schema.counters` (the counters frame), with their shared
building blocks in :mod:`mlms_nb.schema.columns`. New code imports from those modules."""
from __future__ import annotations

from mlms_nb.schema.columns import (LEVEL_DTYPE, LEVEL_NAMES, Column, canonical_categorical, categorical_of,
                                    canonicalize, level_categorical)
from mlms_nb.schema.counters import (COUNTER_COLUMNS, COUNTER_UNITS, COUNTERS, CounterRow, counters_frame,
                                     empty_counters, validate_counters)
from mlms_nb.schema.spans import (DEFAULT_KIND, FIELD_COLUMNS, ID_COLUMNS, KINDS, NO_ID, ROOT, SPAN_COLUMNS,
                                  SPAN_UNITS, SPANS, attrs_dict, empty_spans, sort_spans, spans_frame,
                                  validate_spans)

__all__ = [
    "COUNTERS", "COUNTER_COLUMNS", "COUNTER_UNITS", "Column", "CounterRow", "DEFAULT_KIND", "FIELD_COLUMNS",
    "ID_COLUMNS", "KINDS", "LEVEL_DTYPE", "LEVEL_NAMES", "NO_ID", "ROOT", "SPANS", "SPAN_COLUMNS", "SPAN_UNITS",
    "attrs_dict", "canonical_categorical", "canonicalize", "categorical_of", "counters_frame", "empty_counters",
    "empty_spans", "level_categorical", "sort_spans", "spans_frame", "validate_counters", "validate_spans",
]
