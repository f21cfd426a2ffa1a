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

# Lazy (PEP 562): `import mlms_nb` loads no framework, no SQLAlchemy and no facade; the first use of a name below
# imports the module that defines it. Workers, reader processes and `mlms --help` import only what they use.
_FACADE = ("across", "agent", "agents", "batch_scaling", "compare", "convert", "diverge", "evaluate", "history",
           "kernels", "layers", "load_evaluation", "load_trace", "models", "roofline", "scheduler", "timeline", "trace",
           "trust_add", "trust_list", "trust_remove")
_MANIFEST = ("InputSpec", "Manifest", "OutputSpec", "find_manifest", "load_manifest")


def __getattr__(name: str):
    if name in _FACADE:
        from mlms_nb import api as module
    elif name in _MANIFEST:
        from mlms_nb import manifest as module
    else:
        raise AttributeError(f"module 'mlms_nb' has no attribute {name!r}")
    value = getattr(module, name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


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
           "evaluate", "find_manifest", "history", "kernels", "layers", "load_evaluation", "load_manifest", "load_trace",
           "models", "report", "roofline", "scheduler", "timeline", "trace", "trust_add", "trust_list", "trust_remove"]
