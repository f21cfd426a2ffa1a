"""One framework's work in an evaluation, the unit a launcher runs (:mod:`mlms_nb.launchers`): open the dataset
and the model, time the load and the first inference (cold), per batch size warm up and run the scenario's timed
loop, then stream every input through the model once (the full pass, :mod:`mlms_nb.evaluation.full_pass`:
throughput, and accuracy on labeled data), and finally the traced pass (:mod:`mlms_nb.evaluation.traced`). The
quick timed loops come before the full pass, which may take minutes: stopped during it, they are kept.

Every measurement is emitted as a record (:mod:`mlms_nb.evaluation.records`) the moment it is made; nothing is
kept here. The timed loops use a small sample, the dataset's first inputs, preprocessed once before timing, so
latency is the model's alone. Progress is reported as records too (:mod:`mlms_nb.evaluation.reporter`).
A timed loop cut short (Ctrl-C, a stop signal, a timeout, an error) is emitted as it stands, marked incomplete,
before the stop goes on up.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable

import numpy as np

from mlms_nb.data.datasets import open_dataset
from mlms_nb.data.transforms import Postprocessor, Preprocessor
from mlms_nb.errors import DatasetError
from mlms_nb.data.feeds import take
from mlms_nb.evaluation.checks import check_hidden_state
from mlms_nb.data.labels import label_space_problem, model_classes
from mlms_nb.evaluation.full_pass import head_sample, make_batch, run_full_pass
from mlms_nb.evaluation.outputs import OutputRecorder
from mlms_nb.evaluation.reporter import Phases, Reporter
from mlms_nb.evaluation.records import ColdStart, Note, Opened, OutputsPass, TargetsPass, TimedLoop, TracedPass
from mlms_nb.evaluation.scenarios import run_scenario, wait_for_quiet_first
from mlms_nb.evaluation.stats import bootstrap_median_ci
from mlms_nb.evaluation.targets import TargetScores
from mlms_nb.evaluation.traced import start_traced_pass, trace_batches
from mlms_nb.frameworks import PredictorOptions, open_predictor
from mlms_nb.frameworks.convert import built_ns
from mlms_nb.generation.loop import GENERATE_SCENARIOS
from mlms_nb.generation.work import measure_generation
from mlms_nb.launchers import stop_reason
from mlms_nb.manifest import Manifest
from mlms_nb.options import EvaluateOptions
from mlms_nb.profilers.energy import energy_meter
from mlms_nb.profilers.load import LoadMeter
from mlms_nb.schema.levels import TraceLevel

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FrameworkJob:
    """What one framework's work needs: its manifest, the evaluation's options (dataset resolved) and the id of
    its trace."""
    manifest: Manifest
    options: EvaluateOptions
    trace_id: str
    #: metrics scored against a dataset's targets: built-in names and the user's callables that reach this process
    metrics: Any = None
    #: the user's metrics that could not be sent here (they do not pickle): named in a note when there are targets
    unshipped: tuple[str, ...] = ()


def measure_framework(job: FrameworkJob, emit: Callable, watch) -> None:
    """Run one framework's part of an evaluation, emitting each measurement as it is made (see the module)."""
    manifest, opts = job.manifest, job.options
    fw = manifest.framework.name
    if opts.scenario in GENERATE_SCENARIOS or manifest.task == "text-generation":  # a causal LM: its own loop
        return measure_generation(job, emit, watch)
    reporter = Reporter(emit, fw) if opts.progress else None
    phase = Phases(watch, reporter)
    phase("reading the dataset")
    dataset = open_dataset(opts.dataset, manifest)
    if dataset.labeled and not manifest.pretrained:
        raise DatasetError(
            f"{manifest.key} has random weights: only performance runs accept it; use dataset 'synthetic'")
    label_problem = None
    if dataset.labeled and manifest.outputs[0].type == "classification":  # the label spaces, before the model loads
        label_problem = label_space_problem(dataset.label_ids(), *model_classes(manifest))
        if label_problem:
            emit(Note(fw, f"{fw}: {label_problem}"))
    preprocess = Preprocessor(manifest, trust=opts.trust)
    if opts.reader == "processes":  # the readers' fork server starts while the model loads and is timed
        from mlms_nb.data.processes import start_server

        start_server()
    level = opts.tracing.trace_level
    traced = start_traced_pass(level, job.trace_id, fw) if level > TraceLevel.NONE else None
    t_pre = time.perf_counter_ns()
    # inputs of their own sizes (dynamic dimensions) or cut into ordered chunks go one dataset item per call
    one_by_one = preprocess.input.dynamic or preprocess.chunked
    head = head_sample(dataset, preprocess, 1 if one_by_one else max(opts.batch_sizes), opts.limit)
    inputs = head.data  # the timed loops' and the traced pass's sample, cycled to each batch size
    targets = None
    if head.targets and preprocess.chunked:
        emit(Note(fw, f"{fw}: the dataset's targets are not compared for inputs cut into ordered chunks"))
    elif head.targets:
        targets = TargetScores(manifest, fw, job.metrics)
        for key in head.targets:
            targets.output_of(key)  # a target for an output the model does not have: refused before loading
        if job.unshipped:
            emit(Note(fw, f"{fw}: metric(s) {', '.join(job.unshipped)} not computed against the targets: a worker "
                          "process cannot receive them (they do not pickle; define them at a module's top level)"))
    if preprocess.chunked:
        inputs = take(inputs, (slice(None), 0))  # a sequence's first chunk: latency is one call's
    if traced:
        traced.tracer.add_span("preprocess sample", TraceLevel.APPLICATION, "application", t_pre,
                               time.perf_counter_ns(), inputs=len(head), dataset=dataset.name)

    phase("fetching and converting the model's files (once)")
    built = built_ns()
    asset_sha256 = _prepare_assets(manifest)  # one-time downloads and conversions are not part of the load time
    conversion_ns = built_ns() - built
    phase("loading the model")
    t0 = time.perf_counter_ns()
    predictor = open_predictor(manifest, device=opts.device, options=PredictorOptions(
        threads=opts.threads, trust=opts.trust, graph_optimization_level=opts.graph_optimization_level))
    load_ns = time.perf_counter_ns() - t0
    log.info("opened %s in %.0f ms", manifest.key, load_ns / 1e6)
    if traced:
        traced.tracer.add_span(f"load {manifest.key}", TraceLevel.APPLICATION, "application", t0, t0 + load_ns)
    watch.on_timeout(predictor.cancel if getattr(predictor, "cancellable", False) else None)
    predict = watch.guard(predictor.predict)
    try:
        info = predictor.info()
        emit(Opened(fw, {**info.to_dict(), "asset_sha256": asset_sha256}))
        phase("the first inference")
        first_batch = make_batch(inputs, opts.batch_sizes[0], manifest)
        t0 = time.perf_counter_ns()
        first = predict(first_batch)
        first_ns = time.perf_counter_ns() - t0
        # the model's declared reset, called before every item and timed loop; hidden state without one is refused
        reset = watch.guard(predictor.reset) if manifest.model.reset else None
        carries_state, state_check = False, "not checked (explicit state: inputs)"
        if not manifest.state:  # explicit state is fed by the evaluation itself: nothing hidden to look for
            phase("the hidden-state check")
            check = check_hidden_state(manifest, predict, reset, first_batch, first)
            if check.note:
                emit(Note(fw, check.note))
            carries_state, state_check = check.carries_state, check.summary
        emit(ColdStart(fw, opts.batch_sizes[0], load_ns, first_ns, state_check, conversion_ns))

        untraced_median_ns: dict[int, float] = {}
        untraced_ci_ns: dict[int, tuple[float, float]] = {}  # the 95% CI of each median: the overhead's noise
        for batch_size in opts.batch_sizes:
            phase(f"timing batch size {batch_size}")
            log.info("timing %s at batch size %d (%s)", fw, batch_size, opts.scenario)
            if reset is not None:
                reset()
            untraced_median_ns[batch_size], untraced_ci_ns[batch_size] = _time_one(
                fw, batch_size, predict, inputs, opts, emit, reporter, manifest,
                {"carries_state": True} if carries_state else {}, threads=info.threads)

        phase("the full pass")
        t_full = time.perf_counter_ns()
        recorder = OutputRecorder(manifest, fw, opts.capture_outputs)
        # inputs of their own sizes, or a model reset before each item, run one at a time; ordered chunks run the
        # largest batch of items in lockstep
        one_at_a_time = preprocess.input.dynamic or reset is not None
        full, accuracy = run_full_pass(predict, manifest, dataset, preprocess,
                                       1 if one_at_a_time else max(opts.batch_sizes), limit=opts.limit, reset=reset,
                                       keep_probabilities=opts.keep_probabilities, trust=opts.trust, reporter=reporter,
                                       recorder=recorder if recorder.enabled else None, targets=targets,
                                       reader=opts.reader, niceness=opts.reader_niceness,
                                       note=lambda text: emit(Note(fw, text if text.startswith(f"{fw}: ") else f"{fw}: {text}")),
                                       label_problem=label_problem)
        if dataset.skipped:
            emit(Note(fw, f"{fw}: skipped {len(dataset.skipped)} unreadable input(s): "
                          + "; ".join(f"{i} ({why})" for i, why in dataset.skipped[:3])))
        emit(full)
        if accuracy is not None:
            reason = accuracy.row.get("reason")
            if reason and reason != label_problem:  # found in the pass (labels past the output's width, all NaN)
                emit(Note(fw, f"{fw}: top-1/top-5 n/a: {reason}"))
            emit(accuracy)
        if len(recorder):
            emit(OutputsPass(fw, recorder.frame()))
        if targets is not None and targets.scored:
            emit(TargetsPass(fw, targets.frame()))
        if traced:
            traced.tracer.add_span("full pass", TraceLevel.APPLICATION, "application", t_full, time.perf_counter_ns(),
                                   inputs=full.row["inputs"], dataset=dataset.name)
            phase("the traced pass")
            if reset is not None:
                reset()
            _trace(traced, predictor, manifest, inputs, opts, untraced_median_ns, emit, untraced_ci_ns, info.threads)
    finally:
        predictor.close()


