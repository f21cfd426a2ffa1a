"""Recurrent and streaming models over ordered chunks, several items side by side: state in lockstep.

A dataset item cut into ordered chunks (a ``chunk`` step) is one sequence: zeros for each state input, then one
call per chunk in order, each state output fed back as its state input of the next call (``Manifest.state``).
`run_lockstep` runs up to ``batch_size`` (B) sequences at once, one per row of the batch:

- call t feeds every row the next chunk of its own item (rows stacked on axis 0, then moved to the fed input's
  ``batch_axis``) and every state input that row's state (the rows batched on the state input's own
  ``batch_axis``, as the model returns them);
- an item that ends gives its row to the next item of the dataset, whose state starts as zeros; the batch shrinks
  only when the dataset has no item left, at the tail.

Why refill rather than run B items to the end of the longest and then start B more: items differ in length, and a
group would call the model with fewer and fewer rows (or with padding, whose state would then have to be thrown
away) until its longest item ends. Refilled, every call but those of the tail has B rows and no row computes
anything thrown away: for 200 files of 21 to 200 chunks at B = 8, 3,052 calls where groups make 4,699 and the
chunks allow 2,931 at the least (``benchmarks/lockstep.py``). The rows never see each other (a model
whose outputs mix its batch's rows cannot be run in batches at all), so each item's outputs are those of running
it alone, up to floating-point rounding.

Outputs are cut back per row on axis 0 (a state output: on its state input's batch axis); captured rows go to the
`OutputRecorder` with the item's place in the dataset, so its frame is the one-item-at-a-time one. A state input
without a batch axis (``batch_axis: null``) holds one row: such a model runs one item at a time.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping

import numpy as np

from mlms_nb.data.feeds import fed_name, input_names, moved_axes, stack, to_model_layout, zeros_state
from mlms_nb.manifest import Manifest

Outputs = dict[str, np.ndarray]


@dataclass
class _Row:
    """One item in flight: its id, its place in the dataset, its chunks and the next one to feed."""
    input_id: str
    place: int
    item: Any
    chunks: int
    next: int = 0
    outputs: list[Outputs] = field(default_factory=list)


def chunk_count(item: Any) -> int:
    """How many ordered chunks an item holds (its first axis; a mapping's: that of its arrays)."""
    return len(next(iter(item.values()))) if isinstance(item, Mapping) else len(item)


def _chunk(item: Any, index: int) -> Any:
    return {k: v[index] for k, v in item.items()} if isinstance(item, Mapping) else item[index]


def _row_of(array: np.ndarray, row: int, rows: int, axis: int) -> np.ndarray:
    """Row ``row`` of a call's output, its batch axis kept (size 1); an output without the batch: as it is."""
    if array.ndim > axis and array.shape[axis] == rows:
        return np.take(array, [row], axis=axis)
    return array


def run_lockstep(predict: Callable, manifest: Manifest, items: Iterable[tuple[str, Any]], batch_size: int = 1, *,
                 recorder=None, to_model: Callable | None = None, keep: bool = True,
                 on_item: Callable[[str], None] | None = None) -> list[list[Outputs]]:
    """``items`` (``(input_id, chunks)`` in dataset order; pulled only as rows free up) through ``predict`` (a
    mapping in, every output out), ``batch_size`` at a time in lockstep (see the module docstring).

    Returns, per item in dataset order, the outputs of each of its chunks with a batch of 1 (nothing when ``keep``
    is False: a streamed pass keeps no outputs). ``recorder``: every output of every chunk recorded (``chunk``:
    its place in its item). ``to_model``: moves a batch stacked on axis 0 to the model's batch axes (default: as
    the manifest's ``batch_axis`` says). ``on_item(input_id)``: called when an item's last chunk is done."""
    fed = fed_name(manifest)
    specs = dict(zip(input_names(manifest), manifest.inputs))
    state_axes = {into: specs[into].batch_axis for into in manifest.state.values()}
    width = max(1, int(batch_size)) if all(axis is not None for axis in state_axes.values()) else 1
    output_axes = {out: state_axes[into] or 0 for out, into in manifest.state.items()}
    axes = moved_axes(manifest)
    layout = to_model or (lambda batch: to_model_layout(batch, axes, fed))
    slicing = keep or recorder is not None
    source = iter(items)
    rows: list[_Row] = []
    state: dict[str, np.ndarray] = {}
    results: list[list[Outputs]] = []
    places = 0
    exhausted = False
    while True:
        fresh = 0
        while len(rows) < width and not exhausted:  # free rows go to the next items
            try:
                input_id, item = next(source)
            except StopIteration:
                exhausted = True
                break
            row = _Row(str(input_id), places, item, chunk_count(item))
            places += 1
            if keep:
                results.append(row.outputs)
            if not row.chunks:  # nothing to feed: done at once
                if on_item is not None:
                    on_item(row.input_id)
                continue
            rows.append(row)
            fresh += 1
        if not rows:
            break
        if fresh:
            state = _with_zero_rows(state, fresh, specs, state_axes)
        n = len(rows)
        chunks = layout(stack([_chunk(r.item, r.next) for r in rows]))
        outputs = predict({**(chunks if isinstance(chunks, Mapping) else {fed: chunks}), **state})
        for i, row in enumerate(rows):
            if slicing:
                mine = {name: _row_of(np.asarray(value), i, n, output_axes.get(name, 0))
                        for name, value in outputs.items()}
                if keep:
                    row.outputs.append(mine)
                if recorder is not None:
                    recorder.add([row.input_id], mine, chunk=row.next, place=row.place)
            row.next += 1
        carried = {into: np.asarray(outputs[out]) for out, into in manifest.state.items()}
        alive = [i for i, row in enumerate(rows) if row.next < row.chunks]
        for row in rows:
            if row.next >= row.chunks and on_item is not None:
                on_item(row.input_id)
        if len(alive) < n:
            rows = [rows[i] for i in alive]
            carried = {k: np.take(v, alive, axis=state_axes[k]) for k, v in carried.items()} if alive else {}
        state = carried
    return results


def _with_zero_rows(state: dict[str, np.ndarray], fresh: int, specs: dict, state_axes: dict[str, int | None]
                    ) -> dict[str, np.ndarray]:
    """The state of the rows in flight followed by zeros for ``fresh`` new rows, on each state input's batch axis."""
    out = {}
    for into, axis in state_axes.items():
        zeros = zeros_state(specs[into], fresh)
        if into in state and state[into].size:
            out[into] = np.concatenate([state[into], zeros.astype(state[into].dtype, copy=False)], axis=axis)
        else:
            out[into] = zeros
    return out
