"""Per-layer outputs of an ONNX graph: its intermediate tensors added as graph outputs.

Points (:mod:`mlms_nb.frameworks.capture`): node ``/scope/.../Op`` is point ``(onnx_node_to_torch_name(node), k)``
where ``k`` is the ``_N`` call suffix of its last scope (:func:`onnx_key`); a point's tensor is the output of its
last node in graph order.

- fp32 graph: one output per point; a point may be re-keyed (``rekey``): the exporter folds an eval-mode
  BatchNorm into the Conv before it, so that Conv's output stands for the BatchNorm's point.
- QDQ int8 graph (``fp32_path`` given: the graph it was quantized from): the outputs of the ``QuantizeLinear``
  nodes of fp32 tensors, dequantized here with their own scale and zero point; a quantized tensor takes the
  point of the node that produced that tensor *in the fp32 graph* (QDQ keeps the tensor names, but the quantizer
  merges some nodes: a Conv's int8 output may be the quantized output of the ReLU6 that followed it).
"""
from __future__ import annotations

import re
from typing import Collection, Mapping

import numpy as np
import onnx
import onnxruntime as ort
from onnx import numpy_helper

from mlms_nb.frameworks.capture import Key, LayerCapture
from mlms_nb.naming import onnx_node_to_torch_name
from mlms_nb.schema.trace import attrs_dict

_CALL_SUFFIX = re.compile(r"^(.+)_(\d+)$")


def onnx_key(node_name: str, module_names: Collection[str]) -> Key | None:
    """The point an ONNX node (or a name built from one, such as an ONNX Runtime profile's node name) belongs to;
    None outside any module (``Constant_7``, ``input_QuantizeLinear``) or directly under the root (``/Reshape``)."""
    module = onnx_node_to_torch_name(node_name, module_names)
    if not module:
        return None
    scopes = node_name[1:].split("/")[:-1]
    last_scope, last_name = scopes[-1], module.rsplit(".", 1)[-1]
    call = 0
    m = _CALL_SUFFIX.match(last_scope)
    if m and last_scope != last_name and m.group(1).endswith(last_name):
        call = int(m.group(2))
    return (module, call)


class OnnxCapture(LayerCapture):
    """An ONNX model (fp32, or QDQ int8) with its per-point tensors added as graph outputs (see the module doc)."""

    def __init__(self, path: str, module_names: Collection[str], rekey: Mapping[Key, Key] | None = None,
                 label: str = "onnxruntime", fp32_path: str | None = None):
        self.framework = label
        self.path = str(path)
        self.module_names = set(module_names)
        rekey = rekey or {}
        model = onnx.load(self.path)
        graph = model.graph
        existing = {o.name for o in graph.output}
        self._tensor_of: dict[Key, str] = {}
        self._dequant: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        if fp32_path is not None:
            types = self._quantized_points(graph, onnx.load(str(fp32_path), load_external_data=False).graph, rekey)
        else:
            typed = onnx.shape_inference.infer_shapes(model)
            elem = {v.name: v.type.tensor_type.elem_type
                    for v in list(typed.graph.value_info) + list(typed.graph.output)}
            for node in graph.node:
                key = onnx_key(node.name, self.module_names)
                if key is None or not node.output or elem.get(node.output[0]) != onnx.TensorProto.FLOAT:
                    continue
                self._tensor_of[rekey.get(key, key)] = node.output[0]  # the last node of the point wins
            types = dict.fromkeys(self._tensor_of.values(), onnx.TensorProto.FLOAT)
        for name in self._tensor_of.values():
            if name not in existing:
                graph.output.append(onnx.helper.make_tensor_value_info(name, types[name], None))
        self.keys = set(self._tensor_of)
        self._logits = graph.output[0].name
        self._input = graph.input[0].name
        self._session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        self._names = [o.name for o in self._session.get_outputs()]

    def _quantized_points(self, graph, fp32_graph, rekey: Mapping[Key, Key]) -> dict[str, int]:
        """Point -> QuantizeLinear output of the fp32 tensor of that point; returns each output's element type."""
        producer = {node.output[0]: node.name for node in fp32_graph.node if node.output}
        inits = {t.name: t for t in graph.initializer}
        types = {}
        for node in graph.node:
            source = producer.get(node.input[0]) if node.op_type == "QuantizeLinear" else None
            key = onnx_key(source, self.module_names) if source else None
            if key is None:
                continue
            key = rekey.get(key, key)
            if key in self._tensor_of:
                continue
            scale = numpy_helper.to_array(inits[node.input[1]]).astype(np.float32)
            has_zero = len(node.input) > 2 and node.input[2]
            zero = numpy_helper.to_array(inits[node.input[2]]) if has_zero else np.array(0)
            self._tensor_of[key] = node.output[0]
            self._dequant[node.output[0]] = (scale, zero.astype(np.int32))
            # the Q node's output type is its zero point's (uint8 when it has none)
            types[node.output[0]] = inits[node.input[2]].data_type if has_zero else onnx.TensorProto.UINT8
        return types

    def run(self, x: np.ndarray, wanted: Collection[Key]) -> tuple[dict[Key, np.ndarray], np.ndarray]:
        values = dict(zip(self._names, self._session.run(None, {self._input: np.ascontiguousarray(x, np.float32)})))
        outs = {}
        for key in wanted:
            name = self._tensor_of.get(key)
            if name is None:
                continue
            v = values[name]
            if name in self._dequant:
                scale, zero = self._dequant[name]
                v = (v.astype(np.int32) - zero).astype(np.float32) * scale
            outs[key] = v
        return outs, values[self._logits]

    def layer_keys(self, layers) -> list[Key | None]:
        """Layer spans carry the ONNX node they timed (``attrs["onnx_node"]``, :mod:`.profile`); nodes of the
        optimized graph keep the scope of a node they replace, so :func:`onnx_key` applies to them too."""
        return [onnx_key(str(attrs_dict(a).get("onnx_node", "")), self.module_names) for a in layers["attrs"]]

    def close(self) -> None:
        self._session = None
