"""How every result is shown: plain text, HTML and JSON of evaluations, analyses, divergences, trace summaries
and frames, in one place (torch.utils.benchmark keeps `Measurement` data-only and renders in `Compare`; the same
split here). Value objects hold data and derived views; their ``__repr__``/``_repr_mimebundle_`` call this.

Low in the layers: it imports only the schemas and the bottom layer and reads the objects' public attributes
(duck typing), so the data objects delegate to it without an import upward. What every rendering keeps: units in
every header, how the numbers were measured (the note), the 95% CI of the median and "unstable" warnings.

- :func:`render_text`, :func:`render_html`, :func:`render_json` (JSON-ready data), :func:`mimebundle`;
- :class:`Table` (a frame with a title and a note), :class:`Notes` (a titled list), :class:`Section` (a titled
  part) and :class:`Page` (parts shown one after another) compose what a verb shows.

One module on purpose (~570 lines, the generation table of issue 21 included): issue 9 asks for the text, HTML and JSON rendering of every result in one
module, the way torch.utils.benchmark keeps it in `Compare`.
"""
from __future__ import annotations

import html
import json
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from mlms_nb.schema.divergence import column, pair_label
from mlms_nb.tables import table_html, table_text

MAX_ROWS = 60
"""Rows of a table shown before the middle is elided."""


# ---------------------------------------------------------------------------------------------- numbers

def is_missing(value: Any) -> bool:
    """None, NA, NaT or a float NaN."""
    if value is None or value is pd.NA or value is pd.NaT:
        return True
    return isinstance(value, (float, np.floating)) and math.isnan(value)


def fmt_num(value: Any) -> str:
    """3 significant digits for small numbers, thousands separators for large ones; '-' when missing."""
    if is_missing(value):
        return "-"
    try:
        v = float(value)
    except (TypeError, ValueError):
        return str(value)
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    a = abs(v)
    if a == 0:
        return "0"
    for at_least, spec in ((100, ",.0f"), (10, ".1f"), (1, ".2f"), (0.001, ".3f")):
        if a >= at_least:
            return format(v, spec)
    return f"{v:.2e}"


def fmt_int(value: Any) -> str:
    if is_missing(value) or not isinstance(value, (int, float, np.number)) or not math.isfinite(value):
        return "-" if is_missing(value) else str(value)
    return str(int(value))


def fmt_overhead(pct: Any, noise: Any = None) -> str:
    """A tracing overhead (%) against its noise (%): "within noise (±x%)" when it lies inside it (a negative one
    always: tracing cannot speed a call up), else the percentage with its noise."""
    if is_missing(pct):
        return "-"
    pct = float(pct)
    if is_missing(noise):
        return "within noise (spread not recorded)" if pct <= 0 else f"{pct:+.1f}% (spread not recorded)"
    noise = float(noise)
    if abs(pct) <= noise or pct < 0:
        return f"within noise (±{noise:.1f}%)"
    return f"+{pct:.1f}% (±{noise:.1f}%)"


def overhead_frame(frame: pd.DataFrame) -> pd.DataFrame:
    """A trace_overhead frame for reading: ``overhead_pct`` and ``noise_pct`` as one text column, "overhead"."""
    if frame.empty or "overhead_pct" not in frame:
        return frame
    out = frame.drop(columns=[c for c in ("overhead_pct", "noise_pct") if c in frame])
    noise = frame["noise_pct"] if "noise_pct" in frame else [None] * len(frame)
    out["overhead"] = [fmt_overhead(p, n) for p, n in zip(frame["overhead_pct"], noise)]
    out.attrs.update(frame.attrs)
    return out


def fmt_pct(fraction: Any) -> str:
    """A fraction 0..1 as a percentage with one decimal."""
    return "-" if is_missing(fraction) else f"{100 * float(fraction):.1f}"


# ---------------------------------------------------------------------------------------------- parts of a page

