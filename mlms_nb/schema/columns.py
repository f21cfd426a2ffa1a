"""What the schemas share: the :class:`Column` record, the canonical categorical, and coercing and checking a
column against its declared dtype.

Categorical columns hold their categories sorted, without unused values (:func:`canonical_categorical`), so
two frames with the same rows compare equal however they were built.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Sequence

import numpy as np
import pandas as pd

from mlms_nb.errors import TraceSchemaError
from mlms_nb.schema.levels import TraceLevel

LEVEL_NAMES: tuple[str, ...] = tuple(level.name for level in TraceLevel)
LEVEL_DTYPE = pd.CategoricalDtype(categories=list(LEVEL_NAMES), ordered=True)
"""The ``level`` column's dtype: TraceLevel names in level order; code ``i`` is ``TraceLevel(i)``."""


@dataclass(frozen=True)
class Column:
    """One column of a frame: ``dtype`` is ``"int64" | "float64" | "category" | "level"``; ``default`` fills it
    when a builder is not given it (None: it must be given)."""

    name: str
    dtype: str  # "int64" | "float64" | "category" | "level"
    unit: str
    default: Any
    doc: str


def canonical_categorical(codes: np.ndarray, categories: Sequence[str]) -> pd.Categorical:
    """A categorical from integer ``codes`` into ``categories`` (any order, may hold unused values), with its
    categories sorted and unused ones dropped -- the canonical form every builder here uses."""
    codes = np.asarray(codes, dtype=np.int64)
    cats = np.asarray(list(categories), dtype=object)
    if len(cats) == 0:
        return pd.Categorical.from_codes(np.full(len(codes), -1, np.int8) if len(codes) else codes.astype(np.int8),
                                         categories=pd.Index([], dtype="str"))
    used = np.bincount(codes, minlength=len(cats)) > 0 if len(codes) else np.zeros(len(cats), bool)
    keep = np.flatnonzero(used)
    kept = cats[keep]
    order = np.argsort(kept.astype(str), kind="stable")
    remap = np.full(len(cats), -1, dtype=np.int64)
    remap[keep[order]] = np.arange(len(keep))
    new_codes = remap[codes] if len(codes) else codes
    dtype = np.int8 if len(keep) < 127 else (np.int16 if len(keep) < 32767 else np.int32)
    return pd.Categorical.from_codes(new_codes.astype(dtype, copy=False),
                                     categories=pd.Index(list(kept[order]), dtype="str"), validate=False)


def categorical_of(values: Iterable[str]) -> pd.Categorical:
    """Strings -> canonical categorical."""
    codes, uniques = pd.factorize(np.asarray(list(values) if not isinstance(values, (np.ndarray, pd.Series,
                                                                                    pd.Index)) else values,
                                             dtype=object))
    return canonical_categorical(codes, [str(u) for u in uniques])


def canonicalize(series: pd.Series, *, drop_unused: bool = True) -> pd.Series:
    """A categorical series in canonical form (sorted ``str`` categories, none unused); returned unchanged
    when already so. ``drop_unused=False`` skips the (O(rows)) check for unused categories."""
    cat = series.array
    cats = cat.categories
    ok = cats.dtype == "str" and cats.is_monotonic_increasing and cats.is_unique
    if ok and drop_unused and len(cats):
        codes = cat.codes
        ok = bool((np.bincount(codes[codes >= 0], minlength=len(cats)) > 0).all())
    if ok:
        return series
    return pd.Series(canonical_categorical(cat.codes, [str(c) for c in cats]), index=series.index,
                     name=series.name)


def level_categorical(level_codes: np.ndarray) -> pd.Categorical:
    """TraceLevel integer values -> the ``level`` column."""
    return pd.Categorical.from_codes(np.asarray(level_codes, dtype=np.int8), dtype=LEVEL_DTYPE, validate=False)


