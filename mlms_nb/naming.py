"""Layer names shared between a PyTorch module and its Keras / ONNX copies (bottom layer: imports no framework).

Naming rules (so a layer or node in any framework maps back to one PyTorch module):

- Keras: a layer is named after the PyTorch module's qualified name with every ``.`` replaced by
  ``__`` (``_blocks.3._depthwise_conv`` -> ``_blocks__3___depthwise_conv``). The rule is reversed by
  replacing ``__`` with ``.`` from the left, which is exact as long as no name component contains
  ``__`` or ends with ``_`` (true for every architecture in this package). The Keras input layer,
  named ``input``, maps to ``""``: the root module, whose input it is. Layers with no module of their
  own take the name of the module whose output they produce (a residual ``Add`` is named after its
  block, ``_blocks__3``); a module called several times (a shared ``ReLU6``) is one shared Keras layer.
- ONNX (TorchScript exporter, ``dynamo=False``): nodes are named ``/<scope>/<scope>/<OpType>[_N]``, one
  scope per module call on the path from the root. A scope is the module's attribute name (``conv1``),
  or for a child of a container ``<container>.<index>`` (``layer1.0``, ``_blocks.0``, ``downsample.0``);
  the N-th extra call of the same module appends ``_N`` (``relu_2``). :func:`onnx_node_to_torch_name`
  rebuilds the qualified name (``/layer1/layer1.0/relu_2/Relu`` -> ``layer1.0.relu``,
  ``/_blocks.0/_depthwise_conv/Conv`` -> ``_blocks.0._depthwise_conv``); a node directly under the root
  (``/Reshape``) maps to ``""``; a node without a scope (``Constant_7``) maps to ``None``. Passing the
  model's module names makes it exact; without them a trailing ``_<digits>`` of a scope is always read
  as a call count. The exporter folds each eval-mode BatchNorm into the preceding Conv, so BatchNorm
  modules have no node of their own. A layer span of a node (:func:`onnx_layer_name`) takes its module's
  name; a node under the root, which only the whole model owns (``/Add``, ``/Flatten``), or one without a
  scope takes its own ONNX name without the ``/`` (``Add``): never a blank name.
"""
from __future__ import annotations

import re
from typing import Collection


KERAS_INPUT_NAME = "input"
_SEP = "__"
_CALL_SUFFIX = re.compile(r"^(.+)_(\d+)$")  # "relu_2": the 3rd call of "relu"


def torch_to_keras_name(module_name: str) -> str:
    """``_blocks.3._bn1`` -> ``_blocks__3___bn1``; the root module ``""`` -> ``input``."""
    return module_name.replace(".", _SEP) if module_name else KERAS_INPUT_NAME


def keras_layer_to_torch_name(layer_name: str) -> str:
    """The PyTorch module a Keras layer came from: ``_blocks__3___bn1`` -> ``_blocks.3._bn1``; ``input`` -> ``""``."""
    if layer_name == KERAS_INPUT_NAME:
        return ""
    return layer_name.replace(_SEP, ".")


def onnx_node_to_torch_name(node_name: str, module_names: Collection[str] | None = None) -> str | None:
    """The PyTorch module an ONNX node was exported from (``/layer1/layer1.0/relu_2/Relu`` -> ``layer1.0.relu``).

    ``""`` is the root module; ``None`` means the node has no scope. With ``module_names``
    (``dict(model.named_modules())``), a scope such as ``conv_1`` is kept when it is a real module name.
    """
    if not node_name.startswith("/"):
        return None
    parts: list[str] = []
    for scope in node_name[1:].split("/")[:-1]:
        candidates = [scope]
        called = _CALL_SUFFIX.match(scope)
        if called:
            candidates = [called.group(1)] if module_names is None else [scope, called.group(1)]
        for candidate in candidates:
            head, dot, index = candidate.partition(".")
            if dot and parts and parts[-1] == head:  # "layer1.0" under "layer1": the container was called
                extended = parts + index.split(".")
            else:  # "_blocks.0" under the root: the container was only iterated
                extended = parts + candidate.split(".")
            if module_names is None or ".".join(extended) in module_names or candidate is candidates[-1]:
                parts = extended
                break
    return ".".join(parts)


def onnx_layer_name(node_name: str, op_type: str = "", module_names: Collection[str] | None = None) -> str:
    """The name a layer (span) of ONNX node ``node_name`` goes by: the PyTorch module it was exported from
    (:func:`onnx_node_to_torch_name`); for a node directly under the root (``/Add`` -> ``Add``) or without a scope
    (``Constant_7``), its own name without the leading ``/``; for an unnamed node, its ``op_type``."""
    module = onnx_node_to_torch_name(node_name, module_names)
    return module or node_name.lstrip("/") or op_type
