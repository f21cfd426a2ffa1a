"""The Jupyter server extension of mlms-nb: the REST API (``{base_url}mlms/api/...``) that the JupyterLab runs
sidebar and timeline panel read (see :mod:`mlms_nb.server.handlers`). Enabled on install by
``etc/jupyter/jupyter_server_config.d/mlms_nb.json``; ``jupyter server extension list`` shows it."""
from __future__ import annotations


def _jupyter_server_extension_points():
    return [{"module": "mlms_nb.server"}]


def _load_jupyter_server_extension(serverapp) -> None:
    from mlms_nb.server.handlers import setup_handlers

    setup_handlers(serverapp.web_app)
    serverapp.log.info("mlms_nb: REST API at %smlms/api/", serverapp.web_app.settings["base_url"])
