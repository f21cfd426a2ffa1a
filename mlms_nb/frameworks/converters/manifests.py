"""The manifest of a converted copy: the source manifest with another framework and the copy as its graph.

``converted_manifest(manifest, "tensorflow", path)`` keeps the name, version, inputs, outputs, pre- and
post-processing; sets ``framework`` (any version), ``model.graph_path`` (the file) with its sha256, and drops the
source's ``architecture``, ``weights_path`` and other framework-only fields (``entrypoint`` and the like: the
copy is a data file, it runs no code); ``source`` stays the source manifest's file, so relative paths (labels) resolve
as in the source. The copies :func:`~mlms_nb.frameworks.converters.to_tensorflow` writes take
NHWC images, so an image input's layout and dimensions are made NHWC and a ``to_layout`` step is set to match.

``copy_of_module(manifest, module, framework)`` converts an eager PyTorch module with the kept converters (cached by
checksum) and returns that manifest; ``converted_copies(manifest, frameworks, trust)`` opens a PyTorch manifest
(entrypoint, architecture or live object) to do so for each framework it lacks: how ``evaluate`` runs one PyTorch
manifest in ONNX Runtime and TensorFlow too.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable

import numpy as np

from mlms_nb._fs import sha256_file
from mlms_nb.errors import MlmsError
from mlms_nb.manifest import Manifest, parse_manifest

CONVERTIBLE = ("onnxruntime", "tensorflow")

_MODEL_KEYS = ("graph_path", "sha256", "weights")


def converted_manifest(manifest: Manifest, framework: str, path: str | Path) -> Manifest:
    """``manifest`` as it describes the copy at ``path`` run by ``framework`` (see the module docstring)."""
    data = manifest.to_dict()
    data.pop("source", None)
    data["framework"] = {"name": framework}
    model = {k: v for k, v in data.get("model", {}).items() if k in _MODEL_KEYS}
    model.update(graph_path=str(Path(path).resolve()), sha256={"graph_path": sha256_file(path, memo=False)},
                 weights="pretrained")
    data["model"] = model
    if framework == "tensorflow":
        for spec in data.get("inputs", []):
            if spec.get("layout", "NCHW") == "NCHW" and len(spec.get("dimensions") or []) == 3:
                c, h, w = spec["dimensions"]
                spec.update(layout="NHWC", dimensions=[h, w, c])
        steps = [s for s in data.get("preprocess", []) if "to_layout" not in s]
        if any(s.get("layout") == "NHWC" for s in data.get("inputs", [])) and steps:
            steps.append({"to_layout": {"layout": "NHWC"}})
        data["preprocess"] = steps
    # the copy keeps its source's file: relative paths (labels, code steps) read from the same folder, and trust
    # in that manifest covers the copy's code steps
    return parse_manifest(data, source=manifest.source)


EXAMPLE_ROWS, EXAMPLE_LENGTH = 2, 8  # a batch of 2 and 8 positions on a dynamic axis: neither is specialised away
EXAMPLE_PIXELS = 64  # a dynamic image height or width: enough for a few stride-2 stages


def example_batch(manifest: Manifest) -> tuple[np.ndarray, list[int]]:
    """(a random batch of ``manifest``'s first input to export with, that input's dynamic axes besides the batch):
    2 rows, and ``EXAMPLE_LENGTH`` positions (``EXAMPLE_PIXELS`` for an image) wherever ``dimensions`` holds null or
    a symbol."""
    fed = [i for i in manifest.inputs if i.type != "constant"]
    if len(manifest.inputs) != 1:
        names = ", ".join(i.name or f"inputs[{n}]" for n, i in enumerate(manifest.inputs))
        raise MlmsError(f"{manifest.key}: the kept converters export a model of one input; this one has "
                        f"{len(manifest.inputs)} ({names}{', constants included' if len(fed) < len(manifest.inputs) else ''}): "
                        "export it yourself and give that framework's manifest (docs/byom.md)")
    spec = manifest.inputs[0]
    if not spec.dimensions or spec.batch_axis != 0:
        raise MlmsError(f"{manifest.key}: converting needs inputs[0].dimensions and the batch on axis 0 "
                        f"(batch_axis {spec.batch_axis})")
    size = EXAMPLE_PIXELS if spec.type == "image" else EXAMPLE_LENGTH
    shape = [d if isinstance(d, int) else size for d in spec.dimensions]
    dynamic = [axis + 1 for axis, d in enumerate(spec.dimensions) if not isinstance(d, int)]
    rng = np.random.default_rng(0)
    dtype = np.dtype(spec.element_type)
    if dtype.kind == "f":
        example = rng.standard_normal((EXAMPLE_ROWS, *shape)).astype(dtype)
    else:  # token ids, masks, flags: 0 and 1 are valid for any embedding table
        example = rng.integers(0, 2, (EXAMPLE_ROWS, *shape)).astype(dtype)
    return example, dynamic


def copy_of_module(manifest: Manifest, module: Any, framework: str, onnx_path: Path | None = None) -> Manifest:
    """The manifest of the ``framework`` (onnxruntime or tensorflow) copy of ``module``, the eager PyTorch model
    ``manifest`` describes: exported to ONNX (and ported to Keras) with the kept converters, cached by checksum;
    every dynamic axis of the manifest's input stays dynamic. ``onnx_path``: the ONNX copy already made."""
    from mlms_nb.frameworks.converters import to_onnx, to_tensorflow

    if not hasattr(module, "named_modules"):
        raise MlmsError(f"{manifest.key}: no {framework} manifest, and no eager PyTorch module to convert one from: "
                        "give that framework's manifest (docs/byom.md)")
    if onnx_path is None:
        example, dynamic = example_batch(manifest)
        onnx_path = to_onnx(module, example, label=manifest.name, dynamic_axes=[dynamic])
    path = to_tensorflow(onnx_path, label=manifest.name) if framework == "tensorflow" else onnx_path
    return converted_manifest(manifest, framework, path)


