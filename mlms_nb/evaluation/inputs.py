"""The preprocessed inputs of one framework's work, in one of three shapes:

- dense: every input has one shape; held stacked (an array, or a mapping name -> array for several fed inputs
  such as a tokenizer's ids and mask), N first;
- ragged: inputs of dynamic sizes (``dimensions`` with ``null`` or a symbol), held one by one; each is run alone
  (batch 1) in the outputs pass;
- sequences: each dataset item became ordered chunks (a ``chunk`` step); each item is run chunk by chunk, in order,
  the state outputs fed back as the next chunk's state inputs (``Manifest.state``), several items side by side in
  lockstep at a batch size above 1 (:mod:`mlms_nb.evaluation.lockstep`).

Datasets stack inputs on axis 0; ``to_model`` moves each input whose ``batch_axis`` is another to its own axis
(:func:`mlms_nb.data.feeds.to_model_layout`) before a call.

Timed loops need one batch of a given size: dense inputs cycle through the dataset; ragged ones repeat the first
input; sequences repeat the first chunk of the first item (with zero state), so latency is one call's.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterator

import numpy as np

from mlms_nb.data.feeds import concat, count, fed_name, moved_axes, stack, take, to_model_layout
from mlms_nb.errors import DatasetError


@dataclass
class LoadedInputs:
    """Inputs of one dataset (see the module docstring): ``kind`` is dense, ragged or sequences."""
    kind: str
    data: Any                       # dense: stacked batch; ragged / sequences: list of items
    ids: list[str]
    labels: np.ndarray | None = None
    skipped: list = field(default_factory=list)
    #: fed inputs whose batch axis is not the first: name -> axis (datasets stack on axis 0; moved before a call)
    batch_axes: dict[str, int] = field(default_factory=dict)
    fed: str = "input"
    #: the dataset's ground truth: input id -> target key (an output name; "" the first output) -> array
    targets: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)

    def to_model(self, batch: Any) -> Any:
        """A batch stacked on axis 0, with each fed input's batch moved to its own batch axis."""
        return to_model_layout(batch, self.batch_axes, self.fed)

    def __len__(self) -> int:
        return len(self.ids)

    def batch(self, batch_size: int) -> Any:
        """``batch_size`` inputs for a timed loop (see the module docstring); contiguous."""
        if self.kind == "dense":
            return self.to_model(take(self.data, np.arange(batch_size) % count(self.data)))
        one = self.data[0] if self.kind == "ragged" else take(self.data[0], 0)  # a sequence: its first chunk
        return self.to_model(stack([one] * batch_size))

    def calls(self, batch_size: int) -> Iterator[tuple[list[str], Any]]:
        """``(ids, batch)`` in dataset order: dense inputs ``batch_size`` at a time, ragged ones one at a time."""
        if self.kind == "dense":
            for start in range(0, len(self), batch_size):
                yield self.ids[start:start + batch_size], self.to_model(take(self.data, slice(start, start + batch_size)))
        elif self.kind == "ragged":
            for input_id, item in zip(self.ids, self.data):
                yield [input_id], self.to_model(stack([item]))
        else:
            raise DatasetError("inputs cut into chunks run item by item (run_sequences), not in batches")


def load_inputs(dataset, preprocess, limit: int | None) -> LoadedInputs:
    """Every preprocessed input of ``dataset`` (at most ``limit``), held as dense, ragged or sequences."""
    ragged = preprocess.input.dynamic or preprocess.chunked
    data, labels, ids, targets = [], [], [], {}
    with dataset.iter_batches(1 if ragged else 32, preprocess, limit=limit) as stream:
        for batch in stream:
            if not len(batch.ids):
                continue
            ids.extend(batch.ids)
            for row, input_id in enumerate(batch.ids if batch.targets else ()):
                targets[input_id] = {key: t[row] for key, t in batch.targets.items()}
            if batch.labels is not None:
                labels.append(batch.labels)
            if ragged:
                data.extend(take(batch.data, i) for i in range(len(batch.ids)))
            else:
                data.append(batch.data)
    if not ids:
        raise DatasetError(f"dataset {dataset.name!r} gave no inputs")
    label_array = np.concatenate(labels) if labels else None
    manifest = preprocess.manifest
    layout = dict(batch_axes=moved_axes(manifest), fed=fed_name(manifest), targets=targets)
    if preprocess.chunked:
        return LoadedInputs("sequences", data, ids, label_array, **layout)
    if ragged:
        shapes = {_shape(item) for item in data}
        if len(shapes) == 1:  # every input came out the same size after all
            return LoadedInputs("dense", stack(data), ids, label_array, **layout)
        return LoadedInputs("ragged", data, ids, label_array, **layout)
    return LoadedInputs("dense", concat(data), ids, label_array, **layout)


def _shape(item: Any) -> Any:
    if isinstance(item, dict):
        return tuple(sorted((k, np.shape(v)) for k, v in item.items()))
    return np.shape(item)
