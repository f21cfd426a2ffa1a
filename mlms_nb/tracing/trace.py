"""``Trace``: the spans and counters frames of one trace, its metadata, and its files.

On disk (:meth:`Trace.save` / :meth:`Trace.load`) a trace is a **directory** holding two Parquet files::

    my_trace/
      spans.parquet      the spans frame; its key-value metadata "mlms_nb" holds the trace metadata (JSON)
      counters.parquet   the counters frame

Reopening costs little more than the memory it fills. Each file is one row group, so each column comes back as
one Arrow buffer that numpy and pandas use without a copy, and the reader decodes the columns in parallel.
Categorical columns are stored dictionary-encoded with their categories, int64 columns delta-encoded (times,
ids and counts that mostly grow: 10-1000x smaller than plain, and about 4x faster to decode than plain + LZ4
here). NaN is stored as a float value, not a null. Only float columns are LZ4-compressed: delta and dictionary
pages leave LZ4 little to gain and only cost it time to decode. Files are read memory-mapped. This layout is what
``benchmarks/trace_ingest.py``'s reopen target (>= 10M source events/s) rests on.
:meth:`Trace.to_chrome` / :meth:`Trace.from_chrome` read and write Chrome trace JSON (Perfetto,
chrome://tracing), including PyTorch Kineto and ONNX Runtime profiles (see :mod:`mlms_nb.tracing.chrome`).
"""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pandas as pd

from mlms_nb._facade import FacadeMethod
from mlms_nb.display import for_people, spans_for_people
from mlms_nb._fs import temp_path_beside
from mlms_nb.errors import TraceFormatError, TraceSchemaError
from mlms_nb.schema.columns import LEVEL_DTYPE, canonical_categorical
from mlms_nb.schema.counters import empty_counters, validate_counters
from mlms_nb.schema.spans import empty_spans, validate_spans

PARQUET_FORMAT = "mlms-nb/trace-parquet"
PARQUET_VERSION = 2
"""1: ``attrs`` as text, row groups of 65,536 rows, plain + LZ4 (still read); 2: as described above."""
SPANS_FILE = "spans.parquet"
COUNTERS_FILE = "counters.parquet"
_META_KEY = b"mlms_nb"


class Trace:
    """Spans + counters + metadata of one trace.

    ``spans`` / ``counters``: frames following :mod:`mlms_nb.schema.spans` and :mod:`mlms_nb.schema.counters`
    (validated on construction; build them with ``spans_frame`` / ``counters_frame``).
    ``metadata``: a JSON-serialisable dict (``trace_id``, ``source``, ``clock``, unavailable profilers and
    why, ...).
    """

    layers = FacadeMethod("per-layer latency")
    timeline = FacadeMethod("the spans on a timeline")
    kernels = FacadeMethod("GPU against CPU time per layer")

    def __init__(self, spans: pd.DataFrame | None = None, counters: pd.DataFrame | None = None,
                 metadata: dict[str, Any] | None = None):
        self.spans = spans_for_people(validate_spans(spans) if spans is not None else empty_spans())
        self.counters = for_people(validate_counters(counters) if counters is not None else empty_counters())
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
        import pyarrow.parquet as pq

        root = Path(path)
        if root.exists() and not root.is_dir():
            raise TraceFormatError(f"cannot save a trace to {os.fspath(root)!r}: it is a file; "
                                   f"a trace is saved as a directory")
        root.mkdir(parents=True, exist_ok=True)
        meta = orjson.dumps({"format": PARQUET_FORMAT, "version": PARQUET_VERSION, "metadata": self.metadata},
                            default=str, option=orjson.OPT_NON_STR_KEYS | orjson.OPT_SERIALIZE_NUMPY)
        for name, df, extra in ((SPANS_FILE, self.spans, {_META_KEY: meta}), (COUNTERS_FILE, self.counters, {})):
            cats = [c for c in df.columns if isinstance(df[c].dtype, pd.CategoricalDtype)]
            ints = {c: "DELTA_BINARY_PACKED" for c in df.columns if df[c].dtype == np.int64}
            lz4 = {c: "lz4" if df[c].dtype == np.float64 else "none" for c in df.columns}
            with temp_path_beside(root / name, suffix=".parquet") as tmp:  # a reader never sees half a file
                pq.write_table(_arrow_table(df, extra), tmp, compression=lz4, row_group_size=max(len(df), 1),
                               use_dictionary=cats, column_encoding=ints, write_statistics=False)
                os.replace(tmp, root / name)
        return root

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Trace":
        """Reopen a trace written by :meth:`save`."""
        import pyarrow as pa

        root = Path(path)
        spans_path, counters_path = root / SPANS_FILE, root / COUNTERS_FILE
        if not spans_path.is_file():
            what = "does not exist" if not root.exists() else (
                "is a file, not a trace directory" if root.is_file() else f"has no {SPANS_FILE}")
            raise TraceFormatError(f"cannot load a trace from {os.fspath(root)!r}: it {what}")
        pool = ThreadPoolExecutor(1) if counters_path.is_file() else None
        try:
            # the counters file is read beside the spans file (Arrow releases the GIL while it decodes)
            counters_read = pool.submit(_read_parquet, counters_path) if pool else None
            table = _read_parquet(spans_path)
            raw = (table.schema.metadata or {}).get(_META_KEY)
            if raw is None:
                raise TraceFormatError(f"{os.fspath(spans_path)!r} is not an mlms-nb trace (no mlms_nb metadata)")
            info = orjson.loads(raw)
            if info.get("format") != PARQUET_FORMAT:
                raise TraceFormatError(f"{os.fspath(spans_path)!r} is not an mlms-nb trace "
                                       f"(format {info.get('format')!r})")
            spans = _frame(table)
            del table
            counters = _frame(counters_read.result()) if counters_read else empty_counters()
        except TraceFormatError:
            raise
        except (OSError, pa.ArrowException, orjson.JSONDecodeError) as exc:
            raise TraceFormatError(f"cannot load the trace in {os.fspath(root)!r}: {exc}") from None
        finally:
            if pool:
                pool.shutdown(wait=True, cancel_futures=True)
        try:
            return cls(spans, counters, info.get("metadata") or {})
        except TraceSchemaError as exc:
            raise TraceFormatError(f"the trace in {os.fspath(root)!r} does not follow the schema: {exc}") from None

    # ------------------------------------------------------------------------------------------- Chrome

    def to_chrome(self, path: str | os.PathLike) -> Path:
        """Write Chrome trace JSON (opens in Perfetto / chrome://tracing; :meth:`from_chrome` reads it back
        without loss). Returns the path."""
        from mlms_nb.tracing.chrome import write_chrome

        write_chrome(self.spans, self.counters, self.metadata, path)
        return Path(path)

    @classmethod
    def from_chrome(cls, path: str | os.PathLike) -> "Trace":
        """Import Chrome trace JSON: our own export, a PyTorch Kineto trace (``torch.profiler``
        ``export_chrome_trace``, ``.json`` or ``.json.gz``) or an ONNX Runtime profile. Raises
        :class:`~mlms_nb.errors.TraceFormatError` for a malformed or truncated file."""
        from mlms_nb.tracing.chrome import read_chrome

        spans, counters, meta = read_chrome(path)
        return cls(spans, counters, meta)


