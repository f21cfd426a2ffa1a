"""The verbs shared by the ``mlms`` command and the ``%mlms`` magic: their arguments (an option's flag, help text
and default come from :mod:`mlms_nb.options`; only the arguments that are no option of the facade are written
here), and what each verb returns (:class:`Output`: a value, what to show, the JSON data). Rendering is
:mod:`mlms_nb.display`'s; calling is :mod:`mlms_nb.api`'s.
"""
from __future__ import annotations

import argparse
import sys
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Literal, NamedTuple

from mlms_nb import api, display
from mlms_nb._quiet import quiet
from mlms_nb._translate import heard_since, mark
from mlms_nb.analyses import figure_page
from mlms_nb.errors import MlmsError
from mlms_nb.options import (
    AgentOptions, AgentsOptions, CompareOptions, DivergeOptions, EvaluateOptions, HistoryOptions, LayersOptions, Options,
    RooflineOptions, SchedulerOptions, fields, python_default, spelling,
)

# ---------------------------------------------------------------------------------------------- from the options

class Argument(NamedTuple):
    """One argparse argument: its flags (or positional name) and ``add_argument`` keywords."""
    flags: tuple[str, ...]
    kwargs: dict


def arguments(cls: type[Options]) -> list[Argument]:
    """The flags of ``cls``'s options (those whose field names a ``cli`` flag), help and default from the field.
    Values arrive as text and the model validates them, so the CLI, the magic and Python give the same errors; an
    option not given is not set (the model's default applies), which :func:`given` reads back."""
    out = []
    for name, info in fields(cls):
        extra = info.json_schema_extra or {}
        if not extra.get("cli"):
            continue
        default = extra.get("cli_default", python_default(info))
        kwargs: dict[str, Any] = {"dest": name, "default": extra.get("cli_default", argparse.SUPPRESS)}
        if isinstance(info.default, bool):
            kwargs["action"] = "store_false" if info.default else "store_true"
            help_text = extra.get("cli_help", info.description)
        else:
            if typing.get_origin(info.annotation) is Literal:
                kwargs["choices"] = list(typing.get_args(info.annotation))
            else:
                kwargs["metavar"] = extra.get("metavar") or _METAVARS.get(extra.get("unit", ""),
                                                                          extra["cli"].lstrip("-").upper())
            shown = ",".join(map(str, default)) if isinstance(default, (list, tuple)) else default
            unit = f" {extra['unit']}" if extra.get("unit") and isinstance(default, (int, float)) else ""
            help_text = f"{info.description} (default: {shown}{unit})" if default is not None else info.description
        out.append(Argument((extra["cli"],), {**kwargs, "help": help_text}))
    return out


_METAVARS = {"s": "SECONDS", "ms": "MS", "calls": "N", "inputs": "N", "rows": "N", "tokens": "N", "queries/s": "QPS"}


def given(cls: type[Options], namespace: argparse.Namespace) -> dict[str, Any]:
    """The options of ``cls`` that an argparse ``namespace`` holds (what the user typed, or a CLI default)."""
    return {name: getattr(namespace, name) for name, _ in fields(cls) if hasattr(namespace, name)}


VERBS: dict[str, str] = {
    "models": "list the models mlms-nb can run (built-in manifests and MLMS_MANIFEST_PATH)",
    "eval": "evaluate a model: accuracy on a dataset and latency per framework and batch size",
    "history": "list stored evaluations, newest first",
    "convert": "build the ONNX Runtime or TensorFlow copy of a model's PyTorch weights",
    "layers": "layer occurrence, latency or memory of a traced run (RUN: a history id or, in a notebook, a variable)",
    "roofline": "roofline of a run per layer or per model, under this machine's measured ceilings",
    "compare": "A/B comparison of two runs: latency deltas with a significance test, per-layer deltas",
    "diverge": "where frameworks' layer outputs diverge on the same inputs (and an INT8 copy's); --outputs: every output, any model",
    "timeline": "zoomable timeline of a traced run (Bokeh; matplotlib for print)",
    "report": "a PDF/HTML report and an executed, editable notebook of one run, or a comparison of several",
    "trust": "trust a model file or manifest that can run code (add PATH), list the trust store, or remove PATH",
    "scheduler": "run a Dask scheduler that mlms agents join (until Ctrl-C)",
    "agent": "run an mlms agent: a Dask worker that advertises this machine's stack and runs evaluations (until Ctrl-C)",
    "agents": "list the mlms agents of a scheduler: stack, frameworks, labels, threads",
}

