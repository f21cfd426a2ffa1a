"""A figure's words on top: a one-line title and the subtitle under it (what is drawn, how it was measured), in
Bokeh and in matplotlib alike. A title longer than its panel holds on one line is cut at a clause and the rest
starts the subtitle; subtitles are wrapped to the narrowest width the panel is drawn at, so no title wraps into
the toolbar and no subtitle is cut at the canvas's edge (issue 37)."""
from __future__ import annotations

import textwrap
from typing import Sequence

TITLE_PX_PER_CHAR = 8.5
"""Width of a character of a Bokeh title (11 pt bold) or a matplotlib one (10 pt at 100 dpi), in CSS pixels."""
SUBTITLE_PX_PER_CHAR = 6.3
"""Width of a character of a subtitle (9 pt italic in Bokeh, 8 pt in matplotlib), in CSS pixels."""
TOOLBAR_PX = 40
"""The Bokeh toolbar's column at the right of the canvas."""
_BREAKS = ("; ", ": ", " (")


def split_title(title: str, subtitle: str, chars: int) -> tuple[str, str]:
    """A title that fits one line of ``chars`` characters, and the subtitle under it: a longer title is cut at its
    last ``; `` or ``: `` (else `` (``, else a space) that fits, the rest going to the start of the subtitle."""
    title, subtitle = " ".join(str(title).split()), " ".join(str(subtitle or "").split())
    if len(title) <= chars:
        return title, subtitle
    for mark in _BREAKS:
        at = title.rfind(mark, 0, chars + 1)
        if at > 0:
            break
    else:
        at = title.rfind(" ", 0, chars + 1)
        if at <= 0:
            at = chars
    head, rest = title[:at].rstrip(" ;:"), title[at:].lstrip(" ;:")
    return head, "; ".join(p for p in (rest, subtitle) if p)


def fit_titles(title: str, subtitle: str, room_px: float) -> tuple[str, list[str]]:
    """The title on one line and the subtitle's lines for a panel whose title may use ``room_px`` pixels."""
    title, subtitle = split_title(title, subtitle, max(24, int(room_px / TITLE_PX_PER_CHAR)))
    return title, (textwrap.wrap(subtitle, max(40, int(room_px / SUBTITLE_PX_PER_CHAR))) if subtitle else [])


def subtitles(fig, lines: Sequence[str]) -> None:
    """A Bokeh figure's subtitle lines, under its title, in small italics (each line a ``Title`` above the plot: the
    last one added sits right under the title)."""
    from bokeh.models import Title

    for line in reversed(list(lines)):
        fig.add_layout(Title(text=line, text_font_style="italic", text_font_size="9pt", text_color="#444444",
                             standoff=2), "above")


def matplotlib_titles(ax, title: str, lines: Sequence[str]) -> None:
    """A matplotlib panel's one-line title with its subtitle lines under it (small, italic), both centred over the
    plot (a line wider than the plot runs on over its y labels on the left, which constrained layout has room for);
    constrained layout leaves room above for both."""
    for old in [t for t in ax.texts if getattr(t, "xy", None) == (0.5, 1) and t.get_style() == "italic"]:
        old.remove()
    ax.set_title(title, fontsize=10, pad=6 + 10.5 * len(lines))
    if lines:
        ax.annotate("\n".join(lines), xy=(0.5, 1), xycoords="axes fraction", xytext=(0, 4),
                    textcoords="offset points", ha="center", va="bottom", fontsize=8, style="italic", color="#444444")


def subtitle_of(fig) -> str:
    """The subtitle written by :func:`subtitles` (a Bokeh figure) or :func:`matplotlib_titles` (a matplotlib axes),
    its lines joined by spaces as a reader reads them (for tests and tools reading a figure)."""
    if type(fig).__module__.startswith("bokeh."):
        lines = [t.text for t in fig.above if getattr(t, "text_font_style", None) == "italic"]
        return " ".join(reversed(lines))
    return " ".join(" ".join(t.get_text().split("\n")) for t in fig.texts
                    if getattr(t, "xy", None) == (0.5, 1) and t.get_style() == "italic")
