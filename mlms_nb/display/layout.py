"""Formatted tables cut to fit and rendered: :func:`split_columns` (parts no wider than an A4 page or a notebook's
output column, the key columns repeated in every part), :func:`table_html` (class ``mlms-table``) and
:func:`table_text`; :class:`TableView` is what a notebook displays (both renderings), :func:`show_table` shows it.

No word is ever broken, in a header or a cell: HTML wraps a header or a text cell between its words only (CSS
``overflow-wrap: normal``; numbers never wrap), and a long identifier (a path, a module name, a sha256) gets
break opportunities (``<wbr>``) after its separators, or between groups of 16 characters of a hash, so it wraps
where a reader would and never widens the table past the page; plain text never wraps. What still does not fit
is split into parts of whole columns.
"""
from __future__ import annotations

import html
import re
from dataclasses import dataclass
from typing import Sequence

import pandas as pd

from mlms_nb.display.columns import MAX_CHARS, MISSING, format_frame

#: A text cell or header longer than this may wrap (between words, after an identifier's separators)
WRAP_CHARS = 24
#: Widest HTML table part, in the characters :func:`width_of` counts: an A4 page's 695 px of 7.5 pt print holds
#: about 113 (a digit is 6.4 px, bold headers and cell padding add the rest; measured on a layers-by-phase table),
#: so a part never needs the print script's second split; plain text keeps :data:`MAX_CHARS` (a terminal)
HTML_MAX_CHARS = 110
#: Longest text cell of a plain-text table (a sentence is shortened at a space; an identifier never)
TEXT_MAX_CHARS = 48


def _pieces(text: str) -> list[str]:
    """The pieces a cell may wrap into without breaking a word (see :func:`breakable_html`)."""
    return [p for word in text.split() for p in _word_pieces(word)]


def width_of(column: pd.Series, header: str, whole_header: bool = False) -> int:
    """Characters a column needs: its longest cell (a cell over :data:`WRAP_CHARS` that wraps counts as its
    longest piece, at least that many) or its header's longest word (HTML wraps a header between its words), or
    its whole header (``whole_header``: plain text, where nothing wraps), whichever is wider."""
    if whole_header:
        cells = max((len(str(v)) for v in column), default=0)
        head = len(header.strip())
    else:
        cells = max((len(t) if len(t) <= WRAP_CHARS else max(WRAP_CHARS, *map(len, _pieces(t)))
                     for t in map(str, column)), default=0)
        head = max((len(w) for w in _pieces(header)), default=0)
    return max(cells, head) + 2


def split_columns(table: pd.DataFrame, max_chars: int = MAX_CHARS, whole_headers: bool = False) -> list[pd.DataFrame]:
    """A formatted table cut into parts of whole columns, each at most ``max_chars`` characters wide (a single
    column wider than that gets a part of its own); the key columns (``attrs["keys"]``) start every part, as many
    as fit in half the width (the first always). ``whole_headers``: a header is as wide as all its words (plain
    text), not its longest word (HTML)."""
    keys, key_width = [], 0
    for k in (k for k in table.attrs.get("keys", []) if k in table.columns):
        w = width_of(table[k], k, whole_headers)
        if keys and key_width + w > max_chars // 2:
            break
        keys.append(k)
        key_width += w
    rest = [c for c in table.columns if c not in keys]
    parts, current, used = [], [], key_width
    for col in rest:
        w = width_of(table[col], col, whole_headers)
        if current and used + w > max_chars:
            parts.append(current)
            current, used = [], key_width
        current.append(col)
        used += w
    if current or not parts:
        parts.append(current)
    out = []
    for cols in parts:
        part = table[keys + cols]
        part.attrs = {**table.attrs, "keys": keys}
        out.append(part)
    return out