@dataclass
class Table:
    """A frame with a title (units belong in its column names), the note on how it was measured and what to
    say when it has no rows."""
    frame: pd.DataFrame
    title: str = ""
    note: str | None = None
    empty: str = "(no rows)"

    def __post_init__(self) -> None:
        if self.note is None:
            self.note = str(self.frame.attrs.get("note", ""))


@dataclass
class Notes:
    """A titled list of sentences (manifests that failed to load, what could not be traced)."""
    title: str
    items: list[str]


@dataclass
class Section:
    """A part under a heading (``torch: <trace summary>``)."""
    title: str
    body: Any


@dataclass
class Page:
    """Parts shown one after another (each is anything :func:`render_text` takes)."""
    parts: list = field(default_factory=list)


# ---------------------------------------------------------------------------------------------- dispatch

_PARTS = (("frame", pd.DataFrame), ("table", Table), ("notes", Notes), ("section", Section), ("page", Page),
          ("str", str))
_RESULTS = (("evaluation", ("samples", "latency", "measurement_note")), ("divergence", ("first_divergent_layer", "pairs")),
            ("analysis", ("table", "title")), ("trace", ("spans", "counters")), ("rendered", ("to_text", "_repr_html_")))
"""How a result is recognised: by the public attributes it has (display imports none of their classes); a
result of another face that renders itself (``to_text`` and ``_repr_html_``: a report) is shown as it renders."""


def _kind(obj: Any) -> str:
    kind = next((k for k, cls in _PARTS if isinstance(obj, cls)), None) or next(
        (k for k, attrs in _RESULTS if all(hasattr(obj, a) for a in attrs)), None)
    if kind is None:
        raise TypeError(f"mlms_nb.display cannot render a {type(obj).__name__}")
    return kind


def render_text(obj: Any) -> str:
    """Plain text: what the CLI prints and what a notebook shows where HTML is not rendered."""
    return _TEXT[_kind(obj)](obj)


def render_html(obj: Any) -> str:
    """An HTML fragment (escaped; no scripts) for a notebook output."""
    return _HTML[_kind(obj)](obj)


def render_json(obj: Any) -> Any:
    """JSON-ready data (what ``mlms VERB --json`` prints)."""
    return _JSON[_kind(obj)](obj)


def mimebundle(obj: Any) -> dict[str, str]:
    """``{"text/plain", "text/html"}`` for ``_repr_mimebundle_``."""
    return {"text/plain": render_text(obj), "text/html": render_html(obj)}


def dumps(data: Any) -> str:
    """JSON text of :func:`render_json` data (numpy values become Python ones, anything else its str)."""
    return json.dumps(data, indent=2, default=lambda o: o.item() if hasattr(o, "item") else (
        o.tolist() if hasattr(o, "tolist") else str(o)))


def records(frame: pd.DataFrame) -> list[dict]:
    return json.loads(frame.to_json(orient="records", default_handler=str)) if not frame.empty else []


# ---------------------------------------------------------------------------------------------- tables and pages

def _table_text(t: Table) -> str:
    """The table as :mod:`mlms_nb.tables` formats it for people (the same digits, units and width as the report)."""
    if t.frame.empty:
        return "\n".join(filter(None, [t.title, t.empty, t.note]))
    return table_text(t.frame, t.title or None, t.note, max_rows=MAX_ROWS)


def _table_html(t: Table) -> str:
    if t.frame.empty:
        head = f"<h4>{html.escape(t.title)}</h4>" if t.title else ""
        return head + f"<p>{html.escape(t.empty)}</p>" + (f"<p><small>{html.escape(t.note)}</small></p>" if t.note else "")
    return table_html(t.frame, t.title or None, t.note, max_rows=MAX_ROWS)


def _notes_text(n: Notes) -> str:
    return f"{n.title}:\n" + "\n".join(f"  {item}" for item in n.items) if n.items else ""


def _notes_html(n: Notes) -> str:
    items = "".join(f"<li>{html.escape(str(i))}</li>" for i in n.items)
    return f"<p>{html.escape(n.title)}:</p><ul>{items}</ul>" if n.items else ""


