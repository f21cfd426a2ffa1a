"""Feeds: one call's inputs as a mapping input name -> array, completed and checked against the manifest.

A dataset gives the *fed* input (``Manifest.fed_input``: the first input that is neither a constant nor a state);
a `FeedBuilder` adds the rest -- constants (``type: constant``, their ``value``, repeated along ``batch_axis`` when
they have one), state inputs (zeros of their ``dimensions`` until a call's outputs replace them, see
`Manifest.state`), the tokenizer's other outputs -- and checks every shape against ``dimensions``: a static size
must match, a symbol (``H``) must have one size across the call's inputs, ``null`` takes any size. A mismatch is one
sentence naming the input, the dimension and both sizes.

Unnamed inputs and outputs are called ``input`` / ``output`` (the first) and ``input_N`` / ``output_N``.
Batch size: the size of the fed input along its ``batch_axis``.
"""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from mlms_nb.errors import MlmsError
from mlms_nb.manifest import InputSpec, Manifest

Feed = dict[str, np.ndarray]


class FeedError(MlmsError):
    """A call's inputs do not fit the manifest (a missing or unknown input, or a shape against its dimensions)."""


def input_names(manifest: Manifest) -> list[str]:
    """Each input's name, in manifest order (``input``, ``input_1`` ... for unnamed ones)."""
    return [spec.name or ("input" if i == 0 else f"input_{i}") for i, spec in enumerate(manifest.inputs)]


def output_names(manifest: Manifest) -> list[str]:
    """Each output's name, in manifest order (``output``, ``output_1`` ... for unnamed ones)."""
    return [spec.name or ("output" if i == 0 else f"output_{i}") for i, spec in enumerate(manifest.outputs)]


def fed_name(manifest: Manifest) -> str:
    """The name of the input the dataset feeds."""
    return input_names(manifest)[manifest.fed_index or 0]


def is_plain(manifest: Manifest) -> bool:
    """One input, batched on axis 0, every size static: a numpy batch is the whole feed, with nothing to check."""
    spec = manifest.inputs[0]
    return len(manifest.inputs) == 1 and spec.batch_axis == 0 and not spec.dynamic and spec.type != "constant"


def batch_of(spec: InputSpec, array: np.ndarray) -> int:
    """How many inputs ``array`` holds along the spec's batch axis (1 when it has none)."""
    if spec.batch_axis is None:
        return 1
    return int(np.shape(array)[spec.batch_axis]) if np.ndim(array) > spec.batch_axis else 1


def with_batch(spec: InputSpec, shape: list[int], batch: int) -> tuple[int, ...]:
    """The full shape of ``batch`` inputs of ``shape`` (no batch) on the spec's batch axis."""
    if spec.batch_axis is None:
        return tuple(shape)
    return tuple(shape[:spec.batch_axis]) + (batch,) + tuple(shape[spec.batch_axis:])


def moved_axes(manifest: Manifest) -> dict[str, int]:
    """The inputs a dataset may give (every one but the constants) whose batch axis is not the first: name -> axis.
    Datasets stack inputs on axis 0; `to_model_layout` moves each of these to its own axis before a call."""
    return {name: spec.batch_axis for name, spec in zip(input_names(manifest), manifest.inputs)
            if spec.batch_axis not in (None, 0) and spec.type != "constant"}


def to_model_layout(batch: Any, axes: Mapping[str, int], fed: str) -> Any:
    """``batch`` (an array: the fed input, or a mapping name -> array), stacked on axis 0, with each input named in
    ``axes`` moved to its batch axis (contiguous); the others as they are."""
    if not axes:
        return batch
    if isinstance(batch, Mapping):
        return {k: np.ascontiguousarray(np.moveaxis(v, 0, axes[k])) if k in axes else v for k, v in batch.items()}
    axis = axes.get(fed)
    return batch if axis is None else np.ascontiguousarray(np.moveaxis(batch, 0, axis))


def zeros_state(spec: InputSpec, batch: int) -> np.ndarray:
    """A state input's first value: zeros of its dimensions, ``batch`` of them on its batch axis."""
    return np.zeros(with_batch(spec, [int(d) for d in spec.dimensions], batch), dtype=spec.element_type)


