"""What the runner checks before it measures, so a run that cannot succeed (or would measure the wrong thing) fails
in a second, not minutes. Before loading: the input batch of every batch size must fit in the memory there is, a
per-call timeout without a worker process needs predictors that can cancel a call (ONNX Runtime), and a manifest's
labels file must exist and have one line per class (any dataset, synthetic included). After the first call: a model
that keeps hidden state between calls (:func:`check_hidden_state`) runs only with its declared reset
(``model.reset``), else it is refused.

And what the full pass checks on every batch (:class:`NonFinite`): inputs and outputs holding NaN or Inf, counted
per input with the first one's id, with numpy over whole batches (no Python loop per input), so those inputs are
reported and kept out of every metric."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import numpy as np

from mlms_nb.data.feeds import output_names
from mlms_nb.errors import MlmsError
from mlms_nb.manifest import Manifest
from mlms_nb.options import EvaluateOptions, spell, spell_on

_ITEM_BYTES = {"float32": 4, "float16": 2, "float64": 8, "uint8": 1, "int8": 1, "int32": 4, "int64": 8, "bool": 1}


class ResourceError(MlmsError):
    """An evaluation that asks for more than this machine (or its limits) can give; refused before loading."""


def check_before_loading(manifests: list[Manifest], options: EvaluateOptions, launcher: str) -> None:
    if launcher != "dask":  # an agent's memory is not this machine's
        check_batch_memory(manifests, options)
    check_python_dataset(manifests, options, launcher)
    check_generation(manifests, options)
    if launcher != "dask":  # an agent resolves the manifest's assets itself
        check_labels_file(manifests)
    if options.isolation.call_timeout_s is not None and launcher in ("inline", "dask"):
        check_cancellable(manifests, options, on_agent=launcher == "dask")


def batch_bytes(manifest: Manifest, batch_size: int) -> int:
    """Bytes of one input batch of ``batch_size``: every input (dimensions exclude the batch; an input without a
    batch axis counts once), a dynamic dimension counted as 1 (a lower bound)."""
    total = 0
    for spec in manifest.inputs:
        elements = math.prod(d if isinstance(d, int) else 1 for d in spec.dimensions or ())
        total += (batch_size if spec.batch_axis is not None else 1) * elements * _ITEM_BYTES.get(spec.element_type, 4)
    return total


def available_bytes(options: EvaluateOptions) -> int:
    """Memory the work may use: what the system has available, within the worker's limit when isolated."""
    import psutil

    free = int(psutil.virtual_memory().available)
    limit = options.isolation.memory_limit_bytes if options.isolation.isolate else None
    return min(free, limit) if limit else free


def check_batch_memory(manifests: list[Manifest], options: EvaluateOptions) -> None:
    """Refuse a batch size whose input batch alone exceeds the memory available (the model needs more still)."""
    biggest = max(options.batch_sizes)
    needed = max(batch_bytes(m, biggest) for m in manifests)
    free = available_bytes(options)
    if needed <= free:
        return
    spec = manifests[0].fed_input
    shape = "x".join(str(d) for d in spec.dimensions)
    raise ResourceError(
        f"{spell('batch_sizes', ','.join(map(str, options.batch_sizes)))}: batch size {biggest} needs at least "
        f"{_gib(needed)} for its input batch alone ({biggest} x {shape} {spec.element_type}), more than the "
        f"{_gib(free)} of memory available{' within the limit' if options.isolation.memory_limit_bytes else ''}: "
        "use smaller batch sizes")


def check_cancellable(manifests: list[Manifest], options: EvaluateOptions, on_agent: bool = False) -> None:
    """A per-call timeout in this process (or an agent's) stops only calls the predictor can cancel."""
    from mlms_nb.frameworks import get_predictor_class

    for manifest in manifests:
        fw = manifest.framework.name
        if not getattr(get_predictor_class(fw), "cancellable", False) and on_agent:
            raise MlmsError(f"{spell('call_timeout_s', options.isolation.call_timeout_s)} cannot stop a {fw} call on "
                            "an agent (only ONNX Runtime can cancel one): leave the timeout out, or run it here with "
                            f"{spell_on('isolate')}")
        if not getattr(get_predictor_class(fw), "cancellable", False):
            raise MlmsError(
                f"{spell('call_timeout_s', options.isolation.call_timeout_s)} cannot stop a {fw} call inside this "
                f"process (only ONNX Runtime can cancel one): add {spell_on('isolate')} to run each framework in a "
                "worker process that the timeout can stop")