def _page_text(p: Page) -> str:
    return "\n\n".join(filter(None, (render_text(part) for part in p.parts)))


def _page_html(p: Page) -> str:
    return "".join(render_html(part) for part in p.parts)


# ---------------------------------------------------------------------------------------------- evaluations

def _evaluation_header(ev) -> list[tuple[str, str]]:
    """(label, text) lines shown above the table: model, stack, data, how it was measured, cold start."""
    model = f"{ev.model} {ev.model_version}".strip() or "(no model)"
    if ev.frameworks:
        model += f" in {', '.join(ev.frameworks)}"
    model += f" (evaluation {ev.id[:12]}" + (f", {ev.created_at[:19]}Z)" if ev.created_at else ")")
    lines = [("Model", model)]
    if ev.stack:
        lines.append(("Stack", ev.stack_summary))
    acc = ev.accuracy
    if not acc.empty and {"dataset", "n"} <= set(acc.columns):
        lines.append(("Accuracy", "top-1/top-5 on " + "; ".join(
            f"{r['framework']}: {r['dataset']} ({fmt_int(r['n'])} inputs"
            + (f", {fmt_int(r['skipped'])} skipped" if not is_missing(r.get("skipped")) and r.get("skipped") else "")
            + ")" + (f", n/a: {r['reason']}" if _na_reason(r) else "") for r in acc.to_dict("records"))))
    elif (ev.options or {}).get("dataset"):
        lines.append(("Dataset", str(ev.options["dataset"])))
    full = ev.full_pass
    if not full.empty and {"inputs", "wall_s", "inputs_per_s"} <= set(full.columns):
        lines.append(("Full pass", "; ".join(_full_pass_text(r) for r in full.to_dict("records"))))
    lines.append(("Measured", ev.measurement_note()))
    if not ev.cold_start.empty and {"load_ms", "first_inference_ms"} <= set(ev.cold_start.columns):
        lines.append(("Cold start", "; ".join(
            f"{r.get('framework')}: load {fmt_num(r.get('load_ms'))} ms, first inference "
            f"{fmt_num(r.get('first_inference_ms'))} ms"
            + (f" (batch {fmt_int(r.get('batch_size'))})" if not is_missing(r.get("batch_size")) else "")
            + (f", hidden state: {r['state_check']}" if isinstance(r.get("state_check"), str) and r["state_check"]
               else "")
            for r in ev.cold_start.to_dict("records"))))
    lines += _energy_lines(ev.latency)
    lines += _outputs_lines(ev) + _agreement_line(ev)
    if not ev.complete:
        lines.append(("Incomplete", "; ".join(ev.missing())))
    return lines


def _energy_lines(latency) -> list[tuple[str, str]]:
    """Energy per input over each timed loop, with how it was measured; or, once, why it could not be."""
    if latency is None or latency.empty or "energy_method" not in latency.columns:
        return []
    measured = latency[latency["energy_j_per_input"].notna()]
    if measured.empty:
        return [("Energy", str(latency["energy_method"].iloc[0]))]
    return [("Energy", "; ".join(
        f"{r['framework']}, batch {fmt_int(r['batch_size'])}: {fmt_num(r['energy_j_per_input'])} J per input"
        for r in measured.to_dict("records")) + f" (timed loops only; {measured['energy_method'].iloc[0]})")]