def coerce(col: Column, values, n: int):
    if isinstance(values, pd.Series):
        values = values.array
    if col.dtype == "int64":
        return np.asarray(values, dtype=np.int64)
    if col.dtype == "float64":
        return np.asarray(values, dtype=np.float64)
    if col.dtype == "level":
        if isinstance(values, pd.Categorical) and values.dtype == LEVEL_DTYPE:
            return values
        if isinstance(values, pd.Categorical):
            return values.set_categories(list(LEVEL_NAMES)).astype(LEVEL_DTYPE)
        arr = np.asarray(values)
        if arr.dtype.kind in "iu":
            return level_categorical(arr)
        codes, uniques = pd.factorize(arr)
        try:
            values_of = np.array([TraceLevel.parse(v).value for v in uniques], dtype=np.int8)
        except Exception as exc:  # an unknown level name
            raise TraceSchemaError(f"column 'level': {exc}") from None
        if (codes < 0).any():
            raise TraceSchemaError("column 'level' has missing values")
        return level_categorical(values_of[codes] if len(values_of) else np.zeros(0, np.int8))
    if col.dtype == "category":
        if isinstance(values, pd.Categorical):
            return canonicalize(pd.Series(values)).array
        missing = "{}" if col.name == "attrs" else ""
        return categorical_of([missing if v is None or v != v else str(v) for v in values])
    raise AssertionError(col.dtype)


def default_array(col: Column, n: int):
    if col.dtype == "int64":
        return np.full(n, col.default, dtype=np.int64)
    if col.dtype == "float64":
        return np.full(n, col.default, dtype=np.float64)
    if col.dtype == "category":
        return canonical_categorical(np.zeros(n, np.int64), [col.default])
    raise TraceSchemaError(f"column {col.name!r} has no default; it must be given")


def frame_columns(schema: tuple[Column, ...], columns, required: tuple[str, ...], what: str,
                  derived=None) -> tuple[dict, int]:
    """The one builder behind the spans and counters frames: ``columns`` (name -> values; all the same length, at
    least the ``required`` ones unless there are no rows) coerced to ``schema``'s dtypes, a missing column given its
    default (``derived``: name -> function of the columns built so far, for one computed from others) -> (columns in
    schema order, number of rows)."""
    n = 0
    for v in columns.values():
        n = len(v)
        break
    missing = [c for c in required if c not in columns]
    if n and missing:
        raise TraceSchemaError(f"cannot build a {what} frame: missing column(s) {', '.join(missing)}")
    data = {}
    for col in schema:
        if col.name in columns:
            data[col.name] = coerce(col, columns[col.name], n)
        elif derived and col.name in derived and derived[col.name](data) is not None:
            data[col.name] = derived[col.name](data)
        elif col.name in required:  # no rows
            data[col.name] = _empty(col)
        else:
            data[col.name] = default_array(col, n)
    return data, n


def _empty(col: Column):
    if col.dtype == "level":
        return level_categorical(np.zeros(0, np.int8))
    if col.dtype == "category":
        return canonical_categorical(np.zeros(0, np.int64), [])
    return np.zeros(0, np.int64 if col.dtype == "int64" else np.float64)


def check_columns(df: pd.DataFrame, columns: tuple[Column, ...], what: str) -> None:
    if not isinstance(df, pd.DataFrame):
        raise TraceSchemaError(f"{what} frame must be a pandas DataFrame, not {type(df).__name__}")
    missing = [c.name for c in columns if c.name not in df.columns]
    if missing:
        raise TraceSchemaError(f"{what} frame is missing column(s): {', '.join(missing)} "
                               f"(see mlms_nb.schema.{what})")
    wrong = []
    for col in columns:
        dtype = df[col.name].dtype
        if col.dtype in ("int64", "float64"):
            ok = dtype == np.dtype(col.dtype)
            want = col.dtype
        elif col.dtype == "level":
            ok = isinstance(dtype, pd.CategoricalDtype) and dtype == LEVEL_DTYPE
            want = "ordered category of TraceLevel names"
        elif col.dtype == "category":
            ok = isinstance(dtype, pd.CategoricalDtype)
            want = "category"
        else:
            raise AssertionError(col.dtype)
        if not ok:
            wrong.append(f"{col.name} is {dtype}, expected {want}")
    if wrong:
        raise TraceSchemaError(f"{what} frame has column(s) of the wrong dtype: {'; '.join(wrong)}")