JSON_FLAG = Argument(("--json",), {"action": "store_true", "help": "print one JSON object instead of a table"})
RUN = Argument(("run",), {"help": "a history id (see `history`), an evaluation id, a saved .json, or a notebook variable"})
PLOT = Argument(("--plot",), {"default": "bokeh", "choices": ["bokeh", "matplotlib", "none"],
                              "help": "figure backend (shown in a notebook; written with --html)"})
HTML = Argument(("--html",), {"metavar": "PATH", "default": None, "help": "write the figure as a standalone HTML page"})
MODEL = Argument(("model",), {"help": "model name (see `models`) or a manifest .yaml path"})

ARGUMENTS: dict[str, list[Argument]] = {
    "models": [Argument(("--framework",), {"help": "only this framework (torch, onnxruntime, tensorflow)"}), JSON_FLAG],
    "eval": [MODEL, *arguments(EvaluateOptions),
             Argument(("--inputs",), {"metavar": "VARIABLE", "default": None,
                                      "help": "in a notebook, for a live model object: a variable holding an example "
                                              "input batch (N first) or an input description"}),
             JSON_FLAG],
    "trust": [Argument(("action",), {"choices": ["add", "list", "remove"], "help": "add PATH, list, or remove PATH"}),
              Argument(("path",), {"nargs": "?", "default": None,
                                   "help": "the model file, SavedModel folder or manifest (remove: or a sha256 prefix)"}),
              JSON_FLAG],
    "history": [Argument(("action",), {"nargs": "?", "choices": ["import"], "default": None,
                                       "help": "import PATH: put back evaluations an outage wrote to unsaved/"}),
                Argument(("path",), {"nargs": "?", "default": None, "help": "import: a .json file or a folder of them "
                                                                          "(e.g. $MLMS_HOME/unsaved)"}),
                *arguments(HistoryOptions), JSON_FLAG],
    "layers": [RUN, *arguments(LayersOptions), PLOT, HTML, JSON_FLAG],
    "roofline": [RUN, *arguments(RooflineOptions), PLOT, HTML, JSON_FLAG],
    "compare": [Argument(("run_a",), {"help": "run A: a history id, evaluation id, saved .json, or notebook variable"}),
                Argument(("run_b",), {"help": "run B, the same"}), *arguments(CompareOptions), PLOT, HTML, JSON_FLAG],
    "diverge": [Argument(("model",), {"help": "model name (see `models`) or a manifest path (for layers: a PyTorch "
                                                  "one)"}), *arguments(DivergeOptions), PLOT, HTML,
                JSON_FLAG],
    "timeline": [RUN, Argument(("--framework",), {"default": None, "help": "only this framework's trace"}),
                 Argument(("--plot",), {"default": "bokeh", "choices": ["bokeh", "matplotlib"], "help": "figure backend"}),
                 HTML,
                 Argument(("--panel",), {"action": "store_true", "help": "open the run in the JupyterLab timeline panel "
                                                                         "instead of drawing it in the cell"})],
    "report": [Argument(("runs",), {"nargs": "+", "metavar": "RUN", "help": "history ids, evaluation ids, saved .json "
                                                                          "files or notebook variables; several give a "
                                                                          "comparison"}),
               Argument(("--pdf",), {"metavar": "PATH", "default": None, "help": "write the PDF here (Chromium prints it)"}),
               Argument(("--html",), {"metavar": "PATH", "default": None, "help": "write the report as one HTML page here"}),
               Argument(("--notebook",), {"metavar": "PATH", "default": None,
                                          "help": "keep the executed, editable notebook here"}),
               Argument(("--paper",), {"default": "A4", "choices": ["A4", "Letter"], "help": "paper size of the PDF"}),
               JSON_FLAG],
    "scheduler": arguments(SchedulerOptions),
    "agent": arguments(AgentOptions),
    "agents": [*arguments(AgentsOptions), JSON_FLAG],
    "convert": [Argument(("model",), {"help": "model name with a PyTorch manifest"}),
                Argument(("--to",), {"required": True, "help": "target framework: onnxruntime (onnx) or tensorflow (tf)"}),
                Argument(("--force",), {"action": "store_true", "help": "rebuild even when a verified copy is cached"}),
                JSON_FLAG],
}


