"""The tracer's span record, named: the one place its layout is written down.

While recording, :class:`~mlms_nb.tracing.Tracer` appends one flat tuple per closed span::

    (span_id, parent_id, name, level, kind, start_ns, end_ns, thread, *field_names, *field_values)

``level`` is a plain int (a :class:`~mlms_nb.schema.levels.TraceLevel` value), ``kind`` a string or None (the
level's default kind), times ns on :func:`time.perf_counter_ns`, ``thread`` the OS thread id; the keyword
fields of the span follow, their names first, then their values in the same order. The tuple holds only atomic
values, so the garbage collector untracks it at its first pass; a nested dict or an IntEnum would keep every
record in every full collection, which costs more than the recording itself. That is why the hot path builds
plain tuples and not :class:`SpanRecord` instances (a NamedTuple is built by a Python-level ``__new__``).

Readers outside the tracer get records as :class:`SpanRecord` (``tracer.records(since)``); the tracer itself
and the columnar builder (:mod:`mlms_nb.tracing._build`) read the tuples by the index constants below.

A recorder that ends a session with thousands of spans of a few shapes (the torch layer wrapper: one span per
layer call, one name and set of fields per layer and input shapes) hands them over as one :class:`SpanBlock`
instead: columns, and the name and fields of each distinct *part* once, never a tuple per span.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Mapping, NamedTuple

import numpy as np

SPAN_ID, PARENT_ID, NAME, LEVEL, KIND, START_NS, END_NS, THREAD = range(8)
"""Positions of the fixed fields of a record tuple."""
FIXED = 8
"""Number of fixed fields; the keyword fields' names start here."""


class SpanRecord(NamedTuple):
    """One closed span as the tracer recorded it (before the frames are built)."""

    span_id: int
    parent_id: int
    name: str
    level: int
    kind: str | None
    start_ns: int
    end_ns: int
    thread: int
    extra: tuple = ()
    """The keyword fields, flat: their names, then their values (see :attr:`fields`)."""

    @property
    def fields(self) -> dict:
        """The span's keyword fields (columns such as ``layer_index``, and free attributes)."""
        k = len(self.extra) >> 1
        return dict(zip(self.extra[:k], self.extra[k:]))

    @classmethod
    def of(cls, record: tuple) -> "SpanRecord":
        """A record tuple -> its named view."""
        return cls(*record[:FIXED], record[FIXED:])


def record_fields(record: tuple) -> dict:
    """The keyword fields of a record tuple."""
    k = (len(record) - FIXED) >> 1
    return dict(zip(record[FIXED:FIXED + k], record[FIXED + k:]))


@dataclass(frozen=True, eq=False)
class SpanBlock:
    """Spans of one level and kind recorded in bulk, as columns (``tracer.add_block``).

    ``span_id``, ``parent_id``, ``start_ns``, ``end_ns``, ``thread``: int64 arrays, one value per span, in the
    order the spans were recorded. ``part``: per span, an index into ``parts``, the ``(name, fields)`` its spans
    share (fields as ``tracer.span`` takes them: span columns, or attributes). ``row_fields``: fields that differ
    span by span (``layer_index``), an int64 array per field name; they come first in a span's fields, as the
    keyword order of a record tuple would put them."""

    level: int
    kind: str
    span_id: np.ndarray
    parent_id: np.ndarray
    start_ns: np.ndarray
    end_ns: np.ndarray
    thread: np.ndarray
    part: np.ndarray
    parts: tuple[tuple[str, dict], ...]
    row_fields: Mapping[str, np.ndarray] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.span_id)

    def record(self, i: int) -> SpanRecord:
        """Span ``i`` as a :class:`SpanRecord` (what a record tuple of it would read)."""
        name, fields = self.parts[int(self.part[i])]
        row = {k: int(v[i]) for k, v in self.row_fields.items()}
        merged = {**row, **fields}
        return SpanRecord(int(self.span_id[i]), int(self.parent_id[i]), name, self.level, self.kind,
                          int(self.start_ns[i]), int(self.end_ns[i]), int(self.thread[i]),
                          (*merged, *merged.values()))


def part_numbers(keys, n: int) -> tuple[np.ndarray, list]:
    """The ``n`` hashable ``keys`` -> (each one's number, the distinct keys in order of first appearance), for a
    :class:`SpanBlock`'s ``part`` column and ``parts``: C-level passes (no Python loop per key, each key hashed
    once)."""
    first: dict = {}  # key -> the position it first appeared at
    at = np.fromiter(map(first.setdefault, keys, itertools.count()), np.int64, n)
    return np.unique(at, return_inverse=True)[1].astype(np.int64, copy=False), list(first)


def shared_part_numbers(keys: list) -> tuple[np.ndarray, list]:
    """:func:`part_numbers` for keys most of which are the same objects (a recorder that hands the same tuple on
    while the part does not change): numbered by identity first (C-level, no hashing of the keys' contents), then
    by value among the distinct objects only, so equal keys that are distinct objects still share a number. The
    keys must all be alive (they are ``keys``' items): their ``id`` is then unique."""
    n = len(keys)
    ids = np.fromiter(map(id, keys), np.int64, n)
    _, first, inverse = np.unique(ids, return_index=True, return_inverse=True)
    seen = np.sort(first).tolist()  # where each distinct object first appears, in order
    number_of: dict = {}  # key -> where its value first appears
    at = np.fromiter(map(number_of.setdefault, map(keys.__getitem__, seen), seen), np.int64, len(seen))
    numbers = np.unique(at, return_inverse=True)[1].ravel()
    by_id = np.empty(len(first), np.int64)  # distinct object (in id order) -> its value's number
    by_id[np.argsort(first)] = numbers
    return by_id[inverse.ravel()], list(number_of)
