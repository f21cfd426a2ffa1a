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

import itertools
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import pandas as pd

from mlms_nb.data.feeds import fed_name, input_names, output_names
from mlms_nb.errors import MlmsError
from mlms_nb.evaluation.lockstep import run_lockstep
from mlms_nb.manifest import Manifest
from mlms_nb.schema.evaluation import OUTPUTS

CAPTURE_MODES = ("none", "summary", "all", "first:N")
GROUP_INPUTS = 1024
GROUP_VALUES = 32768
"""Calls whose outputs the recorder (and the full pass's scorer) summarise at once: at least `GROUP_INPUTS` inputs
holding at least `GROUP_VALUES` output values (see `OutputRecorder.add`), so narrow outputs come in groups big
enough to spread numpy's per-call cost (a small CNN's 10 classes: 3,328 inputs at batch 64, a third less of that
cost than 1,024; far bigger groups fall out of cache), and 1,000 classes stay at 1,024."""


def group_full(inputs: int, values: int) -> bool:
    """Whether a group of calls holding ``inputs`` inputs and ``values`` output values is summarised now."""
    return inputs >= GROUP_INPUTS and values >= GROUP_VALUES


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
    """Rows of the ``outputs`` frame for one framework (see the module docstring). Calls are summarised in groups
    with numpy on whole arrays and kept as those few arrays; `frame` spells the rows out once, so the per-input
    cost during a pass is a few array elements."""

    def __init__(self, manifest: Manifest, framework: str, capture: Any = "summary"):
        self.manifest = manifest
        self.framework = framework
        self.keep = parse_capture(capture)
        #: one per summarised group of calls: (ids, chunk, first input's place, output names, summaries, kept)
        self._blocks: list[tuple] = []
        self._pending: list[tuple[Sequence[str], Mapping[str, Any]]] = []  # in-order calls not summarised yet
        self._pending_inputs = 0
        self._pending_values = 0
        self.count = 0  # rows so far
        self.inputs_seen = 0
        specs = dict(zip(input_names(manifest), manifest.inputs))
        #: output name -> its batch axis (a state output's is its state input's)
        self.axes = {name: 0 for name in output_names(manifest)}
        for out, into in manifest.state.items():
            self.axes[out] = specs[into].batch_axis or 0

    @property
    def enabled(self) -> bool:
        return self.keep != -1

    def __len__(self) -> int:
        return self.count + sum(len(ids) * len(outputs) for ids, outputs in self._pending)

    def add(self, ids: Sequence[str], outputs: Mapping[str, Any], chunk: int = -1, place: int | None = None) -> None:
        """One call's outputs for the inputs ``ids`` (in batch order). ``place``: the first input's place in the
        dataset (0-based) when calls do not go through the inputs in order (items side by side); by default the
        inputs are taken to arrive in dataset order, a new one at each row of chunk -1 or 0.

        Calls in dataset order (no chunk, no place) are summarised in groups (`group_full`: numpy's per-call cost
        spread over many calls); :meth:`flush` summarises what is left."""
        n = len(ids)
        if not self.enabled or not n:
            return
        if chunk == -1 and place is None:
            self._pending.append((ids, outputs))  # neither is changed by the pass once given
            self._pending_inputs += n
            self._pending_values += sum(getattr(a, "size", 1) for a in outputs.values())
            if group_full(self._pending_inputs, self._pending_values):
                self.flush()
            return
        self.flush()
        self._add(ids, outputs, chunk, place)

    def flush(self) -> None:
        """Summarise the calls held back, as one group where their outputs stack (else call by call)."""
        pending, self._pending, self._pending_inputs, self._pending_values = self._pending, [], 0, 0
        if not pending:
            return
        names = list(pending[0][1])
        if len(pending) > 1 and all(list(outputs) == names for _, outputs in pending):
            arrays = {name: [np.asarray(o[name]) for _, o in pending] for name in names}
            batched = all(a.ndim > self.axes.get(name, 0) and a.shape[self.axes.get(name, 0)] == len(ids)
                          for name in names for (ids, _), a in zip(pending, arrays[name]))
            if batched:
                try:
                    joined = {name: np.concatenate(arrays[name], axis=self.axes.get(name, 0)) for name in names}
                except ValueError:  # outputs whose other dimensions differ from call to call
                    batched = False
            if batched:
                self._add(_Ids([ids for ids, _ in pending]), joined, -1, None)
                return
        for ids, outputs in pending:
            self._add(ids, outputs, -1, None)

    def _add(self, ids, outputs: Mapping[str, Any], chunk: int, place: int | None) -> None:
        """One group's summaries, kept as they came (a few arrays per output); `frame` spells the rows out."""
        n = len(ids)
        first = self.inputs_seen if place is None else place
        kept = n if self.keep is None else int(np.clip(self.keep - first, 0, n))
        names = list(outputs)
        per_output = [_summaries(np.asarray(outputs[name]), self.axes.get(name, 0), n, kept) for name in names]
        self._blocks.append((ids, int(chunk), first, names, per_output, kept))
        self.count += n * len(names)
        if chunk <= 0:
            self.inputs_seen = max(self.inputs_seen, first + n)

    def frame(self) -> pd.DataFrame:
        """The rows so far, typed as :data:`~mlms_nb.schema.evaluation.OUTPUTS` says."""
        self.flush()
        if not self._blocks:
            return pd.DataFrame()
        columns: dict[str, list] = {name: [] for name in ("input_id", "output", "shape", "dtype", "values")}
        at, chunk, stats = [], [], {name: [] for name in ("min", "max", "mean", "std")}
        for ids, block_chunk, first, names, per_output, kept in self._blocks:
            n, width = len(ids), len(names)
            # rows input-major (input 0: every output, input 1: ...), as the frame lists them
            columns["input_id"].extend(map(str, ids) if width == 1 else [str(i) for i in ids for _ in names])
            columns["output"].extend(names * n)
            at.append(np.repeat(np.arange(first, first + n, dtype=np.int64), width))
            chunk.append(np.full(n * width, block_chunk, dtype=np.int64))
            for name, column in stats.items():
                column.append(np.stack([s[name] for s in per_output], axis=1).reshape(-1))
            columns["shape"].extend(map(list, [s["shape"] for s in per_output] * n))  # a list of its own per row
            columns["dtype"].extend([s["dtype"] for s in per_output] * n)
            columns["values"].extend([s["values"][row] if row < len(s["values"]) else None
                                      for row in range(n) for s in per_output] if kept else [None] * (n * width))
        at, chunk = np.concatenate(at), np.concatenate(chunk)
        columns = {"framework": [self.framework] * len(at), "chunk": chunk, **columns,
                   **{name: np.concatenate(column) for name, column in stats.items()}}
        if (np.diff(at) < 0).any() or ((np.diff(at) == 0) & (np.diff(chunk) < 0)).any():
            order = np.lexsort((chunk, at))  # stable: rows made out of order go back to dataset order
            columns = {k: (v[order] if isinstance(v, np.ndarray) else [v[i] for i in order])
                       for k, v in columns.items()}
        return OUTPUTS.frame(columns)


