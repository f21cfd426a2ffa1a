"""Per-layer outputs of a Keras model: a second ``keras.Model`` over the same layers whose outputs are every layer
call's output. Layer ``L``'s k-th call is point ``(keras_layer_to_torch_name(L), k)``
(:mod:`mlms_nb.frameworks.capture`); NHWC outputs are transposed to NCHW.

``rekey`` (conv point -> the BatchNorm point after it): a model ported from ONNX has no BatchNorm layers (the
exporter folded them into the convolutions), so its convolution's output stands for the BatchNorm's point, as in
ONNX; a model with BatchNorm layers of its own already has that point and is left as it is."""
from __future__ import annotations

from typing import Any, Collection, Mapping

import keras
import numpy as np

from mlms_nb.frameworks.capture import Key, LayerCapture, calls_in_order
from mlms_nb.naming import keras_layer_to_torch_name


class KerasCapture(LayerCapture):
    """A ``keras.Model`` with the outputs of every layer call (see the module docstring)."""

    def __init__(self, model: Any, label: str = "tensorflow", rekey: Mapping[Key, Key] | None = None):
        self.framework = label
        self.model = model
        outputs, keys = [], []
        for layer in model.layers:
            if isinstance(layer, keras.layers.InputLayer):
                continue
            name = keras_layer_to_torch_name(layer.name)
            for k, node in enumerate(layer._inbound_nodes):
                outputs.append(node.output_tensors[0])
                keys.append((name, k))
        if rekey:
            own = set(keys)
            keys = [rekey[k] if k in rekey and rekey[k] not in own else k for k in keys]
        self._keys = keys
        self.keys = set(keys)
        inputs = model.inputs[0] if len(model.inputs) == 1 else model.inputs  # called with one array, as declared
        self._capture = keras.Model(inputs, [model.outputs[0], *outputs])

    def run(self, x: np.ndarray, wanted: Collection[Key]) -> tuple[dict[Key, np.ndarray], np.ndarray]:
        wanted = set(wanted)
        values = self._capture(np.ascontiguousarray(x.transpose(0, 2, 3, 1)), training=False)
        outs = {}
        for key, v in zip(self._keys, values[1:]):
            if key in wanted:
                v = np.asarray(v)
                outs[key] = v.transpose(0, 3, 1, 2) if v.ndim == 4 else v
        return outs, np.asarray(values[0])

    def layer_keys(self, layers) -> list[Key | None]:
        """Layer spans are named after the PyTorch module of their Keras layer (:mod:`.xplane`), one per call in
        execution order (a call fused into another has a zero-length span of its own): the k-th span of a name in
        a predict call is that layer's k-th call."""
        return calls_in_order(layers, layers["name"].astype(str))

    def close(self) -> None:
        self.model = self._capture = None
