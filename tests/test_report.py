"""Reports read back: a real traced evaluation (EfficientNet-Lite0 in PyTorch and ONNX Runtime on 4 labelled photos,
batch sizes 1 and 2, FRAMEWORK level) is reported by ``mlms report``, and the PDF is read back with poppler:
the model, the median latencies exactly as the report formats them, figures present and not blank, every page
the paper's size; then a comparison report of two runs, and the notebook's own screenshots.

Slow: one evaluation (~20 s on 2 busy cores; conftest's ``traced_evaluation``, shared with the analyses' tests),
then two reports (~30-45 s each: a kernel starts, and the roofline builds the model to count its FLOPs); the PDF
checks themselves take a second.
"""
from __future__ import annotations

import io
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest

from mlms_nb.analyses import FIGURE_MARK

from tests.conftest import REPO, SESSION_HOME
from tests.helpers import pdf_text

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("chromium") is None and not os.environ.get("MLMS_CHROMIUM"),
                       reason="Debian's chromium is not installed (scripts/setup.sh installs it)"),
    pytest.mark.skipif(shutil.which("pdftotext") is None, reason="poppler-utils is not installed (scripts/setup.sh)"),
]
ARTIFACTS = Path(os.environ.get("MLMS_TEST_ARTIFACTS", REPO / ".mlms_home" / "artifacts"))
PAPER_POINTS = {"A4": (595.0, 842.0), "Letter": (612.0, 792.0)}


@pytest.fixture(scope="module")
def home():
    mp = pytest.MonkeyPatch()
    SESSION_HOME.mkdir(parents=True, exist_ok=True)
    mp.setenv("MLMS_HOME", str(SESSION_HOME))
    mp.setenv("MLMS_VERBOSE", "0")
    try:
        yield SESSION_HOME
    finally:
        mp.undo()


@pytest.fixture(scope="module")
def evaluation(home, traced_evaluation):
    """The session's traced evaluation (PyTorch and ONNX Runtime, 4 labelled photos, stored)."""
    return traced_evaluation


@pytest.fixture(scope="module")
def report(evaluation, tmp_path_factory):
    """The folder of ``mlms report <evaluation id> --pdf --notebook --html``, as a user types it (timed): made once
    per test run and read by whichever pytest-xdist worker runs a test of this module (the traced evaluation is the
    same on every worker)."""
    from tests.helpers import once_per_run

    def make() -> str:
        out = tmp_path_factory.mktemp("report")
        start = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "mlms_nb.cli", "report", evaluation.id, "--pdf",
                               str(out / "r.pdf"), "--notebook", str(out / "r.ipynb"), "--html", str(out / "r.html")],
                              capture_output=True, text=True, timeout=600, cwd=out)
        assert done.returncode == 0, done.stderr
        print(f"mlms report took {time.perf_counter() - start:.1f} s:\n{done.stdout}")
        return str(out)

    return Path(once_per_run(f"report-{evaluation.id}", make))


def page_sizes(path: Path) -> list[tuple[float, float]]:
    info = subprocess.run(["pdfinfo", "-f", "1", "-l", "1000", str(path)], capture_output=True, text=True,
                          check=True).stdout
    return [(float(w), float(h)) for w, h in re.findall(r"Page\s+\d+ size:\s+([\d.]+) x ([\d.]+) pts", info)]


def images_not_blank(path: Path, folder: Path) -> list[float]:
    """Extract every image of the PDF; the spread (standard deviation of grey levels) of each."""
    from PIL import Image, ImageStat

    folder.mkdir(parents=True, exist_ok=True)
    subprocess.run(["pdfimages", "-png", str(path), str(folder / "img")], check=True)
    return [ImageStat.Stat(Image.open(p).convert("L")).stddev[0] for p in sorted(folder.glob("img-*.png"))]


