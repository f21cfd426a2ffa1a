"""The evaluation runner: open each framework's predictor, measure cold start, accuracy and latency.

Order per framework: load (timed) -> first inference (timed, cold) -> accuracy pass over the dataset ->
for each batch size: warm-up, then the scenario's timed loop. Cold numbers never mix with warm ones.
Inputs for the timed loops are preprocessed once, before timing, so latency is the model's alone.
A KeyboardInterrupt keeps everything measured so far and marks the evaluation incomplete.
"""
from __future__ import annotations

import logging
import time
import numpy as np
import pandas as pd

from mlms_nb.data.datasets import open_dataset
from mlms_nb.data.labels import check_label_count, load_labels
from mlms_nb.data.transforms import Postprocessor, Preprocessor
from mlms_nb.errors import DatasetError, MlmsError
from mlms_nb.manifest import Manifest, canonical_framework, find_manifest
from mlms_nb.options import EvaluateOptions
from mlms_nb.frameworks import PredictorOptions, open_predictor
from mlms_nb.evaluation.result import Evaluation
from mlms_nb.evaluation.scenarios import run_scenario
from mlms_nb.stack import detect_stack
from mlms_nb.evaluation.stats import latency_stats, stability_warning
from mlms_nb.evaluation.traced import start_traced_pass, trace_batches
from mlms_nb.schema.evaluation import SampleKey
from mlms_nb.schema.levels import TraceLevel

log = logging.getLogger(__name__)


def resolve_manifests(model: str | Manifest, frameworks: list[str]) -> list[Manifest]:
    """One manifest per requested framework (a Manifest passes through)."""
    if isinstance(model, Manifest):
        return [model]
    return [find_manifest(model, framework=canonical_framework(fw)) for fw in frameworks]


def default_dataset(manifest: Manifest) -> str:
    """Labeled photos for pretrained image classifiers; synthetic tensors otherwise."""
    image_classifier = manifest.inputs[0].type == "image" and manifest.outputs[0].type == "classification"
    return "imagenet-samples" if manifest.pretrained and image_classifier else "synthetic"