@dataclass
class _Shown:
    """A message another face rendered already (the panel's): its text and its HTML."""
    text: str
    html: str

    def to_text(self) -> str:
        return self.text

    def _repr_html_(self) -> str:
        return self.html


@dataclass
class Output:
    """What a verb produced: the Python value, what to show (anything `mlms_nb.display` renders), the JSON
    data ``--json`` prints, the exit code and the figure (``--plot``)."""
    value: Any
    shown: Any
    data: Any = None
    exit_code: int = 0
    figure: Any = field(default=None, repr=False)
    notes: list[str] = field(default_factory=list)
    """Framework warnings that matter, as our sentences (mlms_nb._translate), that ``shown`` does not hold
    already: the CLI prints them on stderr, a notebook under the result."""

    @property
    def text(self) -> str:
        return display.render_text(self.shown)

    def _repr_mimebundle_(self, include=None, exclude=None) -> dict[str, str]:
        if self.notes:
            return display.mimebundle(display.Page([self.shown, display.Notes("Warnings", self.notes)]))
        return display.mimebundle(self.shown)

    def json(self) -> str:
        return display.dumps(self.data)


def run(verb: str, args: argparse.Namespace) -> Output:
    """Run one verb with parsed arguments; its errors and advice name options by their flags (``--min-time``).
    What the frameworks print meanwhile is kept in ``$MLMS_HOME/logs/frameworks.log`` (``--verbose``: shown)."""
    with spelling("cli"), quiet(verbose=True if getattr(args, "verbose", False) else None, label=f"mlms {verb}"):
        start = mark()
        out = RUNNERS[verb](args)
    heard = heard_since(start)
    if heard:
        shown = out.text
        out.notes = [sentence for sentence in heard if sentence not in shown]
    return out


def run_models(args: argparse.Namespace) -> Output:
    frame = api.models(framework=args.framework)
    shown = frame.drop(columns=["description", "source"], errors="ignore")
    shown.attrs = frame.attrs
    errors = frame.attrs.get("errors") or {}
    page = display.Page([display.Table(shown, "Models", empty="no models found"),
                         display.Notes("Manifests that failed to load", list(errors.values()))])
    return Output(shown, page, {"models": display.records(shown), "errors": errors})


def run_eval(args: argparse.Namespace) -> Output:
    inputs = getattr(args, "inputs", None)
    if isinstance(inputs, str):
        raise MlmsError(f"--inputs {inputs}: names a notebook variable describing a live model's input; from the "
                        "command line, describe the model by a manifest")
    options = given(EvaluateOptions, args)
    # progress goes to stderr; with --json only to a terminal, so a captured stderr holds just the messages
    options["progress"] = options.get("progress", True) and (not args.json or sys.stderr.isatty())
    evaluation = api.evaluate(args.model, inputs=inputs, **options)
    stored = options.get("history", True) is not False  # --no-history: "saved" is false, and that is no failure
    if isinstance(evaluation, list):  # --all: one evaluation per agent
        outs = [_one_eval(ev, stored) for ev in evaluation]
        page = display.Page([display.Section(f"agent {ev.stack['agent']['name']}", o.shown)
                             for ev, o in zip(evaluation, outs)] + [api.across(evaluation)])
        return Output(evaluation, page, [o.data for o in outs], exit_code=max(o.exit_code for o in outs))
    return _one_eval(evaluation, stored)


