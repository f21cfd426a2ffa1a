"""An evaluation in words: the header lines (model, stack, data, how it was measured, cold start, energy,
outputs, agreement), the latency and generation tables with units in their headers, and the CLI's JSON."""
from __future__ import annotations

import html
from typing import Any

import numpy as np
import pandas as pd

from mlms_nb.display.columns import format_number
from mlms_nb.display.layout import table_html, table_text
from mlms_nb.display.spread import ci_decimals, spread_decimals
from mlms_nb.display.numbers import fmt_int, fmt_num, fmt_pct, is_missing, is_set
from mlms_nb.display.parts import records

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
            + (f"; before it, a one-time conversion of {fmt_num(r['conversion_ms'] / 1e3)} s (not in the load)"
               if not is_missing(r.get("conversion_ms")) and r["conversion_ms"] > 0 else "")
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
        num = _spread_formatter(r)
        row = {"framework": str(r.get("framework")), "batch size": fmt_int(r.get("batch_size"))}
        if several:
            row["scenario"] = str(r.get("scenario", ""))
        row.update({
            "top-1 (%)": "n/a" if _na_reason(a) else fmt_pct(a.get("top1")),
            "top-5 (%)": "n/a" if _na_reason(a) else fmt_pct(a.get("top5")),
            "median (ms)": num("median_ms"),
            "95% CI of median (ms)": "-" if is_missing(low) or is_missing(high) else
            f"{num('median_ci_low_ms')} to {num('median_ci_high_ms')}",
            "p90 (ms)": num("p90_ms"), "p99 (ms)": num("p99_ms"),
            "throughput (/s)": num("throughput_per_s"),
            "IQR/median (%)": "-" if is_missing(ratio) else f"{100 * float(ratio):.1f}" + (
                " busy" if is_set(r.get("busy")) else  # the machine's, see the warnings
                " unstable" if is_set(r.get("unstable")) else ""),
            "calls": fmt_int(r.get("samples")),
        })
        if server:
            bound, met = r.get("latency_bound_ms"), r.get("meets_bound")
            row.update({"target (/s)": fmt_num(r.get("target_qps")), "achieved (/s)": fmt_num(r.get("achieved_qps")),
                        "p99 bound (ms)": "-" if is_missing(bound) else
                        f"{fmt_num(bound)} {'met' if is_set(met) else 'missed'}"})
        out.append(row)
    return pd.DataFrame(out)


def _spread_formatter(r: dict):
    """Formats a latency row's statistics with the digits its own spread supports (one row of
    :func:`~mlms_nb.display.columns.spread_decimals`); 3 significant digits where the row has no CI."""
    digits = {c: int(d[0]) for c, d in spread_decimals(pd.DataFrame([r])).items()}

    def num(name: str) -> str:
        d = digits.get(name, -1)
        return fmt_num(r.get(name)) if d < 0 else format_number(r.get(name), d)
    return num


def _ci(low: Any, high: Any, decimals: int | None = None) -> str:
    if is_missing(low) or is_missing(high):
        return "-"
    if decimals is None:
        return f"{fmt_num(low)} to {fmt_num(high)}"
    return f"{format_number(low, decimals)} to {format_number(high, decimals)}"


def _at(decimals: int | None):
    """A formatter of values read beside a median whose CI gave ``decimals`` (3 significant digits without)."""
    return fmt_num if decimals is None else (lambda v: format_number(v, decimals))


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
        ttft = ci_decimals(r.get("ttft_median_ms"), r.get("ttft_ci_low_ms"), r.get("ttft_ci_high_ms"))
        tpot = ci_decimals(r.get("tpot_median_ms"), r.get("tpot_ci_low_ms"), r.get("tpot_ci_high_ms"))
        row.update({
            "TTFT median (ms)": _at(ttft)(r.get("ttft_median_ms")),
            "TTFT 95% CI (ms)": _ci(r.get("ttft_ci_low_ms"), r.get("ttft_ci_high_ms"), ttft),
            "TTFT p99 (ms)": _at(ttft)(r.get("ttft_p99_ms")),
            "TPOT median (ms)": _at(tpot)(r.get("tpot_median_ms")) + (  # the tag qualifies TPOT: its spread
                " unstable" if r.get("unstable") is True else ""),
            "TPOT 95% CI (ms)": _ci(r.get("tpot_ci_low_ms"), r.get("tpot_ci_high_ms"), tpot),
            "TPOT p99 (ms)": _at(tpot)(r.get("tpot_p99_ms")),
            "ITL p99 (ms)": fmt_num(r.get("itl_p99_ms")),
            "tokens/s per request": fmt_num(r.get("tokens_per_s_median")),
            "tokens/s total": fmt_num(r.get("output_tokens_per_s")),
            "prefill tokens/s": fmt_num(r.get("prefill_tokens_per_s_median")),
            "requests": fmt_int(r.get("requests")),
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


def _keyed(table: pd.DataFrame) -> pd.DataFrame:
    """An evaluation's formatted rows with their key columns named, for the one table renderer
    (:mod:`mlms_nb.display.layout`): split to the width, the keys in every part, no word broken."""
    table.attrs["keys"] = [c for c in ("framework", "batch size", "scenario", "KV cache") if c in table.columns]
    return table


def _text_table(table: pd.DataFrame) -> str:
    return table_text(_keyed(table), formatted=True)


def evaluation_text(ev) -> str:
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


def evaluation_html(ev) -> str:
    esc = html.escape
    parts = ['<div class="mlms-evaluation">']
    for label, text in _evaluation_header(ev):
        style = ' style="color:#b00"' if label == "Incomplete" else ""
        parts.append(f"<div{style}><b>{esc(label)}:</b> {esc(text)}</div>")
    table, generation = _evaluation_rows(ev), _generation_rows(ev)
    if table.empty and generation.empty:
        parts.append("<div><i>nothing measured</i></div>")
    for table in [t for t in (table, generation) if not t.empty]:
        parts.append(table_html(_keyed(table), formatted=True))
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


def evaluation_json(ev) -> dict:
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

