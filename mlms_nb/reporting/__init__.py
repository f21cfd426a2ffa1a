"""Reports: a template notebook executed with papermill for one run or several (a comparison), printed to PDF
by headless Chromium (``mlms report RUN... --pdf out.pdf``, ``%mlms report``, :func:`build_report`), and the
``mlms_pdf`` nbconvert exporter for any executed notebook (``jupyter nbconvert --to mlms_pdf nb.ipynb``).

Heavy pieces (papermill, nbconvert, Playwright) are imported when used.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mlms_nb.reporting.run import ReportResult


def build_report(runs, pdf=None, html=None, notebook=None, paper: str = "A4", **kwargs) -> "ReportResult":
    """See :func:`mlms_nb.reporting.run.build_report`."""
    from mlms_nb.reporting.run import build_report as _build

    return _build(runs, pdf=pdf, html=html, notebook=notebook, paper=paper, **kwargs)


build_report.__doc__ = """A report of ``runs`` (history ids, evaluation ids, saved evaluation .json paths or Evaluation
objects; several give a comparison report): the executed, editable ``notebook``, and the ``pdf`` and/or ``html``
printed from it (``paper``: A4 or Letter). Returns a ReportResult saying what was written."""

__all__ = ["build_report"]
