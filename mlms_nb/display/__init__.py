"""How every result is shown: plain text, HTML and JSON of evaluations, analyses, divergences, trace summaries
and frames, in one place (torch.utils.benchmark keeps `Measurement` data-only and renders in `Compare`; the same
split here). Value objects hold data and derived views; their ``__repr__``/``_repr_mimebundle_`` come from
:class:`ShownByDisplay`, which calls this.

Low in the layers: it imports only the schemas and nothing else of mlms_nb, and reads the objects' public
attributes (duck typing), so the data objects delegate to it without an import upward. What every rendering
keeps: units in every header, how the numbers were measured (the note), the 95% CI of the median and "unstable"
warnings.

- :func:`render_text`, :func:`render_html`, :func:`render_json` (JSON-ready data), :func:`mimebundle`;
- :class:`Table` (a frame with a title and a note), :class:`Notes` (a titled list), :class:`Section` (a titled
  part) and :class:`Page` (parts shown one after another) compose what a verb shows.

The package, one module per concern (each under 400 lines):

- :mod:`~mlms_nb.display.columns` -- one column's header, unit, scale and digits; a frame as strings;
- :mod:`~mlms_nb.display.spread` -- the digits a measured spread supports (torch.utils.benchmark's rule), row by row;
- :mod:`~mlms_nb.display.units` -- unit prefixes;
- :mod:`~mlms_nb.display.layout` -- a formatted table split to an A4 page / a notebook cell, as text and HTML;
- :mod:`~mlms_nb.display.people` -- PeopleFrame (and people_table, which makes an analysis's table one), and the
  display plumbing the result classes share;
- :mod:`~mlms_nb.display.numbers` -- single numbers in words;
- :mod:`~mlms_nb.display.parts` -- Table, Notes, Section, Page;
- :mod:`~mlms_nb.display.evaluation` / :mod:`~mlms_nb.display.results` -- evaluations; analyses, divergences, traces.
"""
from __future__ import annotations

import html
import json
from typing import Any

import pandas as pd

from mlms_nb.display.columns import format_frame, format_number
from mlms_nb.display.spread import significant_figures, spread_decimals
from mlms_nb.display.evaluation import (PANEL_LINK_PREFIX, evaluation_html, evaluation_json, evaluation_text,
                                        panel_link_html, target_text)
from mlms_nb.display.layout import breakable_html, show_table, split_columns, table_html, table_text, width_of
from mlms_nb.display.numbers import fmt_int, fmt_num, fmt_overhead, fmt_pct, is_missing, is_set, overhead_frame
from mlms_nb.display.parts import MAX_ROWS, Notes, Page, Section, Table, records
from mlms_nb.display.people import (FramesForPeople, PeopleFrame, PeopleSeries, SpansFrame, for_people, people_table,
                                    spans_for_people, spans_preview)
from mlms_nb.display.results import (analysis_json, analysis_parts, divergence_html, divergence_json,
                                     divergence_text, trace_parts)

__all__ = ["render_text", "render_html", "render_json", "mimebundle", "dumps", "records", "Table", "Notes",
           "Section", "Page", "MAX_ROWS", "fmt_num", "fmt_int", "fmt_pct", "fmt_overhead", "overhead_frame",
           "is_missing", "is_set", "panel_link_html", "PANEL_LINK_PREFIX", "target_text", "format_frame", "format_number",
           "significant_figures", "spread_decimals", "split_columns", "width_of", "table_html", "table_text", "show_table", "PeopleFrame",
           "for_people", "FramesForPeople", "ShownByDisplay", "SpansFrame", "spans_for_people",
           "spans_preview", "PeopleSeries", "people_table", "breakable_html"]

_PARTS = (("frame", pd.DataFrame), ("table", Table), ("notes", Notes), ("section", Section), ("page", Page),
          ("str", str))
_RESULTS = (("evaluation", ("samples", "latency", "measurement_note")), ("divergence", ("first_divergent_layer", "pairs")),
            ("analysis", ("table", "title")), ("trace", ("spans", "counters")), ("rendered", ("to_text", "_repr_html_")))
"""How a result is recognised: by the public attributes it has (display imports none of their classes); a
result of another face that renders itself (``to_text`` and ``_repr_html_``: a report) is shown as it renders."""


def _kind(obj: Any) -> str:
    kind = next((k for k, cls in _PARTS if isinstance(obj, cls)), None) or next(
        (k for k, attrs in _RESULTS if all(hasattr(obj, a) for a in attrs)), None)
    if kind is None:
        raise TypeError(f"mlms_nb.display cannot render a {type(obj).__name__}")
    return kind


