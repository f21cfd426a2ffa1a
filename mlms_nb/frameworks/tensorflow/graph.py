"""What a profile import needs to know of a Keras model and of the graphs its ``tf.function`` traced
(:class:`~mlms_nb.frameworks.tensorflow.xplane.ModelGraph`), read from the live TensorFlow objects.

The graphs are the ones the function traced, before grappler optimizes them: each layer call is a name scope
there (``<model>_1/<layer>_<n>``), so they list every layer call the model makes, whatever the optimizer later
fuses. An op is on the *data path* when it is reachable from the function's non-resource inputs; the others
(variable reads, arithmetic on weights alone) are *weights-only*.
"""
from __future__ import annotations

from typing import Any

import tensorflow as tf

from mlms_nb.frameworks.tensorflow.xplane import ModelGraph, scope_layer


def data_path_ops(graph) -> set[str]:
    """Names of the ops of a ``tf.Graph`` reachable from its non-resource inputs (the function's data)."""
    data = [t.op for t in getattr(graph, "inputs", []) if t.dtype != tf.resource]
    seen = {op.name for op in data}
    stack = list(data)
    while stack:
        op = stack.pop()
        for out in op.outputs:
            for consumer in out.consumers():
                if consumer.name not in seen:
                    seen.add(consumer.name)
                    stack.append(consumer)
    return seen


def layer_types(model: Any) -> dict[str, str]:
    """Keras layer name -> class name, nested layers included."""
    flatten = getattr(model, "_flatten_layers", None)
    layers = flatten(include_self=False, recursive=True) if flatten else model.layers
    return {layer.name: type(layer).__name__ for layer in layers}


def model_graph(model: Any, function: Any) -> ModelGraph:
    """The :class:`ModelGraph` of a Keras ``model`` (None for a model without Keras layers) and the
    ``tf.function`` that runs it, over every graph the function has traced (its concrete functions)."""
    listing = getattr(function, "_list_all_concrete_functions", None)
    graphs = [concrete.graph for concrete in listing()] if listing is not None else []
    info = ModelGraph()
    if model is not None:
        info.layer_types = layer_types(model)
        info.model_name = getattr(model, "name", "")
    layers = set(info.layer_types)
    consumers: dict[str, dict[str, None]] = {}
    calls: dict[str, None] = {}
    for graph in graphs:
        data = data_path_ops(graph)
        info.weights_only |= {op.name for op in graph.get_operations() if op.name not in data}
        if not layers:
            continue
        for op in graph.get_operations():  # creation order: a topological order of the graph
            if op.name not in data:
                continue
            found = scope_layer(op.name, layers, info.model_name)
            if found is None:
                continue
            calls.setdefault(found[1])
            for out in op.outputs:
                for consumer in out.consumers():
                    to = scope_layer(consumer.name, layers, info.model_name) if consumer.name in data else None
                    if to is not None and to[1] != found[1]:
                        consumers.setdefault(found[1], {}).setdefault(to[1])
    info.calls = list(calls)
    info.consumers = {scope: list(to) for scope, to in consumers.items()}
    return info
