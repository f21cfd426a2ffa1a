"""An `Evaluation` as strict JSON and back, losslessly: the saved ``.json`` files and the history store's payloads.

Frames travel as Arrow IPC streams (base64 text inside the JSON): Arrow keeps every column, its order and
dtype, NaN and infinities, and floats to the last bit; pandas' own ``to_json(orient="table")`` keeps the dtypes
but rounds floats to 15 digits and writes infinities as null. Latency samples stay JSON integer lists (int64
nanoseconds, exact); probabilities keep their dtype and shape. The JSON is strict (no NaN): a missing number in
the stack, options or an array is ``null``, an infinity the string ``"inf"``/``"-inf"``.

Format 1 (mlms-nb before issue 9) wrote each frame as ``{"columns", "dtypes", "data"}``; it is still read, since
history stores hold it. Neither this module nor the `Evaluation` imports the other's internals: `encode` reads the
object's public fields, `decode` returns the keyword arguments of its constructor.
"""
from __future__ import annotations

import base64
import datetime as _dt
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from mlms_nb.errors import MlmsError
from mlms_nb.schema.evaluation import FRAMES, SampleKey

FORMAT = "mlms-nb/evaluation"
FORMAT_VERSION = 2
JSON_COLUMNS_KEY = b"mlms_nb.json_columns"
"""Arrow schema metadata: the columns Arrow could not type (mixed Python objects), stored as JSON text."""


class EvaluationFormatError(MlmsError, ValueError):
    """Text or a file that is not a saved mlms-nb evaluation."""


# ---------------------------------------------------------------------------------------------- the whole object

def encode(evaluation) -> dict:
    """A JSON-ready dict of an `Evaluation` (only str, int, float, bool, None, lists and dicts)."""
    ev = evaluation
    return {
        "format": FORMAT, "format_version": FORMAT_VERSION,
        "id": ev.id, "created_at": ev.created_at, "model": ev.model, "model_version": ev.model_version,
        "frameworks": list(ev.frameworks), "complete": bool(ev.complete), "outcomes": plain(ev.outcomes),
        "manifests": plain(ev.manifests), "stack": plain(ev.stack), "options": plain(ev.options),
        **{name: frame_to_text(getattr(ev, name)) for name in FRAMES},
        "samples": [{"framework": k[0], "batch_size": int(k[1]), "scenario": k[2],
                     "dtype": str(np.asarray(v).dtype), "ns": np.asarray(v).tolist()} for k, v in ev.samples.items()],
        "probabilities": {fw: {"dtype": str(np.asarray(a).dtype), "shape": list(np.shape(a)),
                               "data": plain(np.asarray(a).reshape(-1))} for fw, a in ev.probabilities.items()},
        "warnings": [str(w) for w in ev.warnings], "trace_ids": [str(t) for t in ev.trace_ids],
        "history_ids": [int(i) for i in ev.history_ids],
    }


def decode(data: dict) -> dict:
    """The constructor keywords of the `Evaluation` that `encode` (format 1 or 2) wrote."""
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise EvaluationFormatError(f"not a saved mlms-nb evaluation (expected \"format\": \"{FORMAT}\")")
    version = int(data.get("format_version", 0))
    if version > FORMAT_VERSION:
        raise EvaluationFormatError(f"this evaluation was saved by a newer mlms-nb (format {version}); upgrade mlms-nb")
    read_frame = frame_from_text if version >= 2 else _format1_frame
    try:
        return dict(
            id=data["id"], created_at=data["created_at"], model=data.get("model", ""),
            model_version=data.get("model_version", ""), frameworks=list(data.get("frameworks", [])),
            manifests=data.get("manifests", {}), stack=data.get("stack", {}), options=data.get("options", {}),
            **{name: read_frame(data.get(name)) for name in FRAMES},
            samples={SampleKey(s["framework"], int(s["batch_size"]), s["scenario"]):
                     np.asarray(s["ns"], dtype=s.get("dtype", "int64")) for s in data.get("samples", [])},
            probabilities={fw: _array(a) for fw, a in data.get("probabilities", {}).items()},
            complete=bool(data.get("complete", True)), outcomes=dict(data.get("outcomes") or {}), warnings=list(data.get("warnings", [])),
            trace_ids=list(data.get("trace_ids", [])), history_ids=[int(i) for i in data.get("history_ids", [])])
    except (KeyError, TypeError, ValueError, OSError, pa.ArrowException) as err:
        raise EvaluationFormatError(f"a saved evaluation is damaged: {type(err).__name__}: {err}") from None


def to_json(evaluation, indent: int | None = None) -> str:
    return json.dumps(encode(evaluation), indent=indent, allow_nan=False, ensure_ascii=False)


