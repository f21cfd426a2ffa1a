"""ONNX graph -> Keras model of standard layers (so ``keras.models.load_model`` needs no custom objects).

A generic port, op by op, of the convolutional subset of ONNX (the per-op weight layouts are those of
:mod:`mlms_nb.zoo.keras_port`): Conv (grouped and depthwise), BatchNormalization, Relu, Clip(0, max), Sigmoid,
HardSigmoid, HardSwish, Tanh, Softmax, Add/Sub/Mul of two tensors, Add/Mul of a per-channel or scalar constant,
Concat, Pad, MaxPool, AveragePool, GlobalAveragePool, ReduceMean over H and W, Flatten, Reshape to (N, -1), Gemm
and MatMul with constant weights, Identity and Dropout. Feature maps are NHWC inside Keras (TensorFlow's CPU
convolutions need it): the model takes an NHWC input and returns what the ONNX graph returns. Only nodes the
outputs need as data are ported (the ``Shape``/``Gather``/``Concat`` chains that compute a ``Reshape`` target are
read through shape inference instead).

Layer names follow :mod:`mlms_nb.naming`, so the Keras copy lines up with the PyTorch module and the ONNX nodes
without a per-architecture table: the last node of each point ``(module, call)`` (:func:`~mlms_nb.frameworks.
onnxruntime.capture.onnx_key`) becomes the layer ``torch_to_keras_name(module)``, and a module's later calls reuse
that layer (a shared ``ReLU`` is one Keras layer called twice). Other nodes get names no module has
(``conv1__op3_Pad``). An op outside the subset raises :class:`UnsupportedOps` naming every such node.
"""
from __future__ import annotations

from typing import Collection

import numpy as np

from mlms_nb.errors import MlmsError
from mlms_nb.naming import onnx_node_to_torch_name, torch_to_keras_name


class UnsupportedOps(MlmsError):
    """The graph has nodes this port has no Keras equivalent for (named in the message)."""


def _attrs(node) -> dict:
    import onnx

    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def _point(node_name: str, module_names) -> tuple[str, int] | None:
    from mlms_nb.frameworks.onnxruntime.capture import onnx_key

    return onnx_key(node_name, module_names) if node_name.startswith("/") else None


