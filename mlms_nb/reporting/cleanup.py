"""Notebook outputs made fit for print: no framework log noise, no progress bars or widgets, and Bokeh figures
rendered once in Chromium and kept as PNG (no toolbar), so a PDF shows every figure and needs no JavaScript.

Each function changes the notebook node in place and returns what it did (counts), for the exporter's log.
"""
from __future__ import annotations

import base64
import html
import re
from typing import Any

from mlms_nb._quiet import is_chatter
from mlms_nb.analyses import FIGURE_MARK

BOKEH_LOAD = "application/vnd.bokehjs_load.v0+json"
BOKEH_EXEC = "application/vnd.bokehjs_exec.v0+json"
WIDGET = "application/vnd.jupyter.widget-view+json"
#: A tqdm bar: ``  0%|          | 0/4 [00:00<?, ?sweep/s]`` (text) or ``HBox(...)`` (its widget's plain text).
PROGRESS = re.compile(r"(?:\d+%\|.*\|\s*\d+/\d+|^\s*\d+/\d+ \[\d\d:\d\d|^HBox\(children=)")
#: A Python warning from a framework package: ``.../keras/src/x.py:238: UserWarning: ...``
FRAMEWORK_WARNING = re.compile(r"^\S*(?:keras|tensorflow|absl|tf_keras|google/protobuf)\S*\.py:\d+: \w*Warning: ")


def _drop_framework_warnings(lines: list[str]) -> list[str]:
    """Drop each framework warning block: its header line, its continuation lines, and the indented source line
    (``  warnings.warn(msg)``) that ends it."""
    out, skipping = [], False
    for line in lines:
        if FRAMEWORK_WARNING.match(line):
            skipping = True
            continue
        if skipping:
            if line.startswith("  "):  # the source line that closes the block
                skipping = False
            continue
        out.append(line)
    return out


def clean_stream(text: str) -> str:
    """stderr text without framework chatter, framework warnings and progress-bar updates."""
    segments = re.split(r"(?<=[\n\r])", text)
    kept = [s for s in segments if s and not is_chatter(s) and not PROGRESS.search(s)]
    lines = _drop_framework_warnings("".join(kept).splitlines(keepends=True))
    return "".join(lines) if "".join(lines).strip() else ""


def strip_noise(nb) -> dict[str, int]:
    """Remove framework chatter from stderr streams, progress bars (tqdm text and ipywidgets) and widget
    outputs; a stream left empty is removed."""
    counts = {"streams": 0, "widgets": 0}
    for cell in nb.cells:
        if cell.get("cell_type") != "code":
            continue
        outputs = []
        for out in cell.get("outputs", []):
            kind = out.get("output_type")
            if kind == "stream" and out.get("name") == "stderr":
                text = clean_stream(out.get("text", ""))
                if text != out.get("text", ""):
                    counts["streams"] += 1
                if not text:
                    continue
                out["text"] = text
            elif kind in ("display_data", "execute_result") and WIDGET in out.get("data", {}):
                counts["widgets"] += 1
                continue
            outputs.append(out)
        cell["outputs"] = outputs
    return counts


# ---------------------------------------------------------------------------------------------- Bokeh

def _bokeh_figures(nb) -> tuple[str | None, list[dict[str, Any]]]:
    """The BokehJS load script (when the notebook holds one) and every Bokeh figure: ``{"cell", "html",
    "js", "div", "exec"}`` (the output with the div and the one with the embedding script; a figure shown by
    mlms-nb's own display is one output, carrying its embedding script, so ``exec`` is None)."""
    load_js = None
    figures = []
    for cell in nb.cells:
        if cell.get("cell_type") != "code":
            continue
        divs = {}
        for out in cell.get("outputs", []):
            data = out.get("data", {})
            if BOKEH_LOAD in data and load_js is None:
                load_js = data.get("application/javascript")
            match = re.search(r'data-root-id="([^"]+)"', str(data.get("text/html", "")))
            if match:
                divs[match.group(1)] = out
            if FIGURE_MARK in str(data.get("text/html", "")):  # a self-displaying figure (mlms_nb.analyses)
                figures.append({"cell": cell, "div": out, "exec": None, "html": data["text/html"], "js": ""})
                continue
            meta = (out.get("metadata") or {}).get(BOKEH_EXEC) or {}
            if BOKEH_EXEC in data and meta.get("id") in divs:
                div = divs[meta["id"]]
                figures.append({"cell": cell, "div": div, "exec": out, "html": div["data"]["text/html"],
                                "js": data.get("application/javascript", "")})
    return load_js, figures


def _bokeh_js_fallback() -> str:
    from bokeh.resources import INLINE

    return "\n".join(INLINE.js_raw)


#: The width of JupyterLab's output column (its file browser open, a 1400 px window): a figure that stretches to
#: the width is drawn for print at the size it has on screen, so the PNG has the on-screen aspect ratio.
OUTPUT_COLUMN_PX = 970

RENDERED = """() => {
  const figs = document.querySelectorAll('.mlms-fig');
  if (!window.Bokeh || !Bokeh.documents || Bokeh.documents.length < figs.length) return false;
  if (!window.__mlmsToolbarsHidden) {
    for (const doc of Bokeh.documents) for (const m of doc.all_models)
      if (m.toolbar_location !== undefined && m.toolbar_location !== null) m.toolbar_location = null;
    window.__mlmsToolbarsHidden = performance.now();
    return false;
  }
  if (performance.now() - window.__mlmsToolbarsHidden < 250) return false;
  for (const f of figs) {  // the outermost element BokehJS drew: what is photographed, at its own size
    const root = [...f.querySelectorAll('*')].find(e => [...e.classList].some(c => c.startsWith('bk-')));
    const box = root && root.getBoundingClientRect();
    if (!box || box.width < 50 || box.height < 50) return false;
    root.setAttribute('data-mlms-shot', f.id);
  }
  return true;
}"""


