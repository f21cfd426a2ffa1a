"""What the thread readers (pipeline.py) and the reader processes (processes.py) share: the `Batch` a reader
hands over, the helpers that map, stack and join batches, and the readers' scheduling priority."""
from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np


@dataclass
class Batch:
    """``data``: inputs, N first (an array, or a mapping name -> array); ``labels``: int64 class ids (-1 =
    unknown) or None for unlabeled data; ``ids``: one per input. ``skipped``: ``(id, reason)`` of the inputs of
    this chunk that could not be read (the pipeline moves them to ``dataset.skipped``). ``targets``: ground truth
    per output, N first (output name -> array; ``""``: the model's first output), or None."""
    data: Any
    labels: np.ndarray | None
    ids: list[str]
    skipped: list[tuple[str, str]] = field(default_factory=list, repr=False)
    targets: dict[str, np.ndarray] | None = field(default=None, repr=False)

    def __len__(self) -> int:
        return len(self.ids)

    def slice(self, start: int, stop: int) -> "Batch":
        """Inputs ``start:stop`` (views, no copy)."""
        return Batch(map_inputs(self.data, lambda a: a[start:stop]),
                     None if self.labels is None else self.labels[start:stop], self.ids[start:stop],
                     targets=None if self.targets is None else map_inputs(self.targets, lambda a: a[start:stop]))


def map_inputs(data: Any, fn) -> Any:
    """``fn`` applied to the array, or to each array of a mapping name -> array."""
    if isinstance(data, Mapping):
        return {name: fn(value) for name, value in data.items()}
    return fn(data)


def stack_inputs(items: Sequence[Any]) -> Any:
    """Per-input data (arrays, or mappings name -> array) stacked into one batch, N first."""
    if items and isinstance(items[0], Mapping):
        return {name: np.stack([item[name] for item in items]) for name in items[0]}
    return np.stack(items)


def concat_batches(batches: Sequence[Batch]) -> Batch:
    """One batch of the inputs of ``batches``, in order."""
    if len(batches) == 1:
        return batches[0]
    first = batches[0].data
    if isinstance(first, Mapping):
        data = {name: np.concatenate([b.data[name] for b in batches]) for name in first}
    else:
        data = np.concatenate([b.data for b in batches])
    labels = None if batches[0].labels is None else np.concatenate([b.labels for b in batches])
    targets = None if batches[0].targets is None else {
        name: np.concatenate([b.targets[name] for b in batches]) for name in batches[0].targets}
    return Batch(data, labels, [i for b in batches for i in b.ids], targets=targets)


#: How much lower the readers' scheduling priority is than the model's threads (Linux nice steps; 19 is the lowest).
READER_NICENESS = 19


def lower_priority(niceness: int = READER_NICENESS) -> None:
    """Run the calling reader thread ``niceness`` steps below the rest of the process (Linux schedules each thread
    on its own). Readers then take CPU the model leaves idle instead of pre-empting the model's threads, whose
    parallel operators wait for their slowest thread. On 2 cores (efficientnet_lite0 in ONNX Runtime, batch 32,
    medians of interleaved rounds) the full pass ran at 0.74 of a bare loop over preprocessed arrays with readers at
    the model's priority, 0.70 at 5 steps below and 0.80 at 19, where inference ran as fast as bare and the readers
    filled its gaps. The cost: on a machine busy with other work, readers this low get little CPU; give 0 (the
    model's priority, ``reader_niceness``) there. Where priorities cannot be changed (not Linux, a sandbox) the
    readers keep the process's."""
    if niceness <= 0:
        return
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), os.getpriority(os.PRIO_PROCESS, 0) + niceness)
    except (AttributeError, OSError):
        pass
