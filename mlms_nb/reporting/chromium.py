"""Headless Chromium for reports: the system's Chromium (Debian's ``/usr/bin/chromium``), driven by Playwright
with ``executable_path`` (never a browser download of Playwright's own).

:class:`Browser` keeps one Chromium open for a whole export: Bokeh figures rendered and captured as PNG
(:meth:`Browser.capture`), the page printed to PDF (:meth:`Browser.print_pdf`), screenshots
(:meth:`Browser.screenshots`). Playwright's sync API runs in a worker thread of its own, so this works inside
a running asyncio loop too (a Jupyter kernel).
"""
from __future__ import annotations

import concurrent.futures
import os
import shutil
from pathlib import Path
from typing import Any, Callable

from mlms_nb.errors import FrameworkNotInstalledError, MlmsError

CHROMIUM_ENV = "MLMS_CHROMIUM"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
INSTALL_HINT = ("PDF reports need Chromium, which was not found: install it with `apt-get install chromium` "
                "(scripts/setup.sh does) or set MLMS_CHROMIUM to a Chromium or Chrome binary")
PAPERS = {"a4": ("A4", 210.0, 297.0), "letter": ("Letter", 215.9, 279.4)}
PX_PER_MM = 96 / 25.4
#: True once every Bokeh figure of a page (``div[data-root-id]``) has its document embedded.
BOKEH_READY = """() => {
  const roots = document.querySelectorAll('[data-root-id]').length;
  return roots === 0 || (window.Bokeh !== undefined && Bokeh.documents !== undefined && Bokeh.documents.length >= roots);
}"""


class ChromiumNotFoundError(MlmsError):
    """No Chromium to print with; the message says what to install."""


def find_chromium() -> str | None:
    """``$MLMS_CHROMIUM``, else ``chromium`` / ``chromium-browser`` / ``google-chrome`` on the PATH."""
    env = os.environ.get(CHROMIUM_ENV)
    if env:
        return env if Path(env).exists() else shutil.which(env)
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        path = shutil.which(name)
        if path:
            return path
    return None


def require_chromium() -> str:
    path = find_chromium()
    if not path:
        raise ChromiumNotFoundError(INSTALL_HINT)
    return path


def require_playwright():
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        raise FrameworkNotInstalledError("PDF reports drive Chromium through Playwright, which is not installed: "
                                         "pip install 'mlms-nb[report]'") from None
    return sync_playwright


def paper_size(paper: str) -> tuple[str, float, float]:
    """``"A4"`` / ``"Letter"`` (any case) -> (name, width_mm, height_mm)."""
    key = str(paper).strip().lower()
    if key not in PAPERS:
        raise MlmsError(f"paper must be A4 or Letter, not {paper!r}")
    return PAPERS[key]


def page_count(pdf: bytes) -> int:
    """The pages of a PDF Chromium printed (its ``/Type /Page`` objects)."""
    import re

    return len(re.findall(rb"/Type\s*/Page(?![a-zA-Z])", pdf))


def _settle(page, step_ms: int = 200, limit_ms: int = 5000) -> None:
    """Wait until the page's layout stops changing (BokehJS draws after its documents are embedded)."""
    probe = "() => [document.documentElement.scrollWidth, document.documentElement.scrollHeight, " \
            "[...document.querySelectorAll('.jp-OutputArea-output')].map(e => e.scrollWidth).join()]"
    last, waited = None, 0
    while waited < limit_ms:
        now = page.evaluate(probe)
        if now == last:
            return
        last = now
        page.wait_for_timeout(step_ms)
        waited += step_ms


