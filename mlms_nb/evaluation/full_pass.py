"""The full pass: every input of the dataset through the model once, streamed, with its wall time and where the
time went; and, for a classifier on labeled data, top-1/top-5 and one prediction row per input.

Inputs arrive from :class:`mlms_nb.data.pipeline.Stream` (decoded and preprocessed by worker threads, or processes
with ``reader="processes"``, a few batches ahead), so memory does not grow with the dataset: only the per-input
results are kept (the top-5 classes and their probabilities; all probabilities only when asked). The timed loops
and the traced pass use a small sample instead, the dataset's head (:func:`head_sample`), cycled by
:func:`make_batch`.
"""
from __future__ import annotations

import time
from typing import Any, Callable, Iterator

import numpy as np
import pandas as pd

from mlms_nb.data.feeds import fed_name, moved_axes, to_model_layout
from mlms_nb.data.labels import check_label_count, label_space_problem, load_labels
from mlms_nb.data.pipeline import Batch, default_workers, map_inputs
from mlms_nb.data.transforms import Postprocessor
from mlms_nb.evaluation.checks import NonFinite
from mlms_nb.evaluation.outputs import group_full
from mlms_nb.evaluation.records import AccuracyPass, FullPass
from mlms_nb.manifest import Manifest

TOP_K = 5


def head_sample(dataset, preprocess, count: int, limit: int | None) -> Batch:
    """The first ``count`` inputs (at most ``limit``), preprocessed: the timed loops' and the traced pass's data."""
    return dataset.head(count if limit is None else max(1, min(count, limit)), preprocess)


def make_batch(inputs: Any, batch_size: int, manifest: Manifest | None = None) -> Any:
    """``batch_size`` inputs, cycling through the sample when it is smaller; contiguous (per name for a mapping).
    With ``manifest``, each input whose ``batch_axis`` is not the first gets its batch there."""
    def take(array: np.ndarray) -> np.ndarray:
        idx = np.arange(batch_size) % len(array)
        return np.ascontiguousarray(array[idx])

    batch = map_inputs(inputs, take)
    return batch if manifest is None else to_model_layout(batch, moved_axes(manifest), fed_name(manifest))