def converted_copies(manifest: Manifest, frameworks: Iterable[str], trust: bool = False,
                     failures: dict[str, str] | None = None) -> dict[str, Manifest]:
    """``{framework: manifest of its converted copy}`` for each of ``frameworks`` (onnxruntime, tensorflow) of the
    PyTorch ``manifest``, which is opened (with ``trust`` for an entrypoint) to get its module; others are refused
    with a sentence. With ``failures`` (a dict), a framework whose conversion fails is left out and its sentence is
    put there instead of raised: one framework's conversion never costs the others (TensorFlow's copy is made from
    the ONNX one, so it fails with it)."""
    wanted = [fw for fw in frameworks if fw != manifest.framework.name]
    if not wanted:
        return {}
    refused = [fw for fw in wanted if fw not in CONVERTIBLE]
    if manifest.framework.name != "torch" or refused:
        asked = ", ".join(refused or wanted)
        raise MlmsError(f"{manifest.source or manifest.key} is a manifest for {manifest.framework.name}; mlms-nb converts "
                        f"PyTorch manifests to {' and '.join(CONVERTIBLE)}, not this one to {asked}: give that "
                        "framework's manifest (one file per framework), or the model's name")
    from mlms_nb.frameworks.base import PredictorOptions, open_predictor

    predictor = open_predictor(manifest, options=PredictorOptions(trust=trust))
    copies: dict[str, Manifest] = {}
    onnx_path: Path | None = None
    try:
        for fw in wanted:
            try:
                if onnx_path is None:
                    onnx_path = Path(copy_of_module(manifest, predictor.native_model, "onnxruntime").model.graph_path)
                copies[fw] = copy_of_module(manifest, predictor.native_model, fw, onnx_path)
            except Exception as err:  # noqa: BLE001 - with failures, the framework's outcome, not the evaluation's end
                if failures is None:
                    raise
                text = str(err) if isinstance(err, MlmsError) else f"{type(err).__name__}: {' '.join(str(err).split())}"
                failures[fw] = f"not converted from the PyTorch model: {text}"
                if onnx_path is None:  # every later framework's copy starts from the ONNX one
                    failures.update({later: failures[fw] for later in wanted[wanted.index(fw) + 1:]})
                    break
        return copies
    finally:
        predictor.close()
