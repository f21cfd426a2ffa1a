"""THE facade: every verb of the Python API, the ``mlms`` command and the ``%mlms`` magic goes through here.

Evaluate and keep: :func:`evaluate`, :func:`models`, :func:`history`, :func:`load_evaluation`, :func:`convert`.
Trace: :func:`trace`, :func:`load_trace`. Analyse a run (an `Evaluation`, a `Trace`, a history row id, an
evaluation id or a saved ``.json``): :func:`layers`, :func:`roofline`, :func:`batch_scaling`, :func:`compare`,
:func:`kernels`, :func:`timeline`. Across frameworks: :func:`diverge`.

The data objects know no analysis: ``Evaluation`` and ``Trace`` declare their convenience methods as
:class:`mlms_nb._facade.FacadeMethod` (``ev.layers()`` is ``layers(ev)``), which import this module when called.

One module on purpose (~510 lines): issue 9 asks for one facade that every verb goes through; each function here is
a few lines that validate options and call the layer below.
"""
from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import pandas as pd

from mlms_nb.analyses import batch_scaling as _batch_scaling
from mlms_nb.analyses import compare as _compare
from mlms_nb.analyses import kernels as _kernels
from mlms_nb.analyses import normalized as _normalized
from mlms_nb.analyses import layers as _layers
from mlms_nb.analyses import phases as _phases
from mlms_nb.analyses import roofline as _roofline
from mlms_nb.analyses import timeline as _timeline
from mlms_nb.analyses import Displayable
from mlms_nb.analyses.result import Analysis
from mlms_nb.divergence import Divergence, OutputDivergence
from mlms_nb.divergence.outputs import diverge_outputs as _diverge_outputs
from mlms_nb.divergence.run import diverge as _diverge
from mlms_nb import trust as _trust
from mlms_nb._quiet import quieted
from mlms_nb.tables import for_people
from mlms_nb.fleet.registry import agents_frame, list_agents
from mlms_nb.fleet.run import evaluate_on_agents, tls_of
from mlms_nb.errors import MlmsError
from mlms_nb.evaluation.result import Evaluation
from mlms_nb.evaluation.roofline_run import framework_roofline
from mlms_nb.evaluation.manifests import manifests_for
from mlms_nb.evaluation.runner import EvaluationRunner, record_failures
from mlms_nb.frameworks.base import stop_auto_traced
from mlms_nb.frameworks.convert import convert as _convert
from mlms_nb.frameworks.costs import model_costs
from mlms_nb.frameworks.live import check_trust
from mlms_nb.frameworks.modelfiles import file_kind
from mlms_nb.generation.manifests import causal_lm_manifest, causal_lm_source
from mlms_nb.manifest import ManifestCatalog, canonical_framework
from mlms_nb.options import (
    AgentOptions, AgentsOptions, CompareOptions, DivergeOptions, EvaluateOptions, HistoryOptions, LayersOptions, RooflineOptions,
    SchedulerOptions, spell, spell_on, takes,
)
from mlms_nb.schema.levels import TraceLevel
from mlms_nb.store.history import HistoryStore
from mlms_nb.store.keeping import HistoryKeeper
from mlms_nb.theory.ceilings import Ceilings
from mlms_nb.theory.ceilings import machine_ceilings as _machine_ceilings
from mlms_nb.tracing.otel import parent_from_otel
from mlms_nb.tracing.trace import Trace
from mlms_nb.tracing.trace import load_trace as _load_trace
from mlms_nb.tracing.tracer import Tracer, use_tracer

log = logging.getLogger(__name__)

__all__ = ["Analysis", "TraceSession", "across", "agent", "agents", "batch_scaling", "compare", "convert", "diverge",
           "evaluate", "history", "history_import",
           "kernels", "layer_costs", "layers", "load_evaluation", "load_trace", "machine_ceilings", "model_costs",
           "models", "resolve_run", "roofline", "scheduler", "timeline", "trace", "trust_add", "trust_list", "trust_remove"]


# ---------------------------------------------------------------------------------------------- models, evaluate

