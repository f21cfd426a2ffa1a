"""Conversions of a model's PyTorch weights to ONNX (for ONNX Runtime) and to Keras (for TensorFlow).

Each conversion is built once, offline, into ``artifacts_dir()/NAME/VERSION/FRAMEWORK/`` (NAME and VERSION
from the model's PyTorch manifest) as ``model.onnx`` or ``model.keras``, next to an ``artifact.json`` that
records the artifact's sha256, the source weights' sha256, the library versions and ``created_at``.
A cached artifact is reused while its sha256 matches ``artifact.json`` and its source weights are unchanged;
otherwise it is rebuilt (and the reason logged). Files are written under a temporary name, then moved in
place with ``os.replace``; an advisory lock (POSIX) keeps two processes from building the same one twice.

ONNX: ``torch.onnx.export`` (TorchScript exporter, opset 17), input ``input`` (NCHW) and output ``logits``,
batch axis dynamic; node names keep the module scopes (see :func:`onnx_node_to_torch_name`).
Keras: :func:`mlms_nb.zoo.registry.build_keras_model`, standard layers only, so ``keras.models.load_model``
needs no custom objects; layers are named after the PyTorch modules (see ``keras_layer_to_torch_name``).
"""
from __future__ import annotations

import datetime as _dt
import json
import logging
import os
import tempfile
import time
import urllib.parse
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

from mlms_nb._fs import folder_lock, owned, sha256_file
from mlms_nb.data.assets import resolve_asset
from mlms_nb.errors import AssetError, PredictorError
from mlms_nb.manifest import Manifest, canonical_framework, find_manifest
from mlms_nb.paths import artifacts_dir
from mlms_nb.naming import keras_layer_to_torch_name, onnx_node_to_torch_name
from mlms_nb.zoo.registry import build_keras_model, build_torch_model, get_architecture

__all__ = ["Artifact", "ARTIFACT_FILES", "OPSET", "convert", "build_artifact", "built_ns", "fold_constants", "resolve_artifact_uri", "compare_with_torch",
           "onnx_node_to_torch_name", "keras_layer_to_torch_name"]

log = logging.getLogger(__name__)

ARTIFACT_FILES = {"onnxruntime": "model.onnx", "tensorflow": "model.keras"}
OPSET = 17
INPUT_NAME, OUTPUT_NAME = "input", "logits"


@dataclass(frozen=True)
class Artifact:
    """A built conversion: the file, its sha256, the framework it is for, the model's name and version."""
    path: Path
    sha256: str
    framework: str
    name: str
    version: str


# ----------------------------------------------------------------------------- helpers

def _framework(to: str) -> str:
    fw = canonical_framework(to)
    if fw not in ARTIFACT_FILES:
        raise PredictorError(f"cannot convert to {to!r}; expected one of {', '.join(ARTIFACT_FILES)}")
    return fw


def _torch_manifest(manifest_or_name: Manifest | str) -> Manifest:
    """The PyTorch manifest conversions start from (a manifest of another framework is swapped for it)."""
    m = manifest_or_name if isinstance(manifest_or_name, Manifest) else find_manifest(manifest_or_name, framework="torch")
    if m.framework.name != "torch":
        m = find_manifest(m.name, framework="torch")
    if not m.model.architecture:
        raise PredictorError(f"manifest {m.key}: conversion needs model.architecture (a built-in architecture)")
    get_architecture(m.model.architecture)  # unknown names fail here, with the list of known ones
    return m


def _source_weights(m: Manifest) -> tuple[str | None, str | None]:
    """(local weights file, its sha256) for a pretrained manifest; (None, None) for random weights."""
    if m.model.weights != "pretrained":
        return None, None
    if not m.model.weights_path:
        raise PredictorError(f"manifest {m.key}: pretrained weights need model.weights_path")
    declared = m.model.sha256.get("weights_path")
    base = Path(m.source).parent if m.source else None
    path = resolve_asset(m.model.weights_path, sha256=declared, base_dir=base)
    return str(path), declared or sha256_file(path, memo=False)


def _versions(fw: str) -> dict[str, str]:
    import torch

    versions = {"torch": torch.__version__}
    if fw == "onnxruntime":
        import onnx

        versions.update(onnx=onnx.__version__, opset=str(OPSET))
    else:
        import keras
        import tensorflow as tf

        versions.update(tensorflow=tf.__version__, keras=keras.__version__)
    return versions


def _temp_path(folder: Path, suffix: str) -> Path:
    fd, name = tempfile.mkstemp(dir=folder, prefix=owned(".tmp-"), suffix=suffix)
    os.close(fd)
    return Path(name)