class FeedBuilder:
    """Completes and checks feeds for one manifest (see the module docstring); cheap per call."""

    def __init__(self, manifest: Manifest):
        self.manifest = manifest
        self.names = input_names(manifest)
        self.specs = dict(zip(self.names, manifest.inputs))
        self.fed = fed_name(manifest)
        self.plain = is_plain(manifest)
        self.constants = {name: np.asarray(spec.value, dtype=spec.element_type)
                          for name, spec in self.specs.items() if spec.type == "constant"}
        self.states = {into for into in manifest.state.values()}

    def __call__(self, batch: np.ndarray | Mapping[str, Any]) -> Feed:
        """The complete, checked feed for ``batch``: an array (the fed input) or a mapping name -> array."""
        if not isinstance(batch, Mapping):
            feed = {self.fed: np.asarray(batch)}
        else:
            feed = {str(k): np.asarray(v) for k, v in batch.items()}
            unknown = [k for k in feed if k not in self.specs]
            if unknown:
                raise FeedError(f"{self.manifest.key}: {', '.join(map(repr, unknown))} is not an input of this model; "
                                f"its inputs are {', '.join(self.names)}")
        if self.plain:
            return feed
        if self.fed not in feed:
            raise FeedError(f"{self.manifest.key}: the batch has no {self.fed!r} (the input the dataset feeds); "
                            f"it has {', '.join(feed) or 'nothing'}")
        n = batch_of(self.specs[self.fed], feed[self.fed])
        out: Feed = {}
        for name in self.names:
            spec = self.specs[name]
            if name in feed:
                value = feed[name]
                if value.dtype != spec.element_type:
                    value = value.astype(spec.element_type)
            elif name in self.constants:
                value = self.constants[name]
                if spec.batch_axis is not None:
                    value = np.repeat(np.expand_dims(value, spec.batch_axis), n, axis=spec.batch_axis)
            elif name in self.states:
                value = zeros_state(spec, n)
            else:
                raise FeedError(f"{self.manifest.key}: the batch has no {name!r} and nothing else feeds it (it is not "
                                "a constant or a state input)")
            out[name] = value
        self.check(out)
        return out

    def size(self, batch: Any) -> int:
        """How many inputs ``batch`` (an array, or a mapping holding the fed input) holds."""
        if not isinstance(batch, Mapping):
            return len(batch)
        if self.fed in batch:
            return batch_of(self.specs[self.fed], np.asarray(batch[self.fed]))
        return count(batch)

    def check(self, feed: Feed) -> None:
        """Raise `FeedError` for an input whose shape does not fit its dimensions (symbols agree across inputs)."""
        symbols: dict[str, tuple[int, str]] = {}
        for name, value in feed.items():
            spec = self.specs[name]
            shape = list(np.shape(value))
            if spec.batch_axis is not None:
                if len(shape) <= spec.batch_axis:
                    raise FeedError(f"{self.manifest.key}: input {name!r} has {len(shape)} dimension(s), too few for "
                                    f"a batch on axis {spec.batch_axis}")
                del shape[spec.batch_axis]
            dims = list(spec.dimensions)
            if len(shape) != len(dims):
                raise FeedError(f"{self.manifest.key}: input {name!r} is shaped {shape} without the batch, but its "
                                f"dimensions are {_show(dims)} ({len(dims)} dimensions, not {len(shape)})")
            for axis, (size, want) in enumerate(zip(shape, dims)):
                if isinstance(want, int) and size != want:
                    raise FeedError(f"{self.manifest.key}: input {name!r} dimension {axis} is {size} but the manifest "
                                    f"says {want} (dimensions {_show(dims)}, without the batch)")
                if isinstance(want, str):
                    seen = symbols.setdefault(want, (size, f"{name!r} dimension {axis}"))
                    if seen[0] != size:
                        raise FeedError(f"{self.manifest.key}: input {name!r} dimension {axis} ({want}) is {size} but "
                                        f"{want} is {seen[0]} at {seen[1]}; one call gives one size to {want}")


def _show(dims: list) -> str:
    return "[" + ", ".join("null" if d is None else str(d) for d in dims) + "]"


def named_outputs(manifest: Manifest, results: Any, what: str) -> dict[str, Any]:
    """A model's results (one value, a sequence by position, or a mapping by name) named as ``outputs[]`` says.
    The manifest listing more outputs than the model gives is an error; results beyond the listed ones are kept
    as ``output_N`` (N: their position)."""
    names = output_names(manifest)
    if isinstance(results, Mapping):
        missing = [n for n in names if n not in results]
        if missing and len(names) == 1 and manifest.outputs[0].name is None and results:
            return {names[0]: next(iter(results.values()))}
        if missing:
            raise FeedError(f"{manifest.key}: {what} gives outputs {', '.join(map(str, results))}, not "
                            f"{', '.join(missing)}; name outputs[] after them")
        return {**{n: results[n] for n in names}, **{str(k): v for k, v in results.items() if k not in names}}
    if not isinstance(results, (list, tuple)):
        results = [results]
    if len(results) < len(names):
        raise FeedError(f"{manifest.key}: {what} gives {len(results)} output(s) but outputs[] lists {len(names)}; "
                        "list only the outputs the model returns, in its order")
    out = dict(zip(names, results))
    for i in range(len(names), len(results)):
        out[f"output_{i}"] = results[i]
    return out


# ---------------------------------------------------------------- batches of arrays or of feeds

def stack(items: list[Any]) -> Any:
    """Items (arrays, or mappings name -> array) stacked on a new first axis; mappings stack per name."""
    if items and isinstance(items[0], Mapping):
        return {k: np.stack([item[k] for item in items]) for k in items[0]}
    return np.stack(items)


def take(batch: Any, index: Any) -> Any:
    """Rows ``index`` of an array or of every array of a mapping (first axis)."""
    if isinstance(batch, Mapping):
        return {k: np.ascontiguousarray(v[index]) for k, v in batch.items()}
    return np.ascontiguousarray(batch[index])


def concat(batches: list[Any]) -> Any:
    """Batches (arrays or mappings) joined on the first axis."""
    if batches and isinstance(batches[0], Mapping):
        return {k: np.concatenate([b[k] for b in batches]) for k in batches[0]}
    return np.concatenate(batches)


def count(batch: Any) -> int:
    """How many inputs a batch (array or mapping) holds on its first axis."""
    if isinstance(batch, Mapping):
        return len(next(iter(batch.values())))
    return len(batch)
