"""Result objects that show themselves for people: :class:`PeopleFrame` (a DataFrame whose display is the
report's table), :func:`for_people`, :class:`FramesForPeople` (every frame set on a result becomes one).
"""
from __future__ import annotations

import pandas as pd

from mlms_nb.display.layout import table_html, table_text

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
        return table_html(_plain(pd.DataFrame(self)), max_rows=SHOWN_ROWS)

    def __repr__(self) -> str:
        return table_text(_plain(pd.DataFrame(self)), max_rows=SHOWN_ROWS) if len(self.columns) else "(no columns)"


def for_people(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` as a :class:`PeopleFrame` (its attrs kept); anything else as it is."""
    if not isinstance(frame, pd.DataFrame) or isinstance(frame, PeopleFrame):
        return frame
    out = PeopleFrame(frame)
    out.attrs = dict(frame.attrs)
    return out


class FramesForPeople:
    """Mixin for result objects (Evaluation, Analysis, Divergence): every DataFrame set on them is kept as a
    :class:`PeopleFrame`, so a notebook shows ``ev.latency`` or ``d.outputs`` formatted."""

    def __setattr__(self, name, value) -> None:
        super().__setattr__(name, for_people(value))