def run_full_pass(predict: Callable, manifest: Manifest, dataset, preprocess, batch_size: int, *, limit: int | None,
                  keep_probabilities: bool, trust: bool, reporter=None, workers: int | None = None,
                  prefetch: int | None = None, recorder=None, targets=None, reader: str | None = None,
                  niceness: int | None = None, note: Callable[[str], None] | None = None,
                  reset: Callable[[], None] | None = None,
                  label_problem: str | None = None) -> tuple[FullPass, AccuracyPass | None]:
    """Stream the dataset through ``predict`` at ``batch_size``; returns the pass's record and, for a classifier
    on labeled data, its accuracy record (``framework`` filled in by the caller's records: see `work`).
    ``recorder`` (:class:`~mlms_nb.evaluation.outputs.OutputRecorder`): every output of every input is recorded
    (the model is then called by name, and returns every output). ``targets``
    (:class:`~mlms_nb.evaluation.targets.TargetScores`): every output with a target in the batch is scored against
    it. Datasets stack inputs on axis 0; an input whose ``batch_axis`` is another gets its batch moved there before
    each call. ``reader``: threads or processes, ``niceness`` steps below the model's priority
    (:class:`~mlms_nb.data.pipeline.Stream`); ``note`` gets the
    sentence saying why a dataset asked to be read by processes was read by threads, and the sentences saying how
    many inputs held NaN or Inf in their data or outputs (:class:`~mlms_nb.evaluation.checks.NonFinite`, checked on
    whole batches): those inputs are left out of accuracy, the recorded outputs (so of agreement) and the targets.
    ``label_problem``: why the dataset's labels do not fit the model's classes (found before it loaded); accuracy is
    then n/a with that reason, as it is when the labels reach past the output's width. ``reset``: the model keeps
    hidden state (its declared ``model.reset``): called before every item, outside the timed calls, items then
    going one per call (``batch_size`` 1).

    Items cut into ordered chunks (a ``chunk`` step) run ``batch_size`` side by side, each row with its own state
    (:func:`~mlms_nb.evaluation.lockstep.run_lockstep`); the stream then reads one item at a time (items differ in
    length); they are not scored against targets. The record counts dataset items as today's does: ``inputs`` =
    items (not chunks), ``inputs_per_s`` = items / ``wall_s``; ``batches`` = predict calls (one chunk of up to
    ``batch_size`` items each); ``postprocess_s`` = the time between calls spent outside the stream (assembling each
    call's chunks and states, recording outputs)."""
    from mlms_nb.evaluation.lockstep import run_lockstep

    fw = manifest.framework.name
    sequences = bool(getattr(preprocess, "chunked", False))
    if reset is not None and batch_size != 1:
        raise ValueError(f"a model reset before each item runs one item per call, not {batch_size}")
    fed = fed_name(manifest)
    axes = moved_axes(manifest)
    scorer = _Scorer(manifest, trust, keep_probabilities, label_problem) if (
        dataset.labeled and manifest.outputs[0].type == "classification" and not sequences) else None
    size = dataset.size()
    total = None if size is None else (size if limit is None else min(size, limit))
    if reporter is not None:
        reporter.start("full pass", total)
    inference_ns = post_ns = 0
    batches = 0
    finite = NonFinite()
    clock = time.perf_counter_ns
    start = clock()
    with dataset.iter_batches(1 if sequences else batch_size, preprocess, limit=limit,
                              workers=workers or default_workers(), prefetch=prefetch, reader=reader,
                              niceness=niceness) as stream:
        if stream.note and note is not None:
            note(stream.note)
        if sequences:
            timed = _TimedCalls(predict)
            t0 = clock()
            if reset is not None:
                reset()
            run_lockstep(timed, manifest, _items(stream), batch_size, recorder=recorder, keep=False,
                         on_item=_after_item(reporter, reset))
            inference_ns, batches = timed.ns, timed.calls
            post_ns = max(0, clock() - t0 - inference_ns - stream.stats.wait_ns)
        for batch in () if sequences else stream:
            if reset is not None:  # outside the timed call: inference_s is the model's calls alone
                reset()
            t0 = clock()
            named = None
            data = to_model_layout(batch.data, axes, fed)
            if recorder is not None or targets is not None:
                named = predict(data if isinstance(data, dict) else {fed: data})
                outputs = next(iter(named.values()))
            else:
                outputs = predict(data)
            t1 = clock()
            keep = finite.check(batch.ids, batch.data, outputs if named is None else named)
            ids, kept, truth = (batch.ids, named, batch.targets) if keep is None else _finite_rows(
                batch.ids, named, batch.targets, keep)
            n = len(batch)  # asked once (a dataset's ids are a sequence that spells each id only when read)
            rows = n if keep is None else len(ids)
            if kept is not None and recorder is not None and rows:
                recorder.add(ids, kept)
            if kept is not None and targets is not None and rows:
                targets.add(ids, kept, truth)
            if scorer is not None:
                scorer.add(batch, outputs, keep)
            inference_ns += t1 - t0
            post_ns += clock() - t1
            batches += 1
            if reporter is not None:
                reporter.advance(n)
        t1 = clock()  # what the scorer and the recorder held back is scored inside the pass's time
        for held in (scorer, recorder):
            if held is not None:
                held.flush()
        post_ns += clock() - t1
        stats = stream.stats
    wall_ns = clock() - start
    if reporter is not None:
        reporter.finish()
    for sentence in finite.sentences(fw) if note is not None else ():
        note(sentence)
    row = {"framework": fw, "dataset": dataset.name, "batch_size": int(batch_size), "inputs": int(stats.inputs),
           "batches": int(batches), "skipped": int(stats.skipped), "wall_s": wall_ns / 1e9,
           "inputs_per_s": stats.inputs / (wall_ns / 1e9) if wall_ns else float("nan"),
           "preprocess_s": stats.read_ns / 1e9, "inference_s": inference_ns / 1e9, "postprocess_s": post_ns / 1e9,
           "wait_s": stats.wait_ns / 1e9, "workers": int(stats.workers), "reader": stats.reader,
           "prefetch": int(stats.prefetch), "nonfinite_inputs": -1 if sequences else finite.inputs,
           "nonfinite_outputs": -1 if sequences else finite.outputs}
    accuracy = None
    if scorer is not None and scorer.count:
        acc, preds, probs = scorer.result()
        acc.update({"framework": fw, "dataset": dataset.name, "skipped": int(stats.skipped)})
        acc["reason"] = acc.pop("reason")  # last, as the schema orders it
        preds.insert(0, "framework", fw)
        accuracy = AccuracyPass(fw, acc, preds, probs)
    return FullPass(fw, row), accuracy


