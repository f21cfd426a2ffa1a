"""The PyTorch step model of mlms-nb's generate loop (:class:`mlms_nb.generation.step.StepModel`): eager
``transformers`` causal LMs, with the model's own KV cache or without one (the whole sequence again per token).

Where the model comes from (:func:`load_causal_lm`): a live object (``model.instance``), a built-in architecture
(``tiny_gpt2``), a trusted ``model.entrypoint`` returning a causal LM, or ``model.graph_path`` naming a local folder
written by ``save_pretrained`` (``config.json`` + safetensors), read by ``AutoModelForCausalLM`` with
``local_files_only=True``: nothing is downloaded; a hub id with no local copy is refused in one sentence.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from mlms_nb._optional import require
from mlms_nb.errors import ModelFileError, PredictorError
from mlms_nb.frameworks.modelfiles import build_from_entrypoint
from mlms_nb.manifest import Manifest

FRAMEWORK = "torch"


def hub_id_sentence(where: str, text: str) -> str:
    """The one sentence that refuses a Hugging Face hub id (or any name) with no local folder behind it."""
    return (f"{where} {text!r} is not a local folder: mlms-nb downloads nothing at run time; save the model once "
            "with save_pretrained(folder) (or huggingface-cli download) and give that folder")


def load_causal_lm(manifest: Manifest, trust: bool = False) -> Any:
    """The eval-mode causal LM a text-generation manifest names (see the module docstring)."""
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


class TorchStepModel:
    """Prefill and decode over an eager causal LM (see :mod:`mlms_nb.generation.step` for the contract)."""
    framework = FRAMEWORK

    def __init__(self, model: Any, kv_cache: bool, device: str = "cpu"):
        self.device = torch.device(device)
        self.model = model.to(self.device).eval()
        self.kv_cache = bool(kv_cache)
        self.vocab_size = int(model.config.vocab_size)
        config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
        self.num_layers = getattr(config, "num_hidden_layers", None)  # optional: KV bytes per token per layer

    def _forward(self, ids: np.ndarray, mask: np.ndarray, positions: np.ndarray, past: Any) -> tuple[np.ndarray, Any]:
        dev = self.device
        padded = not mask.all()  # no padding: the model's own causal mask and positions are the same, and cheaper
        with torch.inference_mode():
            out = self.model(input_ids=torch.from_numpy(np.ascontiguousarray(ids)).to(dev),
                             attention_mask=torch.from_numpy(np.ascontiguousarray(mask)).to(dev) if padded else None,
                             position_ids=torch.from_numpy(np.ascontiguousarray(positions)).to(dev) if padded else None,
                             past_key_values=past, use_cache=self.kv_cache)
            logits = out.logits[:, -1, :].float().cpu().numpy()  # host copy: the device work is done
        return logits, (out.past_key_values if self.kv_cache else None)

    def prefill(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> tuple[np.ndarray, Any]:
        from mlms_nb.generation.step import position_ids

        logits, past = self._forward(input_ids, attention_mask, position_ids(attention_mask), None)
        return logits, (past if self.kv_cache else np.asarray(input_ids, dtype=np.int64))

    def decode(self, next_ids: np.ndarray, attention_mask: np.ndarray, state: Any) -> tuple[np.ndarray, Any]:
        from mlms_nb.generation.step import position_ids

        positions = position_ids(attention_mask) if not attention_mask.all() else attention_mask  # unused unpadded
        if self.kv_cache:
            return self._forward(next_ids, attention_mask, positions[:, -1:], state)
        ids = np.concatenate([state, np.asarray(next_ids, dtype=np.int64)], axis=1)
        logits, _ = self._forward(ids, attention_mask, positions, None)
        return logits, ids

    def start_tracing(self, tracer: Any) -> None:
        """FRAMEWORK layer spans of every call from now on (:class:`mlms_nb.frameworks.torch.tracing.LayerHooks`)."""
        from mlms_nb.frameworks.torch.tracing import LayerHooks

        self._hooks = LayerHooks(self.model, tracer, cuda=self.device.type == "cuda")

    def stop_tracing(self) -> None:
        hooks, self._hooks = getattr(self, "_hooks", None), None
        if hooks is not None:
            hooks.remove()

    def kv_cache_bytes(self, state: Any) -> int:
        return sum(int(t.numel()) * t.element_size() for t in cache_tensors(state)) if self.kv_cache else 0

    def close(self) -> None:
        self.model = None


def cache_tensors(state: Any) -> list:
    """The key and value tensors of a ``transformers`` cache (``DynamicCache``'s layers, or legacy tuples)."""
    if state is None or isinstance(state, np.ndarray):
        return []
    layers = getattr(state, "layers", None)
    if layers is not None:
        return [t for layer in layers for t in (getattr(layer, "keys", None), getattr(layer, "values", None))
                if isinstance(t, torch.Tensor)]
    if isinstance(state, (tuple, list)):
        return [t for item in state for t in (cache_tensors(item) if not isinstance(item, torch.Tensor) else [item])]
    return []


def open_step_model(manifest: Manifest, *, kv_cache: bool, device: str = "cpu", threads: int | None = None,
                    trust: bool = False) -> TorchStepModel:
    """The step model of a text-generation manifest in PyTorch (the opener every ``frameworks/<name>/generate.py``
    exposes; :func:`mlms_nb.generation.step.open_step_model` finds it by the framework's name)."""
    if threads:
        torch.set_num_threads(threads)
    return TorchStepModel(load_causal_lm(manifest, trust), kv_cache, device)
