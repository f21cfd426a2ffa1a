"""The Python API that the magics and the CLI are thin shells over."""
from __future__ import annotations

import logging
from typing import Iterable

import pandas as pd

from .errors import MlmsError
from .manifest import FRAMEWORKS, Manifest, ManifestCatalog, canonical_framework

log = logging.getLogger(__name__)


def _as_list(value: str | Iterable | None) -> list:
    if value is None:
        return []
    if isinstance(value, str):
        return [v.strip() for v in value.split(",") if v.strip()]
    return list(value)


def parse_batch_sizes(value: str | int | Iterable[int]) -> list[int]:
    """``"1,8"`` / ``8`` / ``[1, 8]`` -> ``[1, 8]``; anything else names the bad entry."""
    items = [value] if isinstance(value, int) else _as_list(value)
    sizes = []
    for item in items:
        try:
            size = int(item)
            if isinstance(item, float) and item != size:
                raise ValueError
        except (TypeError, ValueError):
            raise MlmsError(f"batch sizes: {item!r} is not an integer") from None
        if size < 1:
            raise MlmsError(f"batch sizes: {size} is not a positive integer")
        sizes.append(size)
    if not sizes:
        raise MlmsError("batch sizes: expected at least one, e.g. 1,8")
    return sizes


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
            "framework_version": m.framework.version, "input": "x".join(map(str, m.inputs[0].dimensions)),
            "layout": m.inputs[0].layout, "weights": m.model.weights,
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
    return frame


def evaluate(
    model: str | Manifest,
    framework: str | Iterable[str] = "torch",
    batch_sizes: str | int | Iterable[int] = (1,),
    dataset: str | None = None,
    scenario: str = "single-stream",
    device: str = "cpu",
    threads: int | None = None,
    trace_level: str = "NONE",
    trace_repeats: int = 5,
    warmup: int | str = "auto",
    min_repeats: int = 20,
    min_time_s: float = 1.0,
    max_time_s: float = 120.0,
    target_qps: float | None = None,
    latency_bound_ms: float | None = None,
    limit: int | None = None,
    keep_probabilities: bool = False,
    trust: bool = False,
    progress: bool = True,
    history: bool | str = True,
):
    """Evaluate ``model`` in one or more frameworks; returns an `Evaluation`.

    ``batch_sizes``: inputs per call; ``min_repeats``/``min_time_s``: the timed loop runs until both are
    reached (LoadGen style); ``scenario``: single-stream (report p90), offline (throughput) or server
    (Poisson arrivals at ``target_qps``; p99 against ``latency_bound_ms``). ``history``: store the result
    in the history store (True: the default store; a string: an SQLAlchemy URL; False: don't).
    ``trace_level``: NONE, APPLICATION, MODEL, FRAMEWORK, ML_LIBRARY, SYSTEM_LIBRARY, HARDWARE or FULL; latency
    always comes from the untraced sweep, and a traced pass of ``trace_repeats`` calls per batch size follows it
    (``evaluation.trace``, ``evaluation.trace_overhead``).
    """
    from .evaluation.runner import EvaluationRunner, RunOptions, resolve_manifests
    from .evaluation.scenarios import TimingConfig

    frameworks = [canonical_framework(f) for f in _as_list(framework)] or ["torch"]
    for fw in frameworks:
        if fw not in FRAMEWORKS:
            raise MlmsError(f"unknown framework {fw!r}; expected one of {', '.join(FRAMEWORKS)}")
    from .tracing.levels import TraceLevel

    level = TraceLevel.parse(trace_level)  # a clear error for an unknown level name
    options = RunOptions(
        batch_sizes=parse_batch_sizes(batch_sizes), dataset=dataset, scenario=scenario, device=device,
        threads=threads, trace_level=level.name, trace_repeats=trace_repeats, limit=limit, keep_probabilities=keep_probabilities,
        trust=trust, progress=progress,
        timing=TimingConfig(warmup=warmup, min_repeats=min_repeats, min_time_s=min_time_s, max_time_s=max_time_s,
                            target_qps=target_qps, latency_bound_ms=latency_bound_ms))
    options.validate()
    manifests = resolve_manifests(model, frameworks)
    evaluation = EvaluationRunner(manifests, options).run()
    if history:
        _store(evaluation, None if history is True else str(history))
    return evaluation


def _store(evaluation, url: str | None) -> None:
    """Save to history; a failing store is a warning on the result, never a lost measurement."""
    from .history import HistoryStore

    try:
        store = HistoryStore(url)
        evaluation.history_ids = store.save(evaluation)
        for fw, trace in evaluation.traces.items():
            from .paths import mlms_home

            path = trace.save(mlms_home() / "traces" / evaluation.id / fw)
            store.add_trace(evaluation.id, trace.trace_id or f"{evaluation.id}-{fw}", "parquet", path=str(path))
    except Exception as err:  # the measurement is worth more than the store: keep it, say why
        evaluation.warnings.append(f"not saved to history: {err}")
        log.warning("not saved to history: %s", err)


def history(model: str | None = None, framework: str | None = None, version: str | None = None,
            complete: bool | None = None, limit: int | None = None, url: str | None = None) -> pd.DataFrame:
    """Stored evaluations, newest first (one row per evaluation and framework)."""
    from .history import HistoryStore

    return HistoryStore(url).query(model=model, framework=canonical_framework(framework) if framework else None,
                                   version=version, complete=complete, limit=limit)


def load_evaluation(ref: str | int, url: str | None = None):
    """An `Evaluation` from history (row id or evaluation id) or a saved JSON file."""
    from pathlib import Path

    from .evaluation.result import Evaluation
    from .history import HistoryStore

    if isinstance(ref, str) and ref.endswith(".json") and Path(ref).exists():
        return Evaluation.load(ref)
    store = HistoryStore(url)
    evaluation = store.load(int(ref) if str(ref).isdigit() else ref)
    from .tracing.trace import Trace

    for path in store.traces(evaluation.id)["path"].dropna():
        if Path(path).exists():
            trace = Trace.load(path)
            framework = trace.metadata.get("framework", Path(path).name)
            if framework in evaluation.frameworks:
                evaluation.traces[framework] = trace
    return evaluation


def convert(model: str, to: str, force: bool = False):
    """Build (or reuse) the ONNX Runtime or TensorFlow copy of a model's PyTorch weights."""
    from .models.convert import convert as _convert

    return _convert(model, to=canonical_framework(to), force=force)


class TraceSession:
    """What ``with mlms_nb.trace(...) as session:`` gives: ``session.tracer`` while it runs, ``session.trace``
    (a `Trace`) after. Every predictor opened inside the block is traced at the session's level."""

    def __init__(self, level: str = "FRAMEWORK", name: str = "traced block"):
        from .tracing.levels import TraceLevel
        from .tracing.tracer import Tracer

        self.tracer = Tracer(TraceLevel.parse(level))
        self.name = name
        self.trace = None

    def __enter__(self) -> "TraceSession":
        from .tracing.levels import TraceLevel
        from .tracing.otel import parent_from_otel
        from .tracing.tracer import use_tracer

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
        from .predictors.base import stop_auto_traced

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


def load_trace(path):
    """A `Trace` from a saved Parquet folder or a Chrome trace JSON (ours, PyTorch Kineto, ONNX Runtime)."""
    from .tracing.trace import load_trace as _load

    return _load(path)