def _time_one(fw: str, batch_size: int, predict, inputs, opts: EvaluateOptions, emit: Callable, reporter=None,
              manifest: Manifest | None = None, extra: dict | None = None,
              threads: int | None = None) -> tuple[float, tuple[float, float]]:
    """One timed loop, emitted; returns its median (ns) and the median's 95% bootstrap CI (ns). Cut short, what it
    measured is emitted (marked incomplete, with why) before the stop goes on. ``manifest``: inputs get their batch
    on their own batch axis; ``extra``: columns of the loop's latency row (``carries_state``); ``threads``: the
    framework's intra-op threads, read against the machine's load (None: its default)."""
    try:
        batch = make_batch(inputs, batch_size, manifest)
        extra = {**(extra or {}), **wait_for_quiet_first(fw, batch_size, opts.timing, threads, emit)}
        result = run_scenario(opts.scenario, predict, batch, opts.timing,
                              reporter.loop(batch_size, opts.timing) if reporter else None,
                              energy=energy_meter(opts.device), framework=fw, batch_size=batch_size,
                              load=LoadMeter(threads))
    except BaseException as stop:
        partial = getattr(stop, "partial", None)
        if isinstance(partial, TimedLoop) and len(partial.samples_ns):
            emit(replace(partial, extra=dict(extra or {}), reason=stop_reason(stop)))
        if isinstance(stop, MemoryError):
            raise MemoryError(f"at batch size {batch_size}: {stop or 'an allocation failed'}") from None
        raise
    emit(replace(result, extra={**result.extra, **(extra or {})}))
    if not len(result.samples_ns):
        return float("nan"), (float("nan"), float("nan"))
    return float(np.median(result.samples_ns)), bootstrap_median_ci(np.asarray(result.samples_ns, dtype=float))