def _outputs_lines(ev) -> list[tuple[str, str]]:
    """What ``capture_outputs`` kept, and each output's agreement with the reference framework."""
    targets = getattr(ev, "target_metrics", None)
    target_lines = [] if targets is None or targets.empty else [("Against targets", target_text(targets))]
    outputs = getattr(ev, "outputs", None)
    if outputs is None or outputs.empty or not {"framework", "input_id", "output", "values"} <= set(outputs.columns):
        return target_lines
    parts = []
    for fw, rows in outputs.groupby("framework", sort=False):
        kept = int(rows.loc[rows["values"].notna(), "input_id"].nunique())
        values = f"values of {fmt_int(kept)} inputs kept" if kept else "summaries only: shape, min, max, mean, std"
        parts.append(f"{fw}: {fmt_int(rows['input_id'].nunique())} inputs x {rows['output'].nunique()} output(s), "
                     f"{values}")
    hint = "" if outputs["values"].notna().any() else "; --capture-outputs all or first:N keeps the values"
    lines = [("Outputs", "; ".join(parts) + f" (Evaluation.outputs{hint})")]
    agreement = getattr(ev, "output_agreement", None)
    if agreement is not None and not agreement.empty:
        shown = agreement[agreement["metric"].isin(["max_abs_error", "max_rel_error", "cosine", "flipped_decisions",
                                                    "not_compared"])]
        text = "; ".join(f"{fw} vs {ref}, {out}: " + ", ".join(_agreement_part(r) for r in g.to_dict("records"))
                         for (fw, ref, out), g in shown.groupby(["framework", "reference", "output"], sort=False))
        lines.append(("Output agreement", text + " (rel: of the reference's max |value|; Evaluation.output_agreement)"))
    return lines + target_lines


def _agreement_part(r: dict) -> str:
    """One metric of the output agreement line: decisions as a count of the inputs with their rule, an output not
    compared with why."""
    detail = r.get("detail") if isinstance(r.get("detail"), str) else ""
    if r["metric"] == "not_compared":
        return f"not compared: {detail}"
    if r["metric"] == "flipped_decisions":
        return f"{fmt_int(r['value'])} of {fmt_int(r.get('inputs'))} decisions flipped ({detail})"
    return f"{r['metric']} {fmt_num(r['value'])}"


def target_text(targets: pd.DataFrame) -> str:
    """The ``target_metrics`` frame in words: per framework and output, each metric's mean ± its 95% CI half-width
    over n inputs, with its unit."""
    def one(r) -> str:
        half = (r.ci95_high - r.ci95_low) / 2
        spread = f" ± {fmt_num(half)}" if np.isfinite(half) else ""
        return f"{r.metric} {fmt_num(r.value)}{spread} ({r.unit})"

    return "; ".join(f"{fw}, {out}: " + ", ".join(one(r) for r in g.itertuples()) + f" over {fmt_int(g['inputs'].max())} inputs"
                     for (fw, out), g in targets.groupby(["framework", "output"], sort=False)) + \
        " (mean ± 95% CI; Evaluation.target_metrics)"


def _full_pass_text(r: dict) -> str:
    """One framework's full pass in words, units included."""
    text = (f"{r.get('framework')}: {fmt_int(r.get('inputs'))} inputs in {fmt_num(r.get('wall_s'))} s = "
            f"{fmt_num(r.get('inputs_per_s'))} inputs/s")
    if not is_missing(r.get("batch_size")):
        text += f" at batch size {fmt_int(r.get('batch_size'))}"
    parts = []
    if not is_missing(r.get("preprocess_s")):
        reader = r.get("reader") if isinstance(r.get("reader"), str) else "threads"
        workers = "" if is_missing(r.get("workers")) else f" in {fmt_int(r.get('workers'))} worker {reader}"
        parts.append(f"preprocessing {fmt_num(r.get('preprocess_s'))} s{workers}")
    if not is_missing(r.get("inference_s")):
        parts.append(f"inference {fmt_num(r.get('inference_s'))} s")
    if not is_missing(r.get("wait_s")):
        parts.append(f"waiting for data {fmt_num(r.get('wait_s'))} s")
    if parts:
        text += " (" + ", ".join(parts) + ")"
    return text


def _na_reason(row: dict) -> str:
    """Why a framework's top-1/top-5 are n/a (label spaces differ, every input NaN); "" when they were measured."""
    reason = row.get("reason")
    return "" if is_missing(reason) or not reason else str(reason)