def table_html(frame: pd.DataFrame, title: str | None = None, note: str | None = None,
               key: Sequence[str] | None = None, columns: Sequence[str] | None = None, max_chars: int = MAX_CHARS,
               max_rows: int | None = None, formatted: bool = False, max_text: int | None = None) -> str:
    """HTML of ``frame`` formatted (unless ``formatted``) and split to fit: ``<div class="mlms-table">`` holding
    a caption, one ``<table>`` per part and the note. ``max_rows``: show the first rows and say how many more;
    ``max_text``: longer text is shortened at a space, with an ellipsis (default: never; HTML wraps text between
    its words)."""
    more = 0
    if max_rows is not None and len(frame) > max_rows:  # format only what is shown (a trace has a million spans)
        more, attrs = len(frame) - max_rows, frame.attrs
        frame = frame.head(max_rows)
        frame.attrs = attrs
    table = frame if formatted else format_frame(frame, key=key, columns=columns,
                                                 max_text=max_text if max_text is not None else 1 << 30)
    note = table.attrs.get("note", "") if note is None else note
    parts = split_columns(table, min(max_chars, HTML_MAX_CHARS))
    keys = set(parts[0].attrs.get("keys", []))
    align = {c: "key" if c in keys else ("num" if all(_align(v) == "num" for v in table[c]) else "text")
             for c in table.columns}
    out = ['<div class="mlms-table">']
    if title:
        out.append(f'<p class="mlms-table-title"><b>{breakable_html(title)}</b></p>')
    for i, part in enumerate(parts):
        label = f" ({i + 1} of {len(parts)}: columns continue)" if len(parts) > 1 and i < len(parts) - 1 else ""
        out.append(f'<table class="mlms-split" data-part="{i + 1}">')
        out.append("<thead><tr>" + "".join(
            f'<th class="{align[c]}" style="{_HEAD[align[c]]}">{breakable_html(c.strip())}</th>' for c in part.columns)
            + "</tr></thead><tbody>")
        for row in part.itertuples(index=False):
            out.append("<tr>" + "".join(
                f'<td class="{align[c]}" style="{_STYLE[align[c]]}{_UNSTABLE if str(v).endswith((" unstable", " busy")) else ""}">'
                f'{html.escape(str(v)) if align[c] == "num" else breakable_html(str(v))}</td>'
                for c, v in zip(part.columns, row)) + "</tr>")
        out.append("</tbody></table>")
        if label:
            out.append(f'<p class="mlms-table-cont"><small>{html.escape(label.strip(" ()"))}</small></p>')
    if more:
        out.append(f"<p><small>… and {more} more rows (the notebook's frame holds them all)</small></p>")
    if note:
        out.append(f'<p class="mlms-table-note"><small>{breakable_html(note)}</small></p>')
    out.append("</div>")
    return "\n".join(out)


_WORDS = "white-space:normal;overflow-wrap:normal;word-break:normal"
_STYLE = {"key": f"text-align:left;{_WORDS}", "text": f"text-align:left;{_WORDS}",
          "num": "text-align:right;white-space:nowrap"}
_HEAD = {"key": f"text-align:left;{_WORDS}", "text": f"text-align:left;{_WORDS}", "num": f"text-align:right;{_WORDS}"}
"""Inline, so that JupyterLab (which right-aligns every cell) and any page around the table show text left and
numbers right, wrap a header or a text cell between words only and never a number; print.css says the same for
the PDF."""

_UNSTABLE = ";color:#b00"
"""A measurement tagged unstable (its IQR over 10% of its median) or busy (timed while other programs took the CPU it
needed: :mod:`mlms_nb.profilers.load`) reads red."""

_BREAK = re.compile(r"([/\\_.:=,;&?@~|+\-\[\](){}]+)(?=.)")
"""An identifier's separators: a line may break after them (``/home/user/`` | ``model.onnx``)."""
_HASH = re.compile(r"[0-9A-Za-z]{32,}")
"""A run of letters and digits too long to be a word (a sha256, an id): grouped by 16 for reading and wrapping."""


def _group(match: re.Match) -> str:
    run = match.group(0)
    return "\0".join(run[i:i + 16] for i in range(0, len(run), 16))


def breakable_html(text: str) -> str:
    """``text`` escaped for HTML, with a break opportunity (``<wbr>``) after each separator of a word longer
    than :data:`WRAP_CHARS` and between the 16-character groups of a hash, and a shorter word with a hyphen kept
    whole: it wraps there or between words, never inside a word, and reads (and copies) the same."""
    return "".join(_word_html(w) for w in re.split(r"(\s+)", text))