def check_python_dataset(manifests: list[Manifest], options: EvaluateOptions, launcher: str) -> None:
    """An iterator (a generator) can be read once, in this process: refuse it for several frameworks or a worker."""
    data = options.dataset
    if data is None or isinstance(data, str) or callable(data) or not hasattr(data, "__iter__"):
        return
    if hasattr(data, "chunks"):  # a Dataset object
        return
    if iter(data) is data:
        if len(manifests) > 1:
            raise MlmsError(f"the dataset is an iterator, which can be read once, but {len(manifests)} frameworks "
                            "each read it: pass a list, or a function returning a new iterator")
        if launcher != "inline":
            raise MlmsError(f"the dataset is an iterator, which cannot be sent to a worker process "
                            f"({spell_on('isolate')}): pass a list, or save it as a .npz file")


def check_labels_file(manifests: list[Manifest]) -> None:
    """Refuse a manifest whose ``outputs[0].labels`` cannot be read, or whose line count differs from
    ``outputs[0].classes``, before any model loads (whatever the dataset: a synthetic run would otherwise never
    notice, and a folder dataset would fall back to numeric folder names)."""
    from mlms_nb.data.labels import load_labels
    from mlms_nb.errors import ManifestError

    for manifest in manifests:
        if manifest.outputs[0].labels:
            try:
                load_labels(manifest)
            except MlmsError as err:
                where = manifest.source or manifest.key
                raise ManifestError(f"{where}: outputs[0].labels: {err}") from None


class NonFinite:
    """Inputs whose data or outputs hold NaN or Inf, found batch by batch (numpy on whole arrays): how many, and
    the id of the first; ``mask`` says which rows of a batch are finite (the only ones scored)."""

    def __init__(self) -> None:
        self.inputs = 0
        self.outputs = 0
        self.first_input: str | None = None
        self.first_output: str | None = None
        self.seen = 0

    def check(self, ids: list[str], data, outputs) -> np.ndarray | None:
        """The finite rows of this batch (a boolean per input), or None when every row is finite."""
        n = len(ids)
        self.seen += n
        bad_in, bad_out = bad_rows(data, n), bad_rows(outputs, n)
        if bad_in is None and bad_out is None:
            return None
        if bad_in is not None:
            self.inputs += int(bad_in.sum())
            self.first_input = self.first_input or ids[int(np.argmax(bad_in))]
        if bad_out is not None:
            self.outputs += int(bad_out.sum())
            self.first_output = self.first_output or ids[int(np.argmax(bad_out))]
        bad = bad_in if bad_out is None else bad_out if bad_in is None else bad_in | bad_out
        return ~bad

    def sentences(self, fw: str) -> list[str]:
        """What was found, one sentence per side (inputs, outputs); empty when everything was finite."""
        out = []
        for side, count, first in (("data", self.inputs, self.first_input),
                                   ("outputs", self.outputs, self.first_output)):
            if count:
                some = f"all {count:,}" if count == self.seen else f"{count:,} of {self.seen:,}"
                out.append(f"{fw}: {some} inputs held NaN or Inf in their {side} (first: {first}); they are left "
                           "out of accuracy, output agreement and target metrics")
        return out


_DOT_TYPES = (np.float32, np.float64)


def bad_rows(data, n: int) -> np.ndarray | None:
    """Rows (axis 0, ``n`` of them) of an array, or of any array in a mapping, holding NaN or Inf; None when none
    does. Integer arrays are finite by construction; an array whose first axis is not the batch counts for all."""
    arrays = data.values() if isinstance(data, dict) else (data,)
    bad = None
    for array in arrays:
        if not isinstance(array, np.ndarray):
            array = np.asarray(array) if hasattr(array, "__array__") else None
        if array is None or array.dtype.kind not in "fc" or not array.size:
            continue
        if array.dtype.type in _DOT_TYPES and array.flags.c_contiguous:
            # the sum of squares (BLAS, no temporary, no floating-point warnings) is NaN or Inf whenever an element
            # is: finite, every element is (about 3x faster than isfinite + all); else (or an overflow) look closer
            flat = array.reshape(-1)
            if math.isfinite(np.vdot(flat, flat)):
                continue
        finite = np.isfinite(array)  # one pass, vectorised (faster than a sum, which would also need errstate)
        if finite.all():
            continue
        rows = (~finite.reshape(n, -1)).any(axis=1) if array.ndim and array.shape[0] == n else np.ones(n, bool)
        bad = rows if bad is None else bad | rows
    return bad if bad is not None and bad.any() else None


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"


def check_generation(manifests: list[Manifest], options: EvaluateOptions) -> None:
    """The generate scenarios measure causal language models (``task: text-generation``) only."""
    if not options.scenario.startswith("generate"):
        return
    for manifest in manifests:
        if manifest.task != "text-generation":
            raise MlmsError(f"{spell('scenario', options.scenario)} measures a causal language model, but manifest "
                            f"{manifest.key} has no task: text-generation (docs/language-models.md)")


