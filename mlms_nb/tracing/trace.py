"""``Trace``: the spans and counters frames of one trace, its metadata, and its files.

On disk (:meth:`Trace.save` / :meth:`Trace.load`) a trace is a **directory** holding two Parquet files::

    my_trace/
      spans.parquet      the spans frame; its key-value metadata "mlms_nb" holds the trace metadata (JSON)
      counters.parquet   the counters frame

Categorical columns are stored dictionary-encoded (the others plain), compression is LZ4 (it decodes about 1.3x
faster than zstd here, for 3x the bytes on disk), row groups of 65,536 rows (decoded in parallel), read memory-mapped;
reopening is a columnar read with no per-row work.
:meth:`Trace.to_chrome` / :meth:`Trace.from_chrome` read and write Chrome trace JSON (Perfetto,
chrome://tracing), including PyTorch Kineto and ONNX Runtime profiles (see :mod:`mlms_nb.tracing.chrome`).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import orjson
import pandas as pd

from .errors import TraceFormatError, TraceSchemaError
from .schema import (COUNTER_COLUMNS, LEVEL_DTYPE, SPAN_COLUMNS, STR_DTYPE, canonicalize, counters_frame,
                     empty_counters, empty_spans, validate_counters, validate_spans)

PARQUET_FORMAT = "mlms-nb/trace-parquet"
PARQUET_VERSION = 1
SPANS_FILE = "spans.parquet"
COUNTERS_FILE = "counters.parquet"
_META_KEY = b"mlms_nb"
ROW_GROUP = 65_536
"""Rows per Parquet row group: several groups per big trace let the reader decode them in parallel."""


class Trace:
    """Spans + counters + metadata of one trace.

    ``spans`` / ``counters``: frames following :mod:`mlms_nb.tracing.schema` (validated on construction;
    a counters frame with object/str columns -- as :mod:`mlms_nb.profilers` builds them -- is converted).
    ``metadata``: a JSON-serialisable dict (``trace_id``, ``source``, ``clock``, unavailable profilers and
    why, ...).
    """

    def __init__(self, spans: pd.DataFrame | None = None, counters: pd.DataFrame | None = None,
                 metadata: dict[str, Any] | None = None):
        self.spans = validate_spans(spans) if spans is not None else empty_spans()
        if counters is None:
            counters = empty_counters()
        elif not all(isinstance(counters[c].dtype, pd.CategoricalDtype) for c in ("source", "metric", "unit",
                                                                                    "device")
                     if c in counters.columns):
            counters = counters_frame(counters)
        self.counters = validate_counters(counters)
        self.metadata: dict[str, Any] = dict(metadata or {})

    # ------------------------------------------------------------------------------------------- views

    @property
    def trace_id(self) -> str | None:
        return self.metadata.get("trace_id")

    def __len__(self) -> int:
        return len(self.spans)

    def __repr__(self) -> str:
        s = self.spans
        span = f", {(int(s['end_ns'].max()) - int(s['start_ns'].min())) / 1e6:.3f} ms" if len(s) else ""
        levels = ", ".join(f"{k}={v}" for k, v in s["level"].value_counts(sort=False).items() if v)
        return (f"Trace({self.trace_id!r}, source={self.metadata.get('source')!r}: {len(s)} spans"
                f"{span} [{levels}], {len(self.counters)} counter samples)")

    def to_wall_ns(self, ns):
        """Times on this trace's clock -> wall-clock ns since the epoch (needs ``metadata["clock"]
        ["wall_offset_ns"]``; raises :class:`TraceFormatError` when the source did not say)."""
        offset = (self.metadata.get("clock") or {}).get("wall_offset_ns")
        if offset is None:
            raise TraceFormatError("this trace's clock has no known wall-clock offset "
                                   "(metadata['clock']['wall_offset_ns'] is not set)")
        return ns + offset

    # ------------------------------------------------------------------------------------------- Parquet

    def save(self, path: str | os.PathLike) -> Path:
        """Write the trace as a directory of Parquet files (created; files in it are replaced). Returns it."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        root = Path(path)
        if root.exists() and not root.is_dir():
            raise TraceFormatError(f"cannot save a trace to {os.fspath(root)!r}: it is a file; "
                                   f"a trace is saved as a directory")
        root.mkdir(parents=True, exist_ok=True)
        meta = orjson.dumps({"format": PARQUET_FORMAT, "version": PARQUET_VERSION, "metadata": self.metadata},
                            default=str, option=orjson.OPT_NON_STR_KEYS | orjson.OPT_SERIALIZE_NUMPY)
        for name, df, extra in ((SPANS_FILE, self.spans, {_META_KEY: meta}), (COUNTERS_FILE, self.counters, {})):
            table = pa.Table.from_pandas(df, preserve_index=False)
            table = table.replace_schema_metadata({**(table.schema.metadata or {}), **extra})
            tmp = root / (name + ".part")
            cats = [c for c in df.columns if isinstance(df[c].dtype, pd.CategoricalDtype)]
            pq.write_table(table, tmp, compression="lz4", row_group_size=ROW_GROUP, use_dictionary=cats,
                           write_statistics=False)
            os.replace(tmp, root / name)
        return root

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Trace":
        """Reopen a trace written by :meth:`save`."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        root = Path(path)
        spans_path, counters_path = root / SPANS_FILE, root / COUNTERS_FILE
        if not spans_path.is_file():
            what = "does not exist" if not root.exists() else (
                "is a file, not a trace directory" if root.is_file() else f"has no {SPANS_FILE}")
            raise TraceFormatError(f"cannot load a trace from {os.fspath(root)!r}: it {what}")

        def mapper(t):
            return STR_DTYPE if t in (pa.string(), pa.large_string()) else None

        try:
            table = pq.read_table(spans_path, use_threads=True, memory_map=True)
            raw = (table.schema.metadata or {}).get(_META_KEY)
            if raw is None:
                raise TraceFormatError(f"{os.fspath(spans_path)!r} is not an mlms-nb trace (no mlms_nb metadata)")
            info = orjson.loads(raw)
            spans = table.to_pandas(types_mapper=mapper, split_blocks=True, self_destruct=True)
            del table
            counters = (pq.read_table(counters_path).to_pandas(types_mapper=mapper)
                        if counters_path.is_file() else empty_counters())
        except TraceFormatError:
            raise
        except (OSError, pa.ArrowException, orjson.JSONDecodeError) as exc:
            raise TraceFormatError(f"cannot load the trace in {os.fspath(root)!r}: {exc}") from None
        if info.get("format") != PARQUET_FORMAT:
            raise TraceFormatError(f"{os.fspath(spans_path)!r} is not an mlms-nb trace "
                                   f"(format {info.get('format')!r})")
        spans = _restore(spans, SPAN_COLUMNS)
        counters = _restore(counters, COUNTER_COLUMNS)
        try:
            return cls(spans, counters, info.get("metadata") or {})
        except TraceSchemaError as exc:
            raise TraceFormatError(f"the trace in {os.fspath(root)!r} does not follow the schema: {exc}") from None

    # ------------------------------------------------------------------------------------------- Chrome

    def timeline(self, backend: str = "bokeh", **kwargs):
        """The zoomable timeline of these spans (``analyses.timeline``: Bokeh, or matplotlib for print)."""
        from ..analysis import timeline

        return timeline(self, backend, **kwargs)

    def layers(self, what: str = "latency", by: str = "layer"):
        """Layer occurrence, latency or memory from the layer spans (``analyses.layers``), as an ``Analysis``."""
        from ..analysis import layers

        return layers(self, what=what, by=by)

    def to_chrome(self, path: str | os.PathLike) -> Path:
        """Write Chrome trace JSON (opens in Perfetto / chrome://tracing; :meth:`from_chrome` reads it back
        without loss). Returns the path."""
        from .chrome import write_chrome

        write_chrome(self.spans, self.counters, self.metadata, path)
        return Path(path)

    @classmethod
    def from_chrome(cls, path: str | os.PathLike) -> "Trace":
        """Import Chrome trace JSON: our own export, a PyTorch Kineto trace (``torch.profiler``
        ``export_chrome_trace``, ``.json`` or ``.json.gz``) or an ONNX Runtime profile. Raises
        :class:`~mlms_nb.tracing.errors.TraceFormatError` for a malformed or truncated file."""
        from .chrome import read_chrome

        spans, counters, meta = read_chrome(path)
        return cls(spans, counters, meta)


def _restore(df: pd.DataFrame, columns: tuple[str, ...]) -> pd.DataFrame:
    """Undo what Parquet does not keep exactly: the level dtype's unused categories, canonical categories."""
    for name in df.columns:
        dtype = df[name].dtype
        if name == "level":
            if dtype != LEVEL_DTYPE:
                df[name] = df[name].astype(str).astype(LEVEL_DTYPE) if not isinstance(
                    dtype, pd.CategoricalDtype) else df[name].cat.set_categories(
                    list(LEVEL_DTYPE.categories)).astype(LEVEL_DTYPE)
        elif isinstance(dtype, pd.CategoricalDtype):
            df[name] = canonicalize(df[name], drop_unused=False)  # Parquet dictionaries hold used values only
    return df


def load_trace(path: str | os.PathLike) -> Trace:
    """Open a trace: a directory written by :meth:`Trace.save`, or a Chrome trace JSON file (``.json``,
    ``.json.gz``: our export, PyTorch Kineto, ONNX Runtime)."""
    p = Path(path)
    if p.is_dir():
        return Trace.load(p)
    return Trace.from_chrome(p)
