"""The verbs shared by the ``mlms`` command and the ``%mlms`` magic: their arguments, written once, and
what each verb returns (a value plus its plain-text, HTML and JSON renderings)."""
from __future__ import annotations

import argparse
import html
import json
from dataclasses import dataclass, field
from typing import Any, Callable

from mlms_nb import api
from mlms_nb.errors import MlmsError

VERBS: dict[str, str] = {
    "models": "list the models mlms-nb can run (built-in manifests and MLMS_MANIFEST_PATH)",
    "eval": "evaluate a model: accuracy on a dataset and latency per framework and batch size",
    "history": "list stored evaluations, newest first",
    "convert": "build the ONNX Runtime or TensorFlow copy of a model's PyTorch weights",
    "layers": "layer occurrence, latency or memory of a traced run (RUN: a history id or, in a notebook, a variable)",
    "roofline": "roofline of a run per layer or per model, under this machine's measured ceilings",
    "compare": "A/B comparison of two runs: latency deltas with a significance test, per-layer deltas",
    "diverge": "where frameworks' layer outputs diverge on the same inputs (and an INT8 copy's)",
    "timeline": "zoomable timeline of a traced run (Bokeh; matplotlib for print)",
    "report": "a PDF/HTML report and an executed, editable notebook of one run, or a comparison of several",
}

Arg = tuple[tuple[str, ...], dict[str, Any]]
JSON_FLAG: Arg = (("--json",), {"action": "store_true", "help": "print one JSON object instead of a table"})
RUN: Arg = (("run",), {"help": "a history id (see `history`), an evaluation id, a saved .json, or a notebook variable"})
PLOT: Arg = (("--plot",), {"default": "bokeh", "choices": ["bokeh", "matplotlib", "none"],
                           "help": "figure backend (shown in a notebook; written with --html)"})
HTML: Arg = (("--html",), {"metavar": "PATH", "default": None, "help": "write the figure as a standalone HTML page"})