def _evaluation_rows(ev) -> pd.DataFrame:
    """One row per latency row (or per framework with accuracy only), formatted, units in the headers."""
    lat = ev.latency
    if not lat.empty and "scenario" in lat:  # generate loops have their own table (_generation_rows)
        lat = lat[~lat["scenario"].astype(str).str.startswith("generate")]
    acc_by_fw = {r["framework"]: r for r in ev.accuracy.to_dict("records")} if "framework" in ev.accuracy else {}
    server = "target_qps" in lat
    several = "scenario" in lat and lat["scenario"].nunique() > 1
    rows = lat.to_dict("records")
    rows += [{"framework": fw} for fw in ev.frameworks
             if fw in acc_by_fw and fw not in {r.get("framework") for r in rows}]
    order = {fw: i for i, fw in enumerate(ev.frameworks)}
    rows.sort(key=lambda r: (order.get(r.get("framework"), len(order)),
                             -1 if is_missing(r.get("batch_size")) else float(r["batch_size"])))
    out = []
    for r in rows:
        a = acc_by_fw.get(r.get("framework"), {})
        low, high, ratio = r.get("median_ci_low_ms"), r.get("median_ci_high_ms"), r.get("iqr_over_median")
        row = {"framework": str(r.get("framework")), "batch size": fmt_int(r.get("batch_size"))}
        if several:
            row["scenario"] = str(r.get("scenario", ""))
        row.update({
            "top-1 (%)": "n/a" if _na_reason(a) else fmt_pct(a.get("top1")),
            "top-5 (%)": "n/a" if _na_reason(a) else fmt_pct(a.get("top5")),
            "median (ms)": fmt_num(r.get("median_ms")),
            "95% CI of median (ms)": "-" if is_missing(low) or is_missing(high) else f"{fmt_num(low)} to {fmt_num(high)}",
            "p90 (ms)": fmt_num(r.get("p90_ms")), "p99 (ms)": fmt_num(r.get("p99_ms")),
            "throughput (/s)": fmt_num(r.get("throughput_per_s")),
            "IQR/median (%)": "-" if is_missing(ratio) else f"{100 * float(ratio):.1f}" + (
                " unstable" if r.get("unstable") is True or r.get("unstable") == 1 else ""),
            "calls": fmt_int(r.get("samples")),
        })
        if server:
            bound, met = r.get("latency_bound_ms"), r.get("meets_bound")
            row.update({"target (/s)": fmt_num(r.get("target_qps")), "achieved (/s)": fmt_num(r.get("achieved_qps")),
                        "p99 bound (ms)": "-" if is_missing(bound) else
                        f"{fmt_num(bound)} {'met' if met is True or met == 1 else 'missed'}"})
        out.append(row)
    return pd.DataFrame(out)


def _ci(low: Any, high: Any) -> str:
    return "-" if is_missing(low) or is_missing(high) else f"{fmt_num(low)} to {fmt_num(high)}"


