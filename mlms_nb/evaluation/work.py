"""One framework's work in an evaluation, the unit a launcher runs (:mod:`mlms_nb.launchers`): open the dataset
and the model, time the load and the first inference (cold), score accuracy over the dataset, then per batch
size warm up and run the scenario's timed loop, and finally the traced pass (:mod:`mlms_nb.evaluation.traced`).

Every measurement is emitted as a record (:mod:`mlms_nb.evaluation.records`) the moment it is made; nothing is
kept here. Inputs for the timed loops are preprocessed once, before timing, so latency is the model's alone.
A timed loop cut short (Ctrl-C, a stop signal, a timeout, an error) is emitted as it stands, marked incomplete,
before the stop goes on up.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd

from mlms_nb.data.datasets import open_dataset
from mlms_nb.data.labels import check_label_count, load_labels
from mlms_nb.data.transforms import Postprocessor, Preprocessor
from mlms_nb.errors import DatasetError
from mlms_nb.data.feeds import fed_name
from mlms_nb.evaluation.inputs import LoadedInputs, load_inputs
from mlms_nb.evaluation.outputs import OutputRecorder, capturing, outputs_pass
from mlms_nb.evaluation.records import AccuracyPass, ColdStart, Note, Opened, OutputsPass, TimedLoop, TracedPass
from mlms_nb.evaluation.scenarios import run_scenario
from mlms_nb.evaluation.traced import start_traced_pass, trace_batches
from mlms_nb.frameworks import PredictorOptions, open_predictor
from mlms_nb.launchers import CallTimeout, StopRequested
from mlms_nb.manifest import Manifest
from mlms_nb.options import EvaluateOptions
from mlms_nb.schema.levels import TraceLevel

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FrameworkJob:
    """What one framework's work needs: its manifest, the evaluation's options (dataset resolved) and the id of
    its trace."""
    manifest: Manifest
    options: EvaluateOptions
    trace_id: str


def measure_framework(job: FrameworkJob, emit: Callable, watch) -> None:
    """Run one framework's part of an evaluation, emitting each measurement as it is made (see the module)."""
    manifest, opts = job.manifest, job.options
    fw = manifest.framework.name
    watch.phase = "reading the dataset"
    dataset = open_dataset(opts.dataset, manifest)
    if dataset.labeled and not manifest.pretrained:
        raise DatasetError(
            f"{manifest.key} has random weights: only performance runs accept it; use dataset 'synthetic'")
    preprocess = Preprocessor(manifest, trust=opts.trust)
    level = TraceLevel.parse(opts.tracing.trace_level)
    traced = start_traced_pass(level, job.trace_id, fw) if level > TraceLevel.NONE else None
    t_pre = time.perf_counter_ns()
    inputs = load_inputs(dataset, preprocess, opts.limit)  # dense, ragged (dynamic sizes) or chunked sequences
    labels, ids = inputs.labels, inputs.ids
    if traced:
        traced.tracer.add_span("preprocess dataset", TraceLevel.APPLICATION, "application", t_pre,
                               time.perf_counter_ns(), inputs=len(inputs), dataset=dataset.name)
    if dataset.skipped:
        emit(Note(fw, f"{fw}: skipped {len(dataset.skipped)} unreadable input(s): "
                      + "; ".join(f"{i} ({why})" for i, why in dataset.skipped[:3])))

    _prepare_assets(manifest)  # one-time downloads and conversions are not part of the load time
    watch.phase = "loading the model"
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
        emit(Opened(fw, predictor.info().to_dict()))
        watch.phase = "the first inference"
        first_batch = make_batch(inputs, opts.batch_sizes[0])
        t0 = time.perf_counter_ns()
        predict(first_batch)
        emit(ColdStart(fw, opts.batch_sizes[0], load_ns, time.perf_counter_ns() - t0))

        recorder = OutputRecorder(manifest, fw, opts.capture_outputs)
        if labels is not None and manifest.outputs[0].type == "classification" and inputs.kind == "dense":
            watch.phase = "the accuracy pass"
            scored = (capturing(predict, recorder, ids, fed_name(manifest), inputs.to_model)
                      if recorder.enabled or inputs.batch_axes else predict)
            acc, preds, probs = _accuracy(scored, manifest, inputs.data, labels, ids, max(opts.batch_sizes),
                                          opts.trust)
            acc.update({"framework": fw, "dataset": dataset.name, "skipped": len(dataset.skipped)})
            preds.insert(0, "framework", fw)
            emit(AccuracyPass(fw, acc, preds, probs if opts.keep_probabilities else None))
        elif recorder.enabled:  # at the first batch size, which the first inference already ran
            watch.phase = "the outputs pass"
            outputs_pass(predict, manifest, inputs, recorder, opts.batch_sizes[0])
        if recorder.rows:
            emit(OutputsPass(fw, recorder.frame()))

        untraced_median_ns: dict[int, float] = {}
        for batch_size in opts.batch_sizes:
            watch.phase = f"timing batch size {batch_size}"
            log.info("timing %s at batch size %d (%s)", fw, batch_size, opts.scenario)
            untraced_median_ns[batch_size] = _time_one(fw, batch_size, predict, inputs, opts, emit)
        if traced:
            watch.phase = "the traced pass"
            _trace(traced, predictor, manifest, inputs, opts, untraced_median_ns, emit)
    finally:
        predictor.close()


