"""`TableDataset`: a Parquet file or an Arrow IPC / Feather file, one row per input, read in row blocks.

The input column holds encoded files (binary: image bytes, audio bytes; or a struct with a ``bytes`` field, as
Hugging Face datasets store images) or arrays (a list column: the values of one preprocessed input, flat or
nested). The optional label column holds integer class ids; columns ``target`` (the first output; an integer
``target`` column is a label) and ``target:<output name>`` hold ground truth per output (a number or a list
column: the values of that input's output, flat or nested). Rows are read in order, one block at a time, in the
pipeline's feeder thread (Parquet row groups are decompressed there); decoding runs in the workers.
"""
from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from mlms_nb.data.datasets.arrays import as_input
from mlms_nb.data.datasets.base import Dataset, read_items, target_key
from mlms_nb.data.batch import Batch
from mlms_nb.errors import DatasetError, InputDecodeError

TABLE_SUFFIXES = (".parquet", ".pq", ".arrow", ".feather", ".ipc")
LABEL_COLUMNS = ("label", "labels", "y", "target", "class")
"""Label column names recognised when none is given."""


class TableDataset(Dataset):
    """Rows of a Parquet or Arrow file. ``column``: the input column (default: the first binary, struct-with-bytes
    or list column that is not the label); ``label_column``: class ids (default: the first of `LABEL_COLUMNS`
    present; None in the file means unlabeled)."""

    kind = "row"

    def __init__(self, path: str | os.PathLike, column: str | None = None, label_column: str | None = None):
        super().__init__()
        import pyarrow as pa

        self.path = Path(path).expanduser()
        self.name = str(self.path)
        if not self.path.is_file():
            raise DatasetError(f"{self.path}: no such file")
        self.parquet = self.path.suffix.lower() in (".parquet", ".pq")
        try:
            schema, self.rows = self._schema()
        except (OSError, pa.ArrowException) as err:
            raise DatasetError(f"{self.path}: not a readable {'Parquet' if self.parquet else 'Arrow IPC'} file "
                               f"({err})") from None
        names = list(schema.names)
        if label_column is None:  # a ``target`` column of floats or lists is ground truth, not a label
            label_column = next((n for n in LABEL_COLUMNS if n in names and (
                n != "target" or pa.types.is_integer(schema.field(n).type))), None)
        elif label_column not in names:
            raise DatasetError(f"{self.path}: no label column {label_column!r}; it has {', '.join(names)}")
        if label_column is not None and not pa.types.is_integer(schema.field(label_column).type):
            raise DatasetError(f"{self.path}: label column {label_column!r} must hold integer class ids, got "
                               f"{schema.field(label_column).type}")
        self.target_columns = {n: target_key(n) for n in names if n != label_column and target_key(n) is not None}
        if column is None:
            column = next((n for n in names if n != label_column and n not in self.target_columns
                           and _usable(schema.field(n).type)), None)
            if column is None:
                raise DatasetError(f"{self.path}: no input column (binary image/audio bytes, or a list of numbers) "
                                   f"among {', '.join(names)}; name one with TableDataset(path, column=...)")
        elif column not in names:
            raise DatasetError(f"{self.path}: no column {column!r}; it has {', '.join(names)}")
        self.column, self.label_column = column, label_column
        self.labeled = label_column is not None

    def label_ids(self) -> np.ndarray | None:
        """The label column alone (Parquet and Arrow read one column without the others)."""
        if self.label_column is None:
            return None
        import pyarrow as pa
        import pyarrow.parquet as pq

        if self.parquet:
            column = pq.read_table(self.path, columns=[self.label_column]).column(0)
        else:
            with pa.memory_map(str(self.path)) as source:
                column = pa.ipc.open_file(source).read_all().column(self.label_column)
        return column.fill_null(-1).to_numpy().astype(np.int64)

    def _schema(self):
        import pyarrow as pa
        import pyarrow.parquet as pq

        if self.parquet:
            meta = pq.ParquetFile(self.path)
            return meta.schema_arrow, meta.metadata.num_rows
        with pa.memory_map(str(self.path)) as source:
            reader = pa.ipc.open_file(source)
            return reader.schema, sum(reader.get_batch(i).num_rows for i in range(reader.num_record_batches))

    def __len__(self) -> int:
        return int(self.rows)

    def chunks(self, size: int) -> Iterator[Any]:
        import pyarrow as pa
        import pyarrow.parquet as pq

        columns = [self.column] + ([self.label_column] if self.label_column else []) + list(self.target_columns)
        start = 0
        if self.parquet:
            batches = pq.ParquetFile(self.path).iter_batches(batch_size=size, columns=columns)
            for batch in batches:
                yield start, batch
                start += batch.num_rows
            return
        with pa.memory_map(str(self.path)) as source:  # zero-copy: a block's pages are read when used
            reader = pa.ipc.open_file(source)
            for i in range(reader.num_record_batches):
                block = reader.get_batch(i).select(columns)
                for offset in range(0, block.num_rows, size):
                    part = block.slice(offset, size)
                    yield start, part
                    start += part.num_rows

    def read(self, chunk, preprocess) -> Batch:
        start, block = chunk
        values = _values(block.column(0))
        labels = None
        if self.label_column is not None:
            labels = block.column(1).fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
        ids = [f"{self.path.name}[{start + k}]" for k in range(block.num_rows)]
        targets = None
        if self.target_columns:
            first = 1 + (self.label_column is not None)
            targets = {key: _target_values(block.column(first + i), name, start)
                       for i, (name, key) in enumerate(self.target_columns.items())}
        image = getattr(getattr(preprocess, "manifest", None), "inputs", [None])[0]
        image = image is not None and image.type == "image"
        dims = getattr(preprocess, "shape", None)

        def load(k: int):
            value = values[k]
            if value is None:
                raise InputDecodeError(f"row {start + k}: the {self.column!r} cell is empty")
            if isinstance(value, bytes):
                return as_input(_open_image(value, start + k) if image else io.BytesIO(value), preprocess)
            if dims is not None and value.ndim == 1 and value.size == int(np.prod(dims)) and value.shape != dims:
                value = value.reshape(dims)  # a flat list of the input's values
            return as_input(value, preprocess)

        return read_items(ids, load, labels, range(block.num_rows), targets)