def _generation_rows(ev) -> pd.DataFrame:
    """One row per generate loop (framework x batch size x scenario x KV cache): MLPerf's TTFT and TPOT with their
    spread, tokens/s, and goodput / achieved rate where they apply; units in the headers."""
    gen = getattr(ev, "generation", None)
    if gen is None or gen.empty:
        return pd.DataFrame()
    server = (gen["scenario"] == "generate-server").any()
    limits = "goodput_fraction" in gen and gen["goodput_fraction"].notna().any()
    out = []
    for r in gen.to_dict("records"):
        row = {"framework": str(r["framework"]), "batch size": fmt_int(r["batch_size"]),
               "KV cache": "yes" if r.get("kv_cache") else "no"}
        if gen["scenario"].nunique() > 1:
            row["scenario"] = str(r["scenario"])
        row.update({
            "TTFT median (ms)": fmt_num(r.get("ttft_median_ms")),
            "TTFT 95% CI (ms)": _ci(r.get("ttft_ci_low_ms"), r.get("ttft_ci_high_ms")),
            "TTFT p99 (ms)": fmt_num(r.get("ttft_p99_ms")),
            "TPOT median (ms)": fmt_num(r.get("tpot_median_ms")),
            "TPOT 95% CI (ms)": _ci(r.get("tpot_ci_low_ms"), r.get("tpot_ci_high_ms")),
            "TPOT p99 (ms)": fmt_num(r.get("tpot_p99_ms")),
            "ITL p99 (ms)": fmt_num(r.get("itl_p99_ms")),
            "tokens/s per request": fmt_num(r.get("tokens_per_s_median")),
            "tokens/s total": fmt_num(r.get("output_tokens_per_s")),
            "prefill tokens/s": fmt_num(r.get("prefill_tokens_per_s_median")),
            "requests": fmt_int(r.get("requests")) + (" unstable" if r.get("unstable") is True else ""),
        })
        if server:
            row["achieved (req/s)"] = f"{fmt_num(r.get('achieved_qps'))} of {fmt_num(r.get('target_qps'))}"
        if limits:
            row["goodput (%)"] = fmt_pct(r.get("goodput_fraction"))
        out.append(row)
    return pd.DataFrame(out)


def _agreement_line(ev) -> list[tuple[str, str]]:
    """Greedy tokens across frameworks / KV-cache settings, in one line."""
    agree = getattr(ev, "generation_agreement", None)
    if agree is None or agree.empty:
        return []
    parts = []
    for (fw, kv, ref), rows in agree.groupby(["framework", "kv_cache", "reference"], sort=False):
        same = rows[rows["kind"] == "identical_sequences"].iloc[0]
        logits = rows[rows["kind"] == "logits_max_abs_diff"]
        text = (f"{fw} ({'KV cache' if kv else 'no KV cache'}) vs {ref}: {int(same['value'])} of "
                f"{same['detail']['sequences']} greedy sequences identical")
        if not logits.empty:
            text += f", max |logit difference| {fmt_num(float(logits['value'].max()))}"
        parts.append(text)
    return [("Greedy agreement", "; ".join(parts))]


def _text_table(table: pd.DataFrame) -> str:
    """The first column left-aligned, the others right-aligned, two spaces apart."""
    first = table.columns[0]
    width = max(len(first), table[first].str.len().max())
    table = table.rename(columns={c: first.ljust(width) if c == first else f" {c}" for c in table.columns})
    return table.to_string(index=False, formatters={first.ljust(width): lambda s: s.ljust(width)})


def _evaluation_text(ev) -> str:
    out = [f"{label}: {text}" for label, text in _evaluation_header(ev)]
    table, generation = _evaluation_rows(ev), _generation_rows(ev)
    if table.empty and generation.empty:
        out.append("(nothing measured)")
    if not table.empty:
        out += ["", _text_table(table)]
    if not generation.empty:
        out += ["", "Generation (TTFT: time to first token; TPOT: time per output token, MLPerf; p99 by nearest "
                    "rank):", _text_table(generation)]
    if ev.warnings:
        out += ["", "Warnings:"] + [f"  - {w}" for w in ev.warnings]
    return "\n".join(out)


def _evaluation_html(ev) -> str:
    esc = html.escape
    parts = ['<div class="mlms-evaluation">']
    for label, text in _evaluation_header(ev):
        style = ' style="color:#b00"' if label == "Incomplete" else ""
        parts.append(f"<div{style}><b>{esc(label)}:</b> {esc(text)}</div>")
    table, generation = _evaluation_rows(ev), _generation_rows(ev)
    if table.empty and generation.empty:
        parts.append("<div><i>nothing measured</i></div>")
    for table in [t for t in (table, generation) if not t.empty]:
        left = {table.columns[0], "scenario"}
        parts.append('<table class="mlms-table"><thead><tr>'
                     + "".join(f"<th>{esc(c)}</th>" for c in table.columns) + "</tr></thead><tbody>")
        for row in table.itertuples(index=False):
            cells = []
            for name, value in zip(table.columns, row):
                style = f"text-align:{'left' if name in left else 'right'}"
                if str(value).endswith("unstable"):
                    style += ";color:#b00"
                cells.append(f'<td style="{style}">{esc(str(value))}</td>')
            parts.append("<tr>" + "".join(cells) + "</tr>")
        parts.append("</tbody></table>")
    if ev.warnings:
        parts.append('<div style="color:#a60"><b>Warnings:</b><ul>'
                     + "".join(f"<li>{esc(w)}</li>" for w in ev.warnings) + "</ul></div>")
    if ev.traces and ev.history_ids:
        parts.append(panel_link_html(ev.id))
    return "\n".join(parts + ["</div>"])


