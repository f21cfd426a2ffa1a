"""The facade's analysis verbs: a run (an `Evaluation`, a `Trace`, a history row id, an evaluation id or a saved
``.json``) -> an `Analysis` (a table, a title and its plot): :func:`layers`, :func:`roofline`, :func:`batch_scaling`,
:func:`compare`, :func:`kernels`, :func:`timeline`, :func:`across`; and the roofline's inputs, :func:`layer_costs`
and :func:`machine_ceilings`. Import them from :mod:`mlms_nb.api` (or ``mlms_nb``)."""
from __future__ import annotations

import pandas as pd

from mlms_nb.analyses import Displayable
from mlms_nb.analyses import batch_scaling as _batch_scaling
from mlms_nb.analyses import compare as _compare
from mlms_nb.analyses import kernels as _kernels
from mlms_nb.analyses import layers as _layers
from mlms_nb.analyses import normalized as _normalized
from mlms_nb.analyses import phases as _phases
from mlms_nb.analyses import roofline as _roofline
from mlms_nb.analyses import timeline as _timeline
from mlms_nb.analyses.result import Analysis
from mlms_nb.api.core import load_evaluation
from mlms_nb.display import for_people
from mlms_nb.errors import MlmsError
from mlms_nb.evaluation.result import Evaluation
from mlms_nb.evaluation.roofline_run import framework_roofline
from mlms_nb.frameworks.costs import model_costs
from mlms_nb.options import CompareOptions, LayersOptions, RooflineOptions, spell, takes
from mlms_nb.store.history import HistoryStore
from mlms_nb.theory.ceilings import Ceilings
from mlms_nb.theory.ceilings import machine_ceilings as _machine_ceilings
from mlms_nb.tracing.trace import Trace


def resolve_run(run) -> Evaluation | Trace:
    """An Evaluation or Trace as is; a history row id / evaluation id / saved ``.json`` path -> the Evaluation."""
    if isinstance(run, (Evaluation, Trace)):
        return run
    if isinstance(run, (str, int)):
        return load_evaluation(run)
    raise MlmsError(f"expected an Evaluation, a Trace, or a history id, not {type(run).__name__}")


def _spans(run) -> pd.DataFrame:
    run = resolve_run(run)
    if isinstance(run, Trace):
        return run.spans
    return run.trace.spans  # an untraced evaluation raises a sentence saying how to trace it


def _traced_layers(run) -> pd.DataFrame:
    spans = _spans(run)
    if not (spans["kind"] == "layer").any():
        raise MlmsError("this trace has no layer spans: trace it at level FRAMEWORK or deeper "
                        f"({spell('trace_level', 'FRAMEWORK')})")
    return spans


@takes(LayersOptions, "run")
def layers(run, options: LayersOptions) -> Analysis:
    """Layer occurrence per type (``what="occurrence"``), latency per layer or type over the traced calls
    (``"latency"``, ``by="layer" | "type"``), or memory per layer (``"memory"``). A generate run's trace gives
    them per phase (prefill, and the decode steps aggregated), side by side; ``phase`` keeps one."""
    what, by = options.what, options.by
    table = _layers.compute(_traced_layers(run), what=what, by=by, phase=options.phase)
    if options.framework is not None:
        have = list(dict.fromkeys(table["framework"]))
        if options.framework not in have:
            raise MlmsError(f"{spell('framework', options.framework)}: this run traced {', '.join(have)}")
        attrs = table.attrs
        table = table[table["framework"] == options.framework].reset_index(drop=True)
        table.attrs = attrs
    title = {"occurrence": "Layer occurrence per type (calls in one predict call)",
             "latency": f"Layer latency per {by} (self time over the traced calls, ms)",
             "memory": "Memory held per layer (bytes allocated and still held at its end)"}[what]
    return Analysis("layers", title, table, _layers.plot)


def layer_costs(model: str, framework: str, batch_size: int) -> pd.DataFrame:
    """Theoretical per-layer costs with ``layer_name`` = the PyTorch module name the traced layers carry."""
    costs = model_costs(model, framework, batch_size=batch_size)
    if "layer_name" not in costs:  # ONNX nodes: named after the module they were exported from, where known
        costs = costs.assign(layer_name=costs["torch_name"].where(costs["torch_name"].notna(), costs["node_name"]))
    return for_people(costs)