def render_text(obj: Any) -> str:
    """Plain text: what the CLI prints and what a notebook shows where HTML is not rendered."""
    return _TEXT[_kind(obj)](obj)


def render_html(obj: Any) -> str:
    """An HTML fragment (escaped; no scripts) for a notebook output."""
    return _HTML[_kind(obj)](obj)


def render_json(obj: Any) -> Any:
    """JSON-ready data (what ``mlms VERB --json`` prints)."""
    return _JSON[_kind(obj)](obj)


def mimebundle(obj: Any) -> dict[str, str]:
    """``{"text/plain", "text/html"}`` for ``_repr_mimebundle_``."""
    return {"text/plain": render_text(obj), "text/html": render_html(obj)}


def dumps(data: Any) -> str:
    """JSON text of :func:`render_json` data (numpy values become Python ones, anything else its str)."""
    return json.dumps(data, indent=2, default=lambda o: o.item() if hasattr(o, "item") else (
        o.tolist() if hasattr(o, "tolist") else str(o)))



class ShownByDisplay:
    """Mixin: how a result class shows itself -- ``__repr__`` and ``to_text`` (plain text), ``_repr_html_`` and
    ``_repr_mimebundle_`` (a notebook) -- all rendered here, from the object's public attributes."""

    def to_text(self) -> str:
        """A plain-text rendering (what the CLI prints)."""
        return render_text(self)

    def __repr__(self) -> str:
        return render_text(self)

    def _repr_html_(self) -> str:
        return render_html(self)

    def _repr_mimebundle_(self, include=None, exclude=None) -> dict[str, str]:
        return mimebundle(self)


# ---------------------------------------------------------------------------------------------- tables and pages

def _table_text(t: Table) -> str:
    """The table as :mod:`mlms_nb.display.columns` formats it for people (the same digits, units and width as the
    report)."""
    if t.frame.empty:
        return "\n".join(filter(None, [t.title, t.empty, t.note]))
    return table_text(t.frame, t.title or None, t.note, max_rows=MAX_ROWS)


def _table_html(t: Table) -> str:
    if t.frame.empty:
        head = f"<h4>{html.escape(t.title)}</h4>" if t.title else ""
        return head + f"<p>{html.escape(t.empty)}</p>" + (f"<p><small>{html.escape(t.note)}</small></p>" if t.note else "")
    return table_html(t.frame, t.title or None, t.note, max_rows=MAX_ROWS)


def _notes_text(n: Notes) -> str:
    return f"{n.title}:\n" + "\n".join(f"  {item}" for item in n.items) if n.items else ""


def _notes_html(n: Notes) -> str:
    items = "".join(f"<li>{html.escape(str(i))}</li>" for i in n.items)
    return f"<p>{html.escape(n.title)}:</p><ul>{items}</ul>" if n.items else ""


def _page_text(p: Page) -> str:
    return "\n\n".join(filter(None, (render_text(part) for part in p.parts)))


def _page_html(p: Page) -> str:
    return "".join(render_html(part) for part in p.parts)


_TEXT = {
    "frame": lambda f: _table_text(Table(f)), "table": _table_text, "notes": _notes_text, "page": _page_text,
    "section": lambda s: f"{s.title}: {render_text(s.body)}", "str": str,
    "evaluation": evaluation_text, "divergence": divergence_text,
    "analysis": lambda a: _page_text(Page(analysis_parts(a))), "trace": lambda t: _page_text(Page(trace_parts(t))),
    "rendered": lambda r: r.to_text(),
}
_HTML = {
    "frame": lambda f: _table_html(Table(f)), "table": _table_html, "notes": _notes_html, "page": _page_html,
    "section": lambda s: f"<h4>{html.escape(s.title)}</h4>{render_html(s.body)}",
    "str": lambda s: f"<pre>{html.escape(s)}</pre>",
    "evaluation": evaluation_html, "divergence": divergence_html,
    "analysis": lambda a: _page_html(Page(analysis_parts(a))), "trace": lambda t: _page_html(Page(trace_parts(t))),
    "rendered": lambda r: r._repr_html_(),
}
_JSON = {
    "frame": records, "table": lambda t: records(t.frame), "notes": lambda n: list(n.items), "str": str,
    "section": lambda s: {s.title: render_json(s.body)}, "page": lambda p: [render_json(x) for x in p.parts],
    "evaluation": evaluation_json, "divergence": divergence_json, "analysis": analysis_json,
    "trace": lambda t: records(trace_parts(t)[0].frame),
    "rendered": lambda r: r.to_dict() if hasattr(r, "to_dict") else r.to_text(),
}
