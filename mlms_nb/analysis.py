"""The analyses, reachable from the objects: a thin facade over ``analyses/`` (pure frames -> tables ->
figures) and :mod:`mlms_nb.theory` (costs and ceilings), used by ``Evaluation.roofline()`` and friends, the
``%mlms`` verbs and the ``mlms`` command alike.

Each function returns an :class:`Analysis`: the table (a DataFrame whose ``attrs["note"]`` says how it was
measured), its title, and :meth:`Analysis.plot` to draw it with Bokeh or matplotlib.
"""
from __future__ import annotations

import html
from dataclasses import dataclass, field
from typing import Any, Callable

import pandas as pd

from .errors import MlmsError


@dataclass
class Analysis:
    """One analysis result: ``table`` (units in column names, ``attrs["note"]``: how it was measured), a
    ``title``, and the function that draws it (``plot(backend)``)."""
    name: str
    title: str
    table: pd.DataFrame
    draw: Callable[..., Any] | None = field(default=None, repr=False)
    extra: dict[str, pd.DataFrame] = field(default_factory=dict, repr=False)

    @property
    def note(self) -> str:
        return str(self.table.attrs.get("note", ""))

    def plot(self, backend: str = "bokeh", **kwargs):
        """The figure: a Bokeh layout (``backend="bokeh"``) or a matplotlib Figure (``"matplotlib"``)."""
        if self.draw is None:
            raise MlmsError(f"the {self.name} analysis has nothing to plot")
        from analyses import Displayable

        return Displayable(self.draw(self.table, backend, **kwargs))  # shows itself as a cell's last value

    def show(self, backend: str = "bokeh", **kwargs) -> None:
        """Display the figure in a notebook (Bokeh with INLINE resources: works offline)."""
        from analyses import show

        show(self.plot(backend, **kwargs))

    def to_text(self, max_rows: int = 40) -> str:
        with pd.option_context("display.max_colwidth", 50, "display.width", 200, "display.max_rows", max_rows):
            body = self.table.to_string(index=False, max_rows=max_rows) if not self.table.empty else "(no rows)"
        return "\n".join(filter(None, [self.title, body, self.note]))

    def _repr_html_(self) -> str:
        body = (self.table.to_html(index=False, border=0, na_rep="", max_rows=60) if not self.table.empty
                else "<p>(no rows)</p>")
        note = f"<p><small>{html.escape(self.note)}</small></p>" if self.note else ""
        return f"<h4>{html.escape(self.title)}</h4>{body}{note}"

    def _repr_mimebundle_(self, include=None, exclude=None) -> dict[str, str]:
        return {"text/plain": self.to_text(), "text/html": self._repr_html_()}

    def __repr__(self) -> str:
        return self.to_text()


# ---------------------------------------------------------------------------------------------- inputs

def resolve_run(run):
    """An Evaluation or Trace as is; a history row id / evaluation id / saved ``.json`` path -> the Evaluation."""
    from .evaluation.result import Evaluation
    from .tracing.trace import Trace

    if isinstance(run, (Evaluation, Trace)):
        return run
    if isinstance(run, (str, int)):
        from .api import load_evaluation

        return load_evaluation(run)
    raise MlmsError(f"expected an Evaluation, a Trace, or a history id, not {type(run).__name__}")


def _spans(run) -> pd.DataFrame:
    from .tracing.trace import Trace

    run = resolve_run(run)
    if isinstance(run, Trace):
        return run.spans
    return run.trace.spans  # an untraced evaluation raises a sentence saying how to trace it


def _traced_layers(run) -> pd.DataFrame:
    spans = _spans(run)
    if not (spans["kind"] == "layer").any():
        raise MlmsError("this trace has no layer spans: trace it at level FRAMEWORK or deeper "
                        "(trace_level='FRAMEWORK')")
    return spans


# ---------------------------------------------------------------------------------------------- analyses

def layers(run, what: str = "latency", by: str = "layer") -> Analysis:
    """Layer occurrence per type (``what="occurrence"``), latency per layer or type over the traced calls
    (``"latency"``, ``by="layer" | "type"``), or memory per layer (``"memory"``)."""
    from analyses import layers as mod

    if what not in ("occurrence", "latency", "memory"):
        raise MlmsError(f"layers: what must be occurrence, latency or memory, not {what!r}")
    if by not in ("layer", "type"):
        raise MlmsError(f"layers: by must be layer or type, not {by!r}")
    table = mod.compute(_traced_layers(run), what=what, by=by)
    title = {"occurrence": "Layer occurrence per type (calls in one predict call)",
             "latency": f"Layer latency per {by} (self time over the traced calls, ms)",
             "memory": "Memory held per layer (bytes allocated and still held at its end)"}[what]
    return Analysis("layers", title, table, mod.plot)


