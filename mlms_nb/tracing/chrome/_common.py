"""What the Chrome trace importer's dialects and the exporter share: our format's name, how a category's args are
read, and the small numeric conversions (µs -> ns, pid/tid -> int64, sparse -> dense columns)."""
from __future__ import annotations

from array import array

import numpy as np
import orjson

from mlms_nb.schema.spans import ID_COLUMNS

FORMAT = "mlms-nb/chrome-trace"
FORMAT_VERSION = 1
"""``otherData.mlms_nb.format`` / ``version`` of a file :func:`~mlms_nb.tracing.chrome.write_chrome` wrote."""

# How a category's args are read: each event category (CATEGORIES in kineto.py / ort.py) names one of these, and
# the importer's per-event loop dispatches on it. Every rule moves the per-span integer ids (ID_COLUMNS) out of
# args into their columns and keeps the rest as the span's attrs text.
ARGS_AS_ATTRS = 0           # nothing else: user annotations, Python functions, the profiling window, a session
ARGS_OF_HOST_OP = 1         # a Kineto host op: "Input Dims" -> shape, "flops" -> flops
ARGS_OF_RUNTIME_CALL = 2    # a CUDA runtime/driver call: "correlation" also kept to link the activity it launched
ARGS_OF_DEVICE_ACTIVITY = 3  # a kernel/memcpy/memset: device, stream, "correlation" (its launching call)
ARGS_OF_ORT_NODE = 4        # an ONNX Runtime graph node: op_name, node_index, shapes, sizes, provider
ARGS_OF_UNKNOWN_CATEGORY = 5  # any other category: kept in attrs["cat"] as well

NAN = float("nan")
INT64_MAX = 2**63 - 1


MAX_US = 2**62 // 1000
"""The largest |time| in µs a trace may hold (about 146 years): its ns, a duration added to it, and an origin up to
:data:`MAX_ORIGIN_NS` still fit in int64."""
MAX_ORIGIN_NS = 2**62


def us_to_ns(us: np.ndarray) -> np.ndarray:
    """µs floats (as parsed from JSON, 3 decimals) -> int64 ns, exact while |us| < 2**43 (~100 days). Raises
    ValueError for a time that is not finite or beyond :data:`MAX_US` (it would wrap around in int64)."""
    us = np.asarray(us, dtype=np.float64)
    if len(us) and not np.abs(us).max() <= MAX_US:  # also false for NaN
        bad = us[~(np.abs(us) <= MAX_US)][0]
        raise ValueError(f"a time of {bad!r} µs is not a finite number within ±{MAX_US} µs")
    whole = np.floor(us)
    return whole.astype(np.int64) * 1000 + np.rint((us - whole) * 1000.0).astype(np.int64)


def int_ids(values: list, table: dict) -> np.ndarray:
    """pid / tid values (ints, or strings such as Kineto's "Spans") -> int64; strings get ids -1, -2, ... kept
    in ``table`` (text -> id)."""
    try:
        return np.array(values, dtype=np.int64)
    except (TypeError, ValueError, OverflowError):
        out = np.empty(len(values), np.int64)
        for i, v in enumerate(values):
            if isinstance(v, (int, np.integer)) and not isinstance(v, bool):
                out[i] = v
                continue
            try:
                out[i] = int(v)
            except (TypeError, ValueError, OverflowError):
                key = str(v)
                code = table.get(key)
                if code is None:
                    code = table[key] = -(len(table) + 1)
                out[i] = code
        return out


def id_rows() -> dict:
    """Per id column, the (rows, ids) of the spans that have one, as compact int64 arrays."""
    return {col: (array("q"), array("q")) for col in ID_COLUMNS}


def dense(n: int, rows, vals, default, dtype) -> np.ndarray:
    """A column of ``n`` values: ``default`` except ``vals`` at ``rows`` (sparse -> dense)."""
    out = np.full(n, default, dtype=dtype)
    if len(rows):
        out[np.asarray(rows, np.int64)] = np.asarray(vals, dtype=dtype)
    return out


def to_int(v, default=-1) -> int:
    try:
        return int(v)
    except (TypeError, ValueError):
        return default


def json_safe(obj):
    """``obj`` as plain JSON values (numpy numbers, non-string keys and anything else made JSON-able)."""
    return orjson.loads(orjson.dumps(obj, default=str, option=orjson.OPT_NON_STR_KEYS | orjson.OPT_SERIALIZE_NUMPY))
