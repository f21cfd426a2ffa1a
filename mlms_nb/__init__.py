"""mlms-nb: MLModelScope rebuilt for the notebook.

``mlms_nb.evaluate(...)``, ``mlms_nb.models()``, ``mlms_nb.history()``, ``mlms_nb.trace()``, ``mlms_nb.load_trace()``
and every other verb of the facade (:mod:`mlms_nb.api`); ``%load_ext mlms_nb`` for ``%mlms``.
No public name here is also the name of a subpackage, so importing a submodule never rebinds an API function.
"""
from __future__ import annotations

import os as _os

# TensorFlow's C++ start-up INFO lines would flood notebooks and the CLI; the user's own setting wins.
_os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from mlms_nb._version import __version__  # noqa: E402
from mlms_nb.api import (  # noqa: E402
    across, agent, agents, batch_scaling, compare, convert, diverge, evaluate, history, history_import, kernels, layers,
    load_evaluation, load_trace, models, roofline, scheduler, timeline, trace, trust_add, trust_list, trust_remove,
)
from mlms_nb.manifest import InputSpec, Manifest, OutputSpec, find_manifest, load_manifest  # noqa: E402


def report(runs, pdf=None, html=None, notebook=None, paper: str = "A4", **kwargs):
    """A report of ``runs`` (history ids, evaluation ids, saved .json paths or Evaluation objects; several give a
    comparison): an executed, editable notebook, and a PDF and/or HTML printed from it. Reports are a face of
    mlms-nb (like the CLI) built on the facade, so they are imported only when asked for; see
    :func:`mlms_nb.reporting.build_report`."""
    from mlms_nb.reporting import build_report

    return build_report(runs, pdf=pdf, html=html, notebook=notebook, paper=paper, **kwargs)


def _jupyter_server_extension_points():
    """The Jupyter server extension (the REST API of the JupyterLab sidebar) lives in ``mlms_nb.server``."""
    return [{"module": "mlms_nb.server"}]


def load_ipython_extension(ipython) -> None:
    """``%load_ext mlms_nb`` registers ``%mlms``."""
    from mlms_nb.magics import load_ipython_extension as _load

    _load(ipython)


__all__ = ["InputSpec", "Manifest", "OutputSpec", "__version__", "across", "agent", "agents", "batch_scaling", "compare", "convert", "diverge",
           "evaluate", "find_manifest", "history", "history_import", "kernels", "layers", "load_evaluation", "load_manifest", "load_trace",
           "models", "report", "roofline", "scheduler", "timeline", "trace", "trust_add", "trust_list", "trust_remove"]