def _trace(traced, predictor, manifest: Manifest, inputs, opts: EvaluateOptions,
           untraced_median_ns: dict[int, float], emit: Callable,
           untraced_ci_ns: dict[int, tuple[float, float]] | None = None, threads: int | None = None) -> None:
    """The traced pass after the untraced sweep; its overhead is measured against that sweep's medians."""
    fw = manifest.framework.name
    log.info("tracing %s at level %s", fw, traced.tracer.level.name)
    batches = {b: make_batch(inputs, b, manifest) for b in opts.batch_sizes}
    post = Postprocessor(manifest, trust=opts.trust)
    trace_batches(traced, predictor, post if post.active else None, batches, untraced_median_ns, untraced_ci_ns=untraced_ci_ns,
                  repeats=opts.tracing.trace_repeats, threads=threads)
    emit(TracedPass(fw, traced.tracer.trace(), traced.tracer.trace_id, list(traced.overhead)))


def _prepare_assets(manifest: Manifest) -> dict[str, str]:
    """Fetch, convert and verify the model's assets before its load is timed; returns the sha256 of each asset
    that ran (declared in the manifest, or read from the file for a conversion mlms-nb built, ``artifact://``),
    so the run pins exactly what it measured."""
    from mlms_nb._fs import sha256_file
    from mlms_nb.data.assets import resolve_asset

    base = Path(manifest.source).parent if manifest.source else None
    digests: dict[str, str] = {}
    for field_name in ("graph_path", "weights_path"):
        uri = getattr(manifest.model, field_name)
        if uri:
            declared = manifest.model.sha256.get(field_name)
            path = resolve_asset(uri, declared, base)
            if declared:
                digests[field_name] = declared
            elif str(uri).startswith("artifact://") and Path(path).is_file():
                digests[field_name] = sha256_file(path)
    return digests
