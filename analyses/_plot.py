"""Shared plotting for the analyses: one small chart API drawn by Bokeh or by matplotlib.

Every analysis' ``plot(df, backend=...)`` builds :class:`Chart` panels (title, unit-labelled axes, log
scales, categorical rows for bar charts), draws lines / points / bars / whiskers on them and returns
:func:`combine` of them: a Bokeh layout or a matplotlib ``Figure``. Bokeh output always uses INLINE
resources (the BokehJS code travels inside the notebook or HTML; nothing is fetched from a CDN); :mod:`._output`
shows a figure in a notebook or writes it as a standalone page.

Bokeh and matplotlib are imported lazily, here only; a missing one raises :class:`MissingDependency`
naming the ``analysis`` extra.
"""
from __future__ import annotations

from typing import Any, Iterable, Sequence

import numpy as np
import pandas as pd

from mlms_nb.errors import AnalysisError

from ._titles import TOOLBAR_PX, fit_titles, matplotlib_titles, subtitles

BACKENDS = ("bokeh", "matplotlib")
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
           "#bcbd22", "#17becf")
"""Tableau 10 (matplotlib's default cycle, Bokeh's Category10): the same colours in both backends."""

_EXTRA = "pip install 'mlms-nb[analysis]'"


class MissingDependency(AnalysisError, ImportError):
    """Bokeh, matplotlib or SciPy is not installed; the message names the extra to install."""


# ------------------------------------------------------------------------------------------ input checks

def check_backend(backend: str) -> str:
    name = str(backend).strip().lower()
    if name not in BACKENDS:
        raise AnalysisError(f"unknown plot backend {backend!r}; expected one of {', '.join(BACKENDS)}")
    return name


def require_columns(df: pd.DataFrame, columns: Iterable[str], what: str) -> None:
    """Raise :class:`AnalysisError` naming the columns ``df`` lacks to be used as ``what``."""
    if not isinstance(df, pd.DataFrame):
        raise AnalysisError(f"{what}: expected a pandas DataFrame, got {type(df).__name__}")
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise AnalysisError(f"{what} lacks column(s) {', '.join(missing)}; it has: {', '.join(map(str, df.columns))}")


def require_analysis(df: pd.DataFrame, *kinds: str) -> str:
    """The ``df.attrs["analysis"]`` tag a compute() set, checked against the ones a plot() draws."""
    if not isinstance(df, pd.DataFrame):
        raise AnalysisError(f"plot: expected the DataFrame a compute() returned, got {type(df).__name__}")
    kind = df.attrs.get("analysis")
    if kind not in kinds:
        raise AnalysisError(f"plot: this frame is {'an untagged frame' if kind is None else repr(kind)}; "
                            f"this plot draws the frames of: {', '.join(kinds)}")
    return kind


def positive(value: Any, name: str) -> float:
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise AnalysisError(f"{name}: expected a positive number, got {value!r}") from None
    if not np.isfinite(x) or x <= 0:
        raise AnalysisError(f"{name}: expected a positive finite number, got {value!r}")
    return x


def scipy_stats():
    try:
        from scipy import stats
    except ImportError:
        raise MissingDependency(f"this analysis needs SciPy, which is not installed: {_EXTRA}") from None
    return stats


def _bokeh():
    try:
        import bokeh.plotting as plotting
    except ImportError:
        raise MissingDependency(f"plot backend 'bokeh' needs Bokeh, which is not installed: {_EXTRA}") from None
    return plotting


def _matplotlib_figure():
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise MissingDependency(f"plot backend 'matplotlib' needs matplotlib, which is not installed: "
                                f"{_EXTRA}") from None
    return Figure


# ------------------------------------------------------------------------------------------ charts

