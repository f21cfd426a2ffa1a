"""A causal language model in TensorFlow, as a :class:`mlms_nb.generation.step.StepModel`: keras-hub's implementation
of the same architecture (Keras on the TensorFlow backend), with the weights ported from the PyTorch checkpoint.

``KerasCausalLM.from_torch(model)`` builds the keras-hub backbone from the ``transformers`` config and copies the
weights with keras-hub's own Hugging Face converters (``keras_hub.src.utils.transformers.convert_<arch>``), reading
them from the module's state dict instead of a safetensors file. Architectures: :data:`PORTS` (GPT-2, Llama,
Qwen2, Mistral); any other is refused with one sentence naming it. The port is checked against PyTorch on a
left-padded batch of 3: its max |logit difference| is ``max_abs_diff``; above ``tolerance`` x max |logit| it is
refused.

Positions: GPT-2's learned position embedding is looked up at ``cumsum(attention_mask) - 1`` per row, as
``transformers`` does, so left padding leaves the real tokens' positions alone. The rotary architectures take one
start index per call in keras-hub (a row's padding shifts its real tokens' absolute positions), which leaves the
attention scores unchanged: rotary embeddings make them depend only on the distance between positions, and the
padding positions are masked out. The tests compare logits and greedy tokens with PyTorch on left-padded batches.

The KV cache is keras-hub's: per layer ``(B, 2, positions, kv_heads, head_dim)``, stacked on axis 1; each decode
step grows it by one position (as ONNX Runtime's presents grow). Without a cache each step runs the whole sequence.
"""
from __future__ import annotations

import importlib
import os
from typing import Any

import numpy as np

from mlms_nb._optional import require
from mlms_nb.errors import MlmsError

#: transformers ``model_type`` -> the keras-hub converter module (``keras_hub.src.utils.transformers.<name>``)
PORTS = {"gpt2": "convert_gpt2", "llama": "convert_llama3", "qwen2": "convert_qwen", "mistral": "convert_mistral"}
KERAS_HUB_INSTALL = "pip install --no-deps 'keras-hub>=0.32,<0.33'"


class _StateDictLoader:
    """keras-hub's ``SafetensorLoader.port_weight`` over a state dict (``{name: numpy array}``); a name is found
    as given or under a prefix (``transformer.``, ``model.``)."""

    def __init__(self, tensors: dict[str, np.ndarray]):
        self.tensors = tensors
        self.used: set[str] = set()

    def get_tensor(self, key: str) -> np.ndarray:
        full = key if key in self.tensors else next((k for k in self.tensors if k.endswith("." + key)), None)
        if full is None:
            raise MlmsError(f"the PyTorch checkpoint has no weight {key!r}, which keras-hub's port needs")
        self.used.add(full)
        return self.tensors[full]

    def port_weight(self, keras_variable, hf_weight_key, hook_fn=None) -> None:
        value = self.get_tensor(hf_weight_key)
        if hook_fn:
            value = hook_fn(value, list(keras_variable.shape))
        if tuple(np.shape(value)) != tuple(keras_variable.shape):
            raise MlmsError(f"weight {hf_weight_key!r} has shape {tuple(np.shape(value))}, keras-hub's layer "
                            f"expects {tuple(keras_variable.shape)}")
        keras_variable.assign(np.asarray(value, np.float32))


def _keras_hub():
    os.environ.setdefault("KERAS_BACKEND", "tensorflow")
    try:
        return importlib.import_module("keras_hub")
    except ImportError:
        raise MlmsError(f"generation in TensorFlow needs keras-hub, which is not installed: {KERAS_HUB_INSTALL} "
                        "(--no-deps: its tensorflow-text dependency would pull the `tensorflow` distribution over "
                        "tensorflow-cpu)") from None


def port_backbone(model):
    """keras-hub's backbone of ``model``'s architecture with ``model``'s weights; refused with a sentence when
    keras-hub has no port of it."""
    require("tensorflow")
    _keras_hub()
    config = model.config.to_dict()
    kind = config.get("model_type")
    if kind not in PORTS:
        raise MlmsError(f"TensorFlow: keras-hub has no port of the transformers architecture {kind!r} "
                        f"({type(model).__name__}); mlms-nb ports {', '.join(sorted(PORTS))}")
    if kind == "gpt2" and config.get("n_inner") not in (None, 4 * config["n_embd"]):
        raise MlmsError(f"TensorFlow: keras-hub's GPT-2 has a feed-forward width of 4 x n_embd; this model's n_inner "
                        f"is {config['n_inner']}")
    converter = importlib.import_module(f"keras_hub.src.utils.transformers.{PORTS[kind]}")
    kwargs = converter.convert_backbone_config(config)
    if kind == "llama" and "rms_norm_eps" in config:
        kwargs["layer_norm_epsilon"] = config["rms_norm_eps"]  # keras-hub's llama3 converter leaves its default
    kwargs.pop("dropout", None)
    backbone = converter.backbone_cls(**kwargs, dtype="float32")
    tensors = {k: v.detach().float().cpu().numpy() for k, v in model.state_dict().items()}
    converter.convert_weights(backbone, _StateDictLoader(tensors), config)
    return backbone, kind