def _render_page(load_js: str, figures: list[dict[str, Any]]) -> str:
    parts = ['<!DOCTYPE html><html><head><meta charset="utf-8"><style>',
             "body{margin:0;padding:4px;background:#fff;font-family:sans-serif}",
             f".mlms-fig{{display:block;width:{OUTPUT_COLUMN_PX}px;background:#fff;margin:4px 0}}",
             "</style><script>var element = document.createElement('div');</script>",
             f"<script>{load_js}</script></head><body>"]
    for i, fig in enumerate(figures):
        parts.append(f'<div class="mlms-fig" id="mlms-fig-{i}">{fig["html"]}</div><script>{fig["js"]}</script>')
    parts.append("</body></html>")
    return "\n".join(parts)


class BokehPrintError(RuntimeError):
    """A Bokeh figure of the notebook could not be drawn for print (the PDF would lose it)."""


def _blank(png: bytes) -> bool:
    """True when a screenshot holds no drawing: every pixel the colour of its corner."""
    import io

    from PIL import Image

    image = Image.open(io.BytesIO(png)).convert("RGB")
    background = image.getpixel((0, 0))
    return image.getextrema() == tuple((v, v) for v in background)


def static_bokeh(nb, browser, scale: float = 2.0, strict: bool = True) -> dict[str, int]:
    """Replace every Bokeh figure by a PNG of it rendered in ``browser`` at its on-screen size (the width of
    JupyterLab's output column; toolbars hidden); drop the BokehJS load outputs. A figure that cannot be rendered,
    or renders blank, raises `BokehPrintError` naming its cell (``strict=False``: replaced by one line saying so);
    never silently dropped."""
    load_js, figures = _bokeh_figures(nb)
    counts = {"bokeh_figures": len(figures), "bokeh_failed": 0}
    if figures:
        reason = "it was not found on the page BokehJS drew"
        try:
            shots = browser.capture(_render_page(load_js or _bokeh_js_fallback(), figures), "[data-mlms-shot]",
                                    scale, wait_js=RENDERED)
        except Exception as err:  # a figure BokehJS cannot draw here: say so where the figure was
            shots = []
            reason = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
        shots = [None if shot is not None and _blank(shot[0]) else shot for shot in shots]
        shots = list(shots) + [None] * (len(figures) - len(shots))
        failed = [i for i, shot in enumerate(shots) if shot is None]
        if failed and strict:
            cells = [c for c in nb.cells if c.get("cell_type") == "code"]
            where = ", ".join(f"code cell {cells.index(figures[i]['cell']) + 1}" for i in failed)
            raise BokehPrintError(f"{len(failed)} of {len(figures)} Bokeh figure(s) could not be drawn for print "
                                  f"({where}): {reason}; the PDF would lose them")
        for fig, shot in zip(figures, shots):
            div, script = fig["div"], fig["exec"]
            if shot is None:
                counts["bokeh_failed"] += 1
                div["data"] = {"text/plain": f"[Bokeh figure not rendered for print: {reason}]",
                               "text/html": f"<p><i>[Bokeh figure not rendered for print: {html.escape(reason)}]</i></p>"}
            else:
                png, width, _ = shot
                div["data"] = {"image/png": base64.b64encode(png).decode("ascii"), "text/plain": "<Bokeh figure>"}
                div["metadata"] = {"image/png": {"width": width, "alt": "Bokeh figure"}}
            if script is not None:
                script["data"], script["metadata"] = {}, {}
    for cell in nb.cells:  # the load scripts (4 MB each) and the emptied script outputs
        if cell.get("cell_type") == "code":
            cell["outputs"] = [o for o in cell.get("outputs", [])
                               if not (BOKEH_LOAD in o.get("data", {}) or
                                       (o.get("output_type") == "display_data" and not o.get("data")))]
    return counts


def header_of(nb) -> dict[str, str]:
    """What the page header shows: ``{"title", "date"}`` from the report's own metadata (an output's
    ``metadata["mlms"]``), else the notebook's first level-1 heading, else its name; the date the papermill
    run ended, else empty (the exporter fills in today)."""
    meta = dict((nb.get("metadata") or {}).get("mlms") or {})
    for cell in nb.cells:
        for out in cell.get("outputs", []) if cell.get("cell_type") == "code" else []:
            found = (out.get("metadata") or {}).get("mlms")
            if isinstance(found, dict):
                meta = {**found, **meta}
                break
    if not meta.get("title"):
        for cell in nb.cells:
            sources = [cell.get("source", "")] if cell.get("cell_type") == "markdown" else [
                str(o.get("data", {}).get("text/markdown", "")) for o in cell.get("outputs", [])]
            heading = next((m.group(1) for s in sources for m in [re.search(r"^#\s+(.+)$", s, re.M)] if m), None)
            if heading:
                meta["title"] = re.sub(r"[*_`]", "", heading).strip()
                break
    if not meta.get("date"):
        end = ((nb.get("metadata") or {}).get("papermill") or {}).get("end_time")
        meta["date"] = str(end)[:10] if end else ""
    return {"title": str(meta.get("title", "")), "date": str(meta.get("date", ""))}


def css_string(text: str) -> str:
    """``text`` as a CSS string literal (for ``content:`` in an ``@page`` margin box)."""
    return '"' + " ".join(str(text).split()).replace("\\", "\\\\").replace('"', '\\"') + '"'