def onnx_to_keras(model, input_shape: tuple[int, ...], module_names: Collection[str] | None = None, name: str = "model"):
    """A ``keras.Model`` computing ``model`` (an ``onnx.ModelProto``; one NCHW float input, batch dimension first).

    ``input_shape``: the input's shape without the batch (C, H, W); ``module_names``: the PyTorch model's module
    names when known (exact layer names; see :func:`mlms_nb.naming.onnx_node_to_torch_name`)."""
    import keras
    import onnx
    from onnx import numpy_helper

    module_names = set(module_names) if module_names is not None else _scopes(model)
    graph = model.graph
    consts = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    for node in graph.node:
        if node.op_type == "Constant":
            consts[node.output[0]] = numpy_helper.to_array(_attrs(node)["value"])
    inputs = [i for i in graph.input if i.name not in consts]
    if len(inputs) != 1:
        raise UnsupportedOps(f"the ONNX to Keras port takes graphs with one input, this one has {len(inputs)}")
    fixed = onnx.ModelProto()
    fixed.CopyFrom(model)
    dims = fixed.graph.input[[i.name for i in fixed.graph.input].index(inputs[0].name)].type.tensor_type.shape.dim
    for d, size in zip(dims, (1, *input_shape)):
        d.Clear()
        d.dim_value = int(size)
    inferred = onnx.shape_inference.infer_shapes(fixed, data_prop=True)
    shapes = {}
    for v in list(inferred.graph.value_info) + list(inferred.graph.output) + list(inferred.graph.input):
        t = v.type.tensor_type
        if t.HasField("shape"):
            shapes[v.name] = [d.dim_value if d.HasField("dim_value") else None for d in t.shape.dim]

    producer = {o: n for n in graph.node for o in n.output}
    needed, todo = [], [o.name for o in graph.output]
    seen = set()
    while todo:  # the nodes the outputs need as data, in graph order below
        t = todo.pop()
        node = producer.get(t)
        if node is None or node.name in seen or node.op_type == "Constant":
            continue
        seen.add(node.name)
        needed.append(node)
        data_inputs = node.input[:1] if node.op_type in ("Reshape", "Pad", "Clip", "Expand", "Tile") else node.input
        todo.extend(i for i in data_inputs if i and i not in consts)
    order = {id(n): i for i, n in enumerate(graph.node)}
    needed.sort(key=lambda n: order[id(n)])
    bad = [f"{n.name or '#' + str(order[id(n)])} ({n.op_type})" for n in needed if n.op_type not in _PORTS]
    if bad:
        raise UnsupportedOps(f"no Keras equivalent in the ONNX to Keras port for {len(bad)} node(s): "
                             f"{', '.join(bad[:12])}{' ...' if len(bad) > 12 else ''}")

    last_of_point = {}
    for node in needed:
        key = _point(node.name, module_names)
        if key is not None:
            last_of_point[key] = node.name
    layers: dict[str, object] = {}  # keras name -> layer (reused by the module's later calls)
    x_in = keras.Input(tuple(input_shape[1:]) + (input_shape[0],), name="input")
    values = {inputs[0].name: (x_in, True)}  # tensor -> (keras tensor, is NHWC)

    for index, node in enumerate(needed):
        key = _point(node.name, module_names)
        if key is not None and last_of_point.get(key) == node.name:
            layer_name = torch_to_keras_name(key[0])
        else:
            scope = onnx_node_to_torch_name(node.name, module_names) if node.name.startswith("/") else None
            layer_name = f"{torch_to_keras_name(scope) + '__' if scope else ''}op{order[id(node)]}_{node.op_type}"
        ctx = _Ctx(node, _attrs(node), consts, values, shapes, layers, layer_name, keras)
        ctx.producer = producer
        outs = _PORTS[node.op_type](ctx)
        for name, value in zip(node.output, outs if isinstance(outs, list) else [outs]):
            values[name] = value
    outputs = []
    for o in graph.output:
        tensor, nhwc = values[o.name]
        outputs.append(_to_nchw(keras, tensor, f"output_{len(outputs)}") if nhwc and len(tensor.shape) == 4 else tensor)
    return keras.Model(x_in, outputs if len(outputs) > 1 else outputs[0], name=name)


def _scopes(model) -> set[str]:
    """Module names read off the graph's own scoped node names (every prefix of every scope path)."""
    names = set()
    for node in model.graph.node:
        module = onnx_node_to_torch_name(node.name) if node.name.startswith("/") else None
        while module:
            names.add(module)
            module = module.rpartition(".")[0]
    return names


def _to_nchw(keras, tensor, name):
    return keras.layers.Permute((3, 1, 2), name=name)(tensor)


class _Ctx:
    """One node being ported: its attributes, inputs and the layer (shared by name) it becomes."""

    def __init__(self, node, attrs, consts, values, shapes, layers, name, keras):
        self.node, self.attrs, self.consts, self.values, self.shapes = node, attrs, consts, values, shapes
        self.layers, self.name, self.keras = layers, name, keras
        self.producer: dict = {}

    def x(self, i: int = 0):
        return self.values[self.node.input[i]]

    def const(self, i: int):
        name = self.node.input[i] if i < len(self.node.input) else ""
        return self.consts.get(name) if name else None

    def layer(self, make):
        """The layer named ``self.name``: built once (``make(name)``), reused by the module's later calls."""
        if self.name not in self.layers:
            self.layers[self.name] = make(self.name)
        return self.layers[self.name]

    def non_negative(self, tensor: str) -> bool:
        """Whether ``tensor`` is the output of an op whose outputs are never negative (ReLU, Clip(0, .), ...)."""
        node = self.producer.get(tensor)
        if node is None:
            return False
        if node.op_type in ("Relu", "Sigmoid", "HardSigmoid", "Softmax"):
            return True
        if node.op_type == "Clip" and len(node.input) > 1 and node.input[1] in self.consts:
            return float(np.asarray(self.consts[node.input[1]])) >= 0
        return False

    def fail(self, why: str):
        raise UnsupportedOps(f"node {self.node.name} ({self.node.op_type}): {why}")


