"""The roofline of one evaluated run: its costs, its ceilings and what the honesty check needs, per framework.

- Costs come from the run itself: the manifest it recorded and the artifact it ran (the ONNX file of its
  predictor), never a catalog lookup by the model's name -- so a run evaluated by manifest path has a roofline.
  A manifest with dynamic sizes is costed at the concrete input shapes of its traced calls (one shape per batch
  size; calls of different shapes at one batch size are refused, since their layer times are pooled).
- Ceilings: this machine's, measured with that framework's own kernels at the run's thread count
  (:func:`mlms_nb.theory.ceilings.machine_ceilings`, cached in the store the caller passes).
- The check (:class:`mlms_nb.analyses.roofline.RoofContext`, :meth:`Ceilings.roof_context`): the ceilings' spread,
  the last-level cache, the threads on both sides, whether the machine was busy while they were measured and, per
  traced layer, why its span may not hold its work (ONNX Runtime nodes standing
  for several fused original nodes; Keras layers whose work is fused into another's).
"""
from __future__ import annotations

import json

import pandas as pd

from mlms_nb.analyses import layers as _layers
from mlms_nb.analyses import roofline as _roofline
from mlms_nb.errors import MlmsError
from mlms_nb.frameworks.costs import manifest_costs
from mlms_nb.manifest import Manifest, parse_manifest
from mlms_nb.theory.ceilings import Ceilings, CeilingsCache, machine_ceilings


def _attrs(text) -> dict:
    if isinstance(text, dict):
        return text
    try:
        return json.loads(text) if isinstance(text, str) and text else {}
    except ValueError:
        return {}


def run_manifest(evaluation, framework: str) -> Manifest:
    """The manifest ``framework`` ran with, as the run recorded it."""
    data = (evaluation.manifests or {}).get(framework)
    if not data:
        raise MlmsError(f"run {evaluation.id} recorded no manifest for {framework}: its costs cannot be counted")
    return parse_manifest(data)


def _predictor(evaluation, framework: str) -> dict:
    return ((evaluation.options or {}).get("predictors") or {}).get(framework) or {}


def run_threads(evaluation, framework: str) -> int | None:
    """The intra-op threads ``framework`` ran with (None: the framework's default)."""
    threads = _predictor(evaluation, framework).get("threads") or (evaluation.options or {}).get("threads")
    return int(threads) if threads else None


def _first_calls(spans: pd.DataFrame, batch_size: int) -> list[pd.DataFrame]:
    """The layer spans of every traced predict call at ``batch_size``, each in execution order."""
    predicts = spans[(spans["kind"] == "model") & (spans["name"] == "predict")]
    out = []
    for span_id, attrs in zip(predicts["span_id"], predicts["attrs"]):
        if int(_attrs(attrs).get("batch", -1)) == int(batch_size):
            layers = spans[(spans["kind"] == "layer") & (spans["parent_id"] == span_id)]
            out.append(layers.sort_values("layer_index", kind="stable"))
    return out


def _shape_list(text) -> list:
    try:
        value = json.loads(text) if isinstance(text, str) and text else []
    except ValueError:
        return []
    return value if isinstance(value, list) else []


def _matches(shape, declared) -> bool:
    return (isinstance(shape, list) and len(shape) == len(declared)
            and all(isinstance(d, int) for d in shape)
            and all(not isinstance(want, int) or want == got for want, got in zip(declared, shape)))