def _after_item(reporter, reset: Callable[[], None] | None) -> Callable[[str], None] | None:
    """What runs when an item's last chunk is done: progress, and the model's reset before the next item."""
    if reporter is None and reset is None:
        return None

    def done(_id: str) -> None:
        if reporter is not None:
            reporter.advance(1)
        if reset is not None:
            reset()

    return done


def _finite_rows(ids: list[str], named, targets, keep: np.ndarray):
    """The rows of one batch that are finite: their ids, outputs (name -> array, batch first) and targets."""
    def rows(array):
        array = np.asarray(array)
        return array[keep] if array.ndim and array.shape[0] == len(ids) else array

    return ([i for i, k in zip(ids, keep) if k], None if named is None else {n: rows(a) for n, a in named.items()},
            None if targets is None else {n: rows(a) for n, a in targets.items()})


def _items(stream) -> Iterator[tuple[str, Any]]:
    """``(input_id, data)`` of each input of a stream, in order (its batch axis dropped)."""
    for batch in stream:
        for i, input_id in enumerate(batch.ids):
            yield input_id, map_inputs(batch.data, lambda array: array[i])


class _TimedCalls:
    """``predict``, counting its calls and the time spent inside them (ns)."""

    def __init__(self, predict: Callable):
        self.predict = predict
        self.calls = 0
        self.ns = 0

    def __call__(self, feed):
        t0 = time.perf_counter_ns()
        try:
            return self.predict(feed)
        finally:
            self.ns += time.perf_counter_ns() - t0
            self.calls += 1


