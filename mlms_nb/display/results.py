"""Analyses, divergences and trace summaries as the parts (:mod:`mlms_nb.display.parts`) a page shows."""
from __future__ import annotations

import html

import pandas as pd

from mlms_nb.display.parts import MAX_ROWS, Notes, Table, records
from mlms_nb.schema.divergence import column, pair_label

def analysis_parts(a) -> list:
    extras = [Table(frame, name.replace("_", " ").capitalize(), empty=f"no {name.replace('_', ' ')}")
              for name, frame in a.extra.items()]
    warnings = [Notes("Warnings", a.warnings)] if getattr(a, "warnings", None) else []
    return [Table(a.table, a.title, note=a.note), *warnings, *extras]


def analysis_json(a) -> dict:
    return {"title": a.title, "note": a.note, "warnings": list(getattr(a, "warnings", [])), "rows": records(a.table),
            **{name: records(frame) for name, frame in a.extra.items()}}


# ---------------------------------------------------------------------------------------------- divergences

def _divergence_header(d) -> list[tuple[str, str]]:
    lines = [("Model", f"{d.model} on {d.inputs} inputs of {d.dataset}"),
             ("Frameworks", ", ".join(d.frameworks) + f" (reference: {d.frameworks[0]})"),
             ("Tolerance", f"{d.tolerance:g}, on max_rel_error = max|b - a| / max|a| per layer")]
    outputs = d.outputs.set_index("pair")
    for a, b in d.pairs:
        key = pair_label(a, b)
        out = outputs.loc[key]
        lines.append((key, f"first layer over tolerance: {d.first_divergent_layer.get(key) or 'none'}; largest "
                           f"max_rel_error {d.layers[column('max_rel_error', key)].max(skipna=True):.3g}; top-1 "
                           f"agreement {out['top1_agreement']:.0%}, JS mean {out['js_mean_nats']:.3g} nats, "
                           f"max |logit error| {out['max_abs_logit_error']:.3g}"))
    lines.append(("Top-1 accuracy (delta vs reference)",
                  ", ".join(f"{r.framework} {r.top1:.0%} ({r.top1_delta:+.0%})" for r in d.accuracy.itertuples())))
    return lines


def divergence_text(d) -> str:
    shown = (["layer"] + [column("max_rel_error", pair_label(*p)) for p in d.pairs]
             + [column("latency_ms", f) for f in d.frameworks])
    return "\n".join([f"Divergence of {d.model}", *(f"  {label}: {text}" for label, text in _divergence_header(d)),
                      d.layers[shown].to_string(max_rows=20, float_format=lambda v: f"{v:.3g}"),
                      *(f"  {k}: {v}" for k, v in d.notes.items()),
                      *(["Warnings:", *(f"  - {w}" for w in d.warnings)] if d.warnings else [])])


def divergence_html(d) -> str:
    esc = html.escape

    def details(summary: str, frame: pd.DataFrame, digits: int, max_rows: int = MAX_ROWS) -> str:
        return (f"<details><summary>{esc(summary)}</summary>"
                + frame.to_html(index=False, max_rows=max_rows, float_format=f"{{:.{digits}g}}".format) + "</details>")

    parts = ['<div class="mlms-divergence">', f"<h4>Divergence of {esc(d.model)}</h4>"]
    parts += [f"<div><b>{esc(label)}:</b> {esc(text)}</div>" for label, text in _divergence_header(d)]
    if d.warnings:
        parts.append('<div style="color:#a60"><b>Warnings:</b><ul>'
                     + "".join(f"<li>{esc(w)}</li>" for w in d.warnings) + "</ul></div>")
    parts += [details("outputs per pair", d.outputs, 4), details("accuracy per framework", d.accuracy, 4),
              details("per layer (error, latency in ms)", d.layers.drop(columns=["layer_name", "call"]), 3, 200)]
    parts.append("<ul>" + "".join(f"<li><b>{esc(k)}</b>: {esc(v)}</li>" for k, v in d.notes.items()) + "</ul></div>")
    return "\n".join(parts)


def divergence_json(d) -> dict:
    return {"layers": records(d.layers), "first_divergent_layer": d.first_divergent_layer,
            "warnings": list(d.warnings)}


# ---------------------------------------------------------------------------------------------- traces

def trace_parts(trace) -> list:
    """Spans per level and kind (count, total and median duration in ms), and what could not be traced."""
    spans = trace.spans
    frame = spans if spans.empty else (
        spans.assign(duration_ms=spans["duration_ns"] / 1e6).groupby(["level", "kind"], observed=True)["duration_ms"]
        .agg(spans="count", total_ms="sum", median_ms="median").reset_index())
    note = (f"trace {trace.trace_id}: {len(spans)} spans, {len(trace.counters)} counter samples; "
            "durations from time.perf_counter_ns, summed over every traced call")
    unavailable = trace.metadata.get("unavailable") or {}
    return [Table(frame, "Trace", note=note, empty="no spans were recorded"),
            Notes("Not traced here", [f"{k}: {v}" for k, v in unavailable.items()])]

