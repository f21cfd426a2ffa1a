"""The PyTorch step model of mlms-nb's generate loop (:class:`mlms_nb.generation.step.StepModel`): eager
``transformers`` causal LMs, with the model's own KV cache or without one (the whole sequence again per token).

Where the model comes from: :func:`mlms_nb.frameworks.causal_lm.load_causal_lm`, shared with the ONNX Runtime and
TensorFlow step models, which export or port the same PyTorch model.
"""
from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
import torch

from mlms_nb.frameworks.causal_lm import load_causal_lm
from mlms_nb.generation.step import position_ids
from mlms_nb.manifest import Manifest

FRAMEWORK = "torch"


class TorchCache(NamedTuple):
    """The state between decode steps with a KV cache: the model's cache object, and whether the prompt batch was
    left-padded (decided once at the prefill: without padding every step skips the mask and positions)."""
    past: Any
    padded: bool


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

    def _forward(self, ids: np.ndarray, mask: np.ndarray, positions: np.ndarray | None, past: Any,
                 padded: bool) -> tuple[np.ndarray, Any]:
        """One call of the model; without padding the model's own causal mask and positions are the same, and
        cheaper (``positions`` unused)."""
        on_cpu = self.device.type == "cpu"

        def tensor(a: np.ndarray):
            t = torch.from_numpy(np.ascontiguousarray(a))
            return t if on_cpu else t.to(self.device)

        with torch.inference_mode():
            out = self.model(input_ids=tensor(ids), attention_mask=tensor(mask) if padded else None,
                             position_ids=tensor(positions) if padded else None, past_key_values=past,
                             use_cache=self.kv_cache)
            logits = out.logits[:, -1, :]
            if not on_cpu or logits.dtype != torch.float32:
                logits = logits.float().cpu()
            logits = logits.numpy()  # a host array: the device work is done
        return logits, (out.past_key_values if self.kv_cache else None)

    def prefill(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> tuple[np.ndarray, Any]:
        padded = not attention_mask.all()
        logits, past = self._forward(input_ids, attention_mask, position_ids(attention_mask) if padded else None,
                                     None, padded)
        return logits, (TorchCache(past, padded) if self.kv_cache else np.asarray(input_ids, dtype=np.int64))

    def decode(self, next_ids: np.ndarray, attention_mask: np.ndarray, state: Any) -> tuple[np.ndarray, Any]:
        if self.kv_cache:  # every token fed after the prompt is real: padded only if the prompt was
            padded = state.padded
            positions = position_ids(attention_mask)[:, -1:] if padded else None
            logits, past = self._forward(next_ids, attention_mask, positions, state.past, padded)
            return logits, TorchCache(past, padded)
        padded = not attention_mask.all()
        ids = np.concatenate([state, np.asarray(next_ids, dtype=np.int64)], axis=1)
        logits, _ = self._forward(ids, attention_mask, position_ids(attention_mask) if padded else None, None, padded)
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
    if isinstance(state, TorchCache):
        return cache_tensors(state.past)
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


def phase_costs(model: Any, batch_size: int, prompt_length: int, kv_length: int) -> "pd.DataFrame":
    """Per-layer theoretical costs of a causal LM in each phase of generation
    (:func:`mlms_nb.frameworks.torch.costs.torch_layer_costs`, one row per layer call, a ``phase`` column):
    ``prefill``: the whole prompt, ``(batch_size, prompt_length)`` tokens at once; ``decode``: one new token per
    row against a KV cache of ``kv_length`` positions (the past keys and values are read, the new ones written). The
    cache is built by an untraced prefill of ``kv_length`` tokens first; costs depend only on shapes (the weights
    are whatever the model holds)."""
    import pandas as pd

    from mlms_nb.frameworks.torch.costs import torch_layer_costs

    model = model.eval()
    ids = torch.zeros((int(batch_size), int(prompt_length)), dtype=torch.int64)
    prefill = torch_layer_costs(model, ids)
    with torch.inference_mode():
        past = model(input_ids=torch.zeros((int(batch_size), int(kv_length)), dtype=torch.int64),
                     use_cache=True).past_key_values

    def with_cache(_module, args, kwargs):  # the decode step's call: one token, the cache fed back
        kwargs = dict(kwargs, past_key_values=past, use_cache=True)
        return args, kwargs

    handle = model.register_forward_pre_hook(with_cache, with_kwargs=True, prepend=True)
    try:
        decode = torch_layer_costs(model, torch.zeros((int(batch_size), 1), dtype=torch.int64))
    finally:
        handle.remove()
    out = pd.concat([prefill.assign(phase="prefill"), decode.assign(phase="decode")], ignore_index=True)
    out.attrs = dict(prefill.attrs)
    out.attrs["phases"] = {"prefill": f"{batch_size} x {prompt_length} prompt tokens",
                           "decode": f"{batch_size} x 1 new token, KV cache of {kv_length} positions"}
    return out