STATE_RTOL = 1e-4
"""Float noise between two calls on one input: a difference within ``STATE_ATOL + STATE_RTOL * max|output|``."""
STATE_ATOL = 1e-6


@dataclass(frozen=True)
class StateCheck:
    """What the hidden-state check saw: ``carries_state`` (two calls on one input differed beyond float noise),
    ``summary`` (the cold start's ``state_check`` column: what was seen, what it cost) and ``note`` (the sentence
    the evaluation's warnings carry for a model that carries state; "" otherwise)."""
    carries_state: bool
    summary: str
    note: str = ""


def check_hidden_state(manifest: Manifest, predict: Callable, reset: Callable | None, batch: Any,
                       first: Any) -> StateCheck:
    """Does the model keep state between calls? ``first`` is what ``predict(batch)`` gave on the model's first
    call (the cold start); one more call on ``batch`` must give the same outputs within float noise. A model
    whose calls differ runs only with a declared ``model.reset`` (``reset``) that makes a call after it repeat the
    first one: else it is refused with a sentence naming the two ways out. Costs one extra call (two when the
    model carries state and declares its reset). Not for models whose state is explicit (``state:``)."""
    fw, name = manifest.framework.name, manifest.model.reset
    gap = _largest_gap(first, predict(batch), output_names(manifest)[0])
    tolerance = f"float noise: {STATE_ATOL:g} + {STATE_RTOL:g} x the output's max |value|"
    if gap is None:
        summary = "none seen (1 extra call)"
        if name:
            summary += f", model.reset {name!r} called before every item and timed loop all the same"
        return StateCheck(False, summary)
    output, diff = gap
    seen = (f"two calls on the same input gave outputs that differ by up to {diff:.3g} (output {output!r}, "
            f"beyond {tolerance})")
    if reset is None:
        ways = ("declare the method that clears the state (model.reset: reset_states in the manifest) or describe "
                "the state as explicit state: inputs and outputs") if fw == "torch" else (
                "describe the state as explicit state: inputs and outputs (model.reset, a method that clears it, is "
                "for torch models)")
        raise MlmsError(f"{fw}: {manifest.key} carries state between calls (or is random): {seen}, so its numbers "
                        f"would depend on the calls before them; {ways}")
    reset()
    again = _largest_gap(first, predict(batch), output_names(manifest)[0])
    if again is not None:
        raise MlmsError(
            f"{fw}: {manifest.key} carries state between calls: {seen}, and calling model.reset {name!r} before a "
            f"call does not make it repeat the first one (output {again[0]!r} still differs by up to "
            f"{again[1]:.3g}): declare a method that clears all of the state, or describe the state as explicit "
            "state: inputs and outputs")
    return StateCheck(True, f"carried, cleared by model.reset {name!r} (2 extra calls)",
                      f"{fw}: the model carries hidden state: {seen}; after model.reset {name!r} a call repeats the "
                      "first one, so it is called before every item of the full pass (one item per call) and before "
                      "every timed loop")


def _outputs(value: Any, name: str) -> dict[str, np.ndarray]:
    return {str(k): np.asarray(v) for k, v in value.items()} if isinstance(value, Mapping) else {name: np.asarray(value)}


def _largest_gap(first: Any, second: Any, name: str) -> tuple[str, float] | None:
    """The output that differs most between two calls' results and by how much (its max |difference|), or None
    when every output is the same within float noise (NaN in the same places counts as the same). ``name``: the
    first output's, for a call that returned it alone."""
    a, b = _outputs(first, name), _outputs(second, name)
    worst: tuple[str, float] | None = None
    for key in a.keys() | b.keys():
        x, y = a.get(key), b.get(key)
        if x is None or y is None or x.shape != y.shape:
            return key, float("inf")
        if x.dtype.kind not in "biufc" or y.dtype.kind not in "biufc":
            if not np.array_equal(x, y):
                return key, float("inf")
            continue
        x, y = x.astype(np.float64), y.astype(np.float64)
        both_nan = np.isnan(x) & np.isnan(y)
        diff = np.where(both_nan, 0.0, np.abs(x - y))
        diff = np.where(np.isnan(diff), np.inf, diff)
        finite = np.abs(x[np.isfinite(x)])
        scale = float(finite.max()) if finite.size else 0.0
        largest = float(diff.max()) if diff.size else 0.0
        if largest > STATE_ATOL + STATE_RTOL * scale and (worst is None or largest > worst[1]):
            worst = (key, largest)
    return worst