def _write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = _temp_path(path.parent, ".json")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    tmp.chmod(0o644)
    os.replace(tmp, path)


def _cached(folder: Path, target: Path, label: str, **built_from: Any) -> str | None:
    """The artifact's sha256 when the cached one is whole and current -- its ``artifact.json`` records the
    file's sha256 and, for each ``built_from`` key, the same value (what it was built from); None (reason
    logged) otherwise."""
    meta_path = folder / "artifact.json"
    if not target.is_file() or not meta_path.is_file():
        return None
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        log.warning("%s: unreadable %s; rebuilding", label, meta_path)
        return None
    digest = sha256_file(target, memo=False)
    if digest != meta.get("sha256"):
        log.warning("%s: %s has sha256 %s but artifact.json says %s; rebuilding", label, target, digest, meta.get("sha256"))
        return None
    for key, value in built_from.items():
        if meta.get(key) != value:
            log.info("%s: %s changed since %s was built; rebuilding", label, key, target)
            return None
    return digest


_built = [0]  # ns this process spent building artifacts (see built_ns)


def built_ns() -> int:
    """Nanoseconds this process has spent building artifacts so far (cache hits cost nothing): read before and after
    a step, the difference is its one-time conversions, which a run reports apart from its cold start."""
    return _built[0]


