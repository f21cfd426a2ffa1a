"""What a model file is, which framework runs it, and the errors a bad one gives; entrypoints.

Shared by the three predictors (each framework folder stays independent of the others): :func:`file_kind` tells
the format of a file or folder from its name and, where a name is not enough, its first bytes or zip directory
(reading only, never loading); :func:`refuse_other_framework` refuses a file meant for another framework;
:func:`unreadable` wraps whatever a framework raised on a bad file into one `ModelFileError` sentence naming the
file and the framework; :func:`entrypoint_callable` imports ``model.entrypoint`` once trusted.
"""
from __future__ import annotations

import importlib
import os
import sys
import zipfile
from pathlib import Path
from typing import Any, Callable

from mlms_nb.errors import ModelFileError, PredictorError
from mlms_nb.manifest import Manifest
from mlms_nb.trust import require_trust

#: format -> (what it is, the framework that runs it)
KINDS = {
    "onnx": ("an ONNX graph", "onnxruntime"),
    "torchscript": ("a TorchScript program", "torch"),
    "torch.export": ("a torch.export program (.pt2)", "torch"),
    "torch-weights": ("a PyTorch checkpoint (torch.save)", "torch"),
    "safetensors": ("a safetensors weights file", "torch"),
    "keras": ("a Keras model file", "tensorflow"),
    "savedmodel": ("a TensorFlow SavedModel", "tensorflow"),
}
FRAMEWORK_LABELS = {"torch": "PyTorch", "onnxruntime": "ONNX Runtime", "tensorflow": "TensorFlow"}


def _zip_names(path: Path) -> list[str]:
    try:
        with zipfile.ZipFile(path) as archive:
            return archive.namelist()
    except (zipfile.BadZipFile, OSError, ValueError):
        return []


def file_kind(path: str | os.PathLike) -> str | None:
    """The format of a model file or folder (a key of :data:`KINDS`), or None when neither its name nor its
    contents say. Reads names, the first bytes or the zip directory only."""
    path = Path(path)
    name = path.name.lower()
    if path.is_dir():
        return "savedmodel" if (path / "saved_model.pb").exists() or (path / "saved_model.pbtxt").exists() else None
    if name.endswith(".onnx"):
        return "onnx"
    if name.endswith((".keras", ".h5", ".hdf5")) and not name.endswith(".weights.h5"):
        return "keras"
    if name.endswith(".safetensors"):
        return "safetensors"
    entries = _zip_names(path)
    if name.endswith(".pt2"):
        return "torch.export" if entries else None
    if entries:
        if any(e.endswith("/constants.pkl") or "/code/" in e for e in entries):
            return "torchscript"
        if any(e.endswith("/data.pkl") for e in entries):
            return "torch-weights"
        if name.endswith(".keras") or any(e == "config.json" for e in entries):
            return "keras"
    if name.endswith((".pth", ".bin", ".ckpt")):
        return "torch-weights"
    return None


def refuse_other_framework(path: str | os.PathLike, framework: str, manifest: Manifest, field: str = "graph_path") -> str | None:
    """The file's format; a `ModelFileError` when it belongs to another framework than ``framework``."""
    kind = file_kind(path)
    if kind is not None and KINDS[kind][1] != framework:
        what, other = KINDS[kind]
        raise ModelFileError(f"model.{field} {path} is {what}, which {FRAMEWORK_LABELS[other]} runs, not "
                             f"{FRAMEWORK_LABELS[framework]}: set framework.name: {other} in manifest {manifest.key}")
    return kind


def unreadable(path: str | os.PathLike, framework: str, what: str, err: BaseException | str) -> ModelFileError:
    """One sentence for a model file the framework could not load: the file, the framework, the first line of why."""
    reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    if len(reason) > 200:
        reason = reason[:200] + "..."
    size = ""
    try:
        if Path(path).is_file():
            size = f", {Path(path).stat().st_size:,} bytes"
    except OSError:
        pass
    return ModelFileError(f"{FRAMEWORK_LABELS[framework]} could not load {path} as {what} (truncated, damaged or "
                          f"another format{size}): {reason}")


def entrypoint_callable(manifest: Manifest, trust: bool) -> Callable[..., Any]:
    """The callable ``model.entrypoint`` names (``package.module:callable``), imported only when trusted (this run's
    trust, or the manifest file in the trust store). The manifest's own folder is searched after ``sys.path``."""
    entrypoint = manifest.model.entrypoint
    require_trust(manifest.source, "entrypoint", trust, f"manifest {manifest.key} (entrypoint {entrypoint})")
    module_name, _, attr = entrypoint.partition(":")
    folder = str(Path(manifest.source).resolve().parent) if manifest.source else None
    added = folder is not None and folder not in sys.path
    if added:
        sys.path.append(folder)
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise PredictorError(f"manifest {manifest.key}: model.entrypoint {entrypoint}: cannot import {module_name} "
                             f"({err}); put its package on sys.path (PYTHONPATH) or beside the manifest") from None
    finally:
        if added:
            sys.path.remove(folder)
    target: Any = module
    for part in attr.split("."):
        if not hasattr(target, part):
            raise PredictorError(f"manifest {manifest.key}: model.entrypoint {entrypoint}: module {module_name} has "
                                 f"no attribute {attr}")
        target = getattr(target, part)
    if not callable(target):
        raise PredictorError(f"manifest {manifest.key}: model.entrypoint {entrypoint} is not callable")
    return target


def build_from_entrypoint(manifest: Manifest, trust: bool, expected: type | tuple[type, ...], what: str) -> Any:
    """Call the entrypoint with ``model.entrypoint_args``; refuse a result that is not an ``expected`` instance."""
    build = entrypoint_callable(manifest, trust)
    entrypoint = manifest.model.entrypoint
    try:
        model = build(**manifest.model.entrypoint_args)
    except TypeError as err:
        raise PredictorError(f"manifest {manifest.key}: model.entrypoint {entrypoint} did not accept "
                             f"model.entrypoint_args ({err})") from None
    if not isinstance(model, expected):
        raise PredictorError(f"manifest {manifest.key}: model.entrypoint {entrypoint} returned a "
                             f"{type(model).__name__}, not {what}")
    return model