def models(framework: str | None = None) -> pd.DataFrame:
    """Every manifest mlms-nb can see, one row per model and framework; ``origin`` says whether it is built in
    or from ``MLMS_MANIFEST_PATH`` ("user, not the default" when a built-in of that name and framework wins)."""
    catalog = ManifestCatalog()
    shadowed = {id(user): builtin for user, builtin in catalog.shadowed()}
    rows = []
    for m in catalog.select(framework):
        origin = "built-in" if catalog.is_builtin(m) else ("user, not the default" if id(m) in shadowed else "user")
        rows.append({
            "model": m.name, "version": m.version, "framework": m.framework.name,
            "framework_version": m.framework.version,
            "input": "x".join("?" if d is None else str(d) for d in m.fed_input.dimensions or ())
                     + (f" (+{len(m.inputs) - 1} more)" if len(m.inputs) > 1 else ""),
            "layout": m.fed_input.layout, "weights": m.model.weights,
            "top1": m.attributes.get("top1"), "origin": origin, "description": m.description, "source": m.source,
        })
    frame = pd.DataFrame(rows).sort_values(["model", "framework"], ignore_index=True) if rows else pd.DataFrame()
    frame.attrs["errors"] = catalog.errors
    notes = ["top1: the published ImageNet top-1 accuracy (%), from the manifest"]
    notes += [f"{user.name} {user.version} ({user.framework.name}) from {user.source} has the name of a built-in "
              f"manifest ({builtin.version}), which is used by default: eval it by its path or as "
              f"{user.name}@{user.version}" for user, builtin in catalog.shadowed()
              if framework is None or user.framework.name == canonical_framework(framework)]
    frame.attrs["note"] = "\n".join(notes)
    return for_people(frame)


@quieted("evaluate")
@takes(EvaluateOptions, "model", "inputs", "outputs", "preprocess", "postprocess", "metrics")
def evaluate(model: Any, options: EvaluateOptions, *, inputs: Any = None, outputs: Any = None, preprocess: Any = None,
             postprocess: Any = None, metrics: Any = None) -> Evaluation | list[Evaluation]:
    """Evaluate ``model`` in one or more frameworks; returns an `Evaluation`. ``model``: a name (see
    :func:`models`), a manifest path or `Manifest`, or a live ``torch.nn.Module`` / ``keras.Model`` whose
    ``inputs`` (an example batch, N first, or an `InputSpec` / dict), ``outputs``, ``preprocess`` and
    ``postprocess`` describe it as a manifest would (:func:`mlms_nb.frameworks.live.manifest_for`).

    A PyTorch manifest (or live module) asked for with ``framework="torch,onnxruntime,tensorflow"`` runs the copies
    the kept converters make of it (cached by sha256; docs/byom.md).

    Trust (docs/trust.md): entrypoints, code steps and model files that can run code (TorchScript, .pt2,
    SavedModel, Keras custom objects) run only with ``trust=True`` or when in the trust store (:func:`trust_add`).

    The timed loop runs until both ``min_repeats`` calls and ``min_time_s`` seconds are reached (LoadGen style);
    ``scenario``: single-stream (report p90), offline (throughput) or server (Poisson arrivals at ``target_qps``;
    p99 against ``latency_bound_ms``). Latency always comes from the untraced sweep; with a ``trace_level`` above
    NONE a traced pass of ``trace_repeats`` calls per batch size follows it (``evaluation.trace``,
    ``evaluation.trace_overhead``). ``history``: store the result (True: the default store; a string: an
    SQLAlchemy URL; False: don't); a failing store is a warning on the result, never a lost measurement.

    Outputs: ``capture_outputs`` says what ``evaluation.outputs`` keeps of every output (none, summary, all,
    first:N); the kept values of each framework are compared with the first framework's in
    ``evaluation.output_agreement`` (max/mean abs and rel error, cosine of vectors, flipped argmax or 0.5-threshold
    decisions, outputs not compared with why), plus ``metrics``: built-in names (mse,
    mae, iou, exact_match) or ``{name: fn(output, reference) -> float}``. A dataset with targets per output (``.npz``
    ``target`` / ``target:<output>``, Parquet columns of those names, Python ``(input, targets)`` pairs) also scores
    each framework's outputs against them: ``evaluation.target_metrics`` (mean, std, 95% CI, count, unit).

    Agents (docs/agents.md): ``on="tcp://host:8786"`` runs it on an mlms agent of that Dask scheduler satisfying
    ``where`` (``"torch>=2.0 device=cpu team=vision"``) and the manifests' framework ranges, again on another one
    when it dies mid-run; ``all_agents=True`` on every matching agent in parallel: a list, one `Evaluation` per agent.
    """
    if metrics is not None:
        from mlms_nb.evaluation.agreement import resolve_metrics

        resolve_metrics(metrics)  # an unknown name is refused before anything runs
    if causal_lm_source(model, options.scenario, inputs):  # a save_pretrained folder, a hub id, a live causal LM
        model = causal_lm_manifest(model)
    failed: dict[str, str] = {}  # a framework whose converted copy could not be made: its outcome, not the end
    manifests = manifests_for(model, options.framework, explicit="framework" in options.model_fields_set,
                              trust=options.trust, live=(inputs, outputs, preprocess, postprocess), failed=failed)
    ran = [m.framework.name for m in manifests]
    frameworks = ran + [fw for fw in failed if fw not in ran]
    if options.framework != frameworks:  # the options record what was run (a manifest file names its framework)
        options = options.model_copy(update={"framework": frameworks})
    if any(m.task == "text-generation" for m in manifests) and not options.scenario.startswith("generate"):
        # a causal LM generates: the single-stream and offline scenarios become generate, server generate-server
        options = options.model_copy(update={"scenario": "generate-server" if options.scenario == "server"
                                             else "generate"})
    for manifest in manifests:
        check_trust(manifest, options.trust)
    if options.remote.on:
        results = evaluate_on_agents(manifests, options, metrics)
        for one in results if isinstance(results, list) else [results]:
            record_failures(one, failed, options.batch_sizes)
        return results
    keeper = HistoryKeeper(None if options.history is True else str(options.history)) if options.history else None
    evaluation = EvaluationRunner(manifests, options, sink=keeper, metrics=metrics, failed=failed).run()
    if keeper is not None:
        keeper.finish(evaluation)
        evaluation.saved = keeper.kept(evaluation)
    else:
        evaluation.saved = False  # history=False: nothing is in the store, and "saved" says so
    return evaluation


