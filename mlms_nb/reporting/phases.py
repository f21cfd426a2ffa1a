"""The report's section for a generate run traced at FRAMEWORK level (issue 21): its layers and its roofline per
phase of generation, the prefill (the whole prompt at once) beside the decode steps (one token each against the
KV cache, aggregated over the traced steps). Called from the template notebook after the roofline; a report whose
runs have no phase-tagged trace shows nothing here."""
from __future__ import annotations

from mlms_nb.reporting._show import figure, heading, left_out, note, report_table, section


def _phased(run) -> list[str]:
    """The frameworks of ``run`` whose trace holds phase-tagged layer spans."""
    out = []
    for fw, trace in (run.traces or {}).items():
        spans = trace.spans
        layers = spans[spans["kind"] == "layer"]
        if len(layers) and layers["attrs"].astype(str).head(50).str.contains('"phase"', regex=False).any():
            out.append(fw)
    return out


@section
def phases(runs, labels, backend: str = "matplotlib") -> None:
    shown = [(label, run, _phased(run)) for label, run in zip(labels, runs)]
    if not any(fws for _, _, fws in shown):
        return
    heading("Phases of generation", 2)
    note("A generate run's traced batch, per phase: the prefill runs the whole prompt at once; each decode step "
         "runs one new token against the KV cache (its layers aggregated over every traced decode step, median "
         "and p25-p75). The roofline costs each layer at its phase's shapes: decode reads every weight for one "
         "token per row, so it sits far left of the ridge, memory-bound.")
    for label, run, fws in shown:
        if not fws:
            if label:
                left_out(f"run {label}: no phase-tagged trace (not a generate run traced at FRAMEWORK level)")
            continue
        for fw in fws:
            per_type = run.layers("latency", by="type", framework=fw)
            report_table(per_type.table, f"{label + ': ' if label else ''}{fw}: {per_type.title}, per phase",
                         columns=["framework", "batch_size", "phase", "layer_type", "calls_per_predict", "median_ms",
                                  "p25_ms", "p75_ms", "share_pct"], max_rows=40)
            smallest = int(per_type.table["batch_size"].min())
            figure(run.layers("latency", framework=fw).plot(backend, framework=fw, batch_size=smallest), backend)
            roof = run.roofline(per="layer", framework=fw)
            table = roof.table
            counts = (table[table["flops"] > 0].groupby(["framework", "batch_size", "phase", "bound"]).size()
                      .unstack(fill_value=0).reset_index())
            counts.columns = [c if c in ("framework", "batch_size", "phase") else f"{c}-bound layers"
                              for c in counts.columns]
            report_table(counts, f"{fw}: layers per bound in each phase (roofline per layer and phase)",
                         note=roof.note)
            figure(roof.plot(backend, framework=fw, batch_size=smallest), backend)