def check_pdf(pdf: Path, paper: str, folder: Path, figures_at_least: int) -> str:
    sizes = page_sizes(pdf)
    want = PAPER_POINTS[paper]
    assert sizes and all(abs(w - want[0]) < 2 and abs(h - want[1]) < 2 for w, h in sizes), sizes
    spreads = images_not_blank(pdf, folder)
    assert len(spreads) >= figures_at_least, spreads
    assert all(s > 5 for s in spreads), spreads  # a blank (one-colour) image has no spread
    subprocess.run(["pdftoppm", "-r", "40", "-png", str(pdf), str(folder / "page")], check=True)
    from PIL import Image, ImageStat

    pages = sorted(folder.glob("page-*.png"))
    assert len(pages) == len(sizes)
    assert all(ImageStat.Stat(Image.open(p).convert("L")).stddev[0] > 5 for p in pages)
    return pdf_text(pdf)


def test_report_pdf_holds_the_model_and_the_median_latencies(evaluation, report, tmp_path):
    from mlms_nb.reporting import sections
    from mlms_nb.display import format_frame

    out = report
    flat = check_pdf(out / "r.pdf", "A4", tmp_path / "images", figures_at_least=9)
    assert "efficientnet_lite0" in flat and evaluation.id in flat
    medians = format_frame(sections.latency_frame([evaluation], [""]))["median (ms)"]
    assert len(medians) == 4
    for fw, bs, median in zip(evaluation.latency["framework"], evaluation.latency["batch_size"], medians):
        assert re.search(rf"{fw}\s+{bs}\s+\d+\s+{re.escape(median)}\s", flat), (fw, bs, median)
    assert "median (ms)" in flat
    for section in ("Contents", "What was measured and how", "Accuracy", "Latency and throughput", "Cold start",
                    "Layers", "Roofline", "Divergence across frameworks", "Timeline of the traced pass",
                    "Tracing overhead", "Warnings"):
        assert section in flat, section
    assert "sha256" in flat and "mlms eval efficientnet_lite0 --framework torch,onnxruntime" in flat
    for noise in ("oneDNN", "USDT:", "absl::InitializeLog", "UserWarning", "sweep/s", "Traceback"):
        assert noise not in flat, noise


def table_words(notebook: Path) -> set[str]:
    """Every word of four letters or more of every header and text cell of the tables a report notebook shows, but
    those with a hyphen or a slash (kept on one line in a table, test_display_tables checks it; a paragraph of
    the report may break the same word after its hyphen) and identifiers the renderer wraps after a separator."""
    from mlms_nb.display import breakable_html

    nb = nbformat.read(notebook, as_version=4)
    html = " ".join(str(o.get("data", {}).get("text/html", "")) for c in nb.cells for o in c.get("outputs", []))
    cells = re.findall(r'<t[hd] class="(?:key|text|num)" style="[^"]*">(.*?)</t[hd]>', html)
    words = {w for cell in cells for w in re.sub(r"<[^>]+>", "", cell).split()}
    return {w for w in words if sum(ch.isalpha() for ch in w) >= 4 and "<wbr>" not in breakable_html(w)
            and not re.search(r"[-/&]", w)}


def test_report_pdf_prints_every_table_word_whole(report):
    """Issue 37: a header or a cell never breaks inside a word in the PDF (``b/at/c/h/si/ze``, ``framewo rk`` were
    printed): pdftotext finds the known headers whole, and no word of any table of the report in pieces."""
    from tests.helpers import broken_words

    flat = pdf_text(report / "r.pdf")
    for header in ("framework", "batch size", "median (ms)", "throughput (/s)", "IQR/median (%)", "load (ms)",
                   "first inference (ms)", "layer type", "calls per predict", "share (%)"):
        assert header in flat, header
    words = table_words(report / "r.ipynb")
    assert {"framework", "onnxruntime", "efficientnet_lite0", "throughput"} <= words
    assert broken_words(flat, words) == []


SECTION_HEADINGS = ("What was measured and how", "Accuracy", "Latency and throughput", "Cold start",
                    "Layers: occurrence, latency, memory", "Roofline", "Divergence across frameworks",
                    "Timeline of the traced pass", "Tracing overhead", "Warnings", "Reproduce")


def pdf_pages(path: Path) -> list[str]:
    """Each page's text, lines kept (``-layout``: a code block's lines as printed)."""
    pages = subprocess.run(["pdftotext", "-layout", str(path), "-"], capture_output=True, text=True,
                           check=True).stdout.split("\f")
    return [p for p in pages if p.strip()]