def _one_eval(evaluation, stored: bool = True) -> Output:
    parts = [evaluation]
    if not evaluation.trace_overhead.empty:
        parts.append(display.Table(display.overhead_frame(evaluation.trace_overhead),
                                   "Tracing overhead (traced ÷ untraced median, ± the two medians' 95% CIs)"))
        parts += [display.Section(fw, trace) for fw, trace in evaluation.traces.items()]
    return Output(evaluation, display.Page(parts), display.render_json(evaluation), exit_code=eval_exit_code(evaluation, stored))


def eval_exit_code(evaluation, stored: bool = True) -> int:
    """0: everything measured and stored; 130: stopped by Ctrl-C, 143: by a stop signal (what was measured is
    shown and stored); 1: something not measured (an error, a timeout, a crash) or not stored."""
    reasons = {o.get("reason") for o in evaluation.outcomes.values()}
    if "interrupt" in reasons or (not evaluation.complete and not evaluation.outcomes):
        return 130
    if "signal" in reasons:
        return 143
    return 0 if evaluation.complete and (evaluation.saved or not stored) else 1


def run_scheduler(args: argparse.Namespace) -> Output:
    api.scheduler(**given(SchedulerOptions, args))
    return Output(None, "scheduler stopped", {"stopped": True})


def run_agent(args: argparse.Namespace) -> Output:
    api.agent(**given(AgentOptions, args))
    return Output(None, "agent stopped", {"stopped": True})


def run_agents(args: argparse.Namespace) -> Output:
    frame = api.agents(**given(AgentsOptions, args))
    return Output(frame, display.Table(frame, f"mlms agents of {args.on}", empty="no mlms agents are connected"),
                  display.records(frame))


def run_history(args: argparse.Namespace) -> Output:
    if getattr(args, "action", None) == "import":
        if not args.path:
            raise MlmsError("history import needs the file or folder to put back, e.g. `mlms history import "
                            "$MLMS_HOME/unsaved`")
        frame = api.history_import(args.path)
        return Output(frame, display.Table(frame, f"Put back into the history from {args.path}",
                                           empty="nothing to put back"), display.records(frame))
    frame = api.history(**given(HistoryOptions, args))
    return Output(frame, display.Table(frame, "Evaluation history (newest first)", empty="no stored evaluations match"),
                  display.records(frame))


def run_convert(args: argparse.Namespace) -> Output:
    artifact = api.convert(args.model, to=args.to, force=args.force)
    text = f"{args.model} -> {args.to}: {artifact.path}\nsha256 {artifact.sha256}"
    data = {"model": args.model, "framework": args.to, "path": str(artifact.path), "sha256": artifact.sha256}
    return Output(artifact, text, data)


def _with_figure(out: Output, make_figure: Callable[[str], Any], args: argparse.Namespace) -> Output:
    """Attach the figure (``--plot``) and write it as a page when ``--html`` names one."""
    backend = getattr(args, "plot", "bokeh")
    if backend == "none" and not args.html:
        return out
    out.figure = make_figure("bokeh" if backend == "none" else backend)
    if args.html:
        path = Path(args.html)
        path.write_text(figure_page(out.figure), encoding="utf-8")
        out.shown = display.Page([out.shown, f"figure written to {path}"])
    return out


def _result_output(result, args: argparse.Namespace) -> Output:
    """An analysis or a divergence: shown as it renders itself, with its figure."""
    return _with_figure(Output(result, result, display.render_json(result)), result.plot, args)


def run_layers(args: argparse.Namespace) -> Output:
    return _result_output(api.layers(args.run, **given(LayersOptions, args)), args)