def _spatial_pads(ctx, pads):
    if not pads or not any(pads):
        return None
    if len(pads) != 4:
        ctx.fail(f"pads {pads} are not 2-D")
    return ((pads[0], pads[2]), (pads[1], pads[3]))


def _conv(ctx):
    k = ctx.keras
    x, _ = ctx.x()
    w, b = ctx.const(1), ctx.const(2)
    a = ctx.attrs
    if w is None or w.ndim != 4:
        ctx.fail("only 2-D convolutions with constant weights are ported")
    if any(d != 1 for d in a.get("dilations", [1, 1])) and any(s != 1 for s in a.get("strides", [1, 1])):
        ctx.fail("dilation together with stride is not ported")
    pads = _spatial_pads(ctx, list(a.get("pads", [])))
    if a.get("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET"):
        ctx.fail("auto_pad is not ported (export with explicit pads)")
    if pads:
        pad_name = f"{ctx.name}__pad"
        if pad_name not in ctx.layers:
            ctx.layers[pad_name] = k.layers.ZeroPadding2D(pads, name=pad_name)
        x = ctx.layers[pad_name](x)
    groups, cout, cin_g = int(a.get("group", 1)), w.shape[0], w.shape[1]
    opts = dict(strides=tuple(a.get("strides", [1, 1])), dilation_rate=tuple(a.get("dilations", [1, 1])),
                padding="valid", use_bias=b is not None)
    if groups > 1 and cin_g == 1 and cout == groups:
        layer = ctx.layer(lambda n: k.layers.DepthwiseConv2D(tuple(w.shape[2:]), name=n, **opts))
        weights = [w.transpose(2, 3, 0, 1)]
    else:
        layer = ctx.layer(lambda n: k.layers.Conv2D(cout, tuple(w.shape[2:]), groups=groups, name=n, **opts))
        weights = [w.transpose(2, 3, 1, 0)]
    y = layer(x)
    layer.set_weights(weights + ([b] if b is not None else []))
    return y, True


def _batchnorm(ctx):
    scale, bias, mean, var = (ctx.const(i) for i in (1, 2, 3, 4))
    x, nhwc = ctx.x()
    layer = ctx.layer(lambda n: ctx.keras.layers.BatchNormalization(axis=-1 if nhwc else 1,
                                                                    epsilon=float(ctx.attrs.get("epsilon", 1e-5)),
                                                                    name=n))
    y = layer(x)
    layer.set_weights([scale, bias, mean, var])
    return y, nhwc


def _activation(kind):
    def port(ctx):
        x, nhwc = ctx.x()
        return ctx.layer(lambda n: ctx.keras.layers.Activation(kind, name=n))(x), nhwc
    return port


def _hard_sigmoid(ctx):
    if abs(float(ctx.attrs.get("alpha", 0.2)) - 1 / 6) > 1e-6 or abs(float(ctx.attrs.get("beta", 0.5)) - 0.5) > 1e-6:
        ctx.fail("only HardSigmoid(alpha=1/6, beta=0.5), PyTorch's, is ported")
    return _activation("hard_sigmoid")(ctx)


def _relu(ctx):
    x, nhwc = ctx.x()
    return ctx.layer(lambda n: ctx.keras.layers.ReLU(name=n))(x), nhwc


def _clip(ctx):
    lo = ctx.const(1) if len(ctx.node.input) > 1 else ctx.attrs.get("min")
    hi = ctx.const(2) if len(ctx.node.input) > 2 else ctx.attrs.get("max")
    if lo is None or float(np.asarray(lo)) != 0.0 or hi is None:
        ctx.fail("only Clip(0, max) (ReLU6-like) is ported")
    x, nhwc = ctx.x()
    return ctx.layer(lambda n: ctx.keras.layers.ReLU(max_value=float(np.asarray(hi)), name=n))(x), nhwc