PANEL_LINK_PREFIX = "#mlms-timeline/"
"""An output link to ``#mlms-timeline/<evaluation_id>[/<framework>]`` opens that stored run in the JupyterLab
timeline panel (the mlms-nb lab extension catches the click; elsewhere the link does nothing)."""


def panel_link_html(evaluation_id: str, framework: str | None = None) -> str:
    """A button-like link that opens a stored, traced run in the JupyterLab timeline panel."""
    target = PANEL_LINK_PREFIX + evaluation_id + (f"/{framework}" if framework else "")
    what = f"the {framework} trace" if framework else "the timeline"
    return (f'<div class="mlms-panel-link" style="margin:4px 0"><a href="{html.escape(target)}" '
            f'title="opens in the mlms-nb JupyterLab extension (JupyterLab only)" style="display:inline-block;'
            f'padding:2px 8px;border:1px solid #1f77b4;border-radius:3px;text-decoration:none">'
            f'Open {html.escape(what)} in the JupyterLab panel</a></div>')


def _evaluation_json(ev) -> dict:
    """The CLI's JSON: ``{"evaluation_id", "complete", "saved", "missing" (one sentence per framework not fully
    measured), "outcomes" (per framework: status, reason, message, measured/missing/cut-short batch sizes), "warnings", "stack", "options", "results": [{"model",
    "framework", "accuracy", "cold_start", "full_pass" ({inputs, wall_s, inputs_per_s, preprocess_s, inference_s,
    wait_s, ...}, units in the names), "trace_overhead", "latency": [...]}]}``."""
    def rows_of(frame: pd.DataFrame, fw: str) -> list[dict]:
        return [] if frame.empty else frame[frame["framework"] == fw].drop(columns=["framework"]).to_dict("records")

    results = []
    for fw in ev.frameworks:
        acc = [] if ev.accuracy.empty else ev.accuracy[ev.accuracy["framework"] == fw].to_dict("records")
        cold = rows_of(ev.cold_start, fw)
        full = rows_of(ev.full_pass, fw)
        results.append({
            "model": ev.model, "model_version": ev.model_version, "framework": fw,
            "accuracy": {**{k: acc[0][k] for k in ("top1", "top5", "n", "dataset")},
                         "reason": _na_reason(acc[0]) or None} if acc else None,
            "cold_start": cold[0] if cold else None, "full_pass": full[0] if full else None,
            "trace_overhead": rows_of(ev.trace_overhead, fw), "latency": rows_of(ev.latency, fw),
            "output_agreement": rows_of(getattr(ev, "output_agreement", pd.DataFrame()), fw),
            "target_metrics": rows_of(getattr(ev, "target_metrics", pd.DataFrame()), fw),
            "generation": rows_of(getattr(ev, "generation", pd.DataFrame()), fw),
            "generation_requests": rows_of(getattr(ev, "generation_requests", pd.DataFrame()), fw),
            "generation_agreement": rows_of(getattr(ev, "generation_agreement", pd.DataFrame()), fw)})
    return {"evaluation_id": ev.id, "complete": ev.complete, "saved": ev.saved, "missing": ev.missing(),
            "outcomes": ev.outcomes, "warnings": ev.warnings, "stack": ev.stack, "options": ev.options,
            "results": results}


