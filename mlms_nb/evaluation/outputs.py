"""Every output of every input, captured: the outputs pass, and recurrent models run over ordered chunks.

`OutputRecorder` turns each call's outputs (a mapping output name -> array, batch on axis 0, or on the state
input's batch axis for a state output) into one row per input x output of the ``outputs`` frame
(:data:`mlms_nb.schema.evaluation.OUTPUTS`): its shape, dtype and a summary (min, max, mean, std, all in the
output's own unit), and -- as ``capture_outputs`` asks -- its values (flattened, float64):

- ``none``: no rows; ``summary``: a summary row per input, no values (the default);
- ``all``: values of every input; ``first:N`` (or an int N): values of the first N inputs, a summary of the rest.

The values make outputs comparable across frameworks afterwards (:mod:`mlms_nb.evaluation.agreement`).

`run_sequences` evaluates items cut into chunks: per item, zeros for each state input, then one call per chunk in
order, each state output fed back as its state input of the next call (``Manifest.state``); one row per chunk
(``chunk`` column, 0-based; -1 for inputs that are not chunked).
"""
from __future__ import annotations

from typing import Any, Callable, Mapping

import numpy as np
import pandas as pd

from mlms_nb.data.feeds import fed_name, input_names, output_names
from mlms_nb.errors import MlmsError
from mlms_nb.manifest import Manifest
from mlms_nb.schema.evaluation import OUTPUTS

CAPTURE_MODES = ("none", "summary", "all", "first:N")


def parse_capture(mode: Any) -> int | None:
    """How many inputs keep their values: None for every one (``all``), 0 for none (``summary``), N for
    ``first:N``; -1 for ``none`` (no rows at all)."""
    if isinstance(mode, bool):
        raise MlmsError(f"capture_outputs: expected one of {', '.join(CAPTURE_MODES)} or a number of inputs, got {mode!r}")
    if isinstance(mode, int):
        if mode < 0:
            raise MlmsError(f"capture_outputs: a number of inputs is 0 or more, got {mode}")
        return mode
    text = str(mode).strip().lower()
    if text in ("none", "off"):
        return -1
    if text == "summary":
        return 0
    if text == "all":
        return None
    head, _, number = text.partition(":")
    if head == "first" and number.strip().isdigit():
        return int(number)
    raise MlmsError(f"capture_outputs: expected one of {', '.join(CAPTURE_MODES)} (N a number of inputs), got {mode!r}")


class OutputRecorder:
    """Rows of the ``outputs`` frame for one framework (see the module docstring)."""

    def __init__(self, manifest: Manifest, framework: str, capture: Any = "summary"):
        self.manifest = manifest
        self.framework = framework
        self.keep = parse_capture(capture)
        self.rows: list[dict] = []
        self.inputs_seen = 0
        specs = dict(zip(input_names(manifest), manifest.inputs))
        #: output name -> its batch axis (a state output's is its state input's)
        self.axes = {name: 0 for name in output_names(manifest)}
        for out, into in manifest.state.items():
            self.axes[out] = specs[into].batch_axis or 0

    @property
    def enabled(self) -> bool:
        return self.keep != -1

    def add(self, ids: list[str], outputs: Mapping[str, Any], chunk: int = -1) -> None:
        """One call's outputs for the inputs ``ids`` (in batch order)."""
        if not self.enabled:
            return
        for row, input_id in enumerate(ids):
            keep_values = self.keep is None or self.inputs_seen < self.keep
            for name, value in outputs.items():
                array = np.asarray(value)
                axis = self.axes.get(name, 0)
                one = np.take(array, row, axis=axis) if array.ndim > axis and array.shape[axis] == len(ids) else array
                self.rows.append(_row(self.framework, input_id, chunk, name, one, keep_values))
            if chunk <= 0:
                self.inputs_seen += 1

    def frame(self) -> pd.DataFrame:
        """The rows so far, typed as :data:`~mlms_nb.schema.evaluation.OUTPUTS` says."""
        if not self.rows:
            return pd.DataFrame()
        return OUTPUTS.frame(self.rows)


