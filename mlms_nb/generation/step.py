"""The contract between mlms-nb's generate loop and one framework's causal language model.

A framework folder (``frameworks/<name>/generate.py``) implements :class:`StepModel`; the loop
(:mod:`mlms_nb.generation.loop`) owns everything else: choosing tokens (greedy or seeded sampling), stop tokens,
the clock, warm-up and timing discipline. A step model never picks a token and never reads a clock.

Shapes and dtypes (B rows, T prompt positions, V vocabulary entries):

- ``prefill(input_ids, attention_mask)``: both ``int64 (B, T)``; prompts of different lengths are **left-padded**
  (``attention_mask`` 0 on the padding). Returns the logits of the **last position** of every row, ``float32
  (B, V)``, and the state to pass to the first ``decode``. Position ids, where the model needs them, are
  ``cumsum(attention_mask) - 1`` (clipped at 0), computed by the step model.
- ``decode(next_ids, attention_mask, state)``: ``next_ids`` ``int64 (B, 1)``, the tokens the loop chose;
  ``attention_mask`` ``int64 (B, T + k)`` covering the prompt and every token fed so far, this one included.
  Returns the logits for the next position, ``float32 (B, V)``, and the new state.
- With ``kv_cache`` the state holds the past keys and values (per layer, ``(B, heads, positions, head_dim)``);
  without it the state holds the ids so far and ``decode`` runs the whole sequence again (a full forward per token).
- Returned logits are materialised host numpy arrays: when ``prefill``/``decode`` returns, the device work is
  done, so the loop's clock stamp after the call is the token's arrival.

``kv_cache_bytes(state)`` gives the bytes the cache holds now (0 without a cache), from the state's shapes; an
optional ``num_layers`` attribute (decoder layers) lets the loop report KV-cache bytes per token per layer.

Each ``frameworks/<name>/generate.py`` exposes ``open_step_model(manifest, *, kv_cache, device, threads, trust)``
(:func:`open_step_model` below finds it by the framework's name).
"""
from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import numpy as np


@runtime_checkable
class StepModel(Protocol):
    framework: str
    kv_cache: bool
    vocab_size: int

    def prefill(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> tuple[np.ndarray, Any]: ...

    def decode(self, next_ids: np.ndarray, attention_mask: np.ndarray, state: Any) -> tuple[np.ndarray, Any]: ...

    def kv_cache_bytes(self, state: Any) -> int: ...

    def close(self) -> None: ...


def position_ids(attention_mask: np.ndarray) -> np.ndarray:
    """``cumsum(mask) - 1`` clipped at 0: left padding does not shift the real tokens' positions."""
    return np.maximum(np.cumsum(attention_mask, axis=1) - 1, 0).astype(np.int64)


def open_step_model(manifest, *, kv_cache: bool, device: str = "cpu", threads: int | None = None,
                    trust: bool = False) -> StepModel:
    """The step model of a text-generation manifest in its framework: ``frameworks/<name>/generate.py`` exposes
    ``open_step_model(manifest, *, kv_cache, device, threads, trust)``; a framework without one is refused in one
    sentence."""
    import importlib

    from mlms_nb.errors import PredictorError

    name = manifest.framework.name
    try:
        module = importlib.import_module(f"mlms_nb.frameworks.{name}.generate")
    except ModuleNotFoundError as err:
        if not str(err.name or "").startswith(f"mlms_nb.frameworks.{name}"):
            raise
        raise PredictorError(f"{name} has no step model for text generation yet (mlms_nb/frameworks/{name}/"
                             "generate.py): generate in torch") from None
    return module.open_step_model(manifest, kv_cache=kv_cache, device=device, threads=threads, trust=trust)
