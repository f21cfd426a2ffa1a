"""The parts a verb's page is made of: :class:`Table` (a frame with a title and a note), :class:`Notes` (a titled
list), :class:`Section` (a titled part) and :class:`Page` (parts one after another); :func:`records` (a frame as
JSON-ready rows)."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

MAX_ROWS = 60
"""Rows of a table shown before the rest is elided."""


@dataclass
class Table:
    """A frame with a title (units belong in its column names), the note on how it was measured and what to
    say when it has no rows."""
    frame: pd.DataFrame
    title: str = ""
    note: str | None = None
    empty: str = "(no rows)"

    def __post_init__(self) -> None:
        if self.note is None:
            self.note = str(self.frame.attrs.get("note", ""))


@dataclass
class Notes:
    """A titled list of sentences (manifests that failed to load, what could not be traced)."""
    title: str
    items: list[str]


@dataclass
class Section:
    """A part under a heading (``torch: <trace summary>``)."""
    title: str
    body: Any


@dataclass
class Page:
    """Parts shown one after another (each is anything :func:`render_text` takes)."""
    parts: list = field(default_factory=list)



def records(frame: pd.DataFrame) -> list[dict]:
    return json.loads(frame.to_json(orient="records", default_handler=str)) if not frame.empty else []