@takes(HistoryOptions)
def history(options: HistoryOptions) -> pd.DataFrame:
    """Stored evaluations, newest first (one row per evaluation and framework; columns:
    :data:`mlms_nb.schema.evaluation.HISTORY`)."""
    return for_people(HistoryStore(options.url).query(model=options.model, framework=options.framework,
                                                      version=options.version, complete=options.complete,
                                                      limit=options.limit))


def history_import(path: str | os.PathLike, url: str | None = None) -> pd.DataFrame:
    """Put back into the history store (``url``; default: the default store) the evaluations an outage wrote to
    ``$MLMS_HOME/unsaved/`` instead: ``path`` is one such ``.json`` file or a folder of them. A row the failing
    process left half written is replaced by the whole result. (The next successful open of the store they were
    meant for does this by itself.) Returns the stored rows of the evaluations put back."""
    from mlms_nb.store.recover import put_back

    source = Path(path).expanduser()
    if not source.exists():
        raise MlmsError(f"history import: no such file or folder {source}")
    store = HistoryStore(url)  # opening it puts back the files noted for it
    ids = [*store.put_back, *put_back(store, [source])]
    frame = store.query()
    return frame[frame["evaluation_id"].isin(ids)].reset_index(drop=True)


def load_evaluation(ref: str | int, url: str | None = None) -> Evaluation:
    """An `Evaluation` from history (row id or evaluation id) or a saved JSON file."""
    if isinstance(ref, str) and ref.endswith(".json") and Path(ref).exists():
        return Evaluation.load(ref)
    store = HistoryStore(url)
    evaluation = store.load(int(ref) if str(ref).isdigit() else ref)
    for path in store.traces(evaluation.id)["path"].dropna():
        if Path(path).exists():
            trace = Trace.load(path)
            framework = trace.metadata.get("framework", Path(path).name)
            if framework in evaluation.frameworks:
                evaluation.traces[framework] = trace
    return evaluation


@quieted("convert")
def convert(model: str, to: str, force: bool = False):
    """Build (or reuse) the ONNX Runtime or TensorFlow copy of a model's PyTorch weights."""
    return _convert(model, to=canonical_framework(to), force=force)


# ---------------------------------------------------------------------------------------------- tracing