def _word_html(word: str) -> str:
    """One word as HTML: a long identifier with its <wbr>; a short word with a hyphen or a slash (``one-node``,
    ``IQR/median``, ``onnxruntime-int8``) kept on one line, where a browser would break after the hyphen."""
    pieces = _word_pieces(word)
    if len(pieces) > 1:
        return "<wbr>".join(map(html.escape, pieces))
    if _INNER_BREAK.search(word):
        return f'<span style="white-space:nowrap">{html.escape(word)}</span>'
    return html.escape(word)


_INNER_BREAK = re.compile(r"\w[-/\u2010-\u2014]\w")
"""A hyphen or a slash between two letters: a browser may break the line after it."""


def _word_pieces(word: str) -> list[str]:
    """A word as the pieces it may wrap into: itself up to :data:`WRAP_CHARS` characters, else its parts after
    each separator, a hash in groups of 16."""
    if len(word) <= WRAP_CHARS or word.isspace():
        return [word]
    return [p for p in _BREAK.sub("\\1\0", _HASH.sub(_group, word)).split("\0") if p]


def _align(value: str) -> str:
    """``num`` for a number (or the missing mark), else ``text``."""
    v = str(value).replace(",", "").replace("%", "").strip()
    if v in (MISSING, "inf", "-inf"):
        return "num"
    try:
        float(v)
        return "num"
    except ValueError:
        return "text"


def table_text(frame: pd.DataFrame, title: str | None = None, note: str | None = None,
               key: Sequence[str] | None = None, columns: Sequence[str] | None = None, max_chars: int = MAX_CHARS,
               formatted: bool = False, max_text: int | None = None, max_rows: int | None = None) -> str:
    """Plain text of ``frame``, formatted and split like :func:`table_html`; text longer than ``max_text``
    (default :data:`TEXT_MAX_CHARS`) is shortened at a space: a terminal line does not wrap."""
    more = 0
    if max_rows is not None and len(frame) > max_rows:
        more, attrs = len(frame) - max_rows, frame.attrs
        frame = frame.head(max_rows)
        frame.attrs = attrs
    table = frame if formatted else format_frame(frame, key=key, columns=columns,
                                                 max_text=TEXT_MAX_CHARS if max_text is None else max_text)
    note = table.attrs.get("note", "") if note is None else note
    lines = [title] if title else []
    for part in split_columns(table, max_chars, whole_headers=True):
        widths = {c: width_of(part[c], c, whole_header=True) - 2 for c in part.columns}  # nothing wraps here
        lines.append("  ".join(c.strip().rjust(widths[c]) for c in part.columns))
        for row in part.itertuples(index=False):
            lines.append("  ".join(str(v).rjust(widths[c]) for c, v in zip(part.columns, row)))
        lines.append("")
    if more:
        lines.append(f"… and {more} more rows")
    if note:
        lines.append(note)
    return "\n".join(lines).rstrip()


@dataclass
class TableView:
    """A formatted, split table a notebook displays (HTML, and plain text for text-only front ends)."""
    frame: pd.DataFrame
    title: str | None = None
    note: str | None = None
    key: Sequence[str] | None = None
    columns: Sequence[str] | None = None
    max_rows: int | None = None
    max_chars: int = MAX_CHARS
    max_text: int | None = None

    def _repr_html_(self) -> str:
        return table_html(self.frame, self.title, self.note, self.key, self.columns, self.max_chars, self.max_rows,
                          max_text=self.max_text)

    def __repr__(self) -> str:
        frame = self.frame if self.max_rows is None else self.frame.head(self.max_rows)
        frame.attrs = self.frame.attrs
        return table_text(frame, self.title, self.note, self.key, self.columns, self.max_chars, max_text=self.max_text)


def show_table(frame: pd.DataFrame, title: str | None = None, note: str | None = None, **kwargs) -> None:
    """Display ``frame`` as a report table in a notebook (see :class:`TableView`)."""
    from IPython.display import display

    display(TableView(frame, title, note, **kwargs))

