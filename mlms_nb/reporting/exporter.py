"""``jupyter nbconvert --to mlms_pdf notebook.ipynb``: a PDF of any executed notebook with no TeX and no
browser download -- HTML printed by the system's headless Chromium.

Before printing: framework chatter, progress bars and widgets are removed (:mod:`.cleanup`); every Bokeh figure
is rendered once in the same Chromium and kept as a PNG without its toolbar; matplotlib figures stay PNG. In
the page: the paper size (``--MlmsPdfExporter.paper=Letter``; A4 by default), a header with the notebook's
title (the model, in a report) and date, page numbers, tables split or scaled to the page width, images no
wider than the page, and a table of contents. The PDF also gets an outline (bookmarks) of the headings.
"""
from __future__ import annotations

import copy
import datetime as _dt
import os
import tempfile
import time
from pathlib import Path

from nbconvert.exporters.html import HTMLExporter
from nbconvert.preprocessors import TagRemovePreprocessor
from traitlets import Bool, Unicode, default

from mlms_nb.reporting import cleanup
from mlms_nb.reporting.chromium import PX_PER_MM, Browser, page_count, paper_size

TEMPLATES = Path(__file__).resolve().parent / "templates"
MARGINS_MM = (16.0, 13.0, 15.0, 13.0)  # top, right, bottom, left
HIDE_INPUT_TAGS = ("hide-input", "remove-input", "injected-parameters", "parameters")


def page_css(paper: str, title: str, date: str) -> str:
    """The ``@page`` rule: size, margins, the header (title left, date right) and page numbers."""
    name, _, height_mm = paper_size(paper)
    top, right, bottom, left = MARGINS_MM
    box = "font-family: sans-serif; font-size: 7.5pt; color: #555;"
    return (f":root {{ --mlms-page-height: {int((height_mm - top - bottom) * PX_PER_MM)}px; }}\n"
            f"@page {{ size: {name} portrait; margin: {top}mm {right}mm {bottom}mm {left}mm;\n"
            f"  @top-left {{ content: {cleanup.css_string(title[:110])}; {box} }}\n"
            f"  @top-right {{ content: {cleanup.css_string(date)}; {box} }}\n"
            f"  @bottom-left {{ content: \"mlms-nb\"; {box} }}\n"
            f"  @bottom-right {{ content: \"page \" counter(page) \" of \" counter(pages); {box} }}\n}}")


def content_width_px(paper: str) -> int:
    """The width the page's content is laid out in (paper minus margins), in CSS pixels."""
    _, width_mm, _ = paper_size(paper)
    return int((width_mm - MARGINS_MM[1] - MARGINS_MM[3]) * PX_PER_MM)