class TraceSession:
    """What ``with mlms_nb.trace(...) as session:`` gives: ``session.tracer`` while it runs, ``session.trace``
    (a `Trace`) after. Every predictor opened inside the block is traced at the session's level."""

    def __init__(self, level: str = "FRAMEWORK", name: str = "traced block"):
        self.tracer = Tracer(TraceLevel.parse(level))
        self.name = name
        self.trace = None

    def __enter__(self) -> "TraceSession":
        try:
            parent = parent_from_otel()
        except MlmsError:  # OpenTelemetry not installed: nothing to join
            parent = None
        if parent:
            self.tracer.metadata["otel_parent"] = parent
        self._use = use_tracer(self.tracer)
        self._use.__enter__()
        self._root = self.tracer.start(self.name, TraceLevel.APPLICATION, "application")
        return self

    def __exit__(self, *exc) -> None:
        try:
            stop_auto_traced(self.tracer)
        finally:
            self.tracer.end(self._root)
            self._use.__exit__(*exc)
            self.trace = self.tracer.trace()


def trace(level: str = "FRAMEWORK", name: str = "traced block") -> TraceSession:
    """Trace a block of the user's own pipeline: ``with mlms_nb.trace("FRAMEWORK") as t: ...``; then
    ``t.trace`` holds an APPLICATION span for the block plus the spans of every predictor used in it."""
    return TraceSession(level, name)


def load_trace(path) -> Trace:
    """A `Trace` from a saved Parquet folder or a Chrome trace JSON (ours, PyTorch Kineto, ONNX Runtime)."""
    return _load_trace(path)


# ---------------------------------------------------------------------------------------------- analyses

def resolve_run(run) -> Evaluation | Trace:
    """An Evaluation or Trace as is; a history row id / evaluation id / saved ``.json`` path -> the Evaluation."""
    if isinstance(run, (Evaluation, Trace)):
        return run
    if isinstance(run, (str, int)):
        return load_evaluation(run)
    raise MlmsError(f"expected an Evaluation, a Trace, or a history id, not {type(run).__name__}")


def _spans(run) -> pd.DataFrame:
    run = resolve_run(run)
    if isinstance(run, Trace):
        return run.spans
    return run.trace.spans  # an untraced evaluation raises a sentence saying how to trace it


def _traced_layers(run) -> pd.DataFrame:
    spans = _spans(run)
    if not (spans["kind"] == "layer").any():
        raise MlmsError("this trace has no layer spans: trace it at level FRAMEWORK or deeper "
                        f"({spell('trace_level', 'FRAMEWORK')})")
    return spans


@takes(LayersOptions, "run")
def layers(run, options: LayersOptions) -> Analysis:
    """Layer occurrence per type (``what="occurrence"``), latency per layer or type over the traced calls
    (``"latency"``, ``by="layer" | "type"``), or memory per layer (``"memory"``). A generate run's trace gives
    them per phase (prefill, and the decode steps aggregated), side by side; ``phase`` keeps one."""
    what, by = options.what, options.by
    table = _layers.compute(_traced_layers(run), what=what, by=by, phase=options.phase)
    if options.framework is not None:
        have = list(dict.fromkeys(table["framework"]))
        if options.framework not in have:
            raise MlmsError(f"{spell('framework', options.framework)}: this run traced {', '.join(have)}")
        attrs = table.attrs
        table = table[table["framework"] == options.framework].reset_index(drop=True)
        table.attrs = attrs
    title = {"occurrence": "Layer occurrence per type (calls in one predict call)",
             "latency": f"Layer latency per {by} (self time over the traced calls, ms)",
             "memory": "Memory held per layer (bytes allocated and still held at its end)"}[what]
    return Analysis("layers", title, table, _layers.plot)


def layer_costs(model: str, framework: str, batch_size: int) -> pd.DataFrame:
    """Theoretical per-layer costs with ``layer_name`` = the PyTorch module name the traced layers carry."""
    costs = model_costs(model, framework, batch_size=batch_size)
    if "layer_name" not in costs:  # ONNX nodes: named after the module they were exported from, where known
        costs = costs.assign(layer_name=costs["torch_name"].where(costs["torch_name"].notna(), costs["node_name"]))
    return costs


def machine_ceilings(device: str = "cpu", refresh: bool = False, url: str | None = None, *, framework: str = "torch",
                     threads: int | None = None, dtype: str = "float32") -> Ceilings:
    """This machine's measured peak FLOP/s and memory bandwidth for ``framework``'s own kernels on ``device``, with
    ``threads`` intra-op threads (None: the framework's default) in ``dtype``, cached per stack in the history store
    (``url``; default store); ``refresh=True`` measures anew (about a second per framework on a CPU)."""
    return _machine_ceilings(device, refresh=refresh, cache=HistoryStore(url), framework=framework, threads=threads,
                             dtype=dtype)