def _target_values(column, name: str, start: int) -> np.ndarray:
    """A target column's rows as one array, N first (a number per row, or a list cell per row, all one size)."""
    if column.null_count:
        raise DatasetError(f"column {name!r}: rows from {start} hold an empty target cell")
    if not _nested(column.type):
        return column.to_numpy(zero_copy_only=False)
    try:
        return np.stack(_values(column))
    except ValueError:
        raise DatasetError(f"column {name!r}: rows from {start} hold targets of different sizes in one batch; inputs "
                           "of dynamic size run one at a time") from None


def _usable(kind) -> bool:
    import pyarrow as pa

    if pa.types.is_struct(kind):
        return any(kind.field(i).name == "bytes" for i in range(kind.num_fields))
    return (pa.types.is_binary(kind) or pa.types.is_large_binary(kind) or pa.types.is_list(kind)
            or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind))


def _values(column) -> list:
    """One Python value per row: bytes for encoded files, a numpy array for a list cell, None for a null."""
    import pyarrow as pa
    import pyarrow.compute as pc

    kind = column.type
    if pa.types.is_struct(kind):
        column = column.field("bytes")
        kind = column.type
    if pa.types.is_binary(kind) or pa.types.is_large_binary(kind):
        return column.to_pylist()
    if column.null_count == 0 and not _nested(kind.value_type) and len(column):
        lengths = pc.list_value_length(column)
        if pc.min(lengths).as_py() == pc.max(lengths).as_py():  # one flat list per row: no copy
            flat = column.flatten().to_numpy(zero_copy_only=False)
            return list(flat.reshape(len(column), -1))
    return [None if cell is None else np.asarray(cell) for cell in column.to_pylist()]  # ragged or nested


def _nested(kind) -> bool:
    import pyarrow as pa

    return pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind)


def _open_image(data: bytes, row: int):
    """A lazily decoded PIL image (the preprocessor's decode step loads it)."""
    from PIL import Image, UnidentifiedImageError

    try:
        return Image.open(io.BytesIO(data))
    except (UnidentifiedImageError, OSError, ValueError) as err:
        raise InputDecodeError(f"row {row}: not an image PIL can identify ({type(err).__name__})") from None
