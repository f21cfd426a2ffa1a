"""Opening a stored run in the JupyterLab timeline panel from a kernel (``%mlms timeline RUN --panel``): a comm
to the target the lab extension registers on every notebook kernel, plus a link that opens it later (a saved
notebook keeps the link; the comm only acts while the notebook is open in JupyterLab)."""
from __future__ import annotations

import html

from mlms_nb.server import runs

COMM_TARGET = "mlms_nb.timeline"


def open_in_panel(run, framework: str | None = None) -> tuple[str, str]:
    """Ask JupyterLab to open ``run`` (an Evaluation kept in the history store) in a timeline panel; returns the
    (text, HTML) to show in the cell. Outside a kernel, or in a front end without the extension, nothing opens
    and the text says so."""
    evaluation_id = runs.evaluation_id_of(run, framework)
    sent = False
    try:
        from comm import create_comm

        comm = create_comm(target_name=COMM_TARGET, data={"evaluation_id": evaluation_id, "framework": framework})
        sent = type(comm).__name__ != "DummyComm"
        comm.close()
    except ImportError:  # no kernel machinery: a plain Python or the CLI
        pass
    what = f"the {framework} trace of run {evaluation_id}" if framework else f"run {evaluation_id}"
    text = (f"opening {what} in the JupyterLab timeline panel" if sent else
            f"{what}: the timeline panel opens from a notebook in JupyterLab with the mlms-nb extension "
            "(`jupyter labextension list` shows mlms-nb-lab)")
    return text, f"<p>{html.escape(text)}</p>" + runs.panel_link_html(evaluation_id, framework)
