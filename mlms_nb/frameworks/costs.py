"""Theoretical per-layer costs of a model named by its manifest, in the framework it would run in.

- ``torch``: the manifest's architecture built as an eager module, run once on zeros of the manifest's
  input shape (costs depend on the architecture and shapes, not on the weights, so random weights do);
- ``onnxruntime``: the graph the ONNX Runtime manifest points at (``artifact://`` graphs are converted
  once and cached), costed node by node; ``torch_name`` maps each node back to its PyTorch module;
- ``tensorflow``: the Keras copy is the same architecture with ported weights and one Keras layer per
  PyTorch module (``naming.torch_to_keras_name``), so its costs are the PyTorch costs with a
  ``keras_name`` column; ``attrs["note"]`` says so.
"""
from __future__ import annotations

import pandas as pd

from mlms_nb.data.feeds import with_batch
from mlms_nb.errors import MlmsError
from mlms_nb.manifest import FRAMEWORKS, Manifest, canonical_framework, find_manifest


def _architecture(m: Manifest) -> str:
    if not m.model.architecture:
        raise MlmsError(f"manifest {m.key} names no built-in architecture (model.architecture); theoretical "
                        "costs need an eager PyTorch module or an ONNX graph")
    return m.model.architecture


def _static(m, shapes) -> None:
    """Theoretical costs are counted at one shape: every input's dimensions must be numbers, or given."""
    dynamic = [spec.name or f"inputs[{i}]" for i, spec in enumerate(m.inputs) if spec.dynamic]
    if dynamic and not shapes:
        raise MlmsError(f"manifest {m.key}: theoretical costs are counted at one input shape, but "
                        f"{', '.join(dynamic)} has dynamic dimensions; use a manifest with every size given, or "
                        "count them at a traced call's shapes (the roofline of a traced run does)")


def _nchw_dims(m: Manifest) -> list:
    spec = m.inputs[0]
    if spec.layout == "NCHW":
        return list(spec.dimensions)
    if spec.layout == "NHWC" and len(spec.dimensions or ()) == 3:  # a Keras copy of a PyTorch architecture
        h, w, c = spec.dimensions
        return [c, h, w]
    raise MlmsError(f"manifest {m.key}: expected an NCHW (or NHWC) image input to count PyTorch costs, got "
                    f"{spec.layout}")


def _torch_costs(m: Manifest, batch_size: int, shape: list[int] | None = None) -> pd.DataFrame:
    """Costs of the manifest's architecture as an eager module, at ``shape`` (the whole NCHW input shape, batch
    included) or the manifest's dimensions."""
    import torch

    from mlms_nb.zoo.registry import build_torch_model
    from mlms_nb.frameworks.torch.costs import torch_layer_costs

    _static(m, shape)
    full = list(shape) if shape else [batch_size, *_nchw_dims(m)]
    model = build_torch_model(_architecture(m))
    frame = torch_layer_costs(model, torch.zeros(*full))
    frame.attrs.update(model=m.name, model_version=m.version, batch_size=batch_size, input_shape=full,
                       note="eager PyTorch module of the manifest's architecture (costs do not depend on weights)"
                       + (f", at the traced input shape {full}" if shape else ""))
    return frame


