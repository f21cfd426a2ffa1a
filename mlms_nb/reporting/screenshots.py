"""Screenshots of an executed notebook as JupyterLab draws it (nbconvert's ``lab`` HTML in headless Chromium),
and what a reader would trip over: outputs cut at the right edge of the output column (a figure or table wider
than it, so it scrolls or clips), and log noise (framework chatter or progress bars in stderr outputs).

``notebook_screenshots(path, out_dir)`` -> :class:`ScreenshotReport` (the PNG paths, ``cut``, ``noise``).
The default window (1100 x 1000 CSS px) gives an output column of about 970 px, JupyterLab's with its file
browser open in a 1400 px window.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from mlms_nb._quiet import is_chatter
from mlms_nb.reporting.cleanup import PROGRESS

CHECK_JS = """() => {
  const describe = (el) => {
    const cell = el.closest('.jp-Cell');
    const cells = [...document.querySelectorAll('.jp-Cell')];
    const what = el.querySelector('[class^="bk-"], .bk-Row, .bk-Figure') || el.matches('[class^="bk-"]') ? 'a Bokeh figure'
      : (el.matches('table') || el.querySelector('table')) ? 'a table'
      : (el.matches('img, svg, canvas') || el.querySelector('img, svg, canvas')) ? 'an image'
      : el.tagName.toLowerCase();
    return 'cell ' + (cells.indexOf(cell) + 1) + ' of ' + cells.length + ': ' + what;
  };
  const cut = [];
  for (const area of document.querySelectorAll('.jp-OutputArea-output')) {
    const box = area.getBoundingClientRect();
    if (box.width === 0) continue;
    if (area.scrollWidth > area.clientWidth + 2) { cut.push(describe(area) + ' scrolls ' + (area.scrollWidth - area.clientWidth) + ' px'); continue; }
    for (const el of area.querySelectorAll('img, canvas, table, svg, pre, .bk-Figure, .bk-Row, .bk-Column')) {
      const r = el.getBoundingClientRect();
      if (r.width > 0 && r.right > box.right + 2) { cut.push(describe(el) + ' by ' + Math.round(r.right - box.right) + ' px'); break; }
    }
  }
  const stderr = [...document.querySelectorAll('[data-mime-type="application/vnd.jupyter.stderr"]')]
    .map(e => e.textContent);
  const width = Math.round((document.querySelector('.jp-OutputArea-output') || document.body).getBoundingClientRect().width);
  return {cut, stderr, width};
}"""


@dataclass
class ScreenshotReport:
    """Screenshots of one notebook and what they show: ``cut`` (outputs wider than the output column),
    ``noise`` (stderr lines that are framework chatter or progress bars), ``output_width_px``."""
    notebook: Path
    paths: list[Path] = field(default_factory=list)
    cut: list[str] = field(default_factory=list)
    noise: list[str] = field(default_factory=list)
    output_width_px: int = 0

    @property
    def clean(self) -> bool:
        return not self.cut and not self.noise


def lab_html(notebook) -> str:
    """The notebook as nbconvert's ``lab`` template draws it (JupyterLab's CSS; Bokeh figures live)."""
    import nbformat
    from nbconvert import HTMLExporter

    nb = nbformat.read(notebook, as_version=4) if isinstance(notebook, (str, Path)) else notebook
    html, _ = HTMLExporter(template_name="lab").from_notebook_node(nb)
    return html


def notebook_screenshots(notebook: str | Path, out_dir: str | Path, width: int = 1100, height: int = 1000,
                         browser=None) -> ScreenshotReport:
    """Screenshots of ``notebook`` (one per screenful, ``<stem>_NN.png`` in ``out_dir``) and its check."""
    from mlms_nb.reporting.chromium import Browser

    notebook, out_dir = Path(notebook), Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    page = out_dir / f"{notebook.stem}.html"
    page.write_text(lab_html(notebook), encoding="utf-8")
    if browser is None:
        with Browser() as own:
            paths, found = own.screenshots(page, out_dir, width, height, CHECK_JS, prefix=notebook.stem)
    else:
        paths, found = browser.screenshots(page, out_dir, width, height, CHECK_JS, prefix=notebook.stem)
    noise = [line for text in found["stderr"] for line in text.splitlines()
             if line.strip() and (is_chatter(line) or PROGRESS.search(line))]
    return ScreenshotReport(notebook, paths, list(found["cut"]), noise, int(found["width"]))