def _binary(ctx):
    k, op = ctx.keras, ctx.node.op_type
    c0, c1 = ctx.const(0), ctx.const(1)
    if c0 is None and c1 is None:
        (a, na), (b, nb) = ctx.x(0), ctx.x(1)
        if na != nb:
            ctx.fail("mixes a feature map with a flat tensor")
        cls = {"Add": k.layers.Add, "Sub": k.layers.Subtract, "Mul": k.layers.Multiply}.get(op)
        if cls is None:
            ctx.fail("division of two tensors is not ported")
        return ctx.layer(lambda n: cls(name=n))([a, b]), na
    const, (x, nhwc) = (c1, ctx.x(0)) if c1 is not None else (c0, ctx.x(1))
    if op in ("Sub", "Div") and c1 is None:
        ctx.fail(f"{op} with a constant first operand is not ported")
    const = np.asarray(const, np.float32)
    channels = x.shape[-1] if nhwc else x.shape[1]
    if const.size not in (1, channels) or len(x.shape) != 4 or not nhwc:
        ctx.fail("only scalar or per-channel constants on feature maps are ported")
    per_channel = np.broadcast_to(const.reshape(-1), (channels,)).astype(np.float32)
    scale, shift = np.ones(channels, np.float32), np.zeros(channels, np.float32)
    if op == "Add":
        shift = per_channel
    elif op == "Sub":
        shift = -per_channel
    elif op == "Mul":
        scale = per_channel
    else:
        scale = 1.0 / per_channel
    layer = ctx.layer(lambda n: k.layers.DepthwiseConv2D(1, use_bias=True, name=n))  # y = x * scale + shift
    y = layer(x)
    layer.set_weights([scale.reshape(1, 1, channels, 1), shift])
    return y, True


def _concat(ctx):
    parts = [ctx.values[i] for i in ctx.node.input]
    nhwc = parts[0][1]
    axis = int(ctx.attrs.get("axis", 1))
    if nhwc:
        axis = {1: -1, -3: -1, 2: 1, 3: 2}.get(axis, axis)
    return ctx.layer(lambda n: ctx.keras.layers.Concatenate(axis=axis, name=n))([p[0] for p in parts]), nhwc


def _pad(ctx):
    pads, mode = ctx.const(1), ctx.attrs.get("mode", b"constant")
    value = ctx.const(2)
    if pads is None or mode not in (b"constant", "constant") or (value is not None and float(value) != 0):
        ctx.fail("only zero padding with constant pads is ported")
    pads = [int(p) for p in pads]
    if len(pads) != 8 or any(pads[i] for i in (0, 1, 4, 5)):
        ctx.fail(f"pads {pads} pad more than H and W")
    x, _ = ctx.x()
    return ctx.layer(lambda n: ctx.keras.layers.ZeroPadding2D(((pads[2], pads[6]), (pads[3], pads[7])), name=n))(x), True


