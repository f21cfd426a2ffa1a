"""Result objects that show themselves for people: :class:`PeopleFrame` (a DataFrame whose display is the
report's table), :func:`for_people`, :class:`FramesForPeople` (every frame set on a result becomes one),
:func:`people_table` (an analysis's table function returns one).

What a user does to a shown frame is kept: a selection of columns shows those columns (a spans frame's too), a
``.round(3)`` shows three decimals, and a selection that drops the CI columns keeps the digits the CI gave
(:func:`~mlms_nb.display.spread.carried_figures`). A user's own DataFrame is never touched.
"""
from __future__ import annotations

import functools

import pandas as pd

from mlms_nb.display.layout import table_html, table_text
from mlms_nb.display.numbers import CONDITIONS_CHANGED, overhead_frame
from mlms_nb.display.spread import carried_figures
from mlms_nb.schema.spans import SPAN_COLUMNS

#: Rows a :class:`PeopleFrame` shows before it says how many more there are
SHOWN_ROWS = 60


def _plain(frame: pd.DataFrame, carried: dict | None = None) -> pd.DataFrame:
    """``frame`` as a plain DataFrame to format, with a meaningful index (a groupby's, a pivot's) as leading
    columns, so the display keeps it; ``carried`` (column -> figures by index label) given to the display by row
    position (``attrs["row_figures"]``)."""
    attrs = dict(frame.attrs)
    if carried:
        attrs["row_figures"] = {c: f.reindex(frame.index).fillna(-1).astype(int).tolist()
                                for c, f in carried.items() if c in frame.columns and f.index.is_unique}
    plain = pd.DataFrame(frame)
    if not (isinstance(frame.index, pd.RangeIndex) and frame.index.name is None):
        plain = plain.reset_index()
    else:
        plain = plain.copy(deep=False)
    plain.attrs = attrs
    return plain


class PeopleSeries(pd.Series):
    """A column of a :class:`PeopleFrame`: shown as pandas shows a Series, but what it grows into (a groupby's
    ``.agg(["count", "median"])``, ``.to_frame()``, ``.unstack()``) is a :class:`PeopleFrame` again."""

    @property
    def _constructor(self):
        return PeopleSeries

    @property
    def _constructor_expanddim(self):
        return PeopleFrame


class PeopleFrame(pd.DataFrame):
    """A DataFrame that displays itself for people (headers with units, digits that fit, split to the width):
    every pandas operation works as on any frame, and what it derives stays one of these. ``DataFrame(x)`` or
    ``.to_string()`` give pandas' own rendering."""

    _metadata = ["_row_figures"]
    _row_figures = None
    """The digits the frame's spread supported when the library made it (column -> figures by index label;
    :func:`~mlms_nb.display.spread.carried_figures`): pandas carries them to what a selection or a filter derives
    (not in ``attrs``: they are never saved, compared or concatenated)."""

    @property
    def _constructor(self):
        return PeopleFrame

    @property
    def _constructor_sliced(self):
        return PeopleSeries

    def round(self, decimals=0, *args, **kwargs):
        """pandas' ``round``, remembered (``attrs["rounded"]``: column -> decimals), so the display shows the
        decimals the user asked for instead of the spread's."""
        out = super().round(decimals, *args, **kwargs)
        if isinstance(decimals, int):
            asked = {c: decimals for c in self.columns}
        else:
            asked = {c: int(d) for c, d in dict(decimals).items() if c in self.columns}
        out.attrs = {**self.attrs, "rounded": {**(self.attrs.get("rounded") or {}), **asked}}
        return out

    def _repr_html_(self) -> str:  # the note (attrs["note"]) stays in the frame: the result's own display shows it
        shown, note = _read(self)
        return table_html(shown, note=note, max_rows=SHOWN_ROWS)

    def __repr__(self) -> str:
        if not len(self.columns):
            return "(no columns)"
        shown, note = _read(self)
        return table_text(shown, note=note, max_rows=SHOWN_ROWS)


def _read(frame: "PeopleFrame") -> tuple[pd.DataFrame, str]:
    """What a PeopleFrame shows, and the note under it: :func:`_plain`, with a tracing overhead read against its
    noise (:func:`~mlms_nb.display.numbers.overhead_frame`: never a bare negative percentage), whose caveat is the
    one note shown (a traced pass faster than the untraced one measures no overhead, and why)."""
    shown = overhead_frame(_plain(frame, frame._row_figures))
    faster = "overhead" in shown and any(str(text).startswith("none: ") for text in shown["overhead"])
    return shown, CONDITIONS_CHANGED if faster else ""


def _shown_as(cls: type, frame):
    """``frame`` as a ``cls`` frame, its attrs kept and the digits its spread supports stored by row (they follow
    a selection that drops the CI); anything else (or already one) as it is."""
    if not isinstance(frame, pd.DataFrame) or isinstance(frame, cls):
        return frame
    out = cls(frame)
    out.attrs = dict(frame.attrs)
    if cls is PeopleFrame:  # spans carry no spread (and a million rows)
        out._row_figures = carried_figures(frame) or None
    return out


def for_people(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` as a :class:`PeopleFrame` (its attrs kept); anything else as it is."""
    return _shown_as(PeopleFrame, frame)


def people_table(make):
    """Decorator: the frame ``make`` returns (an analysis's table) is a :class:`PeopleFrame`, so a notebook that
    calls ``roofline.compute(...)`` shows it formatted (no e-notation, bytes with units)."""

    @functools.wraps(make)
    def made(*args, **kwargs):
        return for_people(make(*args, **kwargs))
    return made


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
    """A trace's spans frame (every pandas operation works; what it derives stays one of these): the whole frame
    (every span column, any rows) is shown as :func:`spans_preview` of its first rows; a selection of columns
    shows exactly those columns, in their own units (``start_ns`` stays ns, ``attrs`` stays), as any
    :class:`PeopleFrame`."""

    @property
    def _constructor(self):
        return SpansFrame

    def _shown(self) -> pd.DataFrame:
        head = self.head(SHOWN_ROWS)
        if not set(SPAN_COLUMNS) <= set(head.columns):  # the user chose these columns: show them as they are
            plain = _plain(head)
            plain.attrs["note"] = ""
            return plain
        shown = spans_preview(head)
        if len(self) > SHOWN_ROWS:
            rest = shown.attrs["note"].split("; ", 1)[1]
            shown.attrs["note"] = f"the first {SHOWN_ROWS} of {len(self):,} spans; {rest}"
        return shown

    def _repr_html_(self) -> str:
        more = f"<p><small>… and {len(self) - SHOWN_ROWS:,} more rows</small></p>" if self._cut() else ""
        return table_html(self._shown()) + more

    def __repr__(self) -> str:
        if not len(self.columns):
            return "(no columns)"
        return table_text(self._shown()) + (f"\n… and {len(self) - SHOWN_ROWS:,} more rows" if self._cut() else "")

    def _cut(self) -> bool:
        """A selection of columns shown in part (the whole frame's preview says so in its note)."""
        return len(self) > SHOWN_ROWS and not set(SPAN_COLUMNS) <= set(self.columns)


def spans_for_people(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` (a spans frame) as a :class:`SpansFrame`, its attrs kept."""
    return _shown_as(SpansFrame, frame)
