"""``build_report``: execute the report template with papermill for one or more runs, then write the executed
notebook, and the PDF and/or HTML printed from it by headless Chromium (see :mod:`.exporter`)."""
from __future__ import annotations

import html as _html
import logging
import re
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from mlms_nb._fs import atomic_write
from mlms_nb.errors import MlmsError

TEMPLATE = Path(__file__).resolve().parent / "report.ipynb"
FIGURE_BACKENDS = ("matplotlib", "bokeh")


@dataclass
class ReportResult:
    """What :func:`build_report` wrote: the executed notebook, the PDF and the HTML (each ``None`` when not
    asked for), the PDF's page count, and the seconds each step took."""
    runs: list[str]
    notebook: Path | None = None
    pdf: Path | None = None
    html: Path | None = None
    pages: int | None = None
    paper: str = "A4"
    seconds: dict[str, float] = field(default_factory=dict)
    fit: dict = field(default_factory=dict, repr=False)

    def written(self) -> list[tuple[str, Path]]:
        return [(kind, path) for kind, path in (("notebook", self.notebook), ("PDF", self.pdf), ("HTML", self.html))
                if path is not None]

    def to_text(self) -> str:
        lines = [f"report of {', '.join(self.runs)}:"]
        for kind, path in self.written():
            extra = f" ({self.pages} {self.paper} pages)" if kind == "PDF" and self.pages else ""
            lines.append(f"  {kind}: {path}{extra}")
        if self.seconds:
            lines.append("  took " + ", ".join(f"{k} {v:.1f} s" for k, v in self.seconds.items()))
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        items = "".join(f"<li>{kind}: <code>{_html.escape(str(path))}</code></li>" for kind, path in self.written())
        took = ", ".join(f"{k} {v:.1f} s" for k, v in self.seconds.items())
        return (f"<p>Report of {_html.escape(', '.join(self.runs))}:</p><ul>{items}</ul>"
                f"<p><small>took {_html.escape(took)}</small></p>")

    def __repr__(self) -> str:
        return self.to_text()

    def to_dict(self) -> dict[str, Any]:
        return {"runs": self.runs, "notebook": _str(self.notebook), "pdf": _str(self.pdf), "html": _str(self.html),
                "pages": self.pages, "paper": self.paper, "seconds": self.seconds}


def _str(path: Path | None) -> str | None:
    return None if path is None else str(path)


def _run_list(runs) -> list:
    if runs is None:
        return []
    if isinstance(runs, (str, int)) or not isinstance(runs, Iterable):
        return [runs]
    return list(runs)


def _tag(run) -> str:
    ref = getattr(run, "id", None) or str(run)
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", Path(str(ref)).stem)[:12] or "run"


def resolve_notebook_names(runs: Iterable, namespace: dict | None = None) -> list:
    """In IPython, a run that names a variable holding an Evaluation becomes that Evaluation (``%mlms report ev``)."""
    if namespace is None:
        try:
            from IPython import get_ipython

            shell = get_ipython()
            namespace = shell.user_ns if shell is not None else {}
        except ImportError:
            namespace = {}
    out = []
    for run in runs:
        if isinstance(run, str) and run.isidentifier() and run in namespace:
            run = namespace[run]
        out.append(run)
    return out


def _references(runs: list, folder: Path) -> tuple[list[str], dict[str, dict[str, str]]]:
    """Run references a separate kernel can load; Evaluation objects are saved under ``folder`` when needed."""
    from mlms_nb.reporting import _api

    evaluation = _api.evaluation_class()
    refs, traces = [], {}
    for run in runs:
        if isinstance(run, evaluation):
            ref, saved = _api.save_run(run, folder)
            if saved:
                traces[ref] = saved
        elif isinstance(run, (str, int)):
            ref = str(run)
        else:
            raise MlmsError(f"report: a run is a history id, an evaluation id, a saved .json or an Evaluation, "
                            f"not {type(run).__name__}")
        refs.append(ref)
    return refs, traces