def machine_ceilings(device: str = "cpu", refresh: bool = False, url: str | None = None, *, framework: str = "torch",
                     threads: int | None = None, dtype: str = "float32") -> Ceilings:
    """This machine's measured peak FLOP/s and memory bandwidth for ``framework``'s own kernels on ``device``, with
    ``threads`` intra-op threads (None: the framework's default) in ``dtype``, cached per stack in the history store
    (``url``; default store); ``refresh=True`` measures anew (about a second per framework on a CPU)."""
    return _machine_ceilings(device, refresh=refresh, cache=HistoryStore(url), framework=framework, threads=threads,
                             dtype=dtype)


@takes(RooflineOptions, "run")
def roofline(run, options: RooflineOptions) -> Analysis:
    """The roofline: theoretical FLOPs and bytes against measured time, each framework under its own measured
    ceilings (its best GEMM/convolution and a copy, at the run's threads; cached in the history store); points
    above their roof are flagged with their likely cause. ``per="layer"``: each traced layer (self time, median
    over the traced calls); ``per="model"``: the whole model per framework and batch size (the untraced median
    latency). Costs come from the run's own manifest and artifact, at its traced shapes where sizes are dynamic."""
    evaluation = resolve_run(run)
    if not isinstance(evaluation, Evaluation):
        raise MlmsError("roofline needs an Evaluation (its model and latency), not a bare Trace")
    per, framework, device = options.per, options.framework, options.device
    frameworks = [framework] if framework else list(evaluation.frameworks)
    device = device or str(evaluation.options.get("device") or "cpu")
    store = HistoryStore()
    skipped = []
    if per == "layer":
        for fw in frameworks:
            if evaluation.traces.get(fw) is None:
                raise MlmsError(f"roofline per layer needs a trace of {fw}: evaluate with "
                                f"{spell('trace_level', 'FRAMEWORK')}")
        if not framework:  # every framework whose trace has layer spans (a generate run's ONNX Runtime has none)
            spans = {fw: evaluation.traces[fw].spans for fw in frameworks}
            skipped = [fw for fw in frameworks if not (spans[fw]["kind"] == "layer").any()]
            frameworks = [fw for fw in frameworks if fw not in skipped] or frameworks
    parts, ceilings = zip(*(framework_roofline(evaluation, fw, per, device, store) for fw in frameworks))
    if options.phase is not None:
        parts = tuple(_phases.only_phase(p, options.phase) for p in parts)
    table = pd.concat(parts, ignore_index=True) if len(parts) > 1 else parts[0]
    table.attrs = dict(parts[0].attrs)
    if len(parts) > 1:
        table.attrs["note"] = "\n".join(f"{fw}: {p.attrs.get('note', '')}" for fw, p in zip(frameworks, parts))
    if skipped:
        table.attrs["note"] = (table.attrs.get("note", "") + f"\nleft out: {', '.join(skipped)} (its trace has no "
                               "layer spans: its step model records none)")
    roofs = "; ".join(f"{c.framework} {c.peak_flops_per_s / 1e9:.1f} GFLOP/s, {c.bandwidth_bytes_per_s / 1e9:.1f} "
                      f"GB/s, ridge {c.ridge_flop_per_byte:.2f} FLOP/byte" for c in ceilings)
    title = f"Roofline of {evaluation.model} per {per} on {device} (each framework's own ceilings: {roofs})"
    return Analysis("roofline", title, table, _roofline.plot,
                    extra={"ceilings": pd.concat([c.to_frame() for c in ceilings], ignore_index=True)})


def batch_scaling(run) -> Analysis:
    """Latency and throughput against batch size per framework, and the saturation batch size."""
    evaluation = resolve_run(run)
    table = _batch_scaling.compute(evaluation)
    return Analysis("batch_scaling", f"Batch scaling of {evaluation.model}", table, _batch_scaling.plot)


