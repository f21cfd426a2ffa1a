"""`Analysis`: what every analysis verb returns -- its table, a title, and how to draw it (shown by
:mod:`mlms_nb.display`)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import pandas as pd

from mlms_nb.display import FramesForPeople, ShownByDisplay
from mlms_nb.errors import AnalysisError


@dataclass(repr=False)
class Analysis(ShownByDisplay, FramesForPeople):
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

    @property
    def warnings(self) -> list[str]:
        """What must be read before the table is trusted (``table.attrs["warnings"]``: two different models
        compared, rows one side alone measured), one sentence each; empty when there is nothing to say."""
        return [str(w) for w in self.table.attrs.get("warnings", [])]

    def plot(self, backend: str = "bokeh", **kwargs):
        """The figure: a Bokeh layout (``backend="bokeh"``) or a matplotlib Figure (``"matplotlib"``)."""
        if self.draw is None:
            raise AnalysisError(f"the {self.name} analysis has nothing to plot")
        from ._output import Displayable

        return Displayable(self.draw(self.table, backend, **kwargs))  # shows itself as a cell's last value

    def show(self, backend: str = "bokeh", **kwargs) -> None:
        """Display the figure in a notebook (Bokeh with INLINE resources: works offline)."""
        from ._output import show

        show(self.plot(backend, **kwargs))
