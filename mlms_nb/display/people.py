"""Result objects that show themselves for people: :class:`PeopleFrame` (a DataFrame whose display is the
report's table), :func:`for_people`, :class:`FramesForPeople` (every frame set on a result becomes one).
"""
from __future__ import annotations

import pandas as pd

from mlms_nb.display.layout import table_html, table_text
from mlms_nb.display.numbers import overhead_frame

#: Rows a :class:`PeopleFrame` shows before it says how many more there are
SHOWN_ROWS = 60


def _plain(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` with a meaningful index (a groupby's, a pivot's) as leading columns, so the display keeps it."""
    if isinstance(frame.index, pd.RangeIndex) and frame.index.name is None:
        return frame
    attrs = frame.attrs
    out = pd.DataFrame(frame).reset_index()
    out.attrs = attrs
    return out


class PeopleFrame(pd.DataFrame):
    """A DataFrame that displays itself for people (headers with units, digits that fit, split to the width):
    every pandas operation works as on any frame, and what it derives stays one of these. ``DataFrame(x)`` or
    ``.to_string()`` give pandas' own rendering."""

    @property
    def _constructor(self):
        return PeopleFrame

    def _repr_html_(self) -> str:
        return table_html(_read(pd.DataFrame(self)), max_rows=SHOWN_ROWS)

    def __repr__(self) -> str:
        return table_text(_read(pd.DataFrame(self)), max_rows=SHOWN_ROWS) if len(self.columns) else "(no columns)"


def _read(frame: pd.DataFrame) -> pd.DataFrame:
    """What a PeopleFrame shows: :func:`_plain`, with a tracing overhead read against its noise
    (:func:`~mlms_nb.display.numbers.overhead_frame`: never a bare negative percentage)."""
    return overhead_frame(_plain(frame))


def _shown_as(cls: type, frame):
    """``frame`` as a ``cls`` frame, its attrs kept; anything else (or already one) as it is."""
    if not isinstance(frame, pd.DataFrame) or isinstance(frame, cls):
        return frame
    out = cls(frame)
    out.attrs = dict(frame.attrs)
    return out


def for_people(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` as a :class:`PeopleFrame` (its attrs kept); anything else as it is."""
    return _shown_as(PeopleFrame, frame)


class FramesForPeople:
    """Mixin for result objects (Evaluation, Analysis, Divergence): every DataFrame set on them is kept as a
    :class:`PeopleFrame`, so a notebook shows ``ev.latency`` or ``d.outputs`` formatted."""

    def __setattr__(self, name, value) -> None:
        super().__setattr__(name, for_people(value))


#: The span columns a :class:`SpansFrame` preview shows (when present), in this order
SPAN_PREVIEW = ("name", "level", "kind", "layer_index", "layer_type", "start_ms", "duration_ms", "shape", "device",
                "thread", "flops", "bytes", "memory")


def spans_preview(frame: pd.DataFrame) -> pd.DataFrame:
    """A spans frame as people read it: start in ms from the first span shown and duration in ms (the frame keeps
    nanoseconds), no ids or JSON attributes, ``-`` where a layer index, stream or size is unknown."""
    out = pd.DataFrame(index=range(len(frame)))
    for name in SPAN_PREVIEW:
        if name == "start_ms" and "start_ns" in frame:
            start = frame["start_ns"].to_numpy(dtype="int64")
            out[name] = (start - start.min()) / 1e6 if len(start) else []
        elif name == "duration_ms" and "duration_ns" in frame:
            out[name] = frame["duration_ns"].to_numpy(dtype="int64") / 1e6
        elif name == "layer_index" and name in frame:
            index = frame[name].to_numpy()
            out[name] = pd.array([None if i < 0 else int(i) for i in index], dtype="Int64")
        elif name == "memory" and name in frame:
            out["memory_bytes"] = frame[name].to_numpy()
        elif name in frame:
            out[name] = frame[name].to_numpy()
    out.attrs["note"] = (f"{len(frame):,} spans; start: ms after the first span shown, to the µs; one clock reading "
                         "per span (no spread): durations to 3 significant figures; the frame itself holds every "
                         "column, times in ns")
    if "duration_ms" in out:
        out.attrs["figures"] = {"duration_ms": [3] * len(out)}
    if "start_ms" in out:
        out.attrs["decimals"] = {"start_ms": [3] * len(out)}
    return out


class SpansFrame(PeopleFrame):
    """A trace's spans frame (every pandas operation works; what it derives stays one of these): shown as
    :func:`spans_preview` of its first rows while it still has the span columns, else as any
    :class:`PeopleFrame`."""

    @property
    def _constructor(self):
        return SpansFrame

    def _shown(self) -> pd.DataFrame:
        head = pd.DataFrame(self.head(SHOWN_ROWS))
        if not {"name", "start_ns", "duration_ns"} <= set(head.columns):
            return _plain(head)
        shown = spans_preview(head)
        if len(self) > SHOWN_ROWS:
            rest = shown.attrs["note"].split("; ", 1)[1]
            shown.attrs["note"] = f"the first {SHOWN_ROWS} of {len(self):,} spans; {rest}"
        return shown

    def _repr_html_(self) -> str:
        return table_html(self._shown())

    def __repr__(self) -> str:
        return table_text(self._shown()) if len(self.columns) else "(no columns)"


def spans_for_people(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` (a spans frame) as a :class:`SpansFrame`, its attrs kept."""
    return _shown_as(SpansFrame, frame)
