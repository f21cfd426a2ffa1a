"""The facade's verbs that make and keep runs: :func:`evaluate`, :func:`models`, :func:`history` (and
:func:`history_import`), :func:`load_evaluation`, :func:`convert`; tracing a block (:func:`trace`, :func:`load_trace`);
:func:`diverge` across frameworks; the trust store. The whole facade is :mod:`mlms_nb.api` (the package's
``__init__``); each function here is a few lines that validate options and call the layer below.
"""
from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import pandas as pd

from mlms_nb.divergence import Divergence, OutputDivergence
from mlms_nb.divergence.outputs import diverge_outputs as _diverge_outputs
from mlms_nb.divergence.run import diverge as _diverge
from mlms_nb import trust as _trust
from mlms_nb._quiet import quieted
from mlms_nb._translate import add_heard, mark
from mlms_nb.display import for_people
from mlms_nb.fleet.run import evaluate_on_agents
from mlms_nb.errors import MlmsError
from mlms_nb.evaluation.result import Evaluation
from mlms_nb.evaluation.manifests import manifests_for
from mlms_nb.evaluation.runner import EvaluationRunner, record_failures
from mlms_nb.frameworks.base import stop_auto_traced
from mlms_nb.frameworks.convert import convert as _convert
from mlms_nb.frameworks.live import check_trust, example_batch_size
from mlms_nb.frameworks.modelfiles import file_kind
from mlms_nb.generation.manifests import causal_lm_manifest, causal_lm_source
from mlms_nb.manifest import ManifestCatalog, canonical_framework
from mlms_nb.options import DivergeOptions, EvaluateOptions, HistoryOptions, spell, spell_on, takes
from mlms_nb.schema.levels import TraceLevel
from mlms_nb.store.history import HistoryStore
from mlms_nb.store.keeping import HistoryKeeper
from mlms_nb.tracing.otel import parent_from_otel
from mlms_nb.tracing.trace import Trace
from mlms_nb.tracing.trace import load_trace as _load_trace
from mlms_nb.tracing.tracer import Tracer, use_tracer
from mlms_nb.zoo.registry import ARCHITECTURES

log = logging.getLogger(__name__)

__all__ = ["TraceSession", "convert", "diverge", "evaluate", "history", "history_import", "load_evaluation", "load_trace",
           "models", "trace", "trust_add", "trust_list", "trust_remove"]


# ---------------------------------------------------------------------------------------------- models, evaluate

def models(framework: str | None = None) -> pd.DataFrame:
    """Every manifest mlms-nb can see, one row per model and framework: its ``task``
    (:attr:`~mlms_nb.manifest.Manifest.effective_task`), its ``input`` as the task reads it (an image's
    dimensions in its ``layout``; a text model's token sequence and its longest length), ``origin``: whether it is
    built in or from ``MLMS_MANIFEST_PATH`` ("user, not the default" when a built-in of that name and framework
    wins)."""
    catalog = ManifestCatalog()
    shadowed = {id(user): builtin for user, builtin in catalog.shadowed()}
    rows = []
    for m in catalog.select(framework):
        origin = "built-in" if catalog.is_builtin(m) else ("user, not the default" if id(m) in shadowed else "user")
        text_input = m.effective_task.startswith("text-")
        rows.append({
            "model": m.name, "version": m.version, "task": m.effective_task, "framework": m.framework.name,
            "framework_version": m.framework.version,
            "input": (_tokens(m) if text_input else "x".join("?" if d is None else str(d)
                                                             for d in m.fed_input.dimensions or ()))
                     + (f" (+{len(m.inputs) - 1} more)" if len(m.inputs) > 1 else ""),
            "layout": None if text_input or len(m.fed_input.dimensions or ()) != 3 else m.fed_input.layout,
            "weights": m.model.weights, "top1": m.attributes.get("top1"), "origin": origin,
            "description": m.description, "source": m.source,
        })
    frame = pd.DataFrame(rows).sort_values(["model", "framework"], ignore_index=True) if rows else pd.DataFrame()
    frame.attrs["errors"] = catalog.errors
    notes = ["input: an image's dimensions in its layout; tokens[n]: n token ids, tokens[≤n]: up to n; "
             "top1: the published ImageNet top-1 accuracy (%), from the manifest"]
    notes += [f"{user.name} {user.version} ({user.framework.name}) from {user.source} has the name of a built-in "
              f"manifest ({builtin.version}), which is used by default: eval it by its path or as "
              f"{user.name}@{user.version}" for user, builtin in catalog.shadowed()
              if framework is None or user.framework.name == canonical_framework(framework)]
    frame.attrs["note"] = "\n".join(notes)
    return for_people(frame)


def _tokens(manifest) -> str:
    """A text model's input: ``tokens[128]`` (fixed), ``tokens[≤256]`` (dynamic, up to a built-in architecture's
    context), ``tokens[any]`` (dynamic, no known limit)."""
    length = (manifest.fed_input.dimensions or [None])[-1]
    if isinstance(length, int):
        return f"tokens[{length}]"
    architecture = ARCHITECTURES.get(manifest.model.architecture or "")
    return f"tokens[≤{architecture.max_tokens}]" if architecture and architecture.max_tokens else "tokens[any]"


@quieted("evaluate")
@takes(EvaluateOptions, "model", "inputs", "outputs", "preprocess", "postprocess", "metrics")
def evaluate(model: Any, options: EvaluateOptions, *, inputs: Any = None, outputs: Any = None, preprocess: Any = None,
             postprocess: Any = None, metrics: Any = None) -> Evaluation | list[Evaluation]:
    """Evaluate ``model`` in one or more frameworks; returns an `Evaluation`. ``model``: a name (see
    :func:`models`), a manifest path or `Manifest`, or a live ``torch.nn.Module`` / ``keras.Model`` whose
    ``inputs`` (an example batch, N first, or an `InputSpec` / dict), ``outputs``, ``preprocess`` and
    ``postprocess`` describe it as a manifest would (:func:`mlms_nb.frameworks.live.manifest_for`).

    Batch sizes: ``batch_sizes`` when given; else an example batch's own size (``inputs=x`` with ``x.shape[0] ==
    4`` times batches of 4; the inputs are synthetic ones of its shape and dtype, or ``dataset``); else 1.

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
    heard_from = mark()  # framework warnings that matter, as our sentences, go with the result (mlms_nb._translate)
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
    passed = example_batch_size(inputs)
    if passed is not None and "batch_sizes" not in options.model_fields_set:  # the batch passed is the batch timed
        options = options.model_copy(update={"batch_sizes": [passed]})
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

    def keep(evaluation: Evaluation, framework: str) -> None:  # each framework's part is stored with what was heard
        add_heard(evaluation.warnings, heard_from)
        keeper(evaluation, framework)

    evaluation = EvaluationRunner(manifests, options, sink=keep if keeper is not None else None, metrics=metrics,
                                  failed=failed).run()
    add_heard(evaluation.warnings, heard_from)
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
    return for_people(frame[frame["evaluation_id"].isin(ids)].reset_index(drop=True))


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
    return for_people(frame)


def trust_remove(path_or_sha256: str | Path) -> pd.DataFrame:
    """Stop trusting an asset (by its path, or a sha256 prefix of 8+ hex digits). Returns the trust store."""
    _trust.remove(path_or_sha256)
    return trust_list()
