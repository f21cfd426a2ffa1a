"""What the runner checks before it loads anything, so a run that cannot succeed fails in a second, not minutes:
the input batch of every batch size must fit in the memory there is, and a per-call timeout without a worker
process needs predictors that can cancel a call (ONNX Runtime)."""
from __future__ import annotations

import math

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