def traced_input_shapes(spans: pd.DataFrame, batch_size: int, declared: dict[str, list]) -> dict[str, list[int]]:
    """Each input's concrete shape in the traced calls at ``batch_size``: the first layer input (in execution
    order) whose rank and fixed sizes fit the input's declared shape (``declared``: name -> whole shape, batch
    included, symbols/None where dynamic). Every traced call must agree."""
    calls = _first_calls(spans, batch_size)
    if not calls:
        raise MlmsError(f"the manifest has dynamic sizes and no traced call at batch size {batch_size} says which "
                        "shapes ran: evaluate with a trace (trace_level FRAMEWORK) to get its roofline")
    seen: dict[str, set] = {name: set() for name in declared}
    for layers in calls:
        for name, want in declared.items():
            found = next((s for text in layers["shape"] for s in _shape_list(text) if _matches(s, want)), None)
            if found is None:
                raise MlmsError(f"no traced layer at batch size {batch_size} reads an input shaped like {name!r} "
                                f"{want}: the shapes of its calls are unknown, so its costs cannot be counted")
            seen[name].add(tuple(found))
    several = {n: sorted(s) for n, s in seen.items() if len(s) > 1}
    if several:
        raise MlmsError(f"the traced calls at batch size {batch_size} ran different input shapes ({several}); a "
                        "roofline pools their layer times, so it needs one shape per batch size: trace inputs of "
                        "one size")
    return {n: list(next(iter(s))) for n, s in seen.items()}


def _declared(m: Manifest, framework: str, graph: str | None, batch_size: int) -> dict[str, list]:
    from mlms_nb.data.feeds import with_batch

    names = [spec.name or f"input{i}" for i, spec in enumerate(m.inputs)]
    if framework == "onnxruntime" and graph:
        from mlms_nb._optional import require

        proto = require("onnx", "counting ONNX costs").load(graph, load_external_data=False)
        initializers = {t.name for t in proto.graph.initializer}
        names = [i.name for i in proto.graph.input if i.name not in initializers] or names
    return {n: list(with_batch(spec, [d if isinstance(d, int) else None for d in spec.dimensions or ()],
                               batch_size)) for n, spec in zip(names, m.inputs)}


def run_costs(evaluation, framework: str, batch_size: int) -> pd.DataFrame:
    """Per-layer costs of the model ``framework`` ran in ``evaluation``, at ``batch_size``, with ``layer_name``
    the name its traced layers carry."""
    m = run_manifest(evaluation, framework)
    graph = _predictor(evaluation, framework).get("artifact") if framework == "onnxruntime" else None
    shapes = None
    if any(spec.dynamic for spec in m.inputs):
        trace = (evaluation.traces or {}).get(framework)
        if trace is None:
            raise MlmsError(f"{m.key} has dynamic sizes: its costs are counted at the shapes its traced calls ran, "
                            "and this run has no trace of " + framework + " (evaluate with trace_level FRAMEWORK)")
        shapes = traced_input_shapes(trace.spans, batch_size, _declared(m, framework, graph, batch_size))
    costs = manifest_costs(m, framework, batch_size, graph=graph, input_shapes=shapes)
    if "layer_name" not in costs:  # ONNX nodes: named after the module they were exported from, where known
        costs = costs.assign(layer_name=costs["torch_name"].where(costs["torch_name"].notna(), costs["node_name"]))
    return costs


def span_hints(spans: pd.DataFrame) -> dict[str, str]:
    """Per traced layer name, why its span may not hold exactly the work its costs count."""
    hints: dict[str, str] = {}
    fused_into: dict[str, list[str]] = {}
    layers = spans[spans["kind"] == "layer"].drop_duplicates("name")
    for name, text in zip(layers["name"], layers["attrs"]):
        attrs = _attrs(text)
        originals = attrs.get("original_nodes") or []
        if len(originals) > 1:
            hints[str(name)] = (f"fused work timed under one node: it stands for {len(originals)} original nodes "
                                f"({', '.join(map(str, originals[:4]))}{', ...' if len(originals) > 4 else ''}), "
                                "whose intermediate tensors are counted as memory traffic though the fused kernel "
                                "keeps them out of memory")
        if attrs.get("fused_into"):
            hints[str(name)] = f"its work is fused into {attrs['fused_into']} and timed there, not under its own span"
            fused_into.setdefault(str(attrs["fused_into"]), []).append(str(name))
    for target, parts in fused_into.items():
        hints.setdefault(target, f"fused work timed under one layer: its span also holds {', '.join(parts)}")
    return hints