class KerasCausalLM:
    """keras-hub's backbone driven step by step (see the module docstring)."""

    framework = "tensorflow"

    def __init__(self, backbone, kind: str, *, kv_cache: bool = True):
        self.tf = require("tensorflow")
        self.backbone, self.kind, self.kv_cache = backbone, kind, bool(kv_cache)
        self.vocab_size = int(backbone.vocabulary_size)
        self.layers = len(backbone.transformer_layers)
        heads = getattr(backbone, "num_query_heads", None) or backbone.num_heads
        self.kv_heads = int(getattr(backbone, "num_key_value_heads", None) or heads)
        self.head_dim = int(backbone.hidden_dim // heads)
        self.max_abs_diff: dict[str, float] = {}
        self._graph = None  # the traced step (built on first use)

    @classmethod
    def from_torch(cls, model, *, kv_cache: bool = True, tolerance: float = 1e-4) -> "KerasCausalLM":
        """Port ``model`` (a ``transformers`` causal LM) and check the port's logits against PyTorch's."""
        backbone, kind = port_backbone(model)
        step = cls(backbone, kind, kv_cache=kv_cache)
        diff, scale = _check(step, model)
        step.max_abs_diff["prefill"] = diff
        if not diff <= tolerance * scale:
            raise MlmsError(f"TensorFlow: keras-hub's port of {type(model).__name__} differs from PyTorch by {diff:.3g} "
                            f"in the logits (tolerance {tolerance:g} x {scale:.3g})")
        return step

    def _core(self, ids, positions, attend, cache, index):
        """One call of the backbone over ``ids`` (B, T) with the cache (B, layers, 2, P, kv_heads, head_dim) updated
        from position ``index``: the last position's logits and the new cache. Traced once by ``tf.function``
        (every axis unknown), so each step runs as one graph, not layer by layer in eager mode."""
        tf, bb = self.tf, self.backbone
        x = bb.token_embedding(ids)
        if self.kind == "gpt2":  # learned absolute positions, per row (left padding)
            x = x + tf.gather(bb.position_embedding.position_embeddings, positions)
        caches = []
        for i, layer in enumerate(bb.transformer_layers):
            x, layer_cache = layer(x, decoder_attention_mask=attend, self_attention_cache=cache[:, i],
                                   self_attention_cache_update_index=index)
            caches.append(layer_cache)
        x = bb.layer_norm(x[:, -1:, :])
        return bb.token_embedding(x, reverse=True)[:, 0, :], tf.stack(caches, axis=1)

    def _forward(self, ids: np.ndarray, mask: np.ndarray, cache, index: int):
        tf = self.tf
        if self._graph is None:
            spec = tf.TensorSpec
            self._graph = tf.function(self._core, input_signature=[
                spec([None, None], tf.int32), spec([None, None], tf.int32), spec([None, None, None], tf.int32),
                spec([None, self.layers, 2, None, self.kv_heads, self.head_dim], tf.float32), spec([], tf.int32)])
        positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0)[:, -ids.shape[1]:]
        attend = np.repeat(mask[:, None, :], ids.shape[1], axis=1)
        logits, cache = self._graph(tf.constant(ids, tf.int32), tf.constant(positions, tf.int32),
                                    tf.constant(attend, tf.int32), cache, tf.constant(index, tf.int32))
        return logits.numpy().astype(np.float32, copy=False), cache

    def _empty_cache(self, rows: int, positions: int):
        return self.tf.zeros((rows, self.layers, 2, positions, self.kv_heads, self.head_dim), self.tf.float32)

    def prefill(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> tuple[np.ndarray, Any]:
        ids, mask = np.asarray(input_ids, np.int64), np.asarray(attention_mask, np.int64)
        logits, cache = self._forward(ids, mask, self._empty_cache(*ids.shape), 0)
        return logits, (cache if self.kv_cache else ids)

    def decode(self, next_ids: np.ndarray, attention_mask: np.ndarray, state: Any) -> tuple[np.ndarray, Any]:
        next_ids = np.asarray(next_ids, np.int64).reshape(-1, 1)
        mask = np.asarray(attention_mask, np.int64)
        if not self.kv_cache:
            ids = np.concatenate([state, next_ids], axis=1)
            logits, _ = self._forward(ids, mask, self._empty_cache(*ids.shape), 0)
            return logits, ids
        past = int(state.shape[3])
        grown = self.tf.concat([state, self._empty_cache(next_ids.shape[0], 1)], axis=3)
        return self._forward(next_ids, mask, grown, past)

    def kv_cache_bytes(self, state: Any) -> int:
        if not self.kv_cache or state is None:
            return 0
        return int(np.prod(state.shape)) * 4

    def close(self) -> None:
        self.backbone = None


def _check(step: KerasCausalLM, model) -> tuple[float, float]:
    """(max |logit difference| between the port's prefill and PyTorch's on a left-padded batch of 3, the larger of
    1 and max |logit|)."""
    torch = require("torch")
    rng = np.random.default_rng(0)
    ids = rng.integers(0, step.vocab_size, (3, 6), dtype=np.int64)
    mask = np.ones_like(ids)
    mask[1, :1], mask[2, :3] = 0, 0
    positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0)
    with torch.no_grad():
        expected = model(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask),
                         position_ids=torch.from_numpy(positions)).logits[:, -1, :].float().numpy()
    actual, _ = step._forward(ids, mask, step._empty_cache(3, 6), 0)
    return float(np.max(np.abs(actual - expected))), max(1.0, float(np.max(np.abs(expected))))


def open_step_model(manifest, *, kv_cache: bool, device: str = "cpu", threads: int | None = None,
                    trust: bool = False) -> KerasCausalLM:
    """The TensorFlow step model of a text-generation manifest: keras-hub's implementation of its PyTorch causal LM's
    architecture (:func:`~mlms_nb.frameworks.causal_lm.load_causal_lm`) with the weights ported, checked against
    PyTorch; an architecture keras-hub lacks is refused in one sentence."""
    from mlms_nb.frameworks.causal_lm import load_causal_lm

    if device != "cpu":
        from mlms_nb.errors import PredictorError

        raise PredictorError(f"TensorFlow generation runs on the CPU here (tensorflow-cpu), not on {device}")
    return KerasCausalLM.from_torch(load_causal_lm(manifest, trust), kv_cache=kv_cache)