@takes(RooflineOptions, "run")
def roofline(run, options: RooflineOptions) -> Analysis:
    """The roofline: theoretical FLOPs and bytes against measured time, each framework under its own measured
    ceilings (its best GEMM/convolution and a copy, at the run's threads; cached in the history store); points
    above their roof are flagged with their likely cause. ``per="layer"``: each traced layer (self time, median
    over the traced calls); ``per="model"``: the whole model per framework and batch size (the untraced median
    latency). Costs come from the run's own manifest and artifact, at its traced shapes where sizes are dynamic."""
    evaluation = resolve_run(run)
    if not isinstance(evaluation, Evaluation):
        raise MlmsError("roofline needs an Evaluation (its model and latency), not a bare Trace")
    per, framework, device = options.per, options.framework, options.device
    frameworks = [framework] if framework else list(evaluation.frameworks)
    device = device or str(evaluation.options.get("device") or "cpu")
    store = HistoryStore()
    skipped = []
    if per == "layer":
        for fw in frameworks:
            if evaluation.traces.get(fw) is None:
                raise MlmsError(f"roofline per layer needs a trace of {fw}: evaluate with "
                                f"{spell('trace_level', 'FRAMEWORK')}")
        if not framework:  # every framework whose trace has layer spans (a generate run's ONNX Runtime has none)
            spans = {fw: evaluation.traces[fw].spans for fw in frameworks}
            skipped = [fw for fw in frameworks if not (spans[fw]["kind"] == "layer").any()]
            frameworks = [fw for fw in frameworks if fw not in skipped] or frameworks
    parts, ceilings = zip(*(framework_roofline(evaluation, fw, per, device, store) for fw in frameworks))
    if options.phase is not None:
        parts = tuple(_phases.only_phase(p, options.phase) for p in parts)
    table = pd.concat(parts, ignore_index=True) if len(parts) > 1 else parts[0]
    table.attrs = dict(parts[0].attrs)
    if len(parts) > 1:
        table.attrs["note"] = "\n".join(f"{fw}: {p.attrs.get('note', '')}" for fw, p in zip(frameworks, parts))
    if skipped:
        table.attrs["note"] = (table.attrs.get("note", "") + f"\nleft out: {', '.join(skipped)} (its trace has no "
                               "layer spans: its step model records none)")
    roofs = "; ".join(f"{c.framework} {c.peak_flops_per_s / 1e9:.1f} GFLOP/s, {c.bandwidth_bytes_per_s / 1e9:.1f} "
                      f"GB/s, ridge {c.ridge_flop_per_byte:.2f} FLOP/byte" for c in ceilings)
    title = f"Roofline of {evaluation.model} per {per} on {device} (each framework's own ceilings: {roofs})"
    return Analysis("roofline", title, table, _roofline.plot,
                    extra={"ceilings": pd.concat([c.to_frame() for c in ceilings], ignore_index=True)})


def batch_scaling(run) -> Analysis:
    """Latency and throughput against batch size per framework, and the saturation batch size."""
    evaluation = resolve_run(run)
    table = _batch_scaling.compute(evaluation)
    return Analysis("batch_scaling", f"Batch scaling of {evaluation.model}", table, _batch_scaling.plot)


@takes(CompareOptions, "run_a", "run_b", "labels")
def compare(run_a, run_b, options: CompareOptions, *, labels: tuple[str, str] = ("A", "B")) -> Analysis:
    """A/B: per framework and batch size, median latency deltas with a Mann-Whitney U test on the raw samples
    and a bootstrap CI; per-layer deltas too (``.extra["layers"]``) when both runs were traced: for every framework
    both traced (a ``framework`` column), or ``framework_a`` of A against ``framework_b`` of B."""
    a, b = resolve_run(run_a), resolve_run(run_b)
    table = _compare.compute(a, b, labels=labels)
    extra = {}
    if a.traces and b.traces:
        extra["layers"] = _compare_layers(a, b, options, labels)
    elif options.framework_a or options.framework_b:
        raise MlmsError(f"{spell('framework_a', options.framework_a or options.framework_b)} picks the layers to "
                        f"compare, and only traced runs have layers: {'A' if not a.traces else 'B'} was not traced")
    return Analysis("compare", f"{labels[0]} = {a.model} ({a.id}) vs {labels[1]} = {b.model} ({b.id})", table,
                    _compare.plot, extra=extra)