class MlmsPdfExporter(HTMLExporter):
    """PDF through headless Chromium (see the module doc)."""

    export_from_notebook = "PDF (mlms-nb, Chromium)"
    output_mimetype = "application/pdf"

    paper = Unicode("A4", help="paper size: A4 or Letter").tag(config=True)
    chromium = Unicode("", help="the Chromium binary (default: $MLMS_CHROMIUM, else chromium on the PATH)").tag(
        config=True)
    title = Unicode("", help="page header text (default: the report's model, else the first heading)").tag(config=True)
    toc = Bool(True, help="write a table of contents after the title").tag(config=True)
    exclude_input_prompt = Bool(True).tag(config=True)
    exclude_output_prompt = Bool(True).tag(config=True)

    @default("file_extension")
    def _file_extension_default(self):
        return ".pdf"

    @default("template_extension")
    def _template_extension_default(self):
        return ".html.j2"  # the HTML template; the PDF is printed from its output

    @default("template_name")
    def _template_name_default(self):
        return "mlms_pdf"

    @default("extra_template_basedirs")
    def _default_extra_template_basedirs(self):
        return [os.getcwd(), str(TEMPLATES)]

    # ------------------------------------------------------------------------------------------ HTML

    def print_html(self, nb, resources=None, browser: Browser | None = None, **kw):
        """The HTML the PDF is printed from: the cleaned notebook, Bokeh figures as PNG (needs ``browser``;
        without one they stay interactive), print CSS, header, and the fitting script."""
        nb = copy.deepcopy(nb)
        counts = cleanup.strip_noise(nb)
        nb.metadata.pop("widgets", None)
        if browser is not None:
            counts.update(cleanup.static_bokeh(nb, browser))
        resources = self._init_resources(resources)
        TagRemovePreprocessor(remove_input_tags=set(HIDE_INPUT_TAGS), enabled=True).preprocess(nb, resources)
        header = cleanup.header_of(nb)
        title = self.title or header["title"] or resources.get("metadata", {}).get("name", "") or "notebook"
        nb.metadata["title"] = title  # the page's <title>, which Chromium writes as the PDF's Title
        date = header["date"] or _dt.date.today().isoformat()
        fit_js = (TEMPLATES / "mlms_pdf" / "fit.js").read_text(encoding="utf-8")
        if not self.toc:
            fit_js = fit_js.replace("report.toc = toc(main);", "")
        resources["mlms"] = {"page_css": page_css(self.paper, title, date),
                             "css": (TEMPLATES / "mlms_pdf" / "print.css").read_text(encoding="utf-8"),
                             "fit_js": fit_js}
        html, resources = super().from_notebook_node(nb, resources=resources, **kw)
        resources["mlms_pdf"] = {"cleanup": counts, "title": title, "date": date, "paper": self.paper}
        return html, resources

    # ------------------------------------------------------------------------------------------ PDF

    def from_notebook_node(self, nb, resources=None, **kw):
        start = time.perf_counter()
        paper_size(self.paper)  # a bad paper name fails before Chromium starts
        with Browser(self.chromium or None) as browser:
            html, resources = self.print_html(nb, resources, browser, **kw)
            pdf, fit, printed_html = print_pdf(browser, html, self.paper)
        info = resources["mlms_pdf"]
        info.update(fit=fit, html=printed_html, seconds=time.perf_counter() - start, pages=page_count(pdf))
        if fit and fit.get("overflow"):
            self.log.warning("mlms_pdf: %d element(s) wider than the page: %s", len(fit["overflow"]),
                             "; ".join(fit["overflow"][:5]))
        self.log.info("mlms_pdf: %s", export_summary(info))
        return pdf, resources


def _count(n: int, one: str, many: str | None = None) -> str:
    return f"{n:,} {one if n == 1 else (many or one + 's')}"


def export_summary(info: dict) -> str:
    """One sentence on what the export did: ``printed "title" on 7 A4 pages in 33.7 s: 4 Bokeh figures drawn as
    images, 2 framework messages removed, 3 wide tables split into parts.``"""
    fit, cleaned = info.get("fit") or {}, info.get("cleanup") or {}
    done = [what for n, what in (
        (cleaned.get("bokeh_figures", 0), _count(cleaned.get("bokeh_figures", 0), "Bokeh figure") + " drawn as "
         + ("an image" if cleaned.get("bokeh_figures", 0) == 1 else "images")),
        (cleaned.get("bokeh_failed", 0), _count(cleaned.get("bokeh_failed", 0), "Bokeh figure") + " not drawn"),
        (cleaned.get("streams", 0), _count(cleaned.get("streams", 0), "stderr output") + " cleaned of chatter"),
        (cleaned.get("widgets", 0), _count(cleaned.get("widgets", 0), "widget") + " removed"),
        (fit.get("split", 0), _count(fit.get("split", 0), "wide table") + " split into parts"),
        (fit.get("scaled", 0), _count(fit.get("scaled", 0), "element") + " scaled to the page width")) if n]
    pages = f" on {_count(info['pages'], info.get('paper', 'A4') + ' page')}" if info.get("pages") else ""
    took = f" in {info['seconds']:.1f} s" if info.get("seconds") is not None else ""
    return f'printed "{info.get("title", "")}"{pages}{took}' + (": " + ", ".join(done) if done else "") + "."


def print_pdf(browser: Browser, html: str, paper: str) -> tuple[bytes, dict, str]:
    """Print ``html`` on ``paper`` in ``browser``: ``(pdf bytes, what the fitting script did, the HTML as
    printed, with its tables split and its table of contents)``."""
    with tempfile.TemporaryDirectory(prefix="mlms-pdf-") as tmp:
        path = Path(tmp) / "notebook.html"
        path.write_text(html, encoding="utf-8")
        pdf, (fit, printed) = browser.print_pdf(
            path, paper, prepare_js="() => [window.mlmsFit ? window.mlmsFit() : null, "
                                    "document.documentElement.outerHTML]",
            viewport_width=content_width_px(paper))
    return pdf, fit or {}, "<!DOCTYPE html>\n" + printed
