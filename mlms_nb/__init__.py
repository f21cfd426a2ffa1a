"""mlms-nb: MLModelScope rebuilt for the notebook.

``mlms_nb.evaluate(...)``, ``mlms_nb.models()``, ``mlms_nb.history()``, ``mlms_nb.trace()``, ``mlms_nb.load_trace()``;
``%load_ext mlms_nb`` for ``%mlms``.
"""
from __future__ import annotations

__version__ = "0.1.0"

import os as _os

# TensorFlow's C++ start-up INFO lines would flood notebooks and the CLI; the user's own setting wins.
_os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

# The history module is imported before the API so that the package attribute ``mlms_nb.history`` stays
# the API function (importing a submodule later would rebind the attribute to the module).
from . import history as _history_store  # noqa: E402,F401
from .api import convert, evaluate, history, load_evaluation, load_trace, models, trace  # noqa: E402
from .manifest import find_manifest, load_manifest  # noqa: E402


def _jupyter_server_extension_points():
    """The Jupyter server extension (the REST API of the JupyterLab sidebar) lives in ``mlms_nb.server``."""
    return [{"module": "mlms_nb.server"}]


def load_ipython_extension(ipython) -> None:
    """``%load_ext mlms_nb`` registers ``%mlms``."""
    from .magics import load_ipython_extension as _load

    _load(ipython)


__all__ = ["convert", "evaluate", "find_manifest", "history", "load_evaluation", "load_manifest", "load_trace", "models",
           "trace"]
