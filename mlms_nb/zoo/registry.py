"""The built-in architectures a manifest can name in ``model.architecture``, and their builders.

Builders are imported on first use, so listing architectures needs neither PyTorch nor TensorFlow.
``build_torch(weights_file)`` returns an eval-mode ``nn.Module`` (NCHW input); ``build_keras(state_dict)``
returns a ``keras.Model`` (NHWC input) with the PyTorch weights ported, or is ``None`` where the
architecture has no Keras definition.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from mlms_nb._optional import require
from mlms_nb.errors import PredictorError
from mlms_nb.zoo.decoders import CONFIGS as DECODER_CONFIGS  # plain dicts: importing it loads no framework


@dataclass(frozen=True)
class Architecture:
    """One architecture: its name, square input size in px (0 for a non-image model), its builders, and its input
    (shape without the batch, element type; default: an NCHW RGB image of ``input_size`` px, float32);
    ``max_tokens``: a language model's context (positions), the longest token sequence it takes (0: not one)."""
    name: str
    input_size: int
    build_torch: Callable[[str | None], Any]
    build_keras: Callable[[dict | None], Any] | None = None
    input_shape: tuple[int, ...] = ()
    input_dtype: str = "float32"
    max_tokens: int = 0

    @property
    def example_shape(self) -> tuple[int, ...]:
        """The shape of one input (without the batch) that exports trace the model with."""
        return self.input_shape or (3, self.input_size, self.input_size)


def _lazy(module: str, function: str, name: str) -> Callable[..., Any]:
    def build(*args: Any) -> Any:
        # a missing framework (torch, efficientnet_lite_pytorch, keras) becomes a sentence naming the extra
        return getattr(require(f"mlms_nb.zoo.{module}", f"building {name}"), function)(name, *args)

    build.__name__ = build.__qualname__ = f"{function}[{name}]"
    return build


ARCHITECTURES: dict[str, Architecture] = {
    "efficientnet_lite0": Architecture("efficientnet_lite0", 224,
                                       _lazy("efficientnet_lite", "build_torch", "efficientnet_lite0"),
                                       _lazy("efficientnet_lite", "build_keras", "efficientnet_lite0")),
    "efficientnet_lite1": Architecture("efficientnet_lite1", 240,
                                       _lazy("efficientnet_lite", "build_torch", "efficientnet_lite1"),
                                       _lazy("efficientnet_lite", "build_keras", "efficientnet_lite1")),
    "efficientnet_lite2": Architecture("efficientnet_lite2", 260,
                                       _lazy("efficientnet_lite", "build_torch", "efficientnet_lite2"),
                                       _lazy("efficientnet_lite", "build_keras", "efficientnet_lite2")),
    "resnet50": Architecture("resnet50", 224, _lazy("resnet", "build_torch", "resnet50")),
    # transformer encoders of Hugging Face transformers (the `zoo` extra), random weights
    "vit_tiny": Architecture("vit_tiny", 224, _lazy("transformer_models", "build_torch", "vit_tiny")),
    "bert_tiny": Architecture("bert_tiny", 0, _lazy("transformer_models", "build_torch", "bert_tiny"),
                              input_shape=(128,), input_dtype="int64"),
    # causal language models (task: text-generation), driven by mlms-nb's generate loop
    "tiny_gpt2": Architecture("tiny_gpt2", 0, _lazy("decoders", "build_torch", "tiny_gpt2"),
                              input_shape=(16,), input_dtype="int64",
                              max_tokens=DECODER_CONFIGS["tiny_gpt2"][2]["n_positions"]),
}


def get_architecture(arch: str) -> Architecture:
    """The registered architecture, or a `PredictorError` that lists the known ones."""
    key = arch.strip().lower().replace("-", "_")
    if key not in ARCHITECTURES:
        raise PredictorError(f"unknown architecture {arch!r}; known architectures: {', '.join(sorted(ARCHITECTURES))}")
    return ARCHITECTURES[key]


def build_torch_model(arch: str, weights_file: str | None = None) -> Any:
    """An eval-mode PyTorch module for ``arch``, with the state dict in ``weights_file`` (random weights without)."""
    return get_architecture(arch).build_torch(str(weights_file) if weights_file else None)


def load_torch_state_dict(weights_file: str) -> dict[str, Any]:
    """A ``.pth`` state dict as numpy arrays (loaded with ``weights_only=True``, on the CPU)."""
    torch = require("torch", "reading .pth weights")
    state = torch.load(str(weights_file), map_location="cpu", weights_only=True)
    return {k: v.detach().cpu().numpy() for k, v in state.items()}


def build_keras_model(arch: str, torch_weights_file: str | None = None) -> Any:
    """The Keras copy of ``arch`` with the PyTorch weights in ``torch_weights_file`` ported (random without)."""
    spec = get_architecture(arch)
    if spec.build_keras is None:
        have = ", ".join(sorted(a.name for a in ARCHITECTURES.values() if a.build_keras))
        raise PredictorError(f"architecture {spec.name!r} has no Keras definition; ones that do: {have}")
    state = load_torch_state_dict(torch_weights_file) if torch_weights_file else None
    return spec.build_keras(state)