class _Scorer:
    """Top-1/top-5 of a classifier: keeps the top-5 classes and probabilities per input (and all probabilities
    only when asked). Outputs are scored in groups of calls (`~mlms_nb.evaluation.outputs.group_full`: numpy's
    per-call cost spread over many batches); :meth:`flush` scores what is left."""

    def __init__(self, manifest: Manifest, trust: bool, keep_probabilities: bool, problem: str | None = None):
        self.manifest = manifest
        self.problem = problem  # why the labels cannot be scored (label spaces differ): accuracy n/a
        self.unfinite: list[tuple[int, np.ndarray]] = []  # (first row, which rows are finite) of a batch with NaN/Inf
        self.width: int | None = None
        self.post = Postprocessor(manifest, trust=trust)
        self.names = load_labels(manifest) if manifest.outputs[0].labels else None
        self.keep = keep_probabilities
        self.ids: list = []  # each batch's ids, joined in `result`
        self.labels: list[np.ndarray] = []
        self.top_idx: list[np.ndarray] = []
        self.top_p: list[np.ndarray] = []
        self.probs: list[np.ndarray] = []
        self.count = 0
        #: without a code step, postprocessing is row by row: outputs of several calls are scored at once
        self.grouped = not any(step.op == "code" for step in self.post.steps)
        self._held: list[np.ndarray] = []
        self._held_rows = self._held_values = 0

    def add(self, batch: Batch, outputs, finite: np.ndarray | None = None) -> None:
        """One batch; ``finite``: which of its inputs held no NaN/Inf (None: all), the only ones scored."""
        n = len(batch)
        self.ids.append(batch.ids)
        self.labels.append(batch.labels)
        if finite is not None:
            self.unfinite.append((self.count, np.asarray(finite, bool)))
        self.count += n
        x = np.asarray(outputs)
        if self.grouped and x.ndim >= 2 and x.shape[0] == n:
            self._held.append(x)
            self._held_rows += n
            self._held_values += x.size
            if group_full(self._held_rows, self._held_values):
                self.flush()
            return
        self.flush()
        self._score(x)

    def flush(self) -> None:
        """Score the outputs held back, stacked into one array (rows of equal width), else call by call."""
        held, self._held, self._held_rows, self._held_values = self._held, [], 0, 0
        if len(held) > 1 and len({h.shape[1:] for h in held}) == 1:
            self._score(np.concatenate(held))
        else:
            for x in held:
                self._score(x)

    def _score(self, outputs) -> None:
        pred = self.post(outputs)
        self.width = pred.probabilities.shape[1]
        if self.names is not None and not self.top_idx:  # labels of another length than the model's classes: refused
            check_label_count(self.names, self.width, self.manifest)
        self.top_idx.append(np.asarray(pred.top_k_indices)[:, :TOP_K])
        self.top_p.append(np.asarray(pred.top_k_probabilities)[:, :TOP_K])
        if self.keep:
            self.probs.append(pred.probabilities)

    def _names_of(self, classes: np.ndarray) -> list:
        """Each class id's label (None without labels, or for an id outside them), looked up on the whole column."""
        if not self.names:
            return [None] * len(classes)
        table = np.array([*self.names, None], dtype=object)
        inside = (classes >= 0) & (classes < len(self.names))
        return table[np.where(inside, classes, len(self.names))].tolist()

    def result(self) -> tuple[dict, pd.DataFrame, np.ndarray | None]:
        self.flush()
        labels = np.concatenate(self.labels).astype(np.int64, copy=False)
        finite = np.ones(len(labels), bool)
        for first, rows in self.unfinite:
            finite[first:first + len(rows)] = rows
        ids = [i for batch_ids in self.ids for i in batch_ids]
        top_idx, top_p = np.concatenate(self.top_idx), np.concatenate(self.top_p)
        if self.problem is None:  # labels past the output's width: the label spaces differ
            self.problem = label_space_problem(labels, self.width, "the width of the model's output")
        labeled = labels >= 0
        known = labeled & finite if self.problem is None else np.zeros(len(labels), bool)
        correct1 = top_idx[:, 0] == labels
        correct5 = (top_idx == labels[:, None]).any(axis=1)
        preds = pd.DataFrame({
            "input_id": ids,
            "label": labels.astype(int),
            "label_name": self._names_of(labels),
            "top1": top_idx[:, 0].astype(int),
            "top1_name": self._names_of(top_idx[:, 0]),
            "top1_prob": top_p[:, 0].astype(float),
            "top5": top_idx.astype(int).tolist(),
            "top5_probs": top_p.astype(float).tolist(),
            "correct_top1": correct1 & known,
            "correct_top5": correct5 & known,
        })
        n = int(known.sum())
        reason = self.problem or ("" if n or not labeled.any() else
                                  "every labeled input held NaN or Inf in its data or outputs, so none was scored")
        acc = {"n": n, "top1": float(correct1[known].mean()) if n else float("nan"),
               "top5": float(correct5[known].mean()) if n else float("nan"), "reason": reason}
        return acc, preds, (np.concatenate(self.probs) if self.keep and self.probs else None)
