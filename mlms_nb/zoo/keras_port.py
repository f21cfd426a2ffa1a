"""Port a PyTorch state dict into a Keras model whose layers follow :mod:`mlms_nb.naming`'s rule."""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from mlms_nb.naming import keras_layer_to_torch_name


def port_torch_weights(keras_model: Any, state_dict: Mapping[str, np.ndarray]) -> None:
    """Copy a PyTorch state dict (numpy arrays) into a Keras model whose layers follow the naming rule.

    Layouts: Conv2D kernel OIHW -> HWIO; DepthwiseConv2D (C, 1, kh, kw) -> (kh, kw, C, 1); BatchNormalization
    [gamma, beta, moving_mean, moving_variance] <- [weight, bias, running_mean, running_var]; Dense (out, in) -> (in, out).
    Raises ``ValueError`` naming the keys when the state dict and the model do not match one to one.
    """
    from keras import layers

    used: set[str] = set()

    def take(key: str) -> np.ndarray:
        if key not in state_dict:
            raise ValueError(f"state dict has no {key!r} for Keras layer {layer.name!r}")
        used.add(key)
        return np.asarray(state_dict[key], dtype=np.float32)

    for layer in keras_model.layers:
        if not layer.weights:
            continue
        t = keras_layer_to_torch_name(layer.name)
        if isinstance(layer, layers.DepthwiseConv2D):
            values = [take(f"{t}.weight").transpose(2, 3, 0, 1)]
        elif isinstance(layer, layers.Conv2D):
            values = [take(f"{t}.weight").transpose(2, 3, 1, 0)]
        elif isinstance(layer, layers.BatchNormalization):
            values = [take(f"{t}.{k}") for k in ("weight", "bias", "running_mean", "running_var")]
        elif isinstance(layer, layers.Dense):
            values = [take(f"{t}.weight").T]
        else:
            raise ValueError(f"no weight port for Keras layer {layer.name!r} ({type(layer).__name__})")
        if getattr(layer, "use_bias", False) and not isinstance(layer, layers.BatchNormalization):
            values.append(take(f"{t}.bias"))
        layer.set_weights(values)
    unused = sorted(k for k in state_dict if k not in used and not k.endswith("num_batches_tracked"))
    if unused:
        raise ValueError(f"state dict keys with no Keras layer: {', '.join(unused[:8])}{' ...' if len(unused) > 8 else ''}")