def _compare_layers(a: Evaluation, b: Evaluation, options: CompareOptions, labels) -> pd.DataFrame:
    """Per-layer deltas of each framework pair (A's framework, B's framework), one frame with a framework column."""
    fa, fb = options.framework_a, options.framework_b or options.framework_a
    if fa is None and fb is None:
        pairs = [(f, f) for f in a.traces if f in b.traces]
        if not pairs and len(a.traces) == 1 and len(b.traces) == 1:
            pairs = [(next(iter(a.traces)), next(iter(b.traces)))]
    else:
        pairs = [(fa or fb, fb)]
    for label, run, fw in ((labels[0], a, pairs[0][0] if pairs else None), (labels[1], b, pairs[0][1] if pairs else None)):
        if fw is not None and fw not in run.traces:
            raise MlmsError(f"{label} traced {', '.join(run.traces)}, not {fw!r}: choose with "
                            f"{spell('framework_a', fw)} / {spell('framework_b', fw)}")
    if not pairs:
        raise MlmsError(f"{labels[0]} traced {', '.join(a.traces)} and {labels[1]} {', '.join(b.traces)}: no framework "
                        f"in common; pick one of each with {spell('framework_a', next(iter(a.traces)))} and "
                        f"{spell('framework_b', next(iter(b.traces)))}")
    frames = []
    for x, y in pairs:
        part = _compare.layers(a.traces[x].spans, b.traces[y].spans, labels=labels)
        frames.append(part.assign(framework=x if x == y else f"{x} vs {y}"))
    out = pd.concat(frames, ignore_index=True)
    out = out[["framework", *[c for c in out.columns if c != "framework"]]]
    out.attrs = dict(frames[0].attrs)
    return out


def kernels(run) -> Analysis:
    """GPU vs CPU time per layer (from CUPTI kernels attributed to layers); empty, with the reason, on CPU."""
    source = resolve_run(run)
    trace_of_run = source.trace if isinstance(source, Evaluation) else source
    table = _kernels.compute(trace_of_run)
    return Analysis("kernels", "GPU vs CPU time per layer", table, _kernels.plot,
                    extra={"kernel_table": _kernels.kernel_table(trace_of_run)})


def timeline(run, backend: str = "bokeh", **kwargs) -> Displayable:
    """The zoomable timeline figure of a trace (tracks per level / thread / device), opening on the traced pass;
    it displays itself as a cell's last value (``.figure``: the Bokeh layout or matplotlib Figure)."""
    return Displayable(_timeline.plot(_spans(run), backend, **kwargs))


@quieted("diverge")
@takes(DivergeOptions, "model")
def diverge(model: str, options: DivergeOptions) -> Divergence | OutputDivergence:
    """Run ``model`` in each framework on the same inputs and compare every aligned layer (see
    :func:`mlms_nb.divergence.run.diverge`); ``frameworks``' first entry is the reference.

    ``outputs=True``: compare every output instead (:func:`mlms_nb.divergence.outputs.diverge_outputs`), for any
    model: a name, a manifest path (a PyTorch one that builds its module gets converted copies), several inputs
    and outputs, dynamic sizes; ``metrics`` adds built-in or user metrics, also against a dataset's targets."""
    if options.outputs:
        return _diverge_by_outputs(model, options)
    if options.metrics is not None:
        raise MlmsError(f"{spell('metrics')} applies to the output-level divergence: add {spell_on('outputs')}, or "
                        "leave the metrics out to compare layers")
    kwargs = options.flat()
    for name in ("outputs", "metrics"):
        kwargs.pop(name)
    return _diverge(model, **kwargs)


def _diverge_by_outputs(model: Any, options: DivergeOptions) -> OutputDivergence:
    for name, wrong in (("quantized", options.quantized not in (False, None)),
                        ("latency_repeats", "latency_repeats" in options.model_fields_set)):
        if wrong:
            raise MlmsError(f"{spell_on(name) if name == 'quantized' else spell(name, getattr(options, name))} belongs to the layer-level divergence, not to "
                            f"{spell_on('outputs')}: leave one of them out")
    if options.metrics is not None:
        from mlms_nb.evaluation.agreement import resolve_metrics

        resolve_metrics(options.metrics)  # an unknown name is refused before anything runs
    if len(options.frameworks) < 2:
        raise MlmsError(f"an output divergence compares at least two frameworks; {spell('frameworks')} gives "
                        f"{', '.join(options.frameworks)}")
    manifests = manifests_for(model, options.frameworks, trust=options.trust)
    limit = options.limit if "limit" in options.model_fields_set else 16  # the whole of a dataset only when asked
    return _diverge_outputs(manifests, dataset=options.dataset, tolerance=options.tolerance, limit=limit,
                            batch_size=options.batch_size, trust=options.trust, metrics=options.metrics)