def run_roofline(args: argparse.Namespace) -> Output:
    return _result_output(api.roofline(args.run, **given(RooflineOptions, args)), args)


def run_compare(args: argparse.Namespace) -> Output:
    return _result_output(api.compare(args.run_a, args.run_b, **given(CompareOptions, args)), args)


def run_diverge(args: argparse.Namespace) -> Output:
    return _result_output(api.diverge(args.model, **given(DivergeOptions, args)), args)


def run_timeline(args: argparse.Namespace) -> Output:
    source = api.resolve_run(args.run)
    if getattr(args, "panel", False):
        from mlms_nb.server.panel import open_in_panel

        text, html_text = open_in_panel(source, args.framework)
        return Output(source, _Shown(text, html_text), {"panel": text})
    if args.framework:
        if not hasattr(source, "traces") or args.framework not in source.traces:
            raise MlmsError(f"timeline: no trace of framework {args.framework!r} in this run")
        source = source.traces[args.framework]
    trace = source.trace if hasattr(source, "latency") else source
    return _with_figure(Output(trace, trace, display.render_json(trace)), lambda backend: api.timeline(trace, backend),
                        args)


def run_report(args: argparse.Namespace) -> Output:
    from mlms_nb.reporting.run import build_report, resolve_notebook_names

    result = build_report(resolve_notebook_names(args.runs), pdf=args.pdf, html=args.html, notebook=args.notebook,
                          paper=args.paper)
    return Output(result, result, result.to_dict())


def run_trust(args: argparse.Namespace) -> Output:
    if args.action in ("add", "remove") and not args.path:
        raise MlmsError(f"trust {args.action} needs a PATH (remove: or a sha256 prefix)")
    frame = {"add": api.trust_add, "remove": api.trust_remove}[args.action](args.path) if args.path and \
        args.action != "list" else api.trust_list()
    page = display.Table(frame, "Trusted assets", empty="nothing is trusted yet")
    return Output(frame, page, {"trusted": display.records(frame), "store": frame.attrs["note"]})


RUNNERS: dict[str, Callable[[argparse.Namespace], Output]] = {
    "models": run_models, "eval": run_eval, "history": run_history, "convert": run_convert,
    "layers": run_layers, "roofline": run_roofline, "compare": run_compare, "diverge": run_diverge,
    "timeline": run_timeline, "report": run_report, "trust": run_trust, "scheduler": run_scheduler,
    "agent": run_agent, "agents": run_agents,
}


VERBOSE = Argument(("--verbose",), {"action": "store_true",
                                    "help": "also show what the frameworks print (TensorFlow, ONNX Runtime, Kineto "
                                            "start-up lines and warnings); otherwise it is kept in "
                                            "$MLMS_HOME/logs/frameworks.log"})


def add_arguments(parser: argparse.ArgumentParser, verb: str) -> argparse.ArgumentParser:
    for flags, kwargs in [*ARGUMENTS[verb], VERBOSE]:
        parser.add_argument(*flags, **kwargs)
    return parser


def cli_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mlms", description="MLModelScope for the notebook: evaluate and profile models.")
    sub = parser.add_subparsers(dest="verb", metavar="VERB")
    for verb, text in VERBS.items():
        add_arguments(sub.add_parser(verb, help=text, description=text), verb)
    return parser


def help_text() -> str:
    lines = ["%mlms VERB [options]   (the same verbs as the `mlms` command)", ""]
    lines += [f"  {verb:<9} {text}" for verb, text in VERBS.items()]
    lines += ["", "%%mlms trace [--level FRAMEWORK] [--chrome PATH] [--save VAR] [-o]",
              "            run the cell under the tracer: a span for the cell, and every predictor used in it", "",
              "`%mlms VERB -h` shows a verb's options; -o returns the result, --save VAR stores it.",
              "A failed %mlms raises UsageError, so Run All stops there."]
    return "\n".join(lines)
