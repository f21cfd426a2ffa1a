"""Live models from a notebook, and the trust a manifest needs before anything of it runs.

:func:`manifest_for` describes a model object (a ``torch.nn.Module`` or a ``keras.Model``) by a `Manifest`
holding it (``model.instance``; never saved to YAML), with its inputs described in Python (an `InputSpec`, a dict
of its fields) or by an example batch (N first). :func:`check_trust` refuses, before any data is read or any model
loaded, a manifest whose entrypoint, code steps or model file needs trust that was not given.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any, Iterable

from mlms_nb.data.assets import resolve_asset
from mlms_nb.errors import AssetError, ManifestError
from mlms_nb.frameworks.modelfiles import KINDS, file_kind
from mlms_nb.manifest import InputSpec, Manifest, OutputSpec, parse_manifest
from mlms_nb.trust import require_trust

_ELEMENT_TYPES = {"float32", "float16", "uint8", "int32", "int64"}


def framework_of(obj: Any) -> str:
    """``torch`` for an ``nn.Module``, ``tensorflow`` for a ``keras.Model``; a `ManifestError` otherwise."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(obj, torch.nn.Module):
        return "torch"
    keras = sys.modules.get("keras")
    if keras is not None and isinstance(obj, keras.Model):
        return "tensorflow"
    raise ManifestError(f"cannot evaluate a {type(obj).__name__}: pass a model name, a manifest (path or "
                        "mlms_nb.Manifest), a torch.nn.Module or a keras.Model")


def _input(inputs: Any) -> dict[str, Any]:
    """An input description from an `InputSpec`, a dict of its fields, or an example batch (N first)."""
    if isinstance(inputs, InputSpec):
        return inputs.model_dump(mode="json", exclude_none=True)
    if isinstance(inputs, dict):
        return dict(inputs)
    shape = getattr(inputs, "shape", None)
    if shape is None:
        raise ManifestError("inputs: describe the model's input by an example batch (a tensor or array, N first), "
                            "an mlms_nb.InputSpec, or a dict such as {'type': 'image', 'dimensions': [3, 224, 224]}")
    dims = [int(d) for d in tuple(shape)[1:]]
    if not dims:
        raise ManifestError(f"inputs: an example batch has the batch first, then the input's dimensions; got shape "
                            f"{tuple(shape)}")
    dtype = str(getattr(inputs, "dtype", "float32")).replace("torch.", "").split("'")[-1].split(".")[-1]
    return {"type": "tensor", "dimensions": dims, "element_type": dtype if dtype in _ELEMENT_TYPES else "float32"}


def example_batch_size(inputs: Any) -> int | None:
    """The batch size of ``inputs`` when it is an example batch (a tensor or array, N first): the batch a user
    passes is the batch timed unless ``batch_sizes`` says otherwise; None for an `InputSpec`, a dict or a list of
    them (they describe one input, not a batch)."""
    shape = None if isinstance(inputs, (InputSpec, dict, list, tuple)) else getattr(inputs, "shape", None)
    return int(shape[0]) if shape is not None and len(tuple(shape)) >= 2 and int(shape[0]) > 0 else None


def _name(obj: Any) -> str:
    name = re.sub(r"[^a-z0-9_.-]+", "_", type(obj).__name__.lower()).strip("_.-") or "model"
    return name[:120]


def manifest_for(obj: Any, inputs: Any = None, outputs: Any = None, preprocess: Iterable | None = None,
                 postprocess: Iterable | None = None, name: str | None = None, version: str = "1.0.0") -> Manifest:
    """A `Manifest` for the live model ``obj`` (see the module docstring). ``inputs``: one description, or a list of
    them (`InputSpec` or dicts, each named) for a model of several inputs; ``outputs``: an `OutputSpec`, a dict or a
    list of them (default: a classification output for image inputs, a tensor otherwise)."""
    framework = framework_of(obj)
    if inputs is None:
        raise ManifestError(f"evaluating a live {type(obj).__name__} needs inputs=: an example batch (N first), an "
                            "mlms_nb.InputSpec, or a dict such as {'type': 'image', 'dimensions': [3, 224, 224]}")
    several = isinstance(inputs, (list, tuple)) and bool(inputs) and all(isinstance(i, (dict, InputSpec)) for i in inputs)
    specs = [_input(i) for i in inputs] if several else [_input(inputs)]  # several: one description per input
    spec = specs[0]
    if outputs is None:
        outputs = [{"type": "classification" if spec.get("type", "image") == "image" else "tensor"}]
    elif not isinstance(outputs, list):
        outputs = [outputs]
    outputs = [o.model_dump(mode="json", exclude_none=True) if isinstance(o, OutputSpec) else o for o in outputs]
    data = {"name": name or _name(obj), "version": version, "framework": {"name": framework},
            "inputs": specs, "outputs": outputs, "preprocess": list(preprocess or []),
            "postprocess": list(postprocess or []), "model": {"instance": obj}}
    return parse_manifest(data, source=None)


def check_trust(manifest: Manifest, trust: bool) -> None:
    """Refuse (`UntrustedError`) an entrypoint, code steps, or a TorchScript / .pt2 / SavedModel file that this run
    does not trust, before anything runs. Keras files are checked when loaded (their safe mode tells)."""
    what = f"manifest {manifest.key}"
    if manifest.model.entrypoint:
        require_trust(manifest.source, "entrypoint", trust, f"{what} (entrypoint {manifest.model.entrypoint})")
    if manifest.has_code:
        require_trust(manifest.source, "code", trust, f"{what} (code steps)")
    uri = manifest.model.graph_path
    if uri and not trust and ("://" not in uri or uri.startswith("file://")):  # local files; others at load
        base = Path(manifest.source).parent if manifest.source else None
        try:
            path = resolve_asset(uri, manifest.model.sha256.get("graph_path"), base)
        except AssetError:
            return  # the predictor says what is wrong with it
        kind = file_kind(path)
        # a file of another framework is the loader's to refuse (with the fix), not a trust question
        if kind in ("torchscript", "torch.export", "savedmodel") and KINDS[kind][1] == manifest.framework.name:
            require_trust(path, kind, trust)