# ---------------------------------------------------------------------------------------------- agents

@takes(SchedulerOptions)
def scheduler(options: SchedulerOptions) -> None:
    """Run a Dask scheduler for mlms agents in this process until Ctrl-C or SIGTERM (any Dask scheduler will do);
    prints ``mlms scheduler at ADDRESS`` when it listens."""
    from mlms_nb.fleet.serve import main_guard, run_scheduler

    main_guard(run_scheduler, options.host or "127.0.0.1", options.port, tls_of(options), options.insecure,
               options.tls_setup)


@takes(AgentOptions)
def agent(options: AgentOptions) -> None:
    """Run an mlms agent in this process until Ctrl-C or SIGTERM: a Dask worker of the scheduler that advertises
    this machine's stack (frameworks and versions, CPU, cores, GPUs and driver, memory, host, labels) and serves
    only the frameworks it has (or those named); prints ``mlms agent NAME at ADDRESS`` when it is ready."""
    from mlms_nb.fleet.serve import main_guard, run_agent

    if not options.scheduler:
        raise MlmsError(f"an agent joins a scheduler: give its address, {spell('scheduler', 'tcp://host:8786')} "
                        "(start one with `mlms scheduler`)")
    main_guard(run_agent, options.scheduler, options.name, options.labels, options.nthreads, options.serves,
               options.traces, options.host, tls_of(options), options.insecure)


@takes(AgentsOptions)
def agents(options: AgentsOptions) -> pd.DataFrame:
    """The mlms agents of the scheduler at ``on`` (those satisfying ``where``, when given), one row per agent: address,
    host, threads, labels, the version of each framework it serves, CPU, cores, memory, GPUs and driver, and whether
    it is busy."""
    from mlms_nb.fleet.connect import connect
    from mlms_nb.fleet.constraints import parse_where
    from mlms_nb.fleet.registry import matching

    if not options.on:
        raise MlmsError(f"which scheduler? give its address: {spell('on', 'tcp://host:8786')}")
    found = list_agents(connect(options.on, tls_of(options)))
    if options.where:
        found = matching(found, parse_where(options.where), options.where, options.on)
    return agents_frame(found)


def across(runs, baseline: str | None = None) -> Analysis:
    """Normalised latency across agents (the paper's across-systems figure): each agent's median latency divided
    by the ``baseline`` agent's (default: the first), per framework and batch size. ``runs``: Evaluations (or
    history ids) from different agents or machines, e.g. what ``evaluate(..., all_agents=True)`` returned."""
    evaluations = [resolve_run(r) for r in runs]
    table = _normalized.compute(evaluations, baseline=baseline, by="agent")
    return Analysis("normalized", table.attrs["title"], table, _normalized.plot)


# ---------------------------------------------------------------------------------------------- trust

def trust_add(path: str | Path) -> pd.DataFrame:
    """Trust the model file, SavedModel folder or manifest at ``path`` as it is now (its sha256 is pinned in the
    trust store under MLMS_HOME; a changed file is refused again). Returns the trust store (:func:`trust_list`)."""
    kind = "manifest" if str(path).endswith((".yaml", ".yml")) else (file_kind(path) or "")
    _trust.add(path, kind)
    return trust_list()


def trust_list() -> pd.DataFrame:
    """The trust store: one row per trusted asset (path, sha256, kind, added_at in UTC)."""
    rows = [{"path": e.path, "sha256": e.sha256, "kind": e.kind, "added_at": e.added_at} for e in _trust.entries()]
    frame = pd.DataFrame(rows, columns=["path", "sha256", "kind", "added_at"])
    frame.attrs["note"] = f"trust store: {_trust.store_path()}; built-in manifests and mlms-nb's own conversions " \
                          "are trusted by their checksums"
    return frame


def trust_remove(path_or_sha256: str | Path) -> pd.DataFrame:
    """Stop trusting an asset (by its path, or a sha256 prefix of 8+ hex digits). Returns the trust store."""
    _trust.remove(path_or_sha256)
    return trust_list()
