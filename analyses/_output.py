"""How an analysis' figure reaches the user: in a notebook as one self-displaying output (:class:`Displayable`:
Bokeh as JSON plus a loader, with BokehJS inline once per kernel session; matplotlib as a PNG), or as a standalone
HTML page (:func:`to_html`). Bokeh resources are always INLINE (nothing is fetched from a CDN); Bokeh, matplotlib and
IPython are imported on first use."""
from __future__ import annotations

_BOKEHJS_SENT = False
BOKEHJS_MARK = "<!-- mlms-nb: BokehJS, inline, once per kernel session -->"
FIGURE_MARK = 'class="mlms-bokeh"'
"""What a notebook output holding BokehJS / a Bokeh figure contains (for tests and tools reading notebooks)."""
BOKEH_WAIT_MS = 20_000
"""How long a figure's loader waits for BokehJS (loaded by the first figure shown in the kernel session)."""


class Displayable:
    """A figure that displays itself in a notebook: ``_repr_mimebundle_`` gives one ``text/html`` output (Bokeh:
    the figure as JSON plus a loader that embeds it once BokehJS is on the page; BokehJS itself travels, inline,
    with the first figure of a kernel session only) or a PNG (matplotlib). The output needs no JupyterLab
    extension and re-renders when a saved, trusted notebook is reopened or exported to HTML. Attributes
    (``select``, ``children``, ``savefig``...) are the wrapped figure's (``.figure``)."""

    def __init__(self, figure):
        self.figure = figure.figure if isinstance(figure, Displayable) else figure

    def __getattr__(self, name):
        if name == "figure":  # not set yet (a copy being unpickled)
            raise AttributeError(name)
        return getattr(self.figure, name)

    def __repr__(self) -> str:
        return f"{type(self.figure).__name__} figure ({'Bokeh' if _is_bokeh(self.figure) else 'matplotlib'})"

    def _repr_mimebundle_(self, include=None, exclude=None) -> dict[str, str]:
        if _is_bokeh(self.figure):
            return {"text/html": notebook_html(self.figure), "text/plain": repr(self)}
        import base64
        import io

        buf = io.BytesIO()
        self.figure.savefig(buf, format="png", dpi=100)
        return {"image/png": base64.b64encode(buf.getvalue()).decode("ascii"), "text/plain": repr(self)}


def bokehjs_html() -> str:
    """BokehJS (INLINE, offline) as a script that loads it once per page."""
    from bokeh.resources import INLINE

    code = "\n".join(INLINE.js_raw).replace("</script", "<\\/script")
    return (BOKEHJS_MARK + '<script type="text/javascript">if (!window.Bokeh || !window.Bokeh.embed) {\n' + code
            + '\n}</script>')


def notebook_html(fig) -> str:
    """One ``text/html`` output embedding a Bokeh figure; BokehJS inline only the first time per kernel session."""
    global _BOKEHJS_SENT
    import json
    import uuid

    from bokeh.embed import json_item

    target = f"mlms-bk-{uuid.uuid4().hex}"
    item = json.dumps(json_item(fig, target)).replace("</", "<\\/")
    head = ""
    if not _BOKEHJS_SENT:
        head, _BOKEHJS_SENT = bokehjs_html(), True
    loader = f"""<script type="text/javascript">(function () {{
  const el = document.getElementById("{target}"), t0 = Date.now();
  function go() {{
    if (!el || el.dataset.embedded) return;
    if (window.Bokeh && window.Bokeh.embed) {{
      el.dataset.embedded = "1"; el.replaceChildren();
      window.Bokeh.embed.embed_item(JSON.parse(document.getElementById("{target}-json").textContent), "{target}");
    }} else if (Date.now() - t0 < {BOKEH_WAIT_MS}) setTimeout(go, 50);
    else el.textContent = "BokehJS is not on this page: re-run the cell (the first figure of a kernel session carries BokehJS).";
  }}
  go();
}})();</script>"""
    note = ("interactive Bokeh figure: it renders when the notebook is trusted (JupyterLab: File > Trust Notebook)")
    return (f'{head}<div id="{target}" {FIGURE_MARK} style="width:100%"><small>{note}</small></div>'
            f'<script type="application/json" id="{target}-json">{item}</script>{loader}')


def show(fig) -> None:
    """Display ``fig`` in a notebook (see :class:`Displayable`: Bokeh with INLINE BokehJS once per kernel
    session, matplotlib as PNG)."""
    from IPython.display import display

    display(Displayable(fig))


def to_html(fig, title: str = "mlms-nb analysis") -> str:
    """A standalone HTML page of ``fig`` (Bokeh: BokehJS inlined; matplotlib: an embedded PNG)."""
    if isinstance(fig, Displayable):
        fig = fig.figure
    if _is_bokeh(fig):
        from bokeh.embed import file_html
        from bokeh.resources import INLINE

        return file_html(fig, INLINE, title)
    import base64
    import html
    import io

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    data = base64.b64encode(buf.getvalue()).decode()
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title></head>"
            f"<body><img alt='{html.escape(title)}' src='data:image/png;base64,{data}'></body></html>")


def _is_bokeh(fig) -> bool:
    if isinstance(fig, Displayable):
        fig = fig.figure
    return type(fig).__module__.startswith("bokeh.")
