"""Every output of every input, captured: the outputs pass, and recurrent models run over ordered chunks.

`OutputRecorder` turns each call's outputs (a mapping output name -> array, batch on axis 0, or on the state
input's batch axis for a state output) into one row per input x output of the ``outputs`` frame
(:data:`mlms_nb.schema.evaluation.OUTPUTS`): its shape, dtype and a summary (min, max, mean, std, all in the
output's own unit), and -- as ``capture_outputs`` asks -- its values (flattened, float64):

- ``none``: no rows; ``summary``: a summary row per input, no values (the default);
- ``all``: values of every input; ``first:N`` (or an int N): values of the first N inputs, a summary of the rest.

The values make outputs comparable across frameworks afterwards (:mod:`mlms_nb.evaluation.agreement`).

`run_sequences` evaluates items cut into chunks: per item, zeros for each state input, then one call per chunk in
order, each state output fed back as its state input of the next call (``Manifest.state``), several items side by
side at a batch size above 1 (:mod:`mlms_nb.evaluation.lockstep`); one row per chunk (``chunk`` column, 0-based;
-1 for inputs that are not chunked). Rows are in dataset order, each input's chunks in order, whatever order the
calls made them in.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping

import numpy as np
import pandas as pd

from mlms_nb.data.feeds import fed_name, input_names, output_names
from mlms_nb.errors import MlmsError
from mlms_nb.evaluation.lockstep import run_lockstep
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
        self.places: list[tuple[int, int]] = []  # per row: (its input's place in the dataset, its chunk)
        self.inputs_seen = 0
        specs = dict(zip(input_names(manifest), manifest.inputs))
        #: output name -> its batch axis (a state output's is its state input's)
        self.axes = {name: 0 for name in output_names(manifest)}
        for out, into in manifest.state.items():
            self.axes[out] = specs[into].batch_axis or 0

    @property
    def enabled(self) -> bool:
        return self.keep != -1

    def add(self, ids: list[str], outputs: Mapping[str, Any], chunk: int = -1, place: int | None = None) -> None:
        """One call's outputs for the inputs ``ids`` (in batch order). ``place``: the first input's place in the
        dataset (0-based) when calls do not go through the inputs in order (items side by side); by default the
        inputs are taken to arrive in dataset order, a new one at each row of chunk -1 or 0."""
        if not self.enabled:
            return
        for row, input_id in enumerate(ids):
            at = self.inputs_seen if place is None else place + row
            keep_values = self.keep is None or at < self.keep
            for name, value in outputs.items():
                array = np.asarray(value)
                axis = self.axes.get(name, 0)
                one = np.take(array, row, axis=axis) if array.ndim > axis and array.shape[axis] == len(ids) else array
                self.rows.append(_row(self.framework, input_id, chunk, name, one, keep_values))
                self.places.append((at, chunk))
            if chunk <= 0:
                self.inputs_seen = max(self.inputs_seen, at + 1)

    def frame(self) -> pd.DataFrame:
        """The rows so far, typed as :data:`~mlms_nb.schema.evaluation.OUTPUTS` says."""
        if not self.rows:
            return pd.DataFrame()
        places = self.places
        if any(a > b for a, b in zip(places, places[1:])):  # made out of order: back to dataset order
            return OUTPUTS.frame([self.rows[i] for i in sorted(range(len(places)), key=places.__getitem__)])
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
    :mod:`mlms_nb.evaluation.inputs`; sequences ``batch_size`` items side by side)."""
    if inputs.kind == "sequences":
        run_sequences(predict, manifest, inputs.ids, inputs.data, recorder, inputs.to_model, batch_size=batch_size)
        return
    name = fed_name(manifest)
    for ids, batch in inputs.calls(batch_size):
        recorder.add(ids, predict(batch if isinstance(batch, dict) else {name: batch}))


def run_sequences(predict: Callable, manifest: Manifest, ids: list[str], items: list[Any],
                  recorder: OutputRecorder | None = None, to_model: Callable | None = None,
                  batch_size: int = 1) -> list[list[dict[str, np.ndarray]]]:
    """Each item's chunks in order, state carried from call to call and reset per item; ``batch_size`` items side
    by side (:func:`~mlms_nb.evaluation.lockstep.run_lockstep`); returns per item the outputs of each chunk
    (batch 1). ``to_model`` moves a chunk's batch axis where the model wants it (default: the manifest's)."""
    return run_lockstep(predict, manifest, zip(ids, items), batch_size, recorder=recorder, to_model=to_model)