def this_python_kernel():
    """A kernel manager that starts an IPython kernel on this very Python (whatever ``python3`` kernel spec the
    user's Jupyter folders hold may run another Python, without mlms-nb)."""
    import sys

    from jupyter_client import KernelManager
    from jupyter_client.kernelspec import KernelSpec, KernelSpecManager

    class ThisPython(KernelSpecManager):
        def get_kernel_spec(self, kernel_name):
            return KernelSpec(argv=[sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                              display_name="Python 3 (mlms-nb)", language="python", resource_dir="")

    return KernelManager(kernel_name="python3", kernel_spec_manager=ThisPython())


def execute_template(refs: list[str], traces: dict, notebook: Path, labels=None, figures: str = "matplotlib",
                     history_url: str | None = None, kernel_name: str | None = None, timeout_s: float = 600) -> None:
    """Run the report template with papermill into ``notebook`` (framework chatter silenced)."""
    try:
        import papermill
        from papermill.exceptions import PapermillExecutionError
    except ImportError:
        raise MlmsError("reports are executed by papermill, which is not installed: pip install 'mlms-nb[report]'") \
            from None
    from mlms_nb._quiet import quiet

    # papermill's progress lines and jupyter_client's "could not destroy zmq context" (logged by its clients' __del__)
    loggers = {name: logging.getLogger(name) for name in ("papermill", "traitlets")}
    levels = {name: logger.level for name, logger in loggers.items()}
    for logger in loggers.values():
        logger.setLevel(logging.ERROR)
    kernel = {"kernel_name": kernel_name} if kernel_name else {"kernel_name": "python3", "km": this_python_kernel()}
    try:
        with quiet():
            papermill.execute_notebook(
                str(TEMPLATE), str(notebook), progress_bar=False, **kernel,
                log_output=False, request_save_on_cell_execute=False, cwd=str(notebook.parent),
                execution_timeout=int(timeout_s),
                parameters={"runs": refs, "traces": traces, "labels": list(labels or []), "figures": figures,
                            "history_url": history_url})
    except PapermillExecutionError as err:
        message = str(err.evalue).strip().splitlines()[0] if err.evalue else err.ename
        raise MlmsError(f"report: {message} (the notebook, with the error in its cell {err.exec_count}, is "
                        f"{notebook})") from None
    finally:
        import gc

        gc.collect()  # the kernel's clients are collected (and log) now, while their loggers are raised
        for name, logger in loggers.items():
            logger.setLevel(levels[name])


def build_report(runs, pdf: str | Path | None = None, html: str | Path | None = None,
                 notebook: str | Path | None = None, paper: str = "A4", labels: Iterable[str] | None = None,
                 figures: str = "matplotlib", history_url: str | None = None, kernel_name: str | None = None,
                 timeout_s: float = 600) -> ReportResult:
    """A report of ``runs`` (history ids, evaluation ids, saved evaluation ``.json`` paths or Evaluation objects;
    several give a comparison report): the template notebook executed with papermill (``notebook``: where to
    keep it, editable), and printed by headless Chromium to ``pdf`` and/or ``html``. With none of the three,
    writes ``mlms-report-<run>.pdf`` and ``.ipynb`` in the current folder. ``paper``: A4 or Letter;
    ``figures``: matplotlib (static) or bokeh (interactive in the notebook, PNG in the PDF); ``kernel_name``: a
    Jupyter kernel to run the template on (default: this Python); ``timeout_s``: per template cell."""
    from mlms_nb.reporting.chromium import paper_size, require_chromium, require_playwright

    start = time.perf_counter()
    runs = _run_list(runs)
    if not runs:
        raise MlmsError("report: name at least one run (a history id, an evaluation id or a saved .json); "
                        "`mlms history` lists them")
    name, _, _ = paper_size(paper)
    if figures not in FIGURE_BACKENDS:
        raise MlmsError(f"report: figures must be matplotlib or bokeh, not {figures!r}")
    if pdf is None and html is None and notebook is None:
        stem = f"mlms-report-{_tag(runs[0])}" + (f"-and-{len(runs) - 1}-more" if len(runs) > 1 else "")
        pdf, notebook = Path(f"{stem}.pdf"), Path(f"{stem}.ipynb")
    pdf, html, notebook = (None if p is None else Path(p).expanduser().resolve() for p in (pdf, html, notebook))
    if pdf is not None:  # say what to install before minutes of work, not after
        require_chromium()
        require_playwright()
    result = ReportResult(runs=[getattr(r, "id", None) or str(r) for r in runs], paper=name)
    scratch = Path(tempfile.mkdtemp(prefix="mlms-report-"))
    try:
        # saved runs live beside a notebook the user keeps (it must re-run), else in the scratch folder
        keep = notebook.parent / f"{notebook.stem}_runs" if notebook is not None else scratch / "runs"
        refs, traces = _references(runs, keep)
        executed = notebook or scratch / "report.ipynb"
        executed.parent.mkdir(parents=True, exist_ok=True)
        execute_template(refs, traces, executed, labels, figures, history_url, kernel_name, timeout_s)
        result.seconds["execute"] = time.perf_counter() - start
        if notebook is not None:
            result.notebook = notebook
        if pdf is not None or html is not None:
            _export(executed, pdf, html, name, result)
            result.seconds["export"] = time.perf_counter() - start - result.seconds["execute"]
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    result.seconds["total"] = time.perf_counter() - start
    return result


def _export(executed: Path, pdf: Path | None, html: Path | None, paper: str, result: ReportResult) -> None:
    import nbformat

    from mlms_nb.reporting.chromium import Browser, page_count
    from mlms_nb.reporting.exporter import MlmsPdfExporter, print_pdf

    nb = nbformat.read(executed, as_version=4)
    exporter = MlmsPdfExporter(paper=paper)
    resources = {"metadata": {"name": executed.stem, "path": str(executed.parent)}}
    if pdf is None and not _browser_available():  # HTML only, no browser: the page fits itself when opened
        text, _ = exporter.print_html(nb, resources)
        _write(html, text.encode("utf-8"))
        result.html = html
        return
    with Browser() as browser:
        text, resources = exporter.print_html(nb, resources, browser)
        data, fit, printed = print_pdf(browser, text, paper)
    result.fit = fit
    if pdf is not None:
        _write(pdf, data)
        result.pdf, result.pages = pdf, page_count(data)
    if html is not None:
        _write(html, printed.encode("utf-8"))
        result.html = html


def _browser_available() -> bool:
    from mlms_nb.reporting.chromium import find_chromium, require_playwright

    try:
        require_playwright()
    except MlmsError:
        return False
    return find_chromium() is not None


def _write(path: Path, data: bytes) -> None:
    """Write atomically (a temp file in the same folder, then a rename): a reader never sees half a PDF."""
    with atomic_write(path, "wb") as handle:
        handle.write(data)