def _onnx_costs(m: Manifest, batch_size: int, graph: str | None = None,
                shapes: dict[str, list[int]] | None = None) -> pd.DataFrame:
    """Costs of the ONNX graph ``graph`` (default: the manifest's graph_path), at ``shapes`` (graph input name ->
    whole shape, batch included) or the manifest's dimensions."""
    from pathlib import Path

    from mlms_nb.data.assets import resolve_asset
    from mlms_nb.frameworks.onnxruntime.costs import load_onnx_model, onnx_node_costs

    _static(m, shapes)
    if graph is not None:
        path = Path(graph)
        if not path.is_file():
            raise MlmsError(f"the ONNX graph the run used, {path}, is no longer there: its costs cannot be counted")
    else:
        if not m.model.graph_path:
            raise MlmsError(f"manifest {m.key} has no model.graph_path (an ONNX file) to cost")
        base = Path(m.source).parent if m.source else None
        path = resolve_asset(m.model.graph_path, sha256=m.model.sha256.get("graph_path"), base_dir=base)
    proto = load_onnx_model(path)
    initializers = {t.name for t in proto.graph.initializer}
    graph_inputs = [i.name for i in proto.graph.input if i.name not in initializers]
    if len(graph_inputs) != len(m.inputs):
        raise MlmsError(f"{path} has {len(graph_inputs)} inputs but manifest {m.key} describes {len(m.inputs)}")
    if not shapes:
        shapes = {n: list(with_batch(spec, spec.dimensions, batch_size)) for n, spec in zip(graph_inputs, m.inputs)}
    module_names = None
    if m.model.architecture:
        from mlms_nb.zoo.registry import build_torch_model

        module_names = dict(build_torch_model(m.model.architecture).named_modules())
    frame = onnx_node_costs(proto, shapes, module_names=module_names)
    frame.attrs.update(model=m.name, model_version=m.version, batch_size=batch_size, input_shapes=shapes,
                       note=f"ONNX graph {path.name} of manifest {m.key}, shapes from ONNX shape inference"
                       f" from the inputs {shapes}")
    return frame


def manifest_costs(m: Manifest, framework: str, batch_size: int, *, graph: str | None = None,
                   input_shapes: dict[str, list[int]] | None = None) -> pd.DataFrame:
    """Per-layer costs of the model a manifest describes (as :func:`model_costs`), for ``framework``: of the ONNX
    file ``graph`` when given (the artifact a run used), at ``input_shapes`` (input name -> whole shape, batch
    included; the traced shapes of a manifest with dynamic sizes) when given."""
    fw = canonical_framework(str(framework))
    if fw == "onnxruntime":
        return _onnx_costs(m, batch_size, graph, input_shapes)
    shape = next(iter(input_shapes.values())) if input_shapes else None
    if fw == "tensorflow":
        from mlms_nb.naming import torch_to_keras_name
        from mlms_nb.zoo.registry import get_architecture

        if get_architecture(_architecture(m)).build_keras is None:
            raise MlmsError(f"manifest {m.key}: architecture {m.model.architecture!r} has no Keras definition")
        if shape is not None and m.inputs[0].layout == "NHWC":
            shape = [shape[0], shape[3], shape[1], shape[2]]
        frame = _torch_costs(m, batch_size, shape)
        frame.insert(frame.columns.get_loc("layer_name") + 1, "keras_name",
                     [torch_to_keras_name(n) for n in frame["layer_name"]])
        frame.attrs.update(framework="tensorflow", note=(
            "PyTorch costs reused: the Keras copy is the same architecture with the PyTorch weights ported, one "
            "Keras layer per PyTorch module (keras_name = naming.torch_to_keras_name(layer_name)); Keras pads "
            "with ZeroPadding2D layers and adds residuals with Add layers named after their block, as here"))
        return frame
    return _torch_costs(m, batch_size, shape)


def model_costs(model: str, framework: str = "torch", batch_size: int = 1) -> pd.DataFrame:
    """Per-layer FLOPs, parameters, bytes and intensity of a manifest's model (see ``attrs["convention"]``).

    ``framework``: ``torch`` (one row per layer call), ``onnxruntime`` (one row per ONNX node) or
    ``tensorflow`` (the PyTorch rows plus ``keras_name``: the Keras copy is the same network).
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise MlmsError(f"batch_size: expected an integer >= 1, got {batch_size!r}")
    fw = canonical_framework(str(framework))
    if fw not in FRAMEWORKS:
        raise MlmsError(f"framework {framework!r} is not one of {', '.join(FRAMEWORKS)}")
    return manifest_costs(find_manifest(model, framework=fw), fw, batch_size)