@takes(CompareOptions, "run_a", "run_b", "labels")
def compare(run_a, run_b, options: CompareOptions, *, labels: tuple[str, str] = ("A", "B")) -> Analysis:
    """A/B: per framework and batch size, median latency deltas with a Mann-Whitney U test on the raw samples
    and a bootstrap CI; per-layer deltas too (``.extra["layers"]``) when both runs were traced: for every framework
    both traced (a ``framework`` column), or ``framework_a`` of A against ``framework_b`` of B."""
    a, b = resolve_run(run_a), resolve_run(run_b)
    table = _compare.compute(a, b, labels=labels)
    extra = {}
    if a.traces and b.traces:
        extra["layers"] = _compare_layers(a, b, options, labels)
    elif options.framework_a or options.framework_b:
        raise MlmsError(f"{spell('framework_a', options.framework_a or options.framework_b)} picks the layers to "
                        f"compare, and only traced runs have layers: {'A' if not a.traces else 'B'} was not traced")
    different = " (two different models: see the warning)" if a.model != b.model else ""
    return Analysis("compare", f"{labels[0]} = {a.model} ({a.id}) vs {labels[1]} = {b.model} ({b.id}){different}",
                    table, _compare.plot, extra=extra)


def _compare_layers(a: Evaluation, b: Evaluation, options: CompareOptions, labels) -> pd.DataFrame:
    """Per-layer deltas of each framework pair (A's framework, B's framework), one frame with a framework column."""
    fa, fb = options.framework_a, options.framework_b or options.framework_a
    if fa is None and fb is None:
        pairs = [(f, f) for f in a.traces if f in b.traces]
        if not pairs and len(a.traces) == 1 and len(b.traces) == 1:
            pairs = [(next(iter(a.traces)), next(iter(b.traces)))]
    else:
        pairs = [(fa or fb, fb)]
    for label, run, fw in ((labels[0], a, pairs[0][0] if pairs else None), (labels[1], b, pairs[0][1] if pairs else None)):
        if fw is not None and fw not in run.traces:
            raise MlmsError(f"{label} traced {', '.join(run.traces)}, not {fw!r}: choose with "
                            f"{spell('framework_a', fw)} / {spell('framework_b', fw)}")
    if not pairs:
        raise MlmsError(f"{labels[0]} traced {', '.join(a.traces)} and {labels[1]} {', '.join(b.traces)}: no framework "
                        f"in common; pick one of each with {spell('framework_a', next(iter(a.traces)))} and "
                        f"{spell('framework_b', next(iter(b.traces)))}")
    frames = []
    for x, y in pairs:
        part = _compare.layers(a.traces[x].spans, b.traces[y].spans, labels=labels)
        frames.append(part.assign(framework=x if x == y else f"{x} vs {y}"))
    out = pd.concat(frames, ignore_index=True)
    out = out[["framework", *[c for c in out.columns if c != "framework"]]]
    out.attrs = dict(frames[0].attrs)
    return out


def kernels(run) -> Analysis:
    """GPU vs CPU time per layer (from CUPTI kernels attributed to layers); empty, with the reason, on CPU."""
    source = resolve_run(run)
    trace_of_run = source.trace if isinstance(source, Evaluation) else source
    table = _kernels.compute(trace_of_run)
    return Analysis("kernels", "GPU vs CPU time per layer", table, _kernels.plot,
                    extra={"kernel_table": _kernels.kernel_table(trace_of_run)})


def timeline(run, backend: str = "bokeh", **kwargs) -> Displayable:
    """The zoomable timeline figure of a trace (tracks per level / thread / device), opening on the traced pass;
    it displays itself as a cell's last value (``.figure``: the Bokeh layout or matplotlib Figure)."""
    return Displayable(_timeline.plot(_spans(run), backend, **kwargs))


def across(runs, baseline: str | None = None) -> Analysis:
    """Normalised latency across agents (the paper's across-systems figure): each agent's median latency divided
    by the ``baseline`` agent's (default: the first), per framework and batch size. ``runs``: Evaluations (or
    history ids) from different agents or machines, e.g. what ``evaluate(..., all_agents=True)`` returned."""
    evaluations = [resolve_run(r) for r in runs]
    table = _normalized.compute(evaluations, baseline=baseline, by="agent")
    return Analysis("normalized", table.attrs["title"], table, _normalized.plot)
