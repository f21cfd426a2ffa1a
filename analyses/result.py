"""`Analysis`: what every analysis verb returns -- its table, a title, and how to draw it."""
from __future__ import annotations

import html
from dataclasses import dataclass, field
from typing import Any, Callable

import pandas as pd

from mlms_nb.errors import AnalysisError


@dataclass
class Analysis:
    """One analysis result: ``table`` (units in column names, ``attrs["note"]``: how it was measured), a
    ``title``, and the function that draws it (``plot(backend)``); ``extra`` holds side tables (e.g. the
    machine ceilings under a roofline)."""
    name: str
    title: str
    table: pd.DataFrame
    draw: Callable[..., Any] | None = field(default=None, repr=False)
    extra: dict[str, pd.DataFrame] = field(default_factory=dict, repr=False)

    @property
    def note(self) -> str:
        return str(self.table.attrs.get("note", ""))

    def plot(self, backend: str = "bokeh", **kwargs):
        """The figure: a Bokeh layout (``backend="bokeh"``) or a matplotlib Figure (``"matplotlib"``)."""
        if self.draw is None:
            raise AnalysisError(f"the {self.name} analysis has nothing to plot")
        from ._plot import Displayable

        return Displayable(self.draw(self.table, backend, **kwargs))  # shows itself as a cell's last value

    def show(self, backend: str = "bokeh", **kwargs) -> None:
        """Display the figure in a notebook (Bokeh with INLINE resources: works offline)."""
        from ._plot import show

        show(self.plot(backend, **kwargs))

    def to_text(self, max_rows: int = 40) -> str:
        with pd.option_context("display.max_colwidth", 50, "display.width", 200, "display.max_rows", max_rows):
            body = self.table.to_string(index=False, max_rows=max_rows) if not self.table.empty else "(no rows)"
        return "\n".join(filter(None, [self.title, body, self.note]))

    def _repr_html_(self) -> str:
        body = (self.table.to_html(index=False, border=0, na_rep="", max_rows=60) if not self.table.empty
                else "<p>(no rows)</p>")
        note = f"<p><small>{html.escape(self.note)}</small></p>" if self.note else ""
        return f"<h4>{html.escape(self.title)}</h4>{body}{note}"

    def _repr_mimebundle_(self, include=None, exclude=None) -> dict[str, str]:
        return {"text/plain": self.to_text(), "text/html": self._repr_html_()}

    def __repr__(self) -> str:
        return self.to_text()