def _row(framework: str, input_id: str, chunk: int, name: str, value: np.ndarray, keep_values: bool) -> dict:
    numeric = value.dtype.kind in "biuf"
    flat = value.astype(np.float64, copy=False).reshape(-1) if numeric else None
    finite = flat[np.isfinite(flat)] if flat is not None and flat.size else None
    stat = (lambda f: float(f(finite)) if finite is not None and finite.size else float("nan"))
    return {"framework": framework, "input_id": str(input_id), "chunk": int(chunk), "output": name,
            "shape": [int(d) for d in value.shape], "dtype": str(value.dtype),
            "min": stat(np.min), "max": stat(np.max), "mean": stat(np.mean), "std": stat(np.std),
            "values": flat.tolist() if keep_values and flat is not None else None}


def capturing(predict: Callable, recorder: OutputRecorder, ids: list[str], feed_name: str,
              to_model: Callable = lambda batch: batch) -> Callable:
    """``predict`` for the accuracy pass (array in, first output out) that also records every output of each
    call for the next ``len(batch)`` of ``ids`` (the pass goes through the inputs in order); ``to_model`` moves
    the batch axis where the model wants it."""
    position = [0]

    def predict_and_record(batch: np.ndarray):
        start = position[0]
        position[0] += len(batch)
        return record_batch(predict, feed_name, ids[start:start + len(batch)], batch, recorder, to_model)

    return predict_and_record


def record_batch(predict: Callable, feed_name: str, ids: list[str], data: Any, recorder: OutputRecorder,
                 to_model: Callable = lambda batch: batch) -> Any:
    """One batch of a streamed pass: ``data`` (the fed input's array, N first, or a mapping name -> array) through
    ``predict``, every output recorded for ``ids``; returns the first output (what a classifier's scorer reads)."""
    outputs = predict(to_model(data) if isinstance(data, Mapping) else {feed_name: to_model(data)})
    recorder.add(ids, outputs)
    return next(iter(outputs.values()))


def outputs_pass(predict: Callable, manifest: Manifest, inputs, recorder: OutputRecorder, batch_size: int) -> None:
    """Every input through ``predict`` (a mapping in, every output out), recorded (dense, ragged or sequences:
    :mod:`mlms_nb.evaluation.inputs`)."""
    if inputs.kind == "sequences":
        run_sequences(predict, manifest, inputs.ids, inputs.data, recorder, inputs.to_model)
        return
    name = fed_name(manifest)
    for ids, batch in inputs.calls(batch_size):
        recorder.add(ids, predict(batch if isinstance(batch, dict) else {name: batch}))


def run_sequences(predict: Callable, manifest: Manifest, ids: list[str], items: list[Any],
                  recorder: OutputRecorder | None = None,
                  to_model: Callable = lambda batch: batch) -> list[list[dict[str, np.ndarray]]]:
    """Each item's chunks in order, state carried from call to call and reset per item; returns per item the
    outputs of each chunk (batch 1). ``to_model`` moves a chunk's batch axis where the model wants it."""
    name = fed_name(manifest)
    results = []
    for input_id, item in zip(ids, items):
        state: dict[str, np.ndarray] = {}
        per_chunk = []
        chunks = len(next(iter(item.values()))) if isinstance(item, dict) else len(item)
        for c in range(chunks):
            one = {k: v[c:c + 1] for k, v in item.items()} if isinstance(item, dict) else {name: item[c:c + 1]}
            outputs = predict({**to_model(one), **state})
            state = {into: outputs[out] for out, into in manifest.state.items()}
            per_chunk.append(outputs)
            if recorder is not None:
                recorder.add([input_id], outputs, chunk=c)
        results.append(per_chunk)
    return results