class Browser:
    """One headless Chromium for the duration of a ``with`` block."""

    def __init__(self, executable: str | None = None):
        self.executable = executable or require_chromium()
        self._sync_playwright = require_playwright()
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="mlms-chromium")
        self._playwright = self._browser = None

    def __enter__(self) -> "Browser":
        self._call(self._start)
        return self

    def __exit__(self, *exc) -> None:
        try:
            self._call(self._stop)
        finally:
            self._pool.shutdown(wait=True)

    def _start(self) -> None:
        self._playwright = self._sync_playwright().start()
        try:
            self._browser = self._playwright.chromium.launch(executable_path=self.executable, args=CHROMIUM_ARGS,
                                                             headless=True)
        except Exception as err:
            self._playwright.stop()
            raise MlmsError(f"Chromium at {self.executable} did not start: {str(err).splitlines()[0]}") from None

    def _stop(self) -> None:
        if self._browser is not None:
            self._browser.close()
        if self._playwright is not None:
            self._playwright.stop()

    def _call(self, fn: Callable, *args, **kwargs) -> Any:
        return self._pool.submit(fn, *args, **kwargs).result()

    # ------------------------------------------------------------------------------------------ operations

    def capture(self, page_html: str, selector: str, scale: float = 2.0, wait_js: str | None = None,
                timeout_ms: int = 30000) -> list[tuple[bytes, int, int]]:
        """Load ``page_html``, wait until ``wait_js`` (a JS expression) is true, then screenshot every element
        matching ``selector``: ``[(png, css_width, css_height)]``, at ``scale`` device pixels per CSS pixel."""
        return self._call(self._capture, page_html, selector, scale, wait_js, timeout_ms)

    def _capture(self, page_html, selector, scale, wait_js, timeout_ms):
        page = self._browser.new_page(viewport={"width": 1600, "height": 1000}, device_scale_factor=scale)
        try:
            page.set_content(page_html, wait_until="load", timeout=timeout_ms)
            if wait_js:
                page.wait_for_function(wait_js, timeout=timeout_ms, polling=50)
            out = []
            for handle in page.query_selector_all(selector):
                box = handle.bounding_box() or {"width": 0, "height": 0}
                out.append((handle.screenshot(type="png"), int(round(box["width"])), int(round(box["height"]))))
            return out
        finally:
            page.close()

    def print_pdf(self, html_path: Path, paper: str = "A4", prepare_js: str | None = None,
                  viewport_width: int | None = None, timeout_ms: int = 60000) -> tuple[bytes, Any]:
        """Print the page at ``html_path`` on ``paper`` (page size and margins from its CSS ``@page``), after
        running ``prepare_js`` (its result comes back with the PDF's bytes) in a window ``viewport_width`` CSS
        pixels wide (the width of the page's content, so that what the script measures is what prints)."""
        return self._call(self._print, Path(html_path), paper, prepare_js, viewport_width, timeout_ms)

    def _print(self, html_path, paper, prepare_js, viewport_width, timeout_ms):
        _, width_mm, height_mm = paper_size(paper)
        page = self._browser.new_page(viewport={"width": viewport_width or int(width_mm * PX_PER_MM),
                                                "height": int(height_mm * PX_PER_MM)})
        try:
            page.emulate_media(media="print")
            page.goto(html_path.resolve().as_uri(), wait_until="load", timeout=timeout_ms)
            result = page.evaluate(prepare_js) if prepare_js else None
            pdf = page.pdf(prefer_css_page_size=True, print_background=True, outline=True, tagged=True)
            return pdf, result
        finally:
            page.close()

    def screenshots(self, html_path: Path, out_dir: Path, width: int = 1400, height: int = 1000,
                    check_js: str | None = None, prefix: str = "page") -> tuple[list[Path], Any]:
        """Screenshots of the page at ``html_path`` in a ``width`` x ``height`` window, one per screenful, into
        ``out_dir``; ``check_js`` runs first and its result comes back with the paths."""
        return self._call(self._screenshots, Path(html_path), Path(out_dir), width, height, check_js, prefix)

    def _screenshots(self, html_path, out_dir, width, height, check_js, prefix):
        out_dir.mkdir(parents=True, exist_ok=True)
        page = self._browser.new_page(viewport={"width": width, "height": height})
        try:
            page.goto(html_path.resolve().as_uri(), wait_until="load", timeout=60000)
            page.wait_for_function(BOKEH_READY, timeout=30000, polling=50)
            _settle(page)
            result = page.evaluate(check_js) if check_js else None
            total = int(page.evaluate("document.documentElement.scrollHeight"))
            paths = []
            for i, top in enumerate(range(0, max(total, 1), height)):
                page.evaluate(f"window.scrollTo(0, {top})")
                path = out_dir / f"{prefix}_{i:02d}.png"
                page.screenshot(path=str(path))
                paths.append(path)
            return paths, result
        finally:
            page.close()