def _time_one(fw: str, batch_size: int, predict, inputs: np.ndarray, opts: EvaluateOptions, emit: Callable) -> float:
    """One timed loop, emitted; returns its median (ns). Cut short, what it measured is emitted (marked
    incomplete, with why) before the stop goes on."""
    try:
        batch = make_batch(inputs, batch_size)
        result = run_scenario(opts.scenario, predict, batch, opts.timing)
    except BaseException as stop:
        partial = getattr(stop, "partial", None)
        if partial is not None and len(partial.samples_ns):
            emit(TimedLoop(fw, batch_size, opts.scenario, partial.samples_ns, partial.wall_ns, partial.warmup_calls,
                           {}, complete=False, reason=_reason(stop)))
        if isinstance(stop, MemoryError):
            raise MemoryError(f"at batch size {batch_size}: {stop or 'an allocation failed'}") from None
        raise
    emit(TimedLoop(fw, batch_size, opts.scenario, result.samples_ns, result.wall_ns, result.warmup_calls,
                   result.extra))
    return float(np.median(result.samples_ns)) if len(result.samples_ns) else float("nan")


def _reason(stop: BaseException) -> str:
    if isinstance(stop, KeyboardInterrupt):
        return "interrupt"
    if isinstance(stop, StopRequested):
        return "signal"
    return "timeout" if isinstance(stop, CallTimeout) else "error"


def _trace(traced, predictor, manifest: Manifest, inputs: np.ndarray, opts: EvaluateOptions,
           untraced_median_ns: dict[int, float], emit: Callable) -> None:
    """The traced pass after the untraced sweep; its overhead is measured against that sweep's medians."""
    fw = manifest.framework.name
    log.info("tracing %s at level %s", fw, traced.tracer.level.name)
    batches = {b: make_batch(inputs, b) for b in opts.batch_sizes}
    post = Postprocessor(manifest, trust=opts.trust)
    trace_batches(traced, predictor, post if post.active else None, batches, untraced_median_ns,
                  repeats=opts.tracing.trace_repeats)
    emit(TracedPass(fw, traced.tracer.trace(), traced.tracer.trace_id, list(traced.overhead)))


def _prepare_assets(manifest: Manifest) -> None:
    """Fetch, convert and verify the model's assets before its load is timed."""
    from mlms_nb.data.assets import resolve_asset

    base = Path(manifest.source).parent if manifest.source else None
    for field_name in ("graph_path", "weights_path"):
        uri = getattr(manifest.model, field_name)
        if uri:
            resolve_asset(uri, manifest.model.sha256.get(field_name), base)


def make_batch(inputs: LoadedInputs, batch_size: int):
    """``batch_size`` inputs, cycling through the dataset when it is smaller; contiguous (see
    :meth:`~mlms_nb.evaluation.inputs.LoadedInputs.batch`)."""
    return inputs.batch(batch_size)


def _accuracy(predict, manifest, inputs, labels, ids, batch_size, trust):
    """Top-1 / top-5 over all inputs, and one row of predictions per input."""
    post = Postprocessor(manifest, trust=trust)
    names = load_labels(manifest) if manifest.outputs[0].labels else None
    probs, top_idx, top_p = [], [], []
    for start in range(0, len(inputs), batch_size):
        pred = post(predict(inputs[start:start + batch_size]))
        if names is not None and start == 0:  # labels of another length than the model's classes: refused
            check_label_count(names, pred.probabilities.shape[1], manifest)
        probs.append(pred.probabilities)
        top_idx.append(pred.top_k_indices)
        top_p.append(pred.top_k_probabilities)
    probs, top_idx, top_p = np.concatenate(probs), np.concatenate(top_idx), np.concatenate(top_p)
    known = labels >= 0
    correct1 = top_idx[:, 0] == labels
    correct5 = (top_idx[:, :5] == labels[:, None]).any(axis=1)

    def name(i: int) -> str | None:
        return names[i] if names and 0 <= i < len(names) else None

    preds = pd.DataFrame({
        "input_id": ids,
        "label": labels.astype(int),
        "label_name": [name(int(i)) for i in labels],
        "top1": top_idx[:, 0].astype(int),
        "top1_name": [name(int(i)) for i in top_idx[:, 0]],
        "top1_prob": top_p[:, 0].astype(float),
        "top5": [list(map(int, r[:5])) for r in top_idx],
        "top5_probs": [list(map(float, r[:5])) for r in top_p],
        "correct_top1": correct1 & known,
        "correct_top5": correct5 & known,
    })
    n = int(known.sum())
    acc = {"n": n, "top1": float(correct1[known].mean()) if n else float("nan"),
           "top5": float(correct5[known].mean()) if n else float("nan")}
    return acc, preds, probs