def _read_parquet(path: Path):
    """The whole file as an Arrow table with one chunk per column of a one-row-group file (``read_table``'s
    dataset scanner would cut it into 128 Ki-row chunks that pandas then has to copy together)."""
    import pyarrow.parquet as pq

    with pq.ParquetFile(path, memory_map=True) as f:
        return f.read(use_threads=True)


def _arrow_table(df: pd.DataFrame, metadata: dict):
    """A frame -> an Arrow table without copies: categoricals as dictionary arrays of their categories, NaN
    kept as a value (pandas' own conversion would turn it into a null)."""
    import pyarrow as pa

    arrays = []
    for name in df.columns:
        col = df[name]
        if isinstance(col.dtype, pd.CategoricalDtype):
            codes = col.cat.codes.to_numpy()
            arrays.append(pa.DictionaryArray.from_arrays(
                pa.array(codes, mask=codes < 0 if (codes < 0).any() else None),
                pa.array([str(c) for c in col.cat.categories], pa.string()), ordered=bool(col.cat.ordered)))
        else:
            arrays.append(pa.array(col.to_numpy()))
    return pa.Table.from_arrays(arrays, names=[str(c) for c in df.columns], metadata=metadata or None)


def _frame(table) -> pd.DataFrame:
    """An Arrow table (as :func:`_arrow_table` writes it) -> a frame in the schema's dtypes, sharing the Arrow
    buffers of each column that came back as one chunk without nulls."""
    import pyarrow as pa

    data = {}
    for name, col in zip(table.column_names, table.columns):
        arr = col.chunk(0) if col.num_chunks == 1 else (col.combine_chunks() if col.num_chunks else
                                                         pa.array([], col.type))
        if pa.types.is_dictionary(arr.type):
            codes = arr.indices.to_numpy(zero_copy_only=False)
            if arr.indices.null_count:
                codes = np.where(arr.indices.is_null().to_numpy(zero_copy_only=False), -1, codes)
            data[name] = _categorical(name, codes, arr.dictionary.to_pylist())
        elif name == "attrs" and (pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type)):
            data[name] = pd.Categorical(arr.to_pylist())  # version 1 stored attrs as text
        else:
            data[name] = arr.to_numpy(zero_copy_only=False)
    return pd.DataFrame(data, copy=False)


def _categorical(name: str, codes: np.ndarray, categories: list) -> pd.Categorical:
    """Codes into stored categories -> the column: ``level`` in :data:`LEVEL_DTYPE`, the others with their
    categories sorted -- as :meth:`Trace.save` wrote them, so normally a zero-copy wrap of the codes. (Unused
    categories are not looked for: that is a pass over every row, and a saved frame had none.)"""
    if name == "level":
        if list(categories) == list(LEVEL_DTYPE.categories):
            return pd.Categorical.from_codes(codes.astype(np.int8, copy=False), dtype=LEVEL_DTYPE, validate=False)
        remap = np.array([LEVEL_DTYPE.categories.get_loc(str(c)) for c in categories] or [0], np.int8)
        return pd.Categorical.from_codes(np.where(codes >= 0, remap[np.maximum(codes, 0)], -1).astype(np.int8),
                                         dtype=LEVEL_DTYPE, validate=False)
    cats = pd.Index([str(c) for c in categories], dtype="str")
    if cats.is_monotonic_increasing and cats.is_unique:
        return pd.Categorical.from_codes(codes, categories=cats, validate=False)
    if (codes < 0).any():  # missing values: sort the categories by way of the values
        values = np.asarray(cats, dtype=object).take(np.maximum(codes, 0)) if len(cats) else np.full(
            len(codes), None, dtype=object)
        values[codes < 0] = None
        return pd.Categorical(values)
    return canonical_categorical(codes, list(cats))


def load_trace(path: str | os.PathLike) -> Trace:
    """Open a trace: a directory written by :meth:`Trace.save`, or a Chrome trace JSON file (``.json``,
    ``.json.gz``: our export, PyTorch Kineto, ONNX Runtime)."""
    p = Path(path)
    if p.is_dir():
        return Trace.load(p)
    return Trace.from_chrome(p)