def test_report_pdf_reads_back_as_written(evaluation, report):
    """Read back from the PDF: the Title metadata is the report's title; the reproduce command, copied from the page
    and pasted into a shell, is the command; a classifier's Options name no generation option; each warning and
    each footnote is printed once; no page ends with a section heading."""
    from mlms_nb.reporting import describe
    from tests.test_report_reading import GENERATION_LABELS

    pdf = report / "r.pdf"
    info = subprocess.run(["pdfinfo", str(pdf)], capture_output=True, text=True, check=True).stdout
    assert re.search(r"^Title:\s+efficientnet_lite0: evaluation report \(torch, onnxruntime\)$", info, re.M), info
    pages = pdf_pages(pdf)
    text = "\n".join(pages)
    start = text.index("mlms eval ")
    block = []
    for line in text[start:].splitlines():
        block.append(line)
        if not line.rstrip().endswith("\\"):
            break
    pasted = "\n".join(block).replace("\\\n", "")  # a shell joins continued lines
    assert shlex.split(pasted) == shlex.split(describe.reproduce_command(evaluation)), block
    options = text[text.index("\nOptions"):text.index("How it was measured")]
    assert not [label for label in GENERATION_LABELS if re.search(rf"^\s*{label}\s", options, re.M)], options
    flat = pdf_text(pdf)
    warned = list(evaluation.warnings) + [why for trace in evaluation.traces.values()
                                          for why in (trace.metadata.get("unavailable") or {}).values()]
    for warning in warned:
        assert flat.count(" ".join(warning.split())[:60]) == 1, warning
    assert flat.count("roof: peak") == len(evaluation.frameworks)  # each framework's roof told once, then referenced
    assert re.search(r"Whole model per framework and batch size \(notes [\d, -]+\)", flat)
    for number, page in enumerate(pages[:-1], 1):
        body = [line.strip() for line in page.splitlines() if line.strip() and not re.search(r"page \d+ of", line)]
        assert body[-1] not in SECTION_HEADINGS, (number, body[-3:])


def test_report_notebook_is_executed_editable_and_quiet(evaluation, report):
    out = report
    nb = nbformat.read(out / "r.ipynb", as_version=4)
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    assert not [o for o in outputs if o.output_type == "stream" and o.name == "stderr"]
    assert any("parameters" in c.metadata.get("tags", []) for c in nb.cells)  # papermill's cell stays editable
    assert any(evaluation.id in "".join(c.source) for c in nb.cells if "injected-parameters" in
               c.metadata.get("tags", []))
    html = (out / "r.html").read_text(encoding="utf-8")
    assert "mlms-toc" in html and "efficientnet_lite0" in html and "<script src=\"http" not in html


def test_report_notebook_screenshots_show_nothing_cut_and_no_noise(report):
    from mlms_nb.reporting.screenshots import notebook_screenshots

    out = report
    shots = notebook_screenshots(out / "r.ipynb", ARTIFACTS / "report_screenshots")
    assert shots.paths and all(p.stat().st_size > 1000 for p in shots.paths)
    assert shots.output_width_px >= 900
    assert shots.cut == [] and shots.noise == []


def test_comparison_report_of_two_runs(evaluation, home, tmp_path):
    """Run A from history; run B an untraced PyTorch-only Evaluation object stored nowhere (the report saves it
    beside its notebook): compared on the framework they share, B's layer sections left out with the reason."""
    import mlms_nb
    from mlms_nb.reporting import build_report, sections
    from mlms_nb.display import format_frame

    other = mlms_nb.evaluate("efficientnet_lite0", framework="torch", batch_sizes=[1, 2], dataset="imagenet-samples",
                             limit=4, warmup=2, min_repeats=5, min_time_s=0.05, threads=1, progress=False,
                             history=False)
    result = build_report([evaluation.id, other], pdf=tmp_path / "cmp.pdf", notebook=tmp_path / "cmp.ipynb",
                          paper="Letter")
    assert result.pdf == tmp_path / "cmp.pdf" and result.pages and result.fit.get("overflow") == []
    assert (tmp_path / "cmp_runs" / f"evaluation-{other.id}.json").exists()  # the notebook can be re-run
    flat = check_pdf(result.pdf, "Letter", tmp_path / "images", figures_at_least=10)
    assert "comparison of 2 runs" in flat and "B against A" in flat
    assert evaluation.id[:8] in flat and other.id[:8] in flat
    assert "A median (ms)" in flat and "B median (ms)" in flat and "p value" in flat
    assert "Not compared: onnxruntime only in A" in flat
    assert "run B was not traced" in flat  # its layer, timeline and per-layer sections say why they are empty
    compared = format_frame(sections.latency_frame([evaluation, other], ["A", "B"]))
    for run, fw, bs, median in compared[["run", "framework", "batch size", "median (ms)"]].itertuples(index=False):
        assert re.search(rf"{run}\s+{fw}\s+{bs}\s+\d+\s+{re.escape(median)}\s", flat), (run, fw, bs, median)


