"""THE facade: every verb of the Python API, the ``mlms`` command and the ``%mlms`` magic goes through here.

Evaluate and keep: :func:`evaluate`, :func:`models`, :func:`history`, :func:`load_evaluation`, :func:`convert`.
Trace: :func:`trace`, :func:`load_trace`. Analyse a run (an `Evaluation`, a `Trace`, a history row id, an
evaluation id or a saved ``.json``): :func:`layers`, :func:`roofline`, :func:`batch_scaling`, :func:`compare`,
:func:`kernels`, :func:`timeline`. Across frameworks: :func:`diverge`. Agents: :func:`scheduler`, :func:`agent`,
:func:`agents`, :func:`across`. Trust: :func:`trust_add`, :func:`trust_list`, :func:`trust_remove`.

One facade (issue 9), written in three modules: `core` (runs: evaluate, history, convert, trace, diverge, trust),
`analysis_verbs` (the analyses of a run) and `remote` (the agents); import every name from here.

The data objects know no analysis: ``Evaluation`` and ``Trace`` declare their convenience methods as
:class:`mlms_nb._facade.FacadeMethod` (``ev.layers()`` is ``layers(ev)``), which import this package when called.
"""
from __future__ import annotations

from mlms_nb.analyses.result import Analysis
from mlms_nb.api.analysis_verbs import (across, batch_scaling, compare, kernels, layer_costs, layers, machine_ceilings,
                                        resolve_run, roofline, timeline)
from mlms_nb.api.core import (TraceSession, convert, diverge, evaluate, history, history_import, load_evaluation,
                              load_trace, models, trace, trust_add, trust_list, trust_remove)
from mlms_nb.api.remote import agent, agents, scheduler
from mlms_nb.frameworks.costs import model_costs

__all__ = ["Analysis", "TraceSession", "across", "agent", "agents", "batch_scaling", "compare", "convert", "diverge",
           "evaluate", "history", "history_import",
           "kernels", "layer_costs", "layers", "load_evaluation", "load_trace", "machine_ceilings", "model_costs",
           "models", "resolve_run", "roofline", "scheduler", "timeline", "trace", "trust_add", "trust_list", "trust_remove"]
