"""Transformer encoders from Hugging Face ``transformers`` (the ``zoo`` extra), built from a config with seeded random
weights: nothing is downloaded, and ``weights: random`` in their manifests says they are for latency, throughput and
profiling only.

- ``vit_tiny``: ViT-Ti/16 (DeiT-tiny's shape: 12 layers, hidden 192, 3 heads, MLP 768, 16 px patches), 224 px NCHW
  float32 images, 1000 logits; 5.7M parameters.
- ``bert_tiny``: BERT-Tiny (2 layers, hidden 128, 2 heads, MLP 512, a 30522-token vocabulary) with a sequence
  classification head: int64 token ids of length 128 (attention over all of them), 2 logits; 4.4M parameters.

Each is wrapped so that ``forward`` returns the logits tensor (``transformers`` models return an output object);
module names keep the library's (``model.vit.encoder.layer.3.attention``), so traces read like any ViT or BERT's.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mlms_nb._optional import require

SEED = 0


@dataclass(frozen=True)
class Spec:
    """One model: the ``transformers`` config and model class names, the config's arguments, its input shape
    (without the batch) and element type."""
    config: str
    model: str
    args: dict
    input_shape: tuple[int, ...]
    input_dtype: str


SPECS: dict[str, Spec] = {
    "vit_tiny": Spec("ViTConfig", "ViTForImageClassification",
                     dict(image_size=224, patch_size=16, hidden_size=192, num_hidden_layers=12, num_attention_heads=3,
                          intermediate_size=768, num_labels=1000),
                     (3, 224, 224), "float32"),
    "bert_tiny": Spec("BertConfig", "BertForSequenceClassification",
                      dict(vocab_size=30522, hidden_size=128, num_hidden_layers=2, num_attention_heads=2,
                           intermediate_size=512, max_position_embeddings=512, num_labels=2),
                      (128,), "int64"),
}


def build_torch(name: str, weights_file: str | None = None) -> Any:
    """The eval-mode model ``name`` (see the module docstring) returning its logits; seeded random weights, or the
    state dict in ``weights_file`` (``torch.load(weights_only=True)``)."""
    torch = require("torch", f"building {name} in PyTorch")
    transformers = require("transformers", f"building {name}")
    spec = SPECS[name]
    config = getattr(transformers, spec.config)(**spec.args)
    config._attn_implementation = "eager"  # plain matmul/softmax ops: exportable, and traced layer by layer

    class Logits(torch.nn.Module):
        """``model(x).logits``: a tensor, as every predictor and exporter expects."""

        def __init__(self, model: Any):
            super().__init__()
            self.model = model

        def forward(self, x):
            return self.model(x).logits

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        model = Logits(getattr(transformers, spec.model)(config))
    if weights_file:
        model.load_state_dict(torch.load(str(weights_file), map_location="cpu", weights_only=True), strict=True)
    return model.eval()