def build_artifact(folder: Path, target: Path, label: str, build: Callable[[Path], dict | None], meta: dict,
                   force: bool = False, **built_from: Any) -> str:
    """The sha256 of ``target``, building it first unless a whole, current copy is cached.

    Under the folder's lock: reuse the cached file when its ``artifact.json`` records its sha256 and the same
    ``built_from`` values; otherwise ``build(tmp_path)`` writes the file (returning extra metadata or None), which
    then replaces ``target`` atomically, and ``artifact.json`` records ``meta``, ``built_from``, the extra
    metadata, the sha256, the build time and when."""
    with folder_lock(folder):
        digest = None if force else _cached(folder, target, label, **built_from)
        if digest is not None:
            return digest
        log.info("building %s (one-time): %s", label, target)
        started = time.perf_counter()
        tmp = _temp_path(folder, target.suffix)
        try:
            extra = build(tmp) or {}
            digest = sha256_file(tmp, memo=False)
            tmp.chmod(0o644)  # mkstemp makes it private; artifacts are shared like the cache
            os.replace(tmp, target)
        finally:
            tmp.unlink(missing_ok=True)
            _built[0] += int((time.perf_counter() - started) * 1e9)
        seconds = time.perf_counter() - started
        _write_json(folder / "artifact.json", {
            **meta, **built_from, **extra, "file": target.name, "sha256": digest,
            "build_seconds": round(seconds, 3),
            "created_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        })
        log.info("built %s in %.1f s (sha256 %s)", label, seconds, digest)
        return digest


# ----------------------------------------------------------------------------- the two exporters

def _export_onnx(arch: str, weights: str | None, out: Path) -> None:
    import onnx
    import torch

    model = build_torch_model(arch, weights)
    spec = get_architecture(arch)
    example = torch.zeros(1, *spec.example_shape, dtype=getattr(torch, spec.input_dtype))
    with torch.no_grad(), warnings.catch_warnings():
        # The pads of ZeroPad2d are computed with Slice(step=-1), which the exporter cannot fold; we do.
        warnings.filterwarnings("ignore", message="Constant folding - Only steps=1", category=UserWarning)
        warnings.filterwarnings("ignore", category=DeprecationWarning)  # dynamo=False is deliberate: scoped node names
        torch.onnx.export(model, (example,), str(out), dynamo=False, opset_version=OPSET,
                          input_names=[INPUT_NAME], output_names=[OUTPUT_NAME],
                          dynamic_axes={INPUT_NAME: {0: "batch"}, OUTPUT_NAME: {0: "batch"}},
                          do_constant_folding=True)
    fold_constants(out)
    onnx.checker.check_model(str(out), full_check=True)


def fold_constants(path: Path) -> None:
    """Evaluate once every node computed from constants only, turning its outputs into initializers.

    The TorchScript exporter writes each static ``ZeroPad2d`` as ~20 Constant/Slice/Concat/... nodes that
    compute the pads, and repeated initializers as ``Identity`` nodes; folding them leaves one ``Pad`` per
    padding module, so every remaining node is a real layer op with a scoped name.
    """
    import onnx
    from onnx import numpy_helper
    from onnx.reference import ReferenceEvaluator

    model = onnx.load(str(path))
    graph = model.graph
    initializers = {t.name: t for t in graph.initializer}
    folded: dict[str, np.ndarray] = {}

    def value(name: str) -> np.ndarray:
        return folded[name] if name in folded else numpy_helper.to_array(initializers[name])

    kept = []
    subgraphs = (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
    for node in graph.node:
        constant = all(not i or i in initializers or i in folded for i in node.input)
        if (constant and node.domain in ("", "ai.onnx") and not node.op_type.startswith("Random")
                and not any(a.type in subgraphs for a in node.attribute)):
            outputs = ReferenceEvaluator(node).run(None, {i: value(i) for i in node.input if i})
            folded.update({name: np.asarray(out) for name, out in zip(node.output, outputs)})
        else:
            kept.append(node)
    needed = {i for node in kept for i in node.input} | {o.name for o in graph.output}
    new_initializers = [t for t in graph.initializer if t.name in needed and t.name not in folded]
    new_initializers += [numpy_helper.from_array(v, name) for name, v in folded.items() if name in needed]
    produced = {o for node in kept for o in node.output}
    value_info = [v for v in graph.value_info if v.name in produced]
    del graph.node[:], graph.initializer[:], graph.value_info[:]
    graph.node.extend(kept)
    graph.initializer.extend(new_initializers)
    graph.value_info.extend(value_info)
    onnx.save(model, str(path))


def _export_keras(arch: str, weights: str | None, out: Path) -> None:
    build_keras_model(arch, weights).save(str(out))


# ----------------------------------------------------------------------------- public API

def artifact_folder(name: str, version: str, framework: str) -> Path:
    """``artifacts_dir()/NAME/VERSION/FRAMEWORK`` (created)."""
    folder = artifacts_dir() / name / version / framework
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def convert(manifest_or_name: Manifest | str, to: str, force: bool = False) -> Artifact:
    """Build (or reuse) the ``to`` (``onnxruntime`` or ``tensorflow``) artifact of a model's PyTorch weights.

    ``manifest_or_name`` is a model name (its PyTorch manifest is looked up) or a `Manifest`.
    ``force`` rebuilds even a valid cached artifact.
    """
    fw = _framework(to)
    m = _torch_manifest(manifest_or_name)
    arch = m.model.architecture
    weights, source_sha = _source_weights(m)
    folder = artifact_folder(m.name, m.version, fw)
    target = folder / ARTIFACT_FILES[fw]
    label = f"{m.name}@{m.version} -> {fw}"
    meta = {"name": m.name, "version": m.version, "framework": fw, "architecture": arch,
            "source_weights": m.model.weights_path}

    def build(tmp: Path) -> dict:
        (_export_onnx if fw == "onnxruntime" else _export_keras)(arch, weights, tmp)
        return {"versions": _versions(fw)}  # asked only when building: it imports the frameworks (seconds)

    digest = build_artifact(folder, target, label, build, meta, force, source_weights_sha256=source_sha)
    return Artifact(path=target, sha256=digest, framework=fw, name=m.name, version=m.version)


def resolve_artifact_uri(uri: str) -> Path:
    """The file for ``artifact://MODEL_NAME/FRAMEWORK`` (``artifact://efficientnet_lite0/onnxruntime``),
    built on first use."""
    parsed = urllib.parse.urlparse(uri)
    name, fw = parsed.netloc, parsed.path.strip("/")
    if parsed.scheme != "artifact" or not name or not fw or "/" in fw:
        raise AssetError(f"asset {uri}: expected artifact://MODEL_NAME/FRAMEWORK, e.g. artifact://efficientnet_lite0/onnxruntime")
    try:
        return convert(name, to=fw).path
    except PredictorError as err:
        raise AssetError(f"asset {uri}: {err}") from None


def compare_with_torch(name: str | Manifest, to: str, inputs: np.ndarray) -> float:
    """Max |logit difference| between the ``to`` artifact and PyTorch on ``inputs`` (NCHW float32, normalised)."""
    fw = _framework(to)
    m = _torch_manifest(name)
    weights, _ = _source_weights(m)
    artifact = convert(m, to=fw)
    x = np.ascontiguousarray(inputs, dtype=np.float32)

    import torch

    with torch.inference_mode():
        expected = build_torch_model(m.model.architecture, weights)(torch.from_numpy(x)).numpy()
    if fw == "onnxruntime":
        import onnxruntime as ort

        session = ort.InferenceSession(str(artifact.path), providers=["CPUExecutionProvider"])
        actual = session.run([OUTPUT_NAME], {INPUT_NAME: x})[0]
    else:
        import keras

        model = keras.models.load_model(str(artifact.path), compile=False)
        actual = np.asarray(model(np.ascontiguousarray(x.transpose(0, 2, 3, 1)), training=False))
    return float(np.max(np.abs(actual - expected)))

