"""HTML -> PDF for reports: Chromium's own ``--print-to-pdf`` command line vs Playwright driving the same Chromium
(``Page.printToPDF``), and WeasyPrint when it is installed; speed and faithfulness, side by side.

All three print the same page: the print HTML the ``mlms_pdf`` exporter makes of an executed notebook (Bokeh figures
already PNG, print CSS, the fitting script inline). Each way runs ``--repeats`` times, interleaved, in this one
process; the report is the median and IQR of the wall time per print, and what each PDF holds: pages, images
(``pdfimages -list``), whether the table of contents and the split tables (the fitting script) made it, and how
many elements end past the right margin (measured in Chromium at the page's content width).

    .venv/bin/python benchmarks/report_pdf.py NOTEBOOK.ipynb [--repeats 5] [--paper A4]
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nbformat


def pdf_facts(pdf: Path) -> dict:
    info = subprocess.run(["pdfinfo", str(pdf)], capture_output=True, text=True).stdout
    pages = int(next((l.split()[-1] for l in info.splitlines() if l.startswith("Pages:")), "0"))
    images = max(0, len(subprocess.run(["pdfimages", "-list", str(pdf)], capture_output=True,
                                       text=True).stdout.splitlines()) - 2)
    text = subprocess.run(["pdftotext", str(pdf), "-"], capture_output=True, text=True).stdout
    return {"pages": pages, "images": images, "toc": "Contents" in text, "split": "table continues" in text,
            "bytes": pdf.stat().st_size}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebook", type=Path, help="an executed notebook")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--paper", default="A4")
    args = parser.parse_args(argv)

    from mlms_nb.reporting.chromium import CHROMIUM_ARGS, Browser, require_chromium
    from mlms_nb.reporting.exporter import MlmsPdfExporter, content_width_px, print_pdf

    chromium = require_chromium()
    nb = nbformat.read(args.notebook, as_version=4)
    exporter = MlmsPdfExporter(paper=args.paper)
    tmp = Path(tempfile.mkdtemp(prefix="mlms-bench-pdf-"))
    with Browser() as browser:
        html, _ = exporter.print_html(nb, {"metadata": {"name": args.notebook.stem}}, browser)
    page = tmp / "page.html"
    page.write_text(html, encoding="utf-8")
    width = content_width_px(args.paper)

    def cli(out: Path) -> None:
        subprocess.run([chromium, "--headless", *CHROMIUM_ARGS, "--no-pdf-header-footer",
                        "--generate-pdf-document-outline", f"--window-size={width},1000", "--virtual-time-budget=2000",
                        f"--print-to-pdf={out}", page.as_uri()], check=True, capture_output=True, timeout=120)

    def playwright_cold(out: Path) -> None:  # what one report pays: start the browser, print, stop
        with Browser() as browser:
            data, _, _ = print_pdf(browser, html, args.paper)
        out.write_bytes(data)

    ways = {"chromium --print-to-pdf": cli, "playwright (browser started per print)": playwright_cold}
    try:
        import weasyprint

        ways["weasyprint"] = lambda out: weasyprint.HTML(filename=str(page)).write_pdf(str(out))
    except ImportError:
        print("weasyprint is not installed: not measured (pip install weasyprint to include it)")
    with Browser() as warm:
        ways["playwright (warm browser, print only)"] = lambda out: out.write_bytes(print_pdf(warm, html, args.paper)[0])
        times: dict[str, list[float]] = {name: [] for name in ways}
        for i in range(args.repeats):
            for name, way in ways.items():
                out = tmp / f"{abs(hash(name))}-{i}.pdf"
                start = time.perf_counter()
                way(out)
                times[name].append(time.perf_counter() - start)
        facts = {name: pdf_facts(tmp / f"{abs(hash(name))}-0.pdf") for name in ways}
    print(f"{args.notebook.name}: {len(html) / 1e6:.1f} MB of print HTML, {args.paper}, {args.repeats} prints each, "
          "interleaved")
    print(f"{'way':42} {'median (s)':>10} {'IQR (s)':>8} {'pages':>6} {'images':>7} {'contents':>9} {'split':>6}")
    for name, values in times.items():
        q = statistics.quantiles(values, n=4) if len(values) > 1 else [values[0]] * 3
        f = facts[name]
        print(f"{name:42} {statistics.median(values):10.2f} {q[2] - q[0]:8.2f} {f['pages']:6d} {f['images']:7d} "
              f"{str(f['toc']):>9} {str(f['split']):>6}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