def from_json(text: str | bytes) -> dict:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise EvaluationFormatError(f"not JSON: {err.msg} at line {err.lineno}, column {err.colno}") from None
    return decode(data)


# ---------------------------------------------------------------------------------------------- frames

def frame_to_text(frame: pd.DataFrame | None) -> str | None:
    """A frame as base64 Arrow IPC text; ``None`` for a frame with no columns."""
    if frame is None or len(frame.columns) == 0:
        return None
    frame = frame.reset_index(drop=True)
    as_json = []
    try:
        table = pa.Table.from_pandas(frame, preserve_index=False)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
        as_json = [c for c in frame.columns if not _arrow_can_type(frame[c])]
        frame = frame.assign(**{c: [json.dumps(plain(v), allow_nan=False) for v in frame[c]] for c in as_json})
        table = pa.Table.from_pandas(frame, preserve_index=False)
    if as_json:
        table = table.replace_schema_metadata({**table.schema.metadata, JSON_COLUMNS_KEY: json.dumps(as_json).encode()})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return base64.b64encode(sink.getvalue().to_pybytes()).decode("ascii")


def frame_from_text(text: str | None) -> pd.DataFrame:
    """The frame `frame_to_text` wrote (lists come back as lists, not arrays)."""
    if not text:
        return pd.DataFrame()
    table = pa.ipc.open_stream(base64.b64decode(text)).read_all()
    frame = table.to_pandas()
    for i, field in enumerate(table.schema):
        if pa.types.is_list(field.type) or pa.types.is_large_list(field.type):
            frame[field.name] = pd.Series(table.column(i).to_pylist(), dtype=object)
    for name in json.loads((table.schema.metadata or {}).get(JSON_COLUMNS_KEY, b"[]")):
        frame[name] = pd.Series([json.loads(v) for v in frame[name]], dtype=object)
    return frame


def _arrow_can_type(column: pd.Series) -> bool:
    try:
        pa.array(column, from_pandas=True)
        return True
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
        return False


# ---------------------------------------------------------------------------------------------- plain values

def plain(value: Any) -> Any:
    """numpy and pandas scalars/arrays -> Python values; tuples -> lists; NaN -> None; inf -> "inf"."""
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, np.ndarray)):
        return [plain(v) for v in (value.tolist() if isinstance(value, np.ndarray) else value)]
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        v = float(value)
        return None if math.isnan(v) else ("inf" if v > 0 else "-inf") if math.isinf(v) else v
    if value is None or value is pd.NA or value is pd.NaT:
        return None
    if isinstance(value, (pd.Timestamp, _dt.datetime, _dt.date)):
        return value.isoformat()
    if isinstance(value, pd.Timedelta):
        return int(value.value)
    if isinstance(value, str):
        return value
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", "replace")
    if isinstance(value, Path):
        return str(value)
    if hasattr(value, "item") and callable(value.item):  # other numpy scalar kinds
        try:
            return plain(value.item())
        except (TypeError, ValueError):
            pass
    return str(value)


def _float_back(value: Any, kind: str) -> Any:
    """Undo `plain` for a float: None -> NaN, "inf" -> inf."""
    if kind == "f" and value is None:
        return np.nan
    if kind == "f" and isinstance(value, str):
        return float(value)
    return value


def _array(data: dict) -> np.ndarray:
    kind = np.dtype(data["dtype"]).kind
    return np.asarray([_float_back(v, kind) for v in data["data"]], dtype=data["dtype"]).reshape(data["shape"])


def _format1_frame(data: dict | None) -> pd.DataFrame:
    """A frame as format 1 wrote it: ``{"columns", "dtypes", "data"}`` (rows of `plain` values)."""
    if not data or not data.get("columns"):
        return pd.DataFrame()
    columns, dtypes, rows = data["columns"], data.get("dtypes") or [], data.get("data") or []
    series = {}
    for j, name in enumerate(columns):
        dtype = dtypes[j] if j < len(dtypes) else "object"
        try:
            kind = np.dtype(dtype).kind
        except TypeError:  # extension dtypes: str, string, category, Int64, boolean, datetime64[ns, UTC] ...
            kind = ""
        values = [_float_back(row[j], kind) for row in rows]
        if kind == "M" or dtype.startswith("datetime64"):
            series[name] = pd.Series(pd.to_datetime(values), dtype=dtype)
        elif kind == "m":
            series[name] = pd.Series(pd.to_timedelta(values, unit="ns"), dtype=dtype)
        else:
            try:
                series[name] = pd.Series(values, dtype=dtype)
            except (TypeError, ValueError):
                series[name] = pd.Series(values, dtype=object)
    return pd.DataFrame(series, columns=columns, index=pd.RangeIndex(len(rows)))