ARGUMENTS: dict[str, list[Arg]] = {
    "models": [
        (("--framework",), {"help": "only this framework (torch, onnxruntime, tensorflow)"}),
        JSON_FLAG,
    ],
    "eval": [
        (("model",), {"help": "model name (see `models`) or a manifest .yaml path"}),
        (("--framework",), {"default": "torch", "help": "comma-separated frameworks, e.g. torch,onnxruntime,tensorflow"}),
        (("--batch-sizes",), {"default": "1", "help": "comma-separated batch sizes, e.g. 1,8"}),
        (("--dataset",), {"default": None, "help": "imagenet-samples | synthetic[:N] | an image folder | a .npz file"}),
        (("--scenario",), {"default": "single-stream", "choices": ["single-stream", "offline", "server"],
                           "help": "single-stream (p90), offline (throughput) or server (Poisson arrivals; p99)"}),
        (("--device",), {"default": "cpu", "help": "cpu or cuda[:N]"}),
        (("--threads",), {"type": int, "default": None, "help": "intra-op threads (default: the framework's)"}),
        (("--trace-level",), {"default": "NONE", "help": "NONE, APPLICATION, MODEL, FRAMEWORK, ML_LIBRARY, SYSTEM_LIBRARY, HARDWARE or FULL"}),
        (("--warmup",), {"default": "auto", "help": "untimed calls before timing: a count, or auto (until stable)"}),
        (("--min-repeats",), {"type": int, "default": 20, "help": "timed calls per batch size, at least"}),
        (("--min-time",), {"type": float, "default": 1.0, "help": "seconds of timed calls per batch size, at least"}),
        (("--qps",), {"type": float, "default": None, "help": "server scenario: target queries per second"}),
        (("--latency-bound",), {"type": float, "default": None, "help": "server scenario: p99 bound in ms"}),
        (("--limit",), {"type": int, "default": None, "help": "use at most this many dataset inputs"}),
        (("--no-history",), {"action": "store_true", "help": "do not store the result in the history store"}),
        (("--trust",), {"action": "store_true", "help": "allow the manifest's code steps to run"}),
        JSON_FLAG,
    ],
    "history": [
        (("--model",), {"default": None, "help": "only this model"}),
        (("--framework",), {"default": None, "help": "only this framework"}),
        (("--version",), {"default": None, "help": "only manifest versions in this range, e.g. ^1.0"}),
        (("--limit",), {"type": int, "default": 50, "help": "at most this many rows"}),
        JSON_FLAG,
    ],
    "layers": [
        RUN,
        (("--what",), {"default": "latency", "choices": ["occurrence", "latency", "memory"], "help": "which table"}),
        (("--by",), {"default": "layer", "choices": ["layer", "type"], "help": "latency per layer or per layer type"}),
        PLOT, HTML, JSON_FLAG,
    ],
    "roofline": [
        RUN,
        (("--per",), {"default": "layer", "choices": ["layer", "model"], "help": "each traced layer, or the model"}),
        (("--framework",), {"default": None, "help": "only this framework"}),
        PLOT, HTML, JSON_FLAG,
    ],
    "compare": [
        (("run_a",), {"help": "run A: a history id, evaluation id, saved .json, or notebook variable"}),
        (("run_b",), {"help": "run B, the same"}),
        PLOT, HTML, JSON_FLAG,
    ],
    "diverge": [
        (("model",), {"help": "model name (see `models`)"}),
        (("--framework",), {"default": "torch,onnxruntime",
                            "help": "comma-separated frameworks (the first is the reference), e.g. torch,onnxruntime,tensorflow"}),
        (("--dataset",), {"default": "imagenet-samples", "help": "imagenet-samples | an image folder | a .npz file"}),
        (("--tolerance",), {"type": float, "default": None, "help": "error above which a layer diverges"}),
        (("--limit",), {"type": int, "default": None, "help": "use at most this many inputs"}),
        (("--quantized",), {"action": "store_true", "help": "also compare an INT8-quantized ONNX Runtime copy"}),
        PLOT, HTML, JSON_FLAG,
    ],
    "timeline": [
        RUN,
        (("--framework",), {"default": None, "help": "only this framework's trace"}),
        (("--plot",), {"default": "bokeh", "choices": ["bokeh", "matplotlib"], "help": "figure backend"}),
        HTML,
        (("--panel",), {"action": "store_true",
                        "help": "open the run in the JupyterLab timeline panel instead of drawing it in the cell"}),
    ],
    "report": [
        (("runs",), {"nargs": "+", "metavar": "RUN", "help": "history ids, evaluation ids, saved .json files or "
                                                               "notebook variables; several give a comparison"}),
        (("--pdf",), {"metavar": "PATH", "default": None, "help": "write the PDF here (Chromium prints it)"}),
        (("--html",), {"metavar": "PATH", "default": None, "help": "write the report as one HTML page here"}),
        (("--notebook",), {"metavar": "PATH", "default": None, "help": "keep the executed, editable notebook here"}),
        (("--paper",), {"default": "A4", "choices": ["A4", "Letter"], "help": "paper size of the PDF"}),
        JSON_FLAG,
    ],
    "convert": [
        (("model",), {"help": "model name with a PyTorch manifest"}),
        (("--to",), {"required": True, "help": "target framework: onnxruntime (onnx) or tensorflow (tf)"}),
        (("--force",), {"action": "store_true", "help": "rebuild even when a verified copy is cached"}),
        JSON_FLAG,
    ],
}


@dataclass
class Output:
    """What a verb produced: the Python value, and how to show it as text, HTML and JSON."""
    value: Any
    text: str
    html: str
    data: Any = field(default=None)
    exit_code: int = 0
    figure: Any = field(default=None, repr=False)

    def _repr_mimebundle_(self, include=None, exclude=None) -> dict[str, str]:
        return {"text/plain": self.text, "text/html": self.html}

    def json(self) -> str:
        return json.dumps(self.data, indent=2, default=_json_default)


def _json_default(obj: Any) -> Any:
    if hasattr(obj, "item"):
        return obj.item()
    if hasattr(obj, "tolist"):
        return obj.tolist()
    return str(obj)


def _frame_output(frame, title: str, empty: str) -> Output:
    import pandas as pd

    if frame.empty:
        return Output(frame, empty, f"<p>{html.escape(empty)}</p>", [])
    note = frame.attrs.get("note", "")
    with pd.option_context("display.max_colwidth", 60, "display.width", 200):
        text = f"{title}\n{frame.to_string(index=False)}" + (f"\n{note}" if note else "")
    body = frame.to_html(index=False, border=0, na_rep="")
    html_text = f"<h4>{html.escape(title)}</h4>{body}" + (f"<p><small>{html.escape(note)}</small></p>" if note else "")
    return Output(frame, text, html_text, json.loads(frame.to_json(orient="records")))


def run_models(args: argparse.Namespace) -> Output:
    frame = api.models(framework=args.framework)
    shown = frame.drop(columns=["description", "source"], errors="ignore")
    shown.attrs = frame.attrs
    out = _frame_output(shown, "Models", "no models found")
    errors = frame.attrs.get("errors") or {}
    if errors:
        out.text += "\nManifests that failed to load:\n" + "\n".join(f"  {e}" for e in errors.values())
        out.html += "<p>Manifests that failed to load:</p><ul>" + "".join(
            f"<li>{html.escape(e)}</li>" for e in errors.values()) + "</ul>"
    out.data = {"models": out.data, "errors": errors}
    return out