class _Ids:
    """The ids of several calls in order, one sequence: what a group of calls summarised at once covers."""

    __slots__ = ("parts", "size")

    def __init__(self, parts: list):
        self.parts, self.size = parts, sum(len(p) for p in parts)

    def __len__(self) -> int:
        return self.size

    def __iter__(self):
        return itertools.chain.from_iterable(self.parts)


def _summaries(array: np.ndarray, axis: int, n: int, kept: int) -> dict[str, Any]:
    """One output of one call, per input: shape and dtype (without the batch), min/max/mean/std of the finite
    elements (NaN when none is), and the values (flattened float64) of the first ``kept`` inputs. An output
    without the batch on ``axis`` is the same for every input of the call."""
    batched = array.ndim > axis and array.shape[axis] == n
    one = np.moveaxis(array, axis, 0) if batched else array[None]
    shape = one.shape[1:]
    summary: dict[str, Any] = {"shape": [int(d) for d in shape], "dtype": str(array.dtype)}
    if array.dtype.kind not in "biuf":
        nan = np.full(len(one), np.nan)
        summary.update(min=nan, max=nan, mean=nan, std=nan, values=[])
    else:
        flat = one.reshape(len(one), -1)  # float64 in the stats and the values, cast where cheapest
        summary.update(_finite_stats(flat))
        if kept:
            flat = flat.astype(np.float64, copy=False)
        summary["values"] = flat[:kept].tolist() if batched else [flat[0].tolist() for _ in range(min(kept, n))]
    if not batched:
        for key in ("min", "max", "mean", "std"):
            summary[key] = np.repeat(summary[key], n)
    return summary


NARROW = 64
"""Rows of fewer elements than this are reduced across a transposed copy: numpy reduces along a short axis at a
fixed cost per row (10 classes x 1024 rows: about 10x slower than across the rows)."""


def _finite_stats(flat: np.ndarray) -> dict[str, np.ndarray]:
    """min, max, mean and std (float64) of each row's finite elements (NaN for a row with none), as ``np.std`` gives
    them on the rows cast to float64."""
    rows, width = flat.shape
    if not width:
        nan = np.full(rows, np.nan)
        return {"min": nan, "max": nan, "mean": nan, "std": nan.copy()}
    if width < NARROW:  # the same sums, across a transposed copy: min and max in the rows' own type (the cast to
        across = np.ascontiguousarray(flat.T)  # float64 keeps order), the sums in float64, in place
        if np.isfinite(across).all():
            wide = across.astype(np.float64)
            mean = wide.sum(axis=0) / width
            np.subtract(wide, mean, out=wide)
            np.multiply(wide, wide, out=wide)
            return {"min": across.min(axis=0).astype(np.float64), "max": across.max(axis=0).astype(np.float64),
                    "mean": mean, "std": np.sqrt(wide.sum(axis=0) / width)}
    flat = flat.astype(np.float64, copy=False)
    finite = np.isfinite(flat)
    if finite.all():
        return {"min": flat.min(axis=1), "max": flat.max(axis=1), "mean": flat.mean(axis=1), "std": flat.std(axis=1)}
    count = finite.sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.where(finite, flat, 0.0).sum(axis=1) / count
        dev = np.where(finite, flat - mean[:, None], 0.0)
        std = np.sqrt((dev * dev).sum(axis=1) / count)
        low = np.where(finite, flat, np.inf).min(axis=1)
        high = np.where(finite, flat, -np.inf).max(axis=1)
    none = count == 0
    for column in (low, high, mean, std):
        column[none] = np.nan
    return {"min": low, "max": high, "mean": mean, "std": std}


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
