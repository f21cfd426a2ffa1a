"""EfficientNet-Lite0/1/2 in PyTorch (the ``efficientnet-lite-pytorch`` package) and the same network in plain Keras.

EfficientNet-Lite is EfficientNet without squeeze-excite, with ReLU6 instead of swish and with the stem
(32 channels) and head (1280 channels) fixed across sizes. Both builders take one input layout each:

- PyTorch: NCHW float32, pixels in 0..255 normalised as ``(x - 127) / 128``;
- Keras: NHWC float32, the same normalisation.

Lite0 takes 224 x 224 px, Lite1 240 x 240 px, Lite2 260 x 260 px. Convolutions use TensorFlow's static "same" padding
(asymmetric for stride 2: the extra row/column goes at the bottom/right), computed for that input size;
the Keras copy reproduces it with ``ZeroPadding2D`` + ``padding="valid"``. Keras layers are named after the
PyTorch modules (see :mod:`mlms_nb.naming`), so ``keras_layer_to_torch_name`` maps one to the other.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from mlms_nb._optional import require
from mlms_nb.naming import keras_layer_to_torch_name, torch_to_keras_name
from mlms_nb.zoo.keras_port import port_torch_weights

__all__ = ["VARIANTS", "build_torch", "build_keras", "keras_layer_to_torch_name", "same_padding"]


@dataclass(frozen=True)
class Variant:
    """Scaling of one EfficientNet-Lite size: width/depth multipliers, input size (px), dropout rate."""
    package_name: str
    width: float
    depth: float
    image_size: int
    dropout: float


VARIANTS: dict[str, Variant] = {
    "efficientnet_lite0": Variant("efficientnet-lite0", 1.0, 1.0, 224, 0.2),
    "efficientnet_lite1": Variant("efficientnet-lite1", 1.0, 1.1, 240, 0.2),
    "efficientnet_lite2": Variant("efficientnet-lite2", 1.1, 1.2, 260, 0.3),
}

# Stages of MBConv blocks, as in efficientnet_lite_builder.py:
# (repeats, kernel, stride of the first block, expand ratio, input channels, output channels)
STAGES = (
    (1, 3, 1, 1, 32, 16),
    (2, 3, 2, 6, 16, 24),
    (2, 5, 2, 6, 24, 40),
    (3, 3, 2, 6, 40, 80),
    (3, 5, 1, 6, 80, 112),
    (4, 5, 2, 6, 112, 192),
    (1, 3, 1, 6, 192, 320),
)
STEM_CHANNELS, HEAD_CHANNELS, NUM_CLASSES = 32, 1280, 1000
BN_EPSILON = 1e-3  # the package's batch_norm_epsilon; Keras uses the same value


def _variant(name: str) -> Variant:
    try:
        return VARIANTS[name]
    except KeyError:
        raise ValueError(f"unknown EfficientNet-Lite {name!r}; expected one of {', '.join(VARIANTS)}") from None


def _round_filters(filters: int, width: float, divisor: int = 8) -> int:
    if width == 1.0:
        return filters
    scaled = filters * width
    new = max(divisor, int(scaled + divisor / 2) // divisor * divisor)
    return int(new + divisor if new < 0.9 * scaled else new)


def same_padding(size: int, kernel: int, stride: int) -> tuple[int, int]:
    """TensorFlow "same" padding (before, after) in px for one spatial axis of ``size`` px."""
    out = math.ceil(size / stride)
    total = max((out - 1) * stride + kernel - size, 0)
    return total // 2, total - total // 2


def block_configs(name: str) -> list[dict[str, int]]:
    """One dict per MBConv block (``_blocks.i``): kernel, stride, expand, in/out channels."""
    v = _variant(name)
    blocks = []
    for i, (repeats, kernel, stride, expand, cin, cout) in enumerate(STAGES):
        fixed = i in (0, len(STAGES) - 1)  # stem and head stages are not scaled in depth
        n = repeats if fixed else int(math.ceil(v.depth * repeats))
        cin = STEM_CHANNELS if i == 0 else _round_filters(cin, v.width)
        cout = _round_filters(cout, v.width)
        for j in range(n):
            blocks.append(dict(kernel=kernel, stride=stride if j == 0 else 1, expand=expand,
                               cin=cin if j == 0 else cout, cout=cout))
    return blocks


# ----------------------------------------------------------------------------- PyTorch

def build_torch(name: str, weights_file: str | None = None) -> Any:
    """The package's ``EfficientNet`` in eval mode, with the state dict from ``weights_file`` (a ``.pth``).

    Drop-connect is switched off (it is a no-op at inference and its Python branch only gets in the
    way of tracing); activations are the package's ``nn.ReLU6``, so export and ``torch.jit.trace`` work.
    Without ``weights_file`` the weights are the package's initialisation under ``torch.manual_seed(0)``.
    """
    torch = require("torch", f"building {name} in PyTorch")
    EfficientNet = require("efficientnet_lite_pytorch", f"building {name} in PyTorch").EfficientNet
    v = _variant(name)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = EfficientNet.from_name(v.package_name, drop_connect_rate=None)
    if weights_file:
        state = torch.load(str(weights_file), map_location="cpu", weights_only=True)
        model.load_state_dict(state, strict=True)
    return model.eval()


# ----------------------------------------------------------------------------- Keras

def build_keras(name: str, state_dict: Mapping[str, np.ndarray] | None = None) -> Any:
    """The same network as a functional ``keras.Model`` of standard layers (NHWC input, 1000 logits).

    ``state_dict`` maps PyTorch parameter names to numpy arrays (``_blocks.0._bn1.running_var``, ...);
    without it the layers keep Keras' random initialisation.
    """
    keras = require("keras", f"building {name} in Keras")
    layers = keras.layers
    v = _variant(name)
    size = v.image_size

    def n(module: str) -> str:
        return torch_to_keras_name(module)

    def conv(x, module: str, filters: int, kernel: int, stride: int, depthwise: bool = False):
        nonlocal size
        pad = same_padding(size, kernel, stride)
        if pad != (0, 0):
            x = layers.ZeroPadding2D((pad, pad), name=n(f"{module}.static_padding"))(x)
        if depthwise:
            x = layers.DepthwiseConv2D(kernel, strides=stride, padding="valid", use_bias=False, name=n(module))(x)
        else:
            x = layers.Conv2D(filters, kernel, strides=stride, padding="valid", use_bias=False, name=n(module))(x)
        size = math.ceil(size / stride)
        return x

    def bn(x, module: str):
        return layers.BatchNormalization(epsilon=BN_EPSILON, name=n(module))(x)

    inputs = keras.Input((size, size, 3), name=torch_to_keras_name(""))
    act = layers.ReLU(max_value=6.0, name=n("_swish"))  # one module, called after the stem and the head
    x = act(bn(conv(inputs, "_conv_stem", STEM_CHANNELS, 3, 2), "_bn0"))
    for i, b in enumerate(block_configs(name)):
        p = f"_blocks.{i}"
        block_act = layers.ReLU(max_value=6.0, name=n(f"{p}._swish"))
        shortcut = x
        hidden = b["cin"] * b["expand"]
        if b["expand"] != 1:
            x = block_act(bn(conv(x, f"{p}._expand_conv", hidden, 1, 1), f"{p}._bn0"))
        x = block_act(bn(conv(x, f"{p}._depthwise_conv", hidden, b["kernel"], b["stride"], depthwise=True), f"{p}._bn1"))
        x = bn(conv(x, f"{p}._project_conv", b["cout"], 1, 1), f"{p}._bn2")
        if b["stride"] == 1 and b["cin"] == b["cout"]:
            x = layers.Add(name=n(p))([x, shortcut])  # the block's output: x + inputs
    x = act(bn(conv(x, "_conv_head", HEAD_CHANNELS, 1, 1), "_bn1"))
    x = layers.GlobalAveragePooling2D(name=n("_avg_pooling"))(x)
    x = layers.Dropout(v.dropout, name=n("_dropout"))(x)
    outputs = layers.Dense(NUM_CLASSES, name=n("_fc"))(x)
    model = keras.Model(inputs, outputs, name=name)
    if state_dict is not None:
        port_torch_weights(model, state_dict)
    return model