def layer_costs(model: str, framework: str, batch_size: int) -> pd.DataFrame:
    """Theoretical per-layer costs with ``layer_name`` = the PyTorch module name the traced layers carry."""
    from .theory import model_costs

    costs = model_costs(model, framework, batch_size=batch_size)
    if "layer_name" not in costs:  # ONNX nodes: named after the module they were exported from, where known
        costs = costs.assign(layer_name=costs["torch_name"].where(costs["torch_name"].notna(), costs["node_name"]))
    return costs


def roofline(run, per: str = "layer", framework: str | None = None, device: str | None = None) -> Analysis:
    """The roofline: theoretical FLOPs and bytes (:mod:`mlms_nb.theory`) against measured time, under this
    machine's measured ceilings. ``per="layer"``: each traced layer (self time, median over the traced calls);
    ``per="model"``: the whole model per framework and batch size (the untraced median latency)."""
    from analyses import roofline as mod

    from .theory import machine_ceilings

    evaluation = resolve_run(run)
    if not hasattr(evaluation, "latency"):
        raise MlmsError("roofline needs an Evaluation (its model and latency), not a bare Trace")
    if per not in ("layer", "model"):
        raise MlmsError(f"roofline: per must be layer or model, not {per!r}")
    frameworks = [framework] if framework else list(evaluation.frameworks)
    device = device or str(evaluation.options.get("device") or "cpu")
    ceilings = machine_ceilings(device)
    source = f"{ceilings.method}"
    batch_sizes = sorted(int(b) for b in evaluation.latency["batch_size"].unique())
    parts = []
    for fw in frameworks:
        costs = {bs: layer_costs(evaluation.model, fw, bs) for bs in batch_sizes}
        if per == "model":
            lat = evaluation.latency[evaluation.latency["framework"] == fw]
            parts.append(mod.compute_model(costs, lat, ceilings.peak_flops_per_s, ceilings.bandwidth_bytes_per_s,
                                           ceilings_source=source))
        else:
            from analyses import layers as layer_mod

            trace = evaluation.traces.get(fw)
            if trace is None:
                raise MlmsError(f"roofline per layer needs a trace of {fw}: evaluate with trace_level='FRAMEWORK'")
            latency = layer_mod.latency(_traced_layers(trace), by="layer")
            parts.append(mod.compute(costs, latency, ceilings.peak_flops_per_s, ceilings.bandwidth_bytes_per_s,
                                     ceilings_source=source))
    table = pd.concat(parts, ignore_index=True) if len(parts) > 1 else parts[0]
    table.attrs = dict(parts[0].attrs)
    title = (f"Roofline of {evaluation.model} per {per} on {device} (peak {ceilings.peak_flops_per_s / 1e9:.1f} "
             f"GFLOP/s, bandwidth {ceilings.bandwidth_bytes_per_s / 1e9:.1f} GB/s, ridge "
             f"{ceilings.ridge_flop_per_byte:.2f} FLOP/byte)")
    return Analysis("roofline", title, table, mod.plot, extra={"ceilings": ceilings.to_frame()})


def batch_scaling(run) -> Analysis:
    """Latency and throughput against batch size per framework, and the saturation batch size."""
    from analyses import batch_scaling as mod

    evaluation = resolve_run(run)
    table = mod.compute(evaluation)
    return Analysis("batch_scaling", f"Batch scaling of {evaluation.model}", table, mod.plot)


def compare(run_a, run_b, labels: tuple[str, str] = ("A", "B")) -> Analysis:
    """A/B: per framework and batch size, median latency deltas with a Mann-Whitney U test on the raw samples
    and a bootstrap CI; per-layer deltas too (``.extra["layers"]``) when both runs were traced."""
    from analyses import compare as mod

    a, b = resolve_run(run_a), resolve_run(run_b)
    table = mod.compute(a, b, labels=labels)
    extra = {}
    if a.traces and b.traces:
        extra["layers"] = mod.layers(a.trace.spans, b.trace.spans, labels=labels)
    return Analysis("compare", f"{labels[0]} = {a.model} ({a.id}) vs {labels[1]} = {b.model} ({b.id})", table,
                    mod.plot, extra=extra)


def kernels(run) -> Analysis:
    """GPU vs CPU time per layer (from CUPTI kernels attributed to layers); empty, with the reason, on CPU."""
    from analyses import kernels as mod

    spans_source = resolve_run(run)
    trace = spans_source.trace if hasattr(spans_source, "latency") else spans_source
    table = mod.compute(trace)
    return Analysis("kernels", "GPU vs CPU time per layer", table, mod.plot,
                    extra={"kernel_table": mod.kernel_table(trace)})


def timeline(run, backend: str = "bokeh", **kwargs):
    """The zoomable timeline figure of a trace (tracks per level / thread / device), opening on the traced pass;
    it displays itself as a cell's last value (``.figure``: the Bokeh layout or matplotlib Figure)."""
    from analyses import Displayable, timeline as mod

    return Displayable(mod.plot(_spans(run), backend, **kwargs))