class Chart:
    """One panel: a one-line title with a subtitle under it (what is drawn and how it was measured), axis labels
    (with units), optional log axes, optional categorical y (bar rows), optional fixed x ticks (batch sizes).

    Create panels with :func:`charts`; draw with the methods below; :func:`combine` returns the figure. Bokeh
    panels stretch to the output's width (never narrower than the width their titles were fitted to) with the
    toolbar at the right, so no title runs under it; legends sit outside the data (right of a panel alone, under
    panels side by side). ``categories``: the labels of horizontal bar rows, top to bottom.
    """

    def __init__(self, backend: str, title: str, x_label: str, y_label: str, *, subtitle: str = "",
                 x_log: bool = False, y_log: bool = False, categories: Sequence[str] | None = None,
                 x_ticks: Sequence[float] | None = None, width: int = 720, height: int = 400, ax=None,
                 title_width: int | None = None, beside: bool = False):
        if ax is not None:
            width = int(ax.figure.get_figwidth() * 100 / len(ax.figure.axes))
        self.backend = check_backend(backend)
        self.x_label, self.y_label = x_label, y_label
        self.categories = [str(c) for c in categories] if categories is not None else None
        # the narrowest the panel is drawn at: its own width, or its share of the output column beside others
        self.narrowest = min(width, title_width or width)
        labels_px = labels_width(self.categories)
        # a title starts where the plot frame starts (after the y labels) and must end inside the canvas
        room = self.narrowest - labels_px - (TOOLBAR_PX if self.backend == "bokeh" else 10)
        self._words, self._room = (title, subtitle), room
        self.title, self.subtitle = fit_titles(title, subtitle, room)
        self.side_by_side = beside
        self._legend = False
        self._x_log = x_log
        if self.backend == "bokeh":
            plotting = _bokeh()
            kwargs: dict[str, Any] = dict(title=self.title, x_axis_label=x_label, y_axis_label=y_label, width=width,
                                          height=height, tools="pan,wheel_zoom,box_zoom,reset,save,hover",
                                          x_axis_type="log" if x_log else "linear", toolbar_location="right",
                                          sizing_mode="stretch_width", min_width=self.narrowest,
                                          min_border_right=24)  # room for a tick label at the x axis's end
            if self.categories is not None:
                kwargs["y_range"] = list(reversed(self.categories))
            else:
                kwargs["y_axis_type"] = "log" if y_log else "linear"
            self.native = plotting.figure(**kwargs)
            self.native.title.text_font_size = "11pt"
            subtitles(self.native, self.subtitle)
            if x_ticks is not None:
                from bokeh.models import FixedTicker

                from bokeh.models import NumeralTickFormatter

                self.native.xaxis.ticker = FixedTicker(ticks=[float(t) for t in x_ticks])
                self.native.xaxis.formatter = NumeralTickFormatter(format="0,0.[00]")  # 1, 4, not 10^0
        else:
            self.native = ax  # (its title is set by finish(), once the legend's room is known)
            ax.set_xlabel(x_label)
            ax.set_ylabel(y_label)
            if x_log:
                ax.set_xscale("log")
            if y_log and self.categories is None:
                ax.set_yscale("log")
            if x_ticks is not None:
                ax.set_xticks([float(t) for t in x_ticks], [f"{t:g}" for t in x_ticks])
                ax.minorticks_off()
            if self.categories is not None:
                ax.set_yticks(range(len(self.categories)), self.categories,
                              fontsize=7 if len(self.categories) > 30 else 9)
                ax.set_ylim(len(self.categories) - 0.5, -0.5)
            ax.grid(alpha=0.3)

    def _y(self, y, offset: float = 0.0):
        """Categorical y -> row positions (matplotlib) or labels (Bokeh), shifted by ``offset`` rows."""
        if self.categories is None:
            return np.asarray(y, dtype=float)
        if self.backend == "bokeh":
            return [(str(v), offset) for v in y] if offset else [str(v) for v in y]
        pos = {c: i for i, c in enumerate(self.categories)}
        return np.array([pos[str(v)] - offset for v in y], dtype=float)

    def line(self, x, y, *, label: str | None = None, color: str = PALETTE[0], dash: bool = False,
             width: float = 2.0) -> "Chart":
        x, y = np.asarray(x, dtype=float), self._y(y)
        if self.backend == "bokeh":
            kw = {"legend_label": label} if label else {}
            self.native.line(x, y, color=color, line_width=width, line_dash="dashed" if dash else "solid", **kw)
        else:
            self.native.plot(x, y, color=color, linestyle="--" if dash else "-", linewidth=width, label=label)
        self._legend |= bool(label)
        return self

    def points(self, x, y, *, label: str | None = None, color: str = PALETTE[0], marker: str = "circle",
               size: float = 8, hover: dict[str, Sequence] | None = None) -> "Chart":
        """Markers at (x, y); ``hover`` (Bokeh): extra columns shown in the tooltip, ``{"layer": names}``."""
        x, y = np.asarray(x, dtype=float), self._y(y)
        if self.backend == "bokeh":
            from bokeh.models import ColumnDataSource, HoverTool

            data = {"x": x, "y": y, **{k: list(v) for k, v in (hover or {}).items()}}
            kw = {"legend_label": label} if label else {}
            renderer = self.native.scatter("x", "y", source=ColumnDataSource(data), marker=marker, size=size,
                                           color=color, alpha=0.8, **kw)
            tool = self.native.select_one(HoverTool)
            if tool is not None:
                tool.tooltips = [(k, f"@{{{k}}}") for k in (hover or {})] + [
                    (self.x_label, "@x{0.[000]}"), (self.y_label, "@y{0.[000]}" if self.categories is None else "@y")]
                tool.renderers = [*(tool.renderers if isinstance(tool.renderers, list) else []), renderer]
        else:
            mk = {"circle": "o", "square": "s", "triangle": "^", "diamond": "D", "x": "X"}.get(marker, "o")
            self.native.scatter(x, y, marker=mk, s=size ** 2 * 0.6, color=color, alpha=0.8, label=label, zorder=3)
        self._legend |= bool(label)
        return self

    def whiskers(self, at, low, high, *, horizontal: bool = False, color: str = "#333333",
                 offset: float = 0.0) -> "Chart":
        """Spread bars: vertical from ``low`` to ``high`` at x = ``at``, or horizontal at row ``at`` (shifted by
        ``offset`` rows)."""
        low, high = np.asarray(low, dtype=float), np.asarray(high, dtype=float)
        ok = np.isfinite(low) & np.isfinite(high)
        if not ok.any():
            return self
        at = np.asarray(list(at), dtype=object)[ok]
        low, high = low[ok], high[ok]
        if horizontal:
            y = self._y(at, offset)
            if self.backend == "bokeh":
                self.native.segment(x0=low, y0=y, x1=high, y1=y, color=color, line_width=1.5)
            else:
                self.native.hlines(y, low, high, color=color, linewidth=1.2, zorder=4)
        else:
            x = np.asarray(at, dtype=float)
            if self.backend == "bokeh":
                self.native.segment(x0=x, y0=low, x1=x, y1=high, color=color, line_width=1.5)
            else:
                self.native.vlines(x, low, high, color=color, linewidth=1.2, zorder=4)
        return self

    def hbars(self, categories, values, *, color: str = PALETTE[0], label: str | None = None,
              offset: float = 0.0, thickness: float = 0.7) -> "Chart":
        """Horizontal bars on the categorical rows, ``thickness`` rows thick, shifted by ``offset`` rows (side by
        side bars: offsets -0.2 and 0.2, thickness 0.4)."""
        values = np.asarray(values, dtype=float)
        y = self._y(categories, offset)
        if self.backend == "bokeh":
            kw = {"legend_label": label} if label else {}
            self.native.hbar(y=y, left=0, right=values, height=thickness, color=color, alpha=0.85, **kw)
        else:
            self.native.barh(y, values, height=thickness, color=color, alpha=0.85, label=label)
        self._legend |= bool(label)
        return self

    def vline(self, x: float, *, label: str | None = None, color: str = "#555555") -> "Chart":
        if self.backend == "bokeh":
            from bokeh.models import Span

            self.native.add_layout(Span(location=float(x), dimension="height", line_color=color, line_dash="dotted",
                                        line_width=1.5))
            if label:
                self.text([x], None, [label], color=color)
        else:
            self.native.axvline(float(x), color=color, linestyle=":", linewidth=1.5, label=label)
            self._legend |= bool(label)
        return self

    def text(self, x, y, texts, *, color: str = "#333333") -> "Chart":
        """Labels at (x, y) (y may be categorical rows: then right of a bar's end); ``y=None`` puts every label near
        the top of the plot. A label of a point starts up and right of it, clear of its marker."""
        x, texts = np.asarray(x, dtype=float), [str(t) for t in texts]
        y = None if y is None else list(y)
        top = y is None or all(v is None for v in y)
        rows = self.categories is not None
        if self.backend == "bokeh":
            if top:
                from bokeh.models import Label

                for xi, t in zip(x, texts):
                    self.native.add_layout(Label(x=float(xi), y=self.native.height - 80, y_units="screen", text=t,
                                                 text_font_size="8pt", text_color=color, x_offset=4))
            else:
                self.native.text(x, self._y(y), text=texts, text_font_size="8pt", text_color=color,
                                 x_offset=4 if rows else LABEL_OFFSET_PX, y_offset=0 if rows else -LABEL_OFFSET_PX,
                                 text_baseline="middle" if rows else "bottom")
                self._room_for(x, texts)
        else:
            ax = self.native
            for i, (xi, t) in enumerate(zip(x, texts)):
                if top:
                    ax.annotate(t, (xi, 0.95), xycoords=("data", "axes fraction"), fontsize=7, color=color,
                                xytext=(3, 0), textcoords="offset points")
                elif rows:
                    ax.annotate(t, (xi, self._y([y[i]])[0]), fontsize=7, color=color, xytext=(3, 0),
                                textcoords="offset points", va="center")
                else:
                    ax.annotate(t, (xi, float(y[i])), fontsize=7, color=color, xytext=(LABEL_OFFSET_PT,) * 2,
                                textcoords="offset points", ha="left", va="bottom")
            if not top:
                self._room_for(x, texts)
        return self

    def _room_for(self, x: np.ndarray, texts: list[str]) -> None:
        """Widen a linear x axis so labels written right of their bars end inside the plot (about 6 px per
        character of an 8 pt label against the plot's width)."""
        finite = x[np.isfinite(x)]
        if not finite.size or finite.max() <= 0 or getattr(self, "_x_log", False):
            return
        chars = max(len(t) for t in texts)
        plot_px = max(200, (self.native.width if self.backend == "bokeh" else 500) - 260)
        end = float(finite.max()) / max(0.35, 1 - (6 * chars + 12) / plot_px)
        if self.backend == "bokeh":
            self.native.x_range.start = 0
            self.native.x_range.end = max(end, self.native.x_range.end or 0) if self.native.x_range.end else end
        else:
            self.native.set_xlim(left=0, right=max(end, self.native.get_xlim()[1]))

    def finish(self) -> None:
        """The legend, outside the data: right of a panel alone, under panels side by side; a matplotlib panel's
        title and subtitle, fitted to the plot's width less a legend beside it (they are centred over the plot)."""
        where = "below" if self.side_by_side else "right"
        if self.backend == "matplotlib":
            labels = self.native.get_legend_handles_labels()[1] if self._legend and where == "right" else []
            legend_px = 6.7 * max((len(t) for t in labels), default=0) + 40 if labels else 0
            self.title, self.subtitle = fit_titles(*self._words, self._room - legend_px)
            matplotlib_titles(self.native, self.title, self.subtitle)
        if not self._legend:
            return
        if self.backend == "bokeh":
            legend = self.native.legend[0]
            legend.click_policy = "hide"
            legend.label_text_font_size = "8pt"
            legend.border_line_alpha = 0
            if where == "below":
                legend.orientation, legend.location = "horizontal", "top_left"
            self.native.add_layout(legend, where)
        elif where == "below":
            self.native.legend(fontsize=8, loc="upper left", bbox_to_anchor=(0, -0.2), ncols=2, frameon=False,
                               borderaxespad=0)
        else:
            self.native.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1), frameon=False,
                               borderaxespad=0)


