"""How the PyTorch predictor gets its module: a model file, an entrypoint plus weights, a built-in architecture.

TorchScript and ``torch.export`` programs run operations of their own, so they load only when trusted
(:mod:`mlms_nb.trust`), from the very bytes whose sha256 was checked; weights are data: ``.safetensors`` (safetensors) or a state dict ``torch.load`` reads
with ``weights_only=True``. Every failure of a bad file is a `ModelFileError` naming the file.
"""
from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import torch

from mlms_nb._optional import require
from mlms_nb.errors import ModelFileError, PredictorError
from mlms_nb.frameworks.modelfiles import build_from_entrypoint, refuse_other_framework, unreadable
from mlms_nb.manifest import Manifest
from mlms_nb.trust import trusted_bytes

TORCHSCRIPT_SUFFIXES = (".pt", ".ts", ".torchscript", ".jit")
EXPORT_SUFFIXES = (".pt2",)


def load_program(path: Path, manifest: Manifest, trust: bool, device: str) -> tuple[torch.nn.Module, str]:
    """A TorchScript or ``torch.export`` file as a callable module, and its kind (``torchscript``, ``export``)."""
    kind = refuse_other_framework(path, "torch", manifest)
    if kind in ("torch-weights", "safetensors"):
        raise ModelFileError(f"model.graph_path {path} holds weights, not a program PyTorch can run: give it as "
                             f"model.weights_path with model.entrypoint (your nn.Module) in manifest {manifest.key}")
    if path.is_dir():
        raise ModelFileError(f"model.graph_path {path} is a folder that is not a SavedModel; PyTorch runs a "
                             "TorchScript (.pt) or torch.export (.pt2) file")
    if kind == "torch.export":
        data = trusted_bytes(path, "torch.export", trust)  # checked and loaded from the same bytes
        try:
            program = torch.export.load(io.BytesIO(data))
        except Exception as err:  # noqa: BLE001 - torch raises many types on a bad archive
            raise unreadable(path, "torch", "a torch.export program (.pt2)", err) from None
        return program.module(), "export"
    if kind is None and path.name.lower().endswith(TORCHSCRIPT_SUFFIXES + EXPORT_SUFFIXES):
        what = "a torch.export program (.pt2)" if path.name.lower().endswith(EXPORT_SUFFIXES) else "a TorchScript program"
        raise unreadable(path, "torch", what, "not a zip archive of one")
    if kind != "torchscript":
        raise ModelFileError(f"model.graph_path {path}: PyTorch runs TorchScript ({', '.join(TORCHSCRIPT_SUFFIXES)}) "
                             f"or torch.export ({', '.join(EXPORT_SUFFIXES)}) files, and this is neither")
    data = trusted_bytes(path, "torchscript", trust)  # checked and loaded from the same bytes
    try:
        return torch.jit.load(io.BytesIO(data), map_location=device), "torchscript"
    except Exception as err:  # noqa: BLE001 - RuntimeError, pickle errors, ... on a bad archive
        raise unreadable(path, "torch", "a TorchScript program", err) from None


def read_state_dict(path: Path) -> dict[str, Any]:
    """The tensors of a weights file: safetensors, or ``torch.load(weights_only=True)`` (a bare state dict, or one
    under ``state_dict`` / ``model``). Never unpickles code."""
    kind = "safetensors" if path.name.lower().endswith(".safetensors") else "torch-weights"
    if path.is_dir():
        raise ModelFileError(f"model.weights_path {path} is a folder; expected a .safetensors or .pth file")
    try:
        if kind == "safetensors":
            load_file = require("safetensors.torch", "reading .safetensors weights").load_file
            state = load_file(str(path), device="cpu")
        else:
            state = torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - UnpicklingError, IndexError, SafetensorError ... on a bad file
        what = "safetensors weights" if kind == "safetensors" else "a state dict (torch.load, weights_only=True)"
        raise unreadable(path, "torch", what, err) from None
    for key in ("state_dict", "model"):
        if isinstance(state, dict) and isinstance(state.get(key), dict):
            state = state[key]
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ModelFileError(f"model.weights_path {path} holds a {type(state).__name__}, not a state dict of tensors "
                             "(name -> tensor)")
    return state


def load_weights(model: torch.nn.Module, path: Path, manifest: Manifest) -> None:
    """Load a weights file into ``model``, strictly: missing or unexpected names are named in the error."""
    state = read_state_dict(path)
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as err:
        first = str(err).strip().splitlines()
        raise ModelFileError(f"model.weights_path {path} does not fit the module model.entrypoint "
                             f"{manifest.model.entrypoint} builds: {' '.join(line.strip() for line in first[:3])[:400]}"
                             ) from None


def build_entrypoint(manifest: Manifest, trust: bool, weights: Path | None) -> torch.nn.Module:
    """The ``nn.Module`` of ``model.entrypoint`` (trusted only), with ``weights`` loaded when given."""
    model = build_from_entrypoint(manifest, trust, torch.nn.Module, "a torch.nn.Module")
    if weights is not None:
        load_weights(model, weights, manifest)
    return model


def build_architecture(manifest: Manifest, weights: Path | None) -> torch.nn.Module:
    """A built-in architecture, its weights file read as data (a bad file is a `ModelFileError`)."""
    from mlms_nb.zoo.registry import build_torch_model, get_architecture

    get_architecture(manifest.model.architecture)
    if weights is not None:
        read_state_dict(weights)  # a bad file fails here with its name, before the builder's own torch.load
    try:
        return build_torch_model(manifest.model.architecture, str(weights) if weights else None)
    except (PredictorError, ModelFileError):
        raise
    except RuntimeError as err:  # a state dict of another architecture
        raise ModelFileError(f"model.weights_path {weights} does not fit architecture {manifest.model.architecture}: "
                             f"{str(err).strip().splitlines()[0][:300]}") from None
