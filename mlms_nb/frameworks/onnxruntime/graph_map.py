"""ONNX Runtime graph optimisation levels, and the map from an optimised graph's nodes back to the original graph's.

ONNX Runtime rewrites a graph before running it (``SessionOptions.graph_optimization_level``): ``disabled`` runs the
graph as written (only ``Constant`` nodes become initializers), ``basic`` folds constants and removes redundant
nodes, ``extended`` fuses (``Conv`` + ``Clip`` -> ``FusedConv``), ``all`` adds layout transformations (NCHWc
``Conv`` nodes, ``ReorderInput`` / ``ReorderOutput``). Its profiler, and so the FRAMEWORK trace, times the nodes
of the *optimised* graph. :func:`map_optimized_graph` says which original nodes each optimised node stands for:

- a tensor keeps its name through a rewrite wherever it is still materialised, so an optimised node stands for
  the original tensors it outputs (a ``FusedConv`` outputs its ``Clip``'s tensor); a node whose outputs are all
  new (``reorder_token_7`` of an NCHWc ``Conv``) is matched by name: the NCHWc transformer names its node
  ``<original output tensor>_nchwc``, and a node it only moved into the NCHWc layout (an ``Add`` between two
  NCHWc convolutions) keeps the name and op type of its original node;
- the original nodes it covers are those met walking the original graph back from those tensors until the
  original tensors its inputs stand for (the graph inputs and initializers stop the walk too; a tensor the
  optimiser folded into a constant does not: the nodes that computed it are covered by the node that reads it);
- an original node met by several walks goes to the node of the smallest walk (the most specific); nodes that
  produce no original tensor and cover nothing (``ReorderInput``/``ReorderOutput``) are *inserted*;
  non-``Constant`` original nodes no walk meets are *unmapped* -- counted and named, never guessed.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from mlms_nb._optional import require
from mlms_nb.errors import MlmsError

#: our name -> ``onnxruntime.GraphOptimizationLevel`` member
LEVELS = {"disabled": "ORT_DISABLE_ALL", "basic": "ORT_ENABLE_BASIC", "extended": "ORT_ENABLE_EXTENDED",
          "all": "ORT_ENABLE_ALL"}
DEFAULT_LEVEL = "all"  # ONNX Runtime's own default
_NCHWC_SUFFIX = "_nchwc"


def check_level(value: Any, where: str = "graph_optimization_level") -> str:
    """``"disabled" | "basic" | "extended" | "all"`` (case-insensitive; ONNX Runtime's ``ORT_ENABLE_ALL`` style too)."""
    text = str(getattr(value, "name", value)).strip().lower()
    for name, member in LEVELS.items():
        if text in (name, member.lower()):
            return name
    raise MlmsError(f"{where}: {value!r} is not an ONNX Runtime graph optimisation level; expected one of "
                    f"{', '.join(LEVELS)}")


def ort_level(name: str):
    """The ``onnxruntime.GraphOptimizationLevel`` of a level name."""
    ort = require("onnxruntime")
    return getattr(ort.GraphOptimizationLevel, LEVELS[check_level(name)])


def non_constant_nodes(model) -> int:
    """Nodes of a graph ONNX Runtime runs with optimisations off (it turns ``Constant`` nodes into initializers)."""
    return sum(1 for n in _load(model).graph.node if n.op_type != "Constant")


@dataclass
class GraphMap:
    """Which original nodes each optimised node stands for (see the module docstring)."""
    level: str
    covers: dict[str, list[str]] = field(default_factory=dict)  # optimised node -> original nodes
    op_types: dict[str, str] = field(default_factory=dict)      # original node -> op type
    optimized_nodes: int = 0
    original_nodes: int = 0                                     # non-Constant
    inserted: list[str] = field(default_factory=list)           # optimised nodes standing for no original node
    unmapped: list[str] = field(default_factory=list)           # non-Constant original nodes no node stands for

    def summary(self) -> dict:
        """What a trace records: the level, node counts, and the inserted and unmapped nodes by name."""
        mapped = sum(1 for nodes in self.covers.values() for n in nodes if self.op_types.get(n) != "Constant")
        return {"graph_optimization_level": self.level, "optimized_nodes": self.optimized_nodes,
                "original_nodes": self.original_nodes, "mapped_original_nodes": mapped,
                "fused_nodes": sum(1 for v in self.covers.values() if len(v) > 1),
                "inserted_nodes": len(self.inserted), "inserted": self.inserted[:200],
                "unmapped_nodes": len(self.unmapped), "unmapped": self.unmapped[:200],
                "rule": "optimised nodes mapped to original nodes by tensor names (NCHWc nodes by their name)"}


def _load(model):
    onnx = require("onnx")
    if isinstance(model, (str, Path)):
        return onnx.load(str(model), load_external_data=False)
    return model


def identity_map(model, level: str = "disabled") -> GraphMap:
    """Each node of the graph stands for itself (optimisations off)."""
    graph = _load(model).graph
    kept = [n for n in graph.node if n.op_type != "Constant"]
    return GraphMap(level, {n.name: [n.name] for n in kept}, {n.name: n.op_type for n in graph.node},
                    len(kept), len(kept))


def map_optimized_graph(original, optimized, level: str) -> GraphMap:
    """Map each node of ``optimized`` (the file ONNX Runtime wrote to ``SessionOptions.optimized_model_filepath``)
    to the nodes of ``original`` it stands for. Both are paths or ``onnx.ModelProto``."""
    og, pg = _load(original).graph, _load(optimized).graph
    producer = {}
    for i, node in enumerate(og.node):
        for out in node.output:
            if out:
                producer[out] = i
    known = set(producer) | {t.name for t in og.initializer} | {v.name for v in og.input}
    opt_producer = {out: node for node in pg.node for out in node.output if out}
    folded = {t.name for t in pg.initializer} & set(producer)  # computed in the original graph, constant now
    stands: dict[str, set[str]] = {}  # optimised node -> the original tensors its outputs stand for
    originals = {n.name: n for n in og.node if n.name}

    def own_tensors(node) -> set[str]:
        """The original tensors ``node`` computes: its outputs of original names, else by its name (see above)."""
        own = {o for o in node.output if o in known}
        if not own and node.name.endswith(_NCHWC_SUFFIX) and node.name[:-len(_NCHWC_SUFFIX)] in known:
            own = {node.name[:-len(_NCHWC_SUFFIX)]}
        same = originals.get(node.name)
        if not own and same is not None and same.op_type == node.op_type:  # moved into the NCHWc layout as it is
            own = {o for o in same.output if o}
        return own

    def outputs_of(node) -> set[str]:
        if node.name not in stands:
            own = own_tensors(node)
            stands[node.name] = own
            if not own:  # a pass-through (layout) node stands for what it reads
                stands[node.name] = set().union(*(tensor(i) for i in node.input if i)) if node.input else set()
        return stands[node.name]

    def tensor(name: str) -> set[str]:
        if name in known:
            return {name}
        node = opt_producer.get(name)
        return outputs_of(node) if node is not None else set()

    candidates: dict[int, list[tuple[int, str]]] = {}
    covers_idx: dict[str, set[int]] = {}
    for node in pg.node:
        own = own_tensors(node)
        stop = set().union(*(tensor(i) for i in node.input if i and i not in folded)) if node.input else set()
        seen: set[int] = set()
        todo = [producer[t] for t in own - stop if t in producer]
        while todo:
            i = todo.pop()
            if i in seen:
                continue
            seen.add(i)
            todo.extend(producer[t] for t in og.node[i].input if t and t not in stop and t in producer)
        covers_idx[node.name] = seen
        for i in seen:
            candidates.setdefault(i, []).append((len(seen), node.name))
    best = {i: min(c)[1] for i, c in candidates.items()}
    covers = {node.name: [] for node in pg.node}
    for i in sorted(best):
        covers[best[i]].append(og.node[i].name)
    op_types = {n.name: n.op_type for n in og.node}
    inserted = [n for n, v in covers.items() if not v]
    unmapped = [og.node[i].name or f"#{i}" for i in range(len(og.node))
                if i not in best and og.node[i].op_type != "Constant"]
    originals = sum(1 for n in og.node if n.op_type != "Constant")
    return GraphMap(level, covers, op_types, len(pg.node), originals, inserted, unmapped)


def fold_costs(costs: pd.DataFrame, layers: pd.DataFrame) -> pd.DataFrame:
    """The original graph's per-node costs (:func:`~.costs.onnx_node_costs`) summed onto the traced nodes.

    ``layers``: the layer spans of one predict call (``name``, ``layer_index``, ``attrs`` with ``onnx_node`` and
    ``original_nodes``), in execution order. One row per span: ``layer_name`` its name, ``flops``,
    ``flops_matmul_conv``, ``params`` and ``bytes`` summed over the original nodes it stands for (a fused node's
    bytes count its intermediate tensors as written and read: an upper bound), ``original_nodes`` and
    ``original_op_types`` listing them. ``attrs["unmapped"]`` names cost rows no span stands for."""
    by_node = costs.set_index("node_name")
    rows, used = [], set()
    for name, index, attrs in zip(layers["name"], layers["layer_index"], layers["attrs"]):
        a = _attrs(attrs)
        nodes = [n for n in a.get("original_nodes", [a.get("onnx_node")]) if n in by_node.index]
        used.update(nodes)
        part = by_node.loc[nodes]
        rows.append({"layer_index": int(index), "layer_name": str(name), "node_name": a.get("onnx_node"),
                     "original_nodes": nodes, "original_op_types": list(part["op_type"]),
                     "flops": float(part["flops"].sum()), "flops_matmul_conv": float(part["flops_matmul_conv"].sum()),
                     "params": float(part["params"].sum()), "bytes": float(part["bytes"].sum())})
    out = pd.DataFrame(rows)
    out.attrs = dict(costs.attrs)
    out.attrs["unmapped"] = sorted(set(by_node.index) - used - set(costs.loc[costs["op_type"] == "Constant", "node_name"]))
    out.attrs["note"] = ("costs of the original ONNX graph's nodes summed onto the optimised nodes ONNX Runtime ran "
                         "(graph_map.fold_costs)")
    return out


def _attrs(text) -> dict:
    return json.loads(text) if isinstance(text, str) and text else (text or {})


def first_call_layers(spans: pd.DataFrame, batch_size: int) -> pd.DataFrame:
    """The layer spans of the first traced predict call at ``batch_size``, in execution order (empty if none)."""
    predicts = spans[(spans["kind"] == "model") & (spans["name"] == "predict")]
    for span_id, attrs in zip(predicts["span_id"], predicts["attrs"]):
        if int(_attrs(attrs).get("batch", -1)) == int(batch_size):
            layers = spans[(spans["kind"] == "layer") & (spans["parent_id"] == span_id)]
            return layers.sort_values("layer_index", kind="stable")
    return spans.iloc[:0]


def fold_costs_onto_trace(costs: pd.DataFrame, spans: pd.DataFrame, batch_size: int) -> pd.DataFrame:
    """``costs`` folded (:func:`fold_costs`) onto the traced nodes of an ONNX Runtime trace at ``batch_size``;
    ``costs`` unchanged when the trace's layer spans do not say which original nodes they stand for (a trace
    recorded before graph maps existed)."""
    layers = first_call_layers(spans, batch_size)
    if layers.empty or not any("original_nodes" in _attrs(a) for a in layers["attrs"].head(5)):
        return costs
    return fold_costs(costs, layers)


def check_covered(costs: pd.DataFrame, folded: pd.DataFrame, op_types=("Conv", "Gemm", "MatMul")) -> list[str]:
    """Original nodes of ``op_types`` that no folded row stands for (empty when every one is covered)."""
    if folded.empty:
        raise MlmsError("no traced layer to fold the costs onto")
    covered = {n for nodes in folded["original_nodes"] for n in nodes}
    return [n for n, op in zip(costs["node_name"], costs["op_type"]) if op in op_types and n not in covered]
