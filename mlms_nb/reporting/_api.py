"""The one place the report reaches into mlms-nb beyond an Evaluation object's own frames and methods.

Everything here goes through the facade (:mod:`mlms_nb.api`) and the analyses' display helper: reports are a
face of mlms-nb, like the CLI and the magics, and sit above the facade in the import layers.
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterable, Mapping


def evaluation_class():
    """The Evaluation class (to tell an Evaluation object from a reference)."""
    from mlms_nb.evaluation.result import Evaluation

    return Evaluation


def trace_class():
    from mlms_nb.tracing.trace import Trace

    return Trace


def load_evaluation(ref: str | int, url: str | None = None):
    """An Evaluation from a history row id, an evaluation id or a saved ``.json`` (with its traces, when the
    history store holds them)."""
    from mlms_nb import api

    return api.load_evaluation(ref, url=url)


def load_trace(path: str | Path):
    from mlms_nb import api

    return api.load_trace(path)


def load_runs(runs: Iterable[str | int], traces: Mapping[str, Mapping[str, str]] | None = None,
              url: str | None = None) -> list:
    """One Evaluation per run reference; ``traces``: ``{reference: {framework: saved trace folder}}`` for
    evaluations saved as JSON apart from their traces."""
    from mlms_nb.errors import MlmsError

    runs = list(runs)
    if not runs:
        raise MlmsError("no runs to report on: set runs = [...] in the parameters cell (history ids, evaluation ids "
                        "or saved evaluation .json paths)")
    out = []
    for ref in runs:
        ref = str(ref)
        if ref.endswith(".json") and not Path(ref).exists():
            raise MlmsError(f"report: {ref} does not exist; give a history id, an evaluation id or a saved "
                            "evaluation .json")
        evaluation = load_evaluation(ref, url=url)
        for framework, path in ((traces or {}).get(ref) or {}).items():
            evaluation.traces[framework] = load_trace(path)
        out.append(evaluation)
    return out


def save_run(evaluation, folder: Path) -> tuple[str, dict[str, str]]:
    """A reference a separate kernel can load: the evaluation id when the history store holds it with its
    traces, else a saved ``.json`` (and each trace saved beside it): ``(reference, {framework: trace folder})``."""
    folder.mkdir(parents=True, exist_ok=True)
    if evaluation.history_ids:
        try:
            stored = load_evaluation(evaluation.id)
            if set(stored.traces) >= set(evaluation.traces):
                return evaluation.id, {}
        except Exception:  # not in the default store (another URL, or deleted): save it beside the report
            pass
    path = evaluation.save(folder / f"evaluation-{evaluation.id}.json")
    traces = {fw: str(trace.save(folder / f"trace-{evaluation.id}-{fw}")) for fw, trace in evaluation.traces.items()}
    return str(path), traces


def timeline(trace, backend: str = "matplotlib", **kwargs):
    """The timeline figure of one Trace (``start_ms``/``end_ms``: a window)."""
    from mlms_nb import api

    return api.timeline(trace, backend, **kwargs)


def show_figure(fig) -> None:
    """Display a Bokeh figure (INLINE resources) or a matplotlib figure in the notebook."""
    from mlms_nb.analyses import show

    show(fig)


def version() -> str:
    from mlms_nb._version import __version__

    return __version__