class EvaluationRunner:
    """Runs one evaluation over several manifests (frameworks) with one set of options."""

    def __init__(self, manifests: list[Manifest], options: EvaluateOptions):
        self.manifests = manifests
        self.options = options
        names = {m.name for m in manifests}
        if len(names) != 1:
            raise MlmsError(f"one evaluation covers one model; got {sorted(names)}")

    def run(self) -> Evaluation:
        opts = self.options
        first = self.manifests[0]
        if opts.dataset is None:
            opts.dataset = default_dataset(first)
        frameworks = [m.framework.name for m in self.manifests]
        evaluation = Evaluation(
            model=first.name, model_version=first.version, frameworks=frameworks,
            manifests={m.framework.name: m.to_dict() for m in self.manifests},
            stack=detect_stack(frameworks), options=opts.record())
        rows: list[dict] = []
        cold: list[dict] = []
        self._overhead: list[dict] = []
        accuracy: list[dict] = []
        predictions: list[pd.DataFrame] = []
        progress = _progress(len(self.manifests) * len(opts.batch_sizes), opts.progress, first.name)
        try:
            for manifest in self.manifests:
                self._run_framework(manifest, evaluation, rows, cold, accuracy, predictions, progress)
        except KeyboardInterrupt as interrupt:
            partial = getattr(interrupt, "partial", None)
            if partial is not None and len(partial.samples_ns) and getattr(self, "_current", None):
                fw, batch_size = self._current
                rows.append(self._latency_row(fw, batch_size, partial.samples_ns, partial.wall_ns, 0, {}, evaluation))
            evaluation.complete = False
            evaluation.warnings.append("interrupted (Ctrl-C): the results hold what was measured before it")
        finally:
            progress.close()
        evaluation.latency = pd.DataFrame(rows)
        evaluation.cold_start = pd.DataFrame(cold)
        evaluation.accuracy = pd.DataFrame(accuracy)
        evaluation.predictions = pd.concat(predictions, ignore_index=True) if predictions else pd.DataFrame()
        evaluation.trace_overhead = pd.DataFrame(self._overhead)
        return evaluation

    # ------------------------------------------------------------------ one framework
    def _run_framework(self, manifest, evaluation, rows, cold, accuracy, predictions, progress) -> None:
        opts = self.options
        fw = manifest.framework.name
        dataset = open_dataset(opts.dataset, manifest)
        if dataset.labeled and not manifest.pretrained:
            raise DatasetError(
                f"{manifest.key} has random weights: only performance runs accept it; use dataset 'synthetic'")
        preprocess = Preprocessor(manifest, trust=opts.trust)
        level = TraceLevel.parse(opts.tracing.trace_level)
        traced = start_traced_pass(level, f"{evaluation.id}-{fw}", fw) if level > TraceLevel.NONE else None
        t_pre = time.perf_counter_ns()
        inputs, labels, ids = _load_inputs(dataset, preprocess, opts.limit)
        if traced:
            traced.tracer.add_span("preprocess dataset", TraceLevel.APPLICATION, "application", t_pre,
                                   time.perf_counter_ns(), inputs=len(inputs), dataset=dataset.name)
        if dataset.skipped:
            evaluation.warnings.append(
                f"{fw}: skipped {len(dataset.skipped)} unreadable input(s): "
                + "; ".join(f"{i} ({why})" for i, why in dataset.skipped[:3]))

        popts = PredictorOptions(threads=opts.threads, trust=opts.trust)
        _prepare_assets(manifest)  # one-time downloads and conversions are not part of the load time
        t0 = time.perf_counter_ns()
        predictor = open_predictor(manifest, device=opts.device, options=popts)
        load_ns = time.perf_counter_ns() - t0
        log.info("opened %s in %.0f ms", manifest.key, load_ns / 1e6)
        if traced:
            traced.tracer.add_span(f"load {manifest.key}", TraceLevel.APPLICATION, "application", t0, t0 + load_ns)
        try:
            info = predictor.info()
            evaluation.options.setdefault("predictors", {})[fw] = info.to_dict()
            first_batch = _make_batch(inputs, opts.batch_sizes[0])
            t0 = time.perf_counter_ns()
            predictor.predict(first_batch)
            first_ns = time.perf_counter_ns() - t0
            cold.append({"framework": fw, "batch_size": int(first_batch.shape[0]),
                         "load_ms": load_ns / 1e6, "first_inference_ms": first_ns / 1e6})

            if labels is not None and manifest.outputs[0].type == "classification":
                acc, preds, probs = _accuracy(predictor, manifest, inputs, labels, ids, max(opts.batch_sizes), opts.trust)
                acc.update({"framework": fw, "dataset": dataset.name, "skipped": len(dataset.skipped)})
                accuracy.append(acc)
                preds.insert(0, "framework", fw)
                predictions.append(preds)
                if opts.keep_probabilities:
                    evaluation.probabilities[fw] = probs

            for batch_size in opts.batch_sizes:
                batch = _make_batch(inputs, batch_size)
                self._current = (fw, batch_size)
                log.info("timing %s at batch size %d (%s)", fw, batch_size, opts.scenario)
                result = run_scenario(opts.scenario, predictor.predict, batch, opts.timing)
                rows.append(self._latency_row(fw, batch_size, result.samples_ns, result.wall_ns,
                                              result.warmup_calls, result.extra, evaluation))
                progress.update(1)
            self._current = None
            if traced:
                self._trace(traced, predictor, manifest, inputs, rows, evaluation)
        finally:
            predictor.close()

    def _trace(self, traced, predictor, manifest, inputs, rows, evaluation) -> None:
        """The traced pass after the untraced sweep; its overhead is measured against that sweep."""
        opts = self.options
        fw = manifest.framework.name
        log.info("tracing %s at level %s", fw, traced.tracer.level.name)
        untraced = {r["batch_size"]: r["median_ms"] * 1e6 for r in rows if r["framework"] == fw}
        batches = {b: _make_batch(inputs, b) for b in opts.batch_sizes}
        trace_batches(traced, predictor, Postprocessor(manifest, trust=opts.trust), batches, untraced,
                      repeats=opts.tracing.trace_repeats)
        trace = traced.tracer.trace()
        evaluation.traces[fw] = trace
        evaluation.trace_ids.append(traced.tracer.trace_id)
        self._overhead.extend(traced.overhead)
        for name, reason in trace.metadata.get("unavailable", {}).items():
            evaluation.warnings.append(f"{fw}: {name} not traced: {reason}")

    def _latency_row(self, fw, batch_size, samples, wall_ns, warmup_calls, extra, evaluation) -> dict:
        scenario = self.options.scenario
        # single-stream: throughput = batch / mean latency; offline and server: inputs served / loop wall time
        stats = latency_stats(samples, batch_size, wall_ns=None if scenario == "single-stream" else wall_ns)
        row = {"framework": fw, "batch_size": int(batch_size), "scenario": scenario, **stats,
               "warmup_calls": int(warmup_calls), **extra}
        evaluation.samples[SampleKey(fw, int(batch_size), scenario)] = np.asarray(samples, dtype=np.int64)
        warning = stability_warning(row)
        if warning:
            evaluation.warnings.append(warning)
        return row


def _prepare_assets(manifest: Manifest) -> None:
    """Fetch, convert and verify the model's assets before its load is timed."""
    from pathlib import Path

    from mlms_nb.data.assets import resolve_asset

    base = Path(manifest.source).parent if manifest.source else None
    for field_name in ("graph_path", "weights_path"):
        uri = getattr(manifest.model, field_name)
        if uri:
            resolve_asset(uri, manifest.model.sha256.get(field_name), base)


def _progress(total: int, enabled: bool, name: str):
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=f"mlms eval {name}", unit="sweep", disable=not enabled or total <= 1, leave=False)


def _load_inputs(dataset, preprocess, limit):
    """All preprocessed inputs of the dataset in memory (N first), their labels and ids."""
    data, labels, ids = [], [], []
    for batch in dataset.iter_batches(32, preprocess, limit=limit):
        data.append(batch.data)
        ids.extend(batch.ids)
        if batch.labels is not None:
            labels.append(batch.labels)
    if not data:
        raise DatasetError(f"dataset {dataset.name!r} gave no inputs")
    return np.concatenate(data), (np.concatenate(labels) if labels else None), ids


def _make_batch(inputs: np.ndarray, batch_size: int) -> np.ndarray:
    """``batch_size`` inputs, cycling through the dataset when it is smaller; contiguous."""
    idx = np.arange(batch_size) % len(inputs)
    return np.ascontiguousarray(inputs[idx])


def _accuracy(predictor, manifest, inputs, labels, ids, batch_size, trust):
    """Top-1 / top-5 over all inputs, and one row of predictions per input."""
    post = Postprocessor(manifest, trust=trust)
    names = load_labels(manifest) if manifest.outputs[0].labels else None
    probs, top_idx, top_p = [], [], []
    for start in range(0, len(inputs), batch_size):
        pred = post(predictor.predict(inputs[start:start + batch_size]))
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
