"""Small display helpers for the report's sections: a one-line note, a heading, a static figure, and the
decorator that turns a section's failure into one line saying why it is left out."""
from __future__ import annotations

import functools
import html
import io
from typing import Callable

#: Widest figure, in CSS pixels, before the notebook or the page scales it down.
MAX_FIGURE_PX = 900
FIGURE_DPI = 144
#: Widest matplotlib figure, in inches at 100 px per inch: wider ones are re-laid out to this width.
MAX_FIGURE_IN = 10.0


class Line:
    """One line of text, shown as a paragraph with a CSS class (``mlms-left-out``, ``mlms-note``)."""

    def __init__(self, text: str, kind: str = "note", prefix: str = ""):
        self.text, self.kind, self.prefix = text, kind, prefix

    def _repr_html_(self) -> str:
        lead = f"<b>{html.escape(self.prefix)}</b> " if self.prefix else ""
        # a plain note introduces what follows it (a figure, a table): print keeps the two on one page
        kind = f"mlms-{self.kind}" + (" mlms-lead" if self.kind == "note" and not self.prefix else "")
        return f'<p class="{kind}">{lead}{html.escape(self.text)}</p>'

    def __repr__(self) -> str:
        return f"{self.prefix} {self.text}".strip()


class Block:
    """Preformatted text (a command line), shown as a code block."""

    def __init__(self, text: str):
        self.text = text

    def _repr_html_(self) -> str:
        return f'<pre class="mlms-command">{html.escape(self.text)}</pre>'

    def __repr__(self) -> str:
        return self.text


def display(*objects) -> None:
    from IPython.display import display as _display

    _display(*objects)


def note(text: str, prefix: str = "") -> None:
    display(Line(text, "note", prefix))


def detail(text: str) -> None:
    """A long explanation (how a table or figure was measured), in small type."""
    display(Line(text, "detail"))


def left_out(reason: str) -> None:
    """The one line a section without data shows."""
    display(Line(reason.rstrip(".") + ".", "left-out", "Left out:"))


def heading(text: str, level: int = 3) -> None:
    from IPython.display import Markdown

    display(Markdown(f"{'#' * level} {text}"))


def figure(fig, backend: str = "matplotlib") -> None:
    """Show ``fig``: a matplotlib Figure as a PNG no wider than :data:`MAX_FIGURE_PX` (so it fits the notebook
    column and the page), a Bokeh figure as is (the PDF exporter turns it into a PNG)."""
    if type(fig).__module__.startswith("bokeh."):
        from mlms_nb.reporting import _api

        _api.show_figure(fig)
        return
    from IPython.display import Image

    width_in, height_in = fig.get_size_inches()
    # re-laid out narrower, so its text stays readable on the page; where its panels are too wide for that (long
    # row labels side by side) the layout gives up, and it keeps its width (scaled down as an image)
    for width in ([MAX_FIGURE_IN] if width_in > MAX_FIGURE_IN else []) + [width_in]:
        fig.set_size_inches(width, height_in)
        if _laid_out(fig):
            break
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=FIGURE_DPI, facecolor="white")
    width_px = int(round(fig.get_figwidth() * 100))  # the figure's size at 100 dpi, its "natural" CSS size
    titles = [t for t in ([fig._suptitle.get_text()] if getattr(fig, "_suptitle", None) else []) +
              [ax.get_title() for ax in fig.axes] if t]
    display(Image(data=buf.getvalue(), format="png", width=min(width_px, MAX_FIGURE_PX),
                  metadata={"alt": " / ".join(titles)[:300] or "figure"}))


def report_table(frame, title: str, note: str | None = None, **kwargs) -> None:
    """A table of the report (:func:`mlms_nb.display.show_table`) whose note (``note``, else the frame's
    ``attrs["note"]``) is shown as numbered footnotes: the title names their numbers, and the ones not yet shown in
    this report follow the table (:mod:`mlms_nb.reporting.notes`)."""
    from mlms_nb.display import show_table
    from mlms_nb.reporting import notes

    text = (getattr(frame, "attrs", {}) or {}).get("note", "") if note is None else note
    refs, new = notes.referenced(text or "")
    show_table(frame, title + refs, note="", **kwargs)
    if new is not None:
        display(new)


def _collapses(fig, draws: int = 2) -> bool:
    """Whether matplotlib's constrained layout gives up on ``fig`` at its size (its axes would shrink to nothing);
    drawn twice by default, as a layout that barely holds on a first draw (from the old positions) may give up on
    the next."""
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(draws):
            fig.savefig(io.BytesIO(), format="png", dpi=40)
    return any("collapsed" in str(w.message) for w in caught)


def _laid_out(fig) -> bool:
    """Lay ``fig`` out at its size and keep the first layout that holds (matplotlib's constrained layout, drawn
    again, may give up where it held the draw before: a marginal one alternates), its layout engine then set aside,
    so the figure saved is the one laid out; False when three draws all gave up (its axes would shrink to
    nothing). A figure without a layout engine is laid out as it is."""
    if fig.get_layout_engine() is None:
        return True
    for _ in range(3):
        if not _collapses(fig, draws=1):
            fig.set_layout_engine("none")
            return True
    return False


def section(fn: Callable) -> Callable:
    """Run a section with framework chatter silenced; when it fails (no data, a missing optional piece), show one
    line saying why instead."""

    @functools.wraps(fn)
    def run(*args, **kwargs):
        from mlms_nb._quiet import quiet
        from mlms_nb.errors import MlmsError

        try:
            with quiet():
                return fn(*args, **kwargs)
        except MlmsError as err:
            left_out(str(err))
        except (ImportError, OSError, ValueError, KeyError) as err:
            left_out(f"{fn.__name__.replace('_', ' ')} could not be computed: {type(err).__name__}: {err}")
        return None

    return run