LABEL_OFFSET_PX = 7
"""How far a point's label starts from its point, right and up, in screen pixels (Bokeh): past an 8 px marker."""
LABEL_OFFSET_PT = 5
"""The same in points (matplotlib), past the marker's radius."""


BARS_PX = 420
"""The least width a bar chart keeps for its bars, right of its row labels (a panel with long labels is wider)."""


def labels_width(categories: Sequence[str] | None) -> int:
    """The pixels a panel's y axis takes: its row labels (about 6.5 px per character) and the axis label, or a
    numeric axis's ticks."""
    return int(6.5 * max((len(str(c)) for c in categories), default=0)) + 50 if categories else 70


OUTPUT_COLUMN_PX = 960
"""The width a figure's row of panels shares: about JupyterLab's output column in a 1100 px window, as the
PDF exporter draws it too."""


def charts(backend: str, specs: Sequence[dict], *, width: int = 720, height: int = 400,
           stacked: bool = False) -> list[Chart]:
    """One :class:`Chart` per spec (``dict(title=..., subtitle=..., x_label=..., y_label=..., x_log=...,
    categories=...)``, and optionally its own ``height``), side by side, or one under another when ``stacked``; for
    matplotlib they share one ``Figure``."""
    backend = check_backend(backend)
    heights = [int(spec.get("height", height)) for spec in specs]
    # bars keep their room beside long row labels: such a panel is wider (and stretches wider still)
    width = max([width] + [labels_width(spec["categories"]) + BARS_PX for spec in specs if spec.get("categories")])
    specs = [{k: v for k, v in spec.items() if k != "height"} for spec in specs]
    # side by side, each panel gets its share of the output column (a notebook's, or the PDF exporter's page): its
    # title is fitted to that width, not to the panel's own, so it ends inside its canvas
    share = None if stacked or len(specs) == 1 else OUTPUT_COLUMN_PX // len(specs)
    if backend == "bokeh":
        out = [Chart(backend, width=width, height=h, title_width=share, beside=bool(share), **spec)
               for spec, h in zip(specs, heights)]
    else:
        Figure = _matplotlib_figure()
        if stacked:
            fig = Figure(figsize=(width / 100, sum(heights) / 100), layout="constrained")
            axes = fig.subplots(len(specs), 1, squeeze=False, height_ratios=heights)[:, 0]
        else:
            fig = Figure(figsize=(width / 100 * len(specs), max(heights) / 100), layout="constrained")
            axes = fig.subplots(1, len(specs), squeeze=False)[0]
        out = [Chart(backend, ax=ax, beside=bool(share), **spec) for ax, spec in zip(axes, specs)]
    for chart in out:
        chart.stacked = stacked
    return out


def combine(panels: Sequence[Chart], title: str | None = None):
    """The figure of ``panels``: a Bokeh layout (one figure when alone) or their matplotlib ``Figure``."""
    for panel in panels:
        panel.finish()
    if panels[0].backend == "bokeh":
        if len(panels) == 1:
            return panels[0].native
        from bokeh.layouts import column, row

        arrange = column if getattr(panels[0], "stacked", False) else row
        return arrange(*[p.native for p in panels], sizing_mode="stretch_width")
    fig = panels[0].native.figure
    if title:
        fig.suptitle(title, fontsize=11)
    return fig


def color(i: int) -> str:
    return PALETTE[i % len(PALETTE)]