# ---------------------------------------------------------------------------------------------- analyses

def _analysis_parts(a) -> list:
    extras = [Table(frame, name.replace("_", " ").capitalize(), empty=f"no {name.replace('_', ' ')}")
              for name, frame in a.extra.items()]
    return [Table(a.table, a.title, note=a.note), *extras]


def _analysis_json(a) -> dict:
    return {"title": a.title, "note": a.note, "rows": records(a.table),
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


def _divergence_text(d) -> str:
    shown = (["layer"] + [column("max_rel_error", pair_label(*p)) for p in d.pairs]
             + [column("latency_ms", f) for f in d.frameworks])
    return "\n".join([f"Divergence of {d.model}", *(f"  {label}: {text}" for label, text in _divergence_header(d)),
                      d.layers[shown].to_string(max_rows=20, float_format=lambda v: f"{v:.3g}"),
                      *(f"  {k}: {v}" for k, v in d.notes.items())])


def _divergence_html(d) -> str:
    esc = html.escape

    def details(summary: str, frame: pd.DataFrame, digits: int, max_rows: int = MAX_ROWS) -> str:
        return (f"<details><summary>{esc(summary)}</summary>"
                + frame.to_html(index=False, max_rows=max_rows, float_format=f"{{:.{digits}g}}".format) + "</details>")

    parts = ['<div class="mlms-divergence">', f"<h4>Divergence of {esc(d.model)}</h4>"]
    parts += [f"<div><b>{esc(label)}:</b> {esc(text)}</div>" for label, text in _divergence_header(d)]
    parts += [details("outputs per pair", d.outputs, 4), details("accuracy per framework", d.accuracy, 4),
              details("per layer (error, latency in ms)", d.layers.drop(columns=["layer_name", "call"]), 3, 200)]
    parts.append("<ul>" + "".join(f"<li><b>{esc(k)}</b>: {esc(v)}</li>" for k, v in d.notes.items()) + "</ul></div>")
    return "\n".join(parts)


def _divergence_json(d) -> dict:
    return {"layers": records(d.layers), "first_divergent_layer": d.first_divergent_layer}


# ---------------------------------------------------------------------------------------------- traces

def _trace_parts(trace) -> list:
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


# ---------------------------------------------------------------------------------------------- the tables

_TEXT = {
    "frame": lambda f: _table_text(Table(f)), "table": _table_text, "notes": _notes_text, "page": _page_text,
    "section": lambda s: f"{s.title}: {render_text(s.body)}", "str": str,
    "evaluation": _evaluation_text, "divergence": _divergence_text,
    "analysis": lambda a: _page_text(Page(_analysis_parts(a))), "trace": lambda t: _page_text(Page(_trace_parts(t))),
    "rendered": lambda r: r.to_text(),
}
_HTML = {
    "frame": lambda f: _table_html(Table(f)), "table": _table_html, "notes": _notes_html, "page": _page_html,
    "section": lambda s: f"<h4>{html.escape(s.title)}</h4>{render_html(s.body)}",
    "str": lambda s: f"<pre>{html.escape(s)}</pre>",
    "evaluation": _evaluation_html, "divergence": _divergence_html,
    "analysis": lambda a: _page_html(Page(_analysis_parts(a))), "trace": lambda t: _page_html(Page(_trace_parts(t))),
    "rendered": lambda r: r._repr_html_(),
}
_JSON = {
    "frame": records, "table": lambda t: records(t.frame), "notes": lambda n: list(n.items), "str": str,
    "section": lambda s: {s.title: render_json(s.body)}, "page": lambda p: [render_json(x) for x in p.parts],
    "evaluation": _evaluation_json, "divergence": _divergence_json, "analysis": _analysis_json,
    "trace": lambda t: records(_trace_parts(t)[0].frame),
    "rendered": lambda r: r.to_dict() if hasattr(r, "to_dict") else r.to_text(),
}