def run_eval(args: argparse.Namespace) -> Output:
    warmup = args.warmup if args.warmup == "auto" else int(args.warmup)
    evaluation = api.evaluate(
        args.model, framework=args.framework, batch_sizes=args.batch_sizes, dataset=args.dataset,
        scenario=args.scenario, device=args.device, threads=args.threads, trace_level=args.trace_level,
        warmup=warmup, min_repeats=args.min_repeats, min_time_s=args.min_time, target_qps=args.qps,
        latency_bound_ms=args.latency_bound, limit=args.limit, trust=args.trust,
        progress=not getattr(args, "json", False), history=not args.no_history)
    out = Output(evaluation, evaluation.to_text(), evaluation._repr_html_(), evaluation_json(evaluation),
                 exit_code=0 if evaluation.complete else 130)
    if not evaluation.trace_overhead.empty:
        overhead = _frame_output(evaluation.trace_overhead, "Tracing overhead (traced ÷ untraced median)", "")
        out.text += "\n\n" + overhead.text
        out.html += overhead.html
        for fw, trace in evaluation.traces.items():
            summary = trace_summary(trace)
            out.text += f"\n\n{fw}: " + summary.text
            out.html += f"<h4>{html.escape(fw)}</h4>" + summary.html
    return out


def evaluation_json(evaluation) -> dict:
    """The CLI's JSON: ``{"results": [{"model", "framework", "accuracy", "cold_start", "latency": [...]}]}``."""
    results = []
    for fw in evaluation.frameworks:
        acc = evaluation.accuracy
        acc_row = acc[acc["framework"] == fw].to_dict("records") if not acc.empty else []
        lat = evaluation.latency
        lat_rows = lat[lat["framework"] == fw].drop(columns=["framework"]).to_dict("records") if not lat.empty else []
        cold = evaluation.cold_start
        cold_row = cold[cold["framework"] == fw].drop(columns=["framework"]).to_dict("records") if not cold.empty else []
        results.append({
            "model": evaluation.model, "model_version": evaluation.model_version, "framework": fw,
            "accuracy": ({k: acc_row[0][k] for k in ("top1", "top5", "n")} | {"dataset": acc_row[0]["dataset"]})
            if acc_row else None,
            "cold_start": cold_row[0] if cold_row else None,
            "trace_overhead": (evaluation.trace_overhead.query("framework == @fw").drop(columns=["framework"])
                               .to_dict("records") if not evaluation.trace_overhead.empty else []),
            "latency": lat_rows,
        })
    return {"evaluation_id": evaluation.id, "complete": evaluation.complete, "warnings": evaluation.warnings,
            "stack": evaluation.stack, "options": evaluation.options, "results": results}


def trace_summary(trace) -> Output:
    """Spans per level and kind (count, total and median duration in ms) and what could not be traced."""
    spans = trace.spans
    if spans.empty:
        frame = spans
    else:
        frame = (spans.assign(duration_ms=spans["duration_ns"] / 1e6)
                 .groupby(["level", "kind"], observed=True)["duration_ms"]
                 .agg(spans="count", total_ms="sum", median_ms="median").reset_index())
    frame.attrs["note"] = (f"trace {trace.trace_id}: {len(spans)} spans, {len(trace.counters)} counter samples; "
                           "durations from time.perf_counter_ns, summed over every traced call")
    out = _frame_output(frame, "Trace", "no spans were recorded")
    unavailable = trace.metadata.get("unavailable") or {}
    if unavailable:
        out.text += "\nNot traced here:\n" + "\n".join(f"  {k}: {v}" for k, v in unavailable.items())
        out.html += "<p>Not traced here:</p><ul>" + "".join(
            f"<li>{html.escape(k)}: {html.escape(str(v))}</li>" for k, v in unavailable.items()) + "</ul>"
    out.value = trace
    return out


def run_history(args: argparse.Namespace) -> Output:
    frame = api.history(model=args.model, framework=args.framework, version=args.version, limit=args.limit)
    return _frame_output(frame, "Evaluation history (newest first)", "no stored evaluations match")


def run_convert(args: argparse.Namespace) -> Output:
    artifact = api.convert(args.model, to=args.to, force=args.force)
    text = f"{args.model} -> {args.to}: {artifact.path}\nsha256 {artifact.sha256}"
    data = {"model": args.model, "framework": args.to, "path": str(artifact.path), "sha256": artifact.sha256}
    return Output(artifact, text, f"<pre>{html.escape(text)}</pre>", data)