def has_phases(spans: pd.DataFrame) -> bool:
    """Whether a trace is a generate run's: predict calls tagged with their phase (prefill, decode)."""
    predicts = spans[(spans["kind"] == "model") & (spans["name"] == "predict")]
    return any("phase" in _attrs(a) for a in predicts["attrs"].astype(str).head(4))


def _tensor_math_notes(framework: str, device: str, dtype: str) -> tuple[str, ...]:
    """On CUDA, torch's float32 convolutions (and matmuls, where allowed) may run in TF32 on tensor cores: faster
    than the float32 GEMM ceiling, which is measured with TF32 off. Read from torch's current settings."""
    import sys

    torch = sys.modules.get("torch")
    if framework != "torch" or device == "cpu" or torch is None or dtype not in ("float32", ""):
        return ()
    allowed = [what for what, on in (("convolutions (torch.backends.cudnn.allow_tf32, on by default)",
                                       torch.backends.cudnn.allow_tf32),
                                      ("matrix products (torch.backends.cuda.matmul.allow_tf32)",
                                       torch.backends.cuda.matmul.allow_tf32)) if on]
    if not allowed:
        return ()
    return (f"float32 {' and '.join(allowed)} may run in TF32 on tensor cores, faster than the float32 GEMM "
            "ceiling measured with TF32 off",)


def framework_roofline(evaluation, framework: str, per: str, device: str,
                       cache: CeilingsCache | None) -> tuple[pd.DataFrame, Ceilings]:
    """One framework's roofline table (per layer or per model) under its own ceilings, and those ceilings."""
    threads = run_threads(evaluation, framework)
    ceilings = machine_ceilings(device, cache=cache, framework=framework, threads=threads)
    # a noisy measurement stays cached (once per stack): the check names it as a cause, and refresh=True re-measures
    batch_sizes = sorted(int(b) for b in evaluation.latency["batch_size"].unique())
    trace = (evaluation.traces or {}).get(framework)
    if per == "layer" and trace is not None and has_phases(trace.spans):  # a generate run: costs per phase
        from mlms_nb.generation.phase_costs import generate_phase_costs

        trust = bool((evaluation.options or {}).get("trust"))
        costs = {bs: generate_phase_costs(run_manifest(evaluation, framework), trace.spans, bs, trust)
                 for bs in batch_sizes}
    else:
        costs = {bs: run_costs(evaluation, framework, bs) for bs in batch_sizes}
    roof = ceilings.roof_context(threads, run_notes=_tensor_math_notes(framework, device, ceilings.dtype),
                                 hints=span_hints(trace.spans) if trace is not None else {})
    source = f"{framework}'s ceilings: {ceilings.method}"
    peak, bw = ceilings.peak_flops_per_s, ceilings.bandwidth_bytes_per_s
    if per == "model":
        lat = evaluation.latency[evaluation.latency["framework"] == framework]
        return _roofline.compute_model(costs, lat, peak, bw, ceilings_source=source, roof=roof), ceilings
    if trace is None or not (trace.spans["kind"] == "layer").any():
        raise MlmsError(f"roofline per layer needs a trace of {framework} with layer spans: evaluate with "
                        "trace_level FRAMEWORK or deeper")
    latency = _layers.latency(trace.spans, by="layer")
    if framework == "onnxruntime" and not has_phases(trace.spans):  # costs of the original graph's nodes summed onto the optimised nodes that ran
        from mlms_nb.frameworks.onnxruntime.graph_map import fold_costs_onto_trace

        costs = {bs: fold_costs_onto_trace(c, trace.spans, bs) for bs, c in costs.items()}
    return _roofline.compute(costs, latency, peak, bw, ceilings_source=source, roof=roof), ceilings