@pytest.mark.skipif(not (REPO / "example_notebooks" / "04_roofline_and_layers.ipynb").exists(), reason="no 04")
def test_nbconvert_mlms_pdf_keeps_every_bokeh_figure_of_example_04(home, tmp_path):
    """``jupyter nbconvert --to mlms_pdf`` on the executed example 04: every Bokeh figure is an image in the PDF."""
    from tests.test_notebooks import run_notebook_once

    nb = run_notebook_once("04_roofline_and_layers.ipynb")  # executed once per run, shared with test_analyses.py
    executed = tmp_path / "04.ipynb"
    nbformat.write(nb, executed)
    bokeh = sum(FIGURE_MARK in str(o.get("data", {}).get("text/html", "")) for c in nb.cells
                for o in c.get("outputs", []))
    pngs = sum("image/png" in o.get("data", {}) for c in nb.cells for o in c.get("outputs", []))
    assert bokeh >= 4
    done = subprocess.run([sys.executable, "-m", "jupyter", "nbconvert", "--to", "mlms_pdf", str(executed)],
                          capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    said = [line for line in done.stderr.splitlines() if "mlms_pdf:" in line]
    assert said and all("{" not in line for line in said) and any('printed "' in line for line in said), said
    pdf = tmp_path / "04.pdf"
    title = re.search(r"^Title:\s+(.*)$", subprocess.run(["pdfinfo", str(pdf)], capture_output=True, text=True,
                                                          check=True).stdout, re.M)
    assert title and "Roofline and layers" in title.group(1), title  # the notebook's title, not its file name
    flat = check_pdf(pdf, "A4", tmp_path / "images", figures_at_least=bokeh + pngs)
    assert "Roofline and layers" in flat and "Contents" in flat
    # each Bokeh figure prints whole, at the aspect ratio it has on screen (measured in the notebook as JupyterLab's
    # HTML draws it, a 1100 px window: not the exporter's own page), with its bars or points drawn
    on_screen = bokeh_sizes_on_screen(executed)
    assert len(on_screen) == bokeh, on_screen
    matplotlib_dims = {png_size(o["data"]["image/png"]) for c in nb.cells for o in c.get("outputs", [])
                       if "image/png" in o.get("data", {})}
    printed = [(w, h, path) for w, h, path in pdf_images(pdf, tmp_path / "bokeh") if (w, h) not in matplotlib_dims]
    assert len(printed) == bokeh, (printed, on_screen)
    for (w, h, path), (sw, sh) in zip(printed, on_screen):
        assert abs((w / h) / (sw / sh) - 1) < 0.05, (path, w, h, sw, sh)
        assert drawn_share(path) > 0.002, path  # bars/points in the palette's colours, not an empty frame
        assert ink_at_edges(path) == 0, path  # titles and labels end inside the canvas: none cut at its edge
    shutil.copy(pdf, ARTIFACTS / "04_roofline_and_layers.pdf") if ARTIFACTS.is_dir() else None


FIGURE_ROOTS_JS = """() => [...document.querySelectorAll('.mlms-bokeh')].map(f => {
  const root = [...f.querySelectorAll('*')].find(e => [...e.classList].some(c => c.startsWith('bk-')));
  const b = root ? root.getBoundingClientRect() : {width: 0, height: 0};
  return [b.width, b.height]; })"""


def bokeh_sizes_on_screen(notebook: Path) -> list[tuple[float, float]]:
    """The CSS size of every Bokeh figure of ``notebook`` as nbconvert's lab HTML draws it in Chromium."""
    from mlms_nb.reporting.chromium import Browser
    from mlms_nb.reporting.screenshots import lab_html

    page = notebook.with_suffix(".lab.html")
    page.write_text(lab_html(notebook), encoding="utf-8")
    wait = f"() => {{ const s = ({FIGURE_ROOTS_JS})(); return s.length > 0 && s.every(([w, h]) => w > 50 && h > 50); }}"

    def measure(browser):
        tab = browser._browser.new_page(viewport={"width": 1100, "height": 1000})
        try:
            tab.goto(page.resolve().as_uri(), wait_until="load", timeout=60_000)
            tab.wait_for_function(wait, timeout=60_000)
            tab.wait_for_timeout(1000)
            return [tuple(size) for size in tab.evaluate(FIGURE_ROOTS_JS)]
        finally:
            tab.close()

    with Browser() as browser:
        return browser._call(measure, browser)


def png_size(data: str) -> tuple[int, int]:
    import base64
    import io

    from PIL import Image

    return Image.open(io.BytesIO(base64.b64decode(data))).size


def pdf_images(pdf: Path, folder: Path) -> list[tuple[int, int, Path]]:
    """Every image of ``pdf`` in order: (width, height) in pixels and the PNG pdfimages wrote."""
    folder.mkdir(parents=True, exist_ok=True)
    subprocess.run(["pdfimages", "-png", str(pdf), str(folder / "img")], check=True)
    from PIL import Image

    return [(*Image.open(path).size, path) for path in sorted(folder.glob("img-*.png"))]


def ink_at_edges(path: Path, margin: int = 3) -> int:
    """Dark pixels (text, axis lines) within ``margin`` pixels of an image's edges: a title or label the canvas
    cuts leaves its ink there; a whole figure has none (its frame and grid are light)."""
    import numpy as np
    from PIL import Image

    ink = np.asarray(Image.open(path).convert("L")) < 120
    return int(ink[:margin].sum() + ink[-margin:].sum() + ink[:, :margin].sum() + ink[:, -margin:].sum())


def drawn_share(path: Path) -> float:
    """The share of an image's pixels in one of the figures' palette colours (within a small tolerance)."""
    import numpy as np
    from PIL import Image

    from mlms_nb.analyses._plot import PALETTE

    pixels = np.asarray(Image.open(path).convert("RGB"), dtype=int).reshape(-1, 3)
    colours = np.array([[int(c[i:i + 2], 16) for i in (1, 3, 5)] for c in PALETTE])
    near = (np.abs(pixels[:, None, :] - colours[None, :, :]).max(axis=2) < 40).any(axis=1)
    return float(near.mean())


def test_a_tick_label_at_the_x_axis_end_stays_inside_the_canvas(tmp_path):
    """A chart whose x range ends on a major tick (80 ms here; in example 04 it depends on the measured latencies)
    draws that tick's label inside its canvas: the PNG Chromium takes of the figure has no ink at its right edge."""
    from bokeh.embed import file_html
    from bokeh.resources import INLINE

    from mlms_nb.analyses import _plot
    from mlms_nb.reporting.chromium import Browser

    rows = [f"{i} layer" for i in range(5)]
    (chart,) = _plot.charts("bokeh", [dict(title="Latency per layer", x_label="latency (ms)", y_label="layer",
                                           categories=rows)], width=720, height=300)
    chart.native.x_range.start, chart.native.x_range.end = 0, 80.0
    chart.native.hbar(y=rows, right=[10, 20, 30, 40, 79], height=0.6)
    _plot.combine([chart])
    page, png = tmp_path / "figure.html", tmp_path / "figure.png"
    page.write_text(file_html(chart.native, INLINE, "figure"), encoding="utf-8")

    def shoot(browser):
        tab = browser._browser.new_page(viewport={"width": 1000, "height": 500}, device_scale_factor=2)
        try:
            tab.goto(page.resolve().as_uri(), wait_until="load", timeout=60_000)
            tab.wait_for_function("() => document.querySelector('[class^=bk-]') !== null", timeout=60_000)
            tab.wait_for_timeout(1000)
            tab.query_selector("[class^=bk-]").screenshot(path=str(png))
        finally:
            tab.close()

    with Browser() as browser:
        browser._call(shoot, browser)
    assert drawn_share(png) > 0.01 and ink_at_edges(png) == 0