def _with_figure(out: Output, make_figure: Callable[[str], Any], args: argparse.Namespace) -> Output:
    """Attach the figure (``--plot``) and write it as a page when ``--html`` names one."""
    backend = getattr(args, "plot", "bokeh")
    if backend == "none" and not args.html:
        return out
    out.figure = make_figure("bokeh" if backend == "none" else backend)
    if args.html:
        from pathlib import Path

        from mlms_nb.analyses import to_html

        path = Path(args.html)
        path.write_text(to_html(out.figure), encoding="utf-8")
        out.text += f"\nfigure written to {path}"
        out.html += f"<p><small>figure written to {html.escape(str(path))}</small></p>"
    return out


def _analysis_output(result, args: argparse.Namespace) -> Output:
    data = json.loads(result.table.to_json(orient="records", default_handler=str))
    out = Output(result, result.to_text(), result._repr_html_(), {"title": result.title, "note": result.note,
                                                                    "rows": data})
    for name, frame in result.extra.items():
        extra = _frame_output(frame, name.replace("_", " ").capitalize(), f"no {name.replace('_', ' ')}")
        out.text += "\n\n" + extra.text
        out.html += extra.html
        out.data[name] = extra.data
    return _with_figure(out, result.plot, args)


def run_layers(args: argparse.Namespace) -> Output:

    return _analysis_output(api.layers(args.run, what=args.what, by=args.by), args)


def run_roofline(args: argparse.Namespace) -> Output:

    return _analysis_output(api.roofline(args.run, per=args.per, framework=args.framework), args)


def run_compare(args: argparse.Namespace) -> Output:

    return _analysis_output(api.compare(args.run_a, args.run_b), args)


def run_diverge(args: argparse.Namespace) -> Output:
    frameworks = [f.strip() for f in args.framework.split(",") if f.strip()]
    kwargs = {"tolerance": args.tolerance} if args.tolerance is not None else {}
    result = api.diverge(args.model, frameworks=frameworks, dataset=args.dataset, limit=args.limit,
                     quantized=args.quantized, **kwargs)
    table = result.layers
    out = Output(result, result.to_text() if hasattr(result, "to_text") else repr(result), result._repr_html_(),
                 {"layers": json.loads(table.to_json(orient="records", default_handler=str)),
                  "first_divergent_layer": result.first_divergent_layer})
    return _with_figure(out, result.plot, args)


def run_timeline(args: argparse.Namespace) -> Output:
    run = api.resolve_run(args.run)
    if getattr(args, "panel", False):
        from mlms_nb.server.panel import open_in_panel

        text, html_text = open_in_panel(run, args.framework)
        return Output(run, text, html_text, {"panel": text})
    if args.framework:
        if not hasattr(run, "traces") or args.framework not in run.traces:
            raise MlmsError(f"timeline: no trace of framework {args.framework!r} in this run")
        run = run.traces[args.framework]
    trace = run.trace if hasattr(run, "latency") else run
    out = trace_summary(trace)
    out.value = trace
    return _with_figure(out, lambda backend: api.timeline(trace, backend), args)


def run_report(args: argparse.Namespace) -> Output:
    from mlms_nb.reporting.run import build_report, resolve_notebook_names

    result = build_report(resolve_notebook_names(args.runs), pdf=args.pdf, html=args.html, notebook=args.notebook,
                          paper=args.paper)
    return Output(result, result.to_text(), result._repr_html_(), result.to_dict())


RUNNERS: dict[str, Callable[[argparse.Namespace], Output]] = {
    "models": run_models, "eval": run_eval, "history": run_history, "convert": run_convert,
    "layers": run_layers, "roofline": run_roofline, "compare": run_compare, "diverge": run_diverge,
    "timeline": run_timeline, "report": run_report,
}


def add_arguments(parser: argparse.ArgumentParser, verb: str) -> argparse.ArgumentParser:
    for flags, kwargs in ARGUMENTS[verb]:
        parser.add_argument(*flags, **kwargs)
    return parser


def cli_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mlms", description="MLModelScope for the notebook: evaluate and profile models.")
    sub = parser.add_subparsers(dest="verb", metavar="VERB")
    for verb, help_text in VERBS.items():
        add_arguments(sub.add_parser(verb, help=help_text, description=help_text), verb)
    return parser


def help_text() -> str:
    lines = ["%mlms VERB [options]   (the same verbs as the `mlms` command)", ""]
    lines += [f"  {verb:<9} {text}" for verb, text in VERBS.items()]
    lines += ["", "`%mlms VERB -h` shows a verb's options; -o returns the result, --save VAR stores it."]
    return "\n".join(lines)
