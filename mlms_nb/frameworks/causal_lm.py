"""Where a text-generation manifest's causal LM comes from, for every framework's step model (the ONNX Runtime and
TensorFlow ones export or port this PyTorch model): a live object (``model.instance``), a built-in architecture
(``tiny_gpt2``), a trusted ``model.entrypoint`` returning a causal LM, or ``model.graph_path`` naming a local folder
written by ``save_pretrained`` (``config.json`` + safetensors), read by ``AutoModelForCausalLM`` with
``local_files_only=True``: nothing is downloaded; a hub id with no local copy is refused in one sentence."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from mlms_nb._optional import require
from mlms_nb.errors import ModelFileError, PredictorError
from mlms_nb.frameworks.modelfiles import build_from_entrypoint
from mlms_nb.manifest import Manifest


def hub_id_sentence(where: str, text: str) -> str:
    """The one sentence that refuses a Hugging Face hub id (or any name) with no local folder behind it."""
    return (f"{where} {text!r} is not a local folder: mlms-nb downloads nothing at run time; save the model once "
            "with save_pretrained(folder) (or huggingface-cli download) and give that folder")


def load_causal_lm(manifest: Manifest, trust: bool = False) -> Any:
    """The eval-mode causal LM a text-generation manifest names (see the module docstring)."""
    torch = require("torch", "generating with a causal LM")
    spec = manifest.model
    if spec.instance is not None:
        model = spec.instance
    elif spec.graph_path:
        model = _from_folder(spec.graph_path, manifest)
    elif spec.entrypoint:
        model = build_from_entrypoint(manifest, trust, torch.nn.Module, "a torch.nn.Module")
    else:
        from mlms_nb.zoo.registry import build_torch_model

        model = build_torch_model(spec.architecture)
    if not isinstance(model, torch.nn.Module) or getattr(model, "config", None) is None:
        raise PredictorError(f"manifest {manifest.key}: generation needs a transformers causal LM (an nn.Module with "
                             f"a config, returning logits), got a {type(model).__name__}")
    return model.eval()


def _from_folder(uri: str, manifest: Manifest) -> Any:
    base = Path(manifest.source).parent if manifest.source else Path.cwd()
    path = Path(uri).expanduser()
    path = path if path.is_absolute() else base / path
    if not path.exists():
        raise ModelFileError(hub_id_sentence("model.graph_path", uri))
    if manifest.source:  # a manifest file's assets stay inside its allowed folders (MLMS_ALLOW_PATHS)
        from mlms_nb.data.assets import resolve_asset

        path = resolve_asset(uri, None, base)
    if not path.is_dir() or not (path / "config.json").is_file():
        raise ModelFileError(f"model.graph_path {path}: a text-generation model is a folder written by "
                             "save_pretrained (config.json and safetensors weights)")
    transformers = require("transformers", "loading a Hugging Face causal LM")
    try:
        return transformers.AutoModelForCausalLM.from_pretrained(str(path), local_files_only=True,
                                                                 attn_implementation="eager")
    except (OSError, ValueError, KeyError) as err:
        raise ModelFileError(f"model.graph_path {path}: transformers could not read it as a causal LM "
                             f"({str(err).strip().splitlines()[0][:300]})") from None