def _pool(ctx):
    k, a, op = ctx.keras, ctx.attrs, ctx.node.op_type
    x, _ = ctx.x()
    kernel, strides = tuple(a["kernel_shape"]), tuple(a.get("strides", [1, 1]))
    pads = list(a.get("pads", [0, 0, 0, 0]))
    if a.get("ceil_mode", 0) or any(d != 1 for d in a.get("dilations", [1, 1])):
        ctx.fail("ceil_mode and dilations are not ported")
    padding = "valid"
    if any(pads):
        h, w = x.shape[1], x.shape[2]
        same = []
        for size, kk, s in ((h, kernel[0], strides[0]), (w, kernel[1], strides[1])):
            total = max((-(-size // s) - 1) * s + kk - size, 0)
            same += [total // 2, total - total // 2]
        if [pads[0], pads[2], pads[1], pads[3]] == same and not (op == "AveragePool" and a.get("count_include_pad", 0)):
            padding = "same"
        elif op == "MaxPool" and ctx.non_negative(ctx.node.input[0]):  # zero padding is exact for x >= 0
            pad_name = f"{ctx.name}__pad"
            if pad_name not in ctx.layers:
                ctx.layers[pad_name] = k.layers.ZeroPadding2D(((pads[0], pads[2]), (pads[1], pads[3])), name=pad_name)
            x = ctx.layers[pad_name](x)
        else:
            ctx.fail(f"pads {pads} differ from TensorFlow's 'same' padding and the input may be negative")
    cls = k.layers.MaxPooling2D if op == "MaxPool" else k.layers.AveragePooling2D
    return ctx.layer(lambda n: cls(kernel, strides, padding=padding, name=n))(x), True


def _global_pool(ctx):
    x, nhwc = ctx.x()
    if ctx.node.op_type == "ReduceMean":
        axes = ctx.const(1) if len(ctx.node.input) > 1 else ctx.attrs.get("axes")
        if axes is None or sorted(int(v) % 4 for v in axes) != [2, 3] or not nhwc:
            ctx.fail("only a mean over H and W is ported")
        keep = bool(ctx.attrs.get("keepdims", 1))
    else:
        keep = True
    y = ctx.layer(lambda n: ctx.keras.layers.GlobalAveragePooling2D(keepdims=keep, name=n))(x)
    return y, keep


def _flatten(ctx):
    x, nhwc = ctx.x()
    out = ctx.shapes.get(ctx.node.output[0])
    if ctx.node.op_type == "Reshape" and (out is None or len(out) != 2):
        ctx.fail(f"only a Reshape to (batch, features) is ported (output shape {out})")
    if ctx.node.op_type == "Flatten" and int(ctx.attrs.get("axis", 1)) != 1:
        ctx.fail("only Flatten(axis=1) is ported")
    if nhwc and len(x.shape) == 4 and (x.shape[1] != 1 or x.shape[2] != 1):
        x = _to_nchw(ctx.keras, x, f"{ctx.name}__nchw")
    return ctx.layer(lambda n: ctx.keras.layers.Flatten(name=n))(x), False


def _dense(ctx):
    x, nhwc = ctx.x()
    w, b = ctx.const(1), ctx.const(2)
    a = ctx.attrs
    if w is None or nhwc or len(x.shape) != 2:
        ctx.fail("only (batch, features) x constant weights is ported")
    if ctx.node.op_type == "Gemm":
        if a.get("transA", 0) or float(a.get("alpha", 1.0)) != 1.0 or float(a.get("beta", 1.0)) != 1.0:
            ctx.fail("only Gemm with transA=0, alpha=beta=1 is ported")
        w = w.T if a.get("transB", 0) else w
    else:
        b = None
    layer = ctx.layer(lambda n: ctx.keras.layers.Dense(w.shape[1], use_bias=b is not None, name=n))
    y = layer(x)
    layer.set_weights([w] + ([np.broadcast_to(b, (w.shape[1],))] if b is not None else []))
    return y, False


def _softmax(ctx):
    x, nhwc = ctx.x()
    if nhwc or int(ctx.attrs.get("axis", -1)) not in (-1, len(x.shape) - 1):
        ctx.fail("only a softmax over the last axis of a flat tensor is ported")
    return ctx.layer(lambda n: ctx.keras.layers.Softmax(name=n))(x), False


def _identity(ctx):
    return ctx.x()


_PORTS = {
    "Conv": _conv, "BatchNormalization": _batchnorm, "Relu": _relu, "Clip": _clip,
    "Sigmoid": _activation("sigmoid"), "Tanh": _activation("tanh"), "HardSigmoid": _hard_sigmoid,
    "HardSwish": _activation("hard_silu"), "Add": _binary, "Sub": _binary, "Mul": _binary, "Div": _binary,
    "Concat": _concat, "Pad": _pad, "MaxPool": _pool, "AveragePool": _pool, "GlobalAveragePool": _global_pool,
    "ReduceMean": _global_pool, "Flatten": _flatten, "Reshape": _flatten, "Gemm": _dense, "MatMul": _dense,
    "Softmax": _softmax, "Identity": _identity, "Dropout": _identity,
}
