"""The report's sections, called from the template notebook (``report.ipynb``): each shows its tables and
figures, or one line saying why it is left out. They read an Evaluation's frames and call its methods
(``ev.layers()``, ``ev.roofline()``, ``ev.batch_scaling()``, ``ev.compare()``); anything else goes through
:mod:`mlms_nb.reporting._api`. ``runs`` is the list of Evaluations, ``labels`` their labels ("" for one run).
"""
from __future__ import annotations

import datetime as _dt
from typing import Sequence

import pandas as pd

from mlms_nb.display import is_missing, overhead_frame
from mlms_nb.reporting import _api, describe, notes
from mlms_nb.reporting._show import Block, detail, display, figure, heading, left_out, note, report_table, section

LATENCY_COLUMNS = ("framework", "batch_size", "scenario", "samples", "median_ms", "median_ci_low_ms",
                   "median_ci_high_ms", "p90_ms", "p99_ms", "iqr_ms", "iqr_over_median", "unstable",
                   "throughput_per_s")
TRACE_HINT = "evaluate with --trace-level framework (trace_level='FRAMEWORK') to record layers"


def run_labels(runs, labels: Sequence[str] | None = None) -> list[str]:
    """The labels of the runs: the given ones, else "" for a single run and A, B, C, ... for several."""
    labels = [str(x) for x in (labels or [])]
    if len(runs) == 1 and not labels:
        return [""]
    return labels[: len(runs)] + [chr(ord("A") + i) for i in range(len(labels), len(runs))]


def _name(run, label: str) -> str:
    who = f"{run.model} ({run.id[:8]}, {', '.join(run.frameworks)})"
    return f"{label}: {who}" if label else who


def _per_run(runs, labels, frame_of) -> pd.DataFrame:
    """The frames of every run, one under the other, with a ``run`` column when there are several."""
    parts = []
    for label, run in zip(labels, runs):
        frame = frame_of(run)
        if frame is None or frame.empty:
            continue
        frame = frame.copy()
        if len(runs) > 1:
            frame.insert(0, "run", label)
        parts.append(frame)
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()


def _each_run(runs, labels):
    """(label, run) pairs, with a sub-heading per run when there are several."""
    for label, run in zip(labels, runs):
        if len(runs) > 1:
            heading(_name(run, label), 3)
        yield label, run


# ---------------------------------------------------------------------------------------------- sections

def title(runs, labels) -> None:
    """The report's title and one paragraph: what, when, which evaluations."""
    models = list(dict.fromkeys(r.model for r in runs))
    frameworks = list(dict.fromkeys(fw for r in runs for fw in r.frameworks))
    what = "evaluation report" if len(runs) == 1 else f"comparison of {len(runs)} runs"
    now = _dt.datetime.now(_dt.timezone.utc)
    when = now.strftime("%Y-%m-%d %H:%M UTC")
    text = f"{', '.join(models)}: {what}"
    notes.start(frameworks)  # footnotes numbered from 1, each shown once in this report
    from IPython.display import Markdown, display

    # the page header of the PDF (model and date) comes from this output's metadata
    display(Markdown(f"# {text}"), metadata={"mlms": {"title": f"{text} ({', '.join(frameworks)})",
                                                      "date": now.strftime("%Y-%m-%d")}})
    ids = "; ".join(f"{_name(r, lab)} measured {str(r.created_at)[:16].replace('T', ' ')} UTC"
                    for lab, r in zip(labels, runs))
    note(f"{ids}. Frameworks: {', '.join(frameworks)}. Report made {when} with mlms-nb {_api.version()}.")


@section
def measured(runs, labels) -> None:
    """What was measured and how: runs, stack, manifests and checksums, options, the reproduction command."""
    report_table(describe.runs_table(runs, labels), "Runs", key=["what"])
    report_table(describe.stack_table(runs, labels), "Hardware and software stack", key=["what"])
    manifests = describe.manifests_table(runs, labels)
    if manifests.empty:
        left_out("no manifest was stored with these runs")
    else:
        report_table(manifests, "Manifests and the sha256 of their assets", key=["run", "framework"], max_text=80)
    options = describe.options_table(runs, labels)
    report_table(options, "Options" + (" (side by side; those that differ first)" if len(runs) > 1 else ""),
                 key=list(options.attrs.get("keys", ["option"])))
    for label, run in zip(labels, runs):
        note(run.measurement_note(), f"How {label} was measured:" if label else "How it was measured:")
    heading("Reproduce", 3)
    for label, run in zip(labels, runs):
        if label:
            note(f"run {label}:")
        display_block(describe.command_lines(describe.reproduce_command(run)))


def display_block(text: str) -> None:
    display(Block(text))


@section
def accuracy(runs, labels) -> None:
    frame = _per_run(runs, labels, lambda r: r.accuracy)
    if frame.empty:
        datasets = ", ".join(str(r.options.get("dataset") or "synthetic inputs") for r in runs)
        left_out(f"no accuracy was measured: the dataset ({datasets}) has no labels; evaluate on a labelled "
                 "dataset (--dataset imagenet-samples or an image folder) to measure it")
        return
    frame.attrs["note"] = "top-1/top-5: share of the inputs whose label is the first / among the first five " \
                          "predictions; n: inputs scored; skipped: inputs without a usable label"
    report_table(frame, "Accuracy")


def latency_frame(runs, labels) -> pd.DataFrame:
    """The latency table exactly as the report shows it (before formatting): one row per run, framework and
    batch size (and scenario when there are several)."""
    frame = _per_run(runs, labels, lambda r: r.latency)
    if frame.empty:
        return frame
    columns = [c for c in ("run", *LATENCY_COLUMNS) if c in frame.columns]
    if "scenario" in frame and frame["scenario"].nunique() == 1:
        columns.remove("scenario")
    out = frame[columns]
    out.attrs["note"] = ("calls: timed calls; CI: 95% bootstrap confidence interval of the median; IQR: interquartile "
                         "range; a row is unstable when IQR/median is above 10%; how it was timed: see above")
    return out


@section
def latency(runs, labels, backend: str = "matplotlib") -> None:
    frame = latency_frame(runs, labels)
    if frame.empty:
        left_out("no latency was measured (the run was interrupted before its first timed loop)")
        return
    report_table(frame, "Latency and throughput per batch size (untraced timed loop)")
    for label, run in _each_run(runs, labels):
        scaling = run.batch_scaling()
        figure(scaling.plot(backend), backend)
        detail(scaling.note)


@section
def cold_start(runs, labels) -> None:
    frame = _per_run(runs, labels, lambda r: r.cold_start)
    if frame.empty:
        left_out("no cold start was recorded for these runs")
        return
    frame.attrs["note"] = ("load: opening the model (reading and building it); first inference: the first call "
                           "after loading, timed once before any warm-up and never mixed into the warm numbers")
    report_table(frame, "Cold start (one measurement each)")


def _traced(run, label: str) -> bool:
    if not run.traces:
        left_out(f"{'run ' + label + ' was' if label else 'this run was'} not traced: {TRACE_HINT}")
        return False
    return True


@section
def layers(runs, labels, backend: str = "matplotlib") -> None:
    for label, run in _each_run(runs, labels):
        if not _traced(run, label):
            continue
        occurrence = run.layers("occurrence")
        phase = ["phase"] if "phase" in occurrence.table else []  # a generate run: prefill and decode apart
        report_table(occurrence.table, occurrence.title, key=["framework", *phase, "layer_type"])
        per_type = run.layers("latency", by="type")
        keys = ["framework", "batch_size", *phase]
        table = per_type.table.sort_values(keys + ["median_ms"], ascending=[True] * len(keys) + [False])
        table.attrs = per_type.table.attrs
        report_table(table, per_type.title, columns=keys + ["layer_type", "calls_per_predict", "median_ms", "p25_ms",
                                                            "p75_ms", "share_pct"], max_rows=40)
        smallest = int(per_type.table["batch_size"].min())
        for fw in per_type.table["framework"].unique():  # a trace without layer spans has no panel
            figure(per_type.plot(backend, framework=fw, batch_size=smallest), backend)
        memory = run.layers("memory")
        top = (memory.table.sort_values("memory_bytes", ascending=False)
               .groupby(keys, sort=True).head(8)
               .sort_values(keys + ["memory_bytes"], ascending=[True] * len(keys) + [False]))
        top.attrs = memory.table.attrs
        report_table(top, "Memory held per layer: the 8 largest per framework and batch size"
                     + (" and phase" if phase else ""),
                     columns=keys + ["layer_index", "name", "layer_type", "memory_bytes", "io_bytes"])


SHORT_HOW = 40
"""A ceiling's ``how`` up to this many characters stays in its cell; a longer one is a numbered note."""


def ceilings_frame(extra: pd.DataFrame) -> tuple[pd.DataFrame, list]:
    """The roofline's ceilings (framework, metric, value, IQR, unit, how) with each value written in its own unit,
    and the new notes to show under it: a long ``how`` is a numbered note of the report, its cell says which."""
    rows, new = [], []
    scales = {"FLOP/s": (1e9, "GFLOP/s"), "bytes/s": (1e9, "GB/s")}
    for rec in extra.to_dict("records"):
        factor, unit = scales.get(rec.get("unit"), (1.0, rec.get("unit") or ""))
        value, iqr = rec.get("value"), rec.get("iqr")
        rows.append({"framework": rec.get("framework", ""), "metric": str(rec.get("metric", "")).replace("_", " "),
                     "value": "-" if is_missing(value) else f"{value / factor:,.2f} {unit}",
                     "IQR": "-" if is_missing(iqr) else f"{iqr / factor:,.2f} {unit}",
                     "how": _how(str(rec.get("how", "") or ""), new)})
    frame = pd.DataFrame(rows)
    frame.attrs["keys"] = ["framework", "metric"]
    return frame, new


def _how(text: str, new: list) -> str:
    if len(text) <= SHORT_HOW:
        return text
    refs, added = notes.NOTES.add(text, whole=True)
    new += added
    return notes.numbers_text(refs)


FLAGGED_SHOWN = 12


def _flagged(table: pd.DataFrame, note: str | None = None) -> None:
    """The points above their roof, with why: never a silent point above 100% of attainable."""
    if "roof_check" not in table:
        return
    above = table[table["roof_check"] != "below roof"]
    if above.empty:
        return
    columns = [c for c in ("framework", "batch_size", "layer_index", "layer_name", "median_ms", "pct_of_attainable",
                           "roof_check", "roof_check_why") if c in above]
    shown = above.sort_values("pct_of_attainable", ascending=False).groupby("framework").head(FLAGGED_SHOWN)
    report_table(shown[columns], f"Points above their roof ({len(above)} of {len(table)}): measurement problems and "
                 f"their likely causes (up to {FLAGGED_SHOWN} per framework, highest first)", note=note)


@section
def roofline(runs, labels, backend: str = "matplotlib") -> None:
    for label, run in _each_run(runs, labels):
        model = run.roofline(per="model")
        detail(model.title)
        ceilings, hows = ceilings_frame(model.extra["ceilings"])
        report_table(ceilings, "Measured ceilings of this machine, per framework", key=["framework", "metric"])
        if hows:
            display(notes.NoteList(hows))
        report_table(model.table, "Whole model per framework and batch size",
                     columns=["framework", "batch_size", "flops", "bytes", "intensity_flop_per_byte", "median_ms",
                              "achieved_flops_per_s", "attainable_flops_per_s", "pct_of_attainable", "bound",
                              "roof_check"])
        _flagged(model.table)
        for fw in model.table["framework"].unique():
            figure(model.plot(backend, framework=fw), backend)
        if not _traced(run, label):
            continue
        per_layer = run.roofline(per="layer")
        counts = (per_layer.table.groupby(["framework", "batch_size", "bound"]).size().unstack(fill_value=0)
                  .reset_index())
        counts.columns = [str(c) if c in ("framework", "batch_size") else f"{c}-bound layers" for c in counts.columns]
        checks = per_layer.table.groupby(["framework", "batch_size", "roof_check"]).size().unstack(fill_value=0)
        counts = counts.merge(checks.reset_index(), on=["framework", "batch_size"], how="left")
        report_table(counts, "Layers per bound and against their roof (per-layer roofline: theoretical FLOPs over "
                     "measured self time)", note=per_layer.note)
        _flagged(per_layer.table)
        smallest = int(per_layer.table["batch_size"].min())
        for fw in per_layer.table["framework"].unique():
            figure(per_layer.plot(backend, framework=fw, batch_size=smallest), backend)


@section
def divergence(runs, labels) -> None:
    """Output agreement across the frameworks of a run, on the same inputs: top-1 class and its probability."""
    shown = False
    for label, run in zip(labels, runs):
        preds = run.predictions
        if preds.empty or not {"framework", "input_id", "top1"} <= set(preds.columns) or \
                preds["framework"].nunique() < 2:
            continue
        top1 = preds.pivot_table(index="input_id", columns="framework", values="top1", aggfunc="first")
        prob = (preds.pivot_table(index="input_id", columns="framework", values="top1_prob", aggfunc="first")
                if "top1_prob" in preds else None)
        reference = next(fw for fw in run.frameworks if fw in top1.columns)
        rows = []
        for fw in [c for c in run.frameworks if c in top1.columns and c != reference]:
            both = top1[[reference, fw]].dropna()
            row = {"framework": fw, "reference": reference, "inputs": len(both),
                   "same_top1_pct": 100.0 * float((both[fw] == both[reference]).mean()) if len(both) else float("nan")}
            if prob is not None:
                delta = (prob[fw] - prob[reference]).abs().dropna()
                row["top1_prob_delta_median"] = float(delta.median()) if len(delta) else float("nan")
                row["top1_prob_delta_max"] = float(delta.max()) if len(delta) else float("nan")
            rows.append(row)
        frame = pd.DataFrame(rows)
        frame.attrs["note"] = ("per input, the top-1 class and its probability in each framework against the "
                               "reference (the run's first framework); layer-by-layer divergence is measured by "
                               "`mlms diverge MODEL --framework a,b` and is not stored with a run")
        if len(runs) > 1:
            heading(_name(run, label), 3)
        report_table(frame, "Output agreement across frameworks (same inputs)")
        shown = True
    if not shown:
        left_out("no divergence data: these runs hold no per-input predictions of two or more frameworks "
                 "(synthetic inputs keep none); `mlms diverge MODEL --framework a,b` measures where frameworks' "
                 "layer outputs diverge")


@section
def timeline(runs, labels) -> None:
    """A static timeline of each framework's traced pass, and of its first traced predict call."""
    for label, run in _each_run(runs, labels):
        if not _traced(run, label):
            continue
        for fw, trace in run.traces.items():
            spans = trace.spans
            note(f"{fw}: {len(spans):,} spans of the traced pass "
                 f"({run.options.get('trace_repeats', '?')} traced calls per batch size)")
            model = spans[spans["kind"] == "model"].sort_values("start_ns")
            if model.empty:
                figure(_api.timeline(trace, "matplotlib", title=f"{fw}: the whole trace"))
                continue
            t0 = int(spans["start_ns"].min())
            ms = lambda ns: (int(ns) - t0) / 1e6  # noqa: E731 - the plot's axis: ms since the trace's start
            figure(_api.timeline(trace, "matplotlib", start_ms=ms(model["start_ns"].min()),
                                 end_ms=ms(model["end_ns"].max()), title=f"{fw}: the traced predict calls"))
            first = model.iloc[0]
            figure(_api.timeline(trace, "matplotlib", start_ms=ms(first["start_ns"]), end_ms=ms(first["end_ns"]),
                                 title=f"{fw}: the first traced predict call"))


@section
def trace_overhead(runs, labels) -> None:
    frame = _per_run(runs, labels, lambda r: r.trace_overhead)
    if frame.empty:
        left_out(f"no traced pass, so no tracing overhead: {TRACE_HINT}")
        return
    frame = overhead_frame(frame)
    frame.attrs["note"] = ("traced median of the traced pass over the untraced median of the timed loop, per "
                           "framework and batch size, ± its noise (the two medians' 95% CI half-widths, summed); "
                           "the per-layer numbers above include this overhead; one inside its noise, or negative, "
                           "is shown as within noise")
    report_table(frame, "Tracing overhead (traced vs untraced median)")


@section
def warnings(runs, labels) -> None:
    shown = False
    for label, run in zip(labels, runs):
        lead = f"run {label}: " if label else ""
        items = list(run.warnings)
        if not run.complete:
            items.insert(0, "the sweep was interrupted; the tables hold what was measured before")
        for fw, trace in run.traces.items():  # what was not traced, unless a warning of the run says it already
            for what, why in (trace.metadata.get("unavailable") or {}).items():
                if not any(str(why) in item for item in items):
                    items.append(f"{fw}: {what} not traced: {why}")
        for item in dict.fromkeys(items):  # each warning once
            note(lead + item, "⚠")
            shown = True
    if not shown:
        note("No warnings: every latency was stable and everything asked for was traced.")


def _relabel(frame: pd.DataFrame, a: str, b: str) -> pd.DataFrame:
    """``a_median_ms`` -> ``A_median_ms`` (the run labels in the headers); attrs kept."""
    out = frame.rename(columns=lambda c: f"{a}_{c[2:]}" if c.startswith("a_") else f"{b}_{c[2:]}"
                       if c.startswith("b_") else c)
    out.attrs = frame.attrs
    return out


@section
def comparison(runs, labels, backend: str = "matplotlib") -> None:
    """Each run against the first, framework by framework: median latency deltas with a significance test, and
    per-layer deltas when both were traced."""
    if len(runs) < 2:
        left_out("one run only; give two or more runs to compare them")
        return
    base, a = runs[0], labels[0]
    for b, run in zip(labels[1:], runs[1:]):
        heading(f"{b} against {a}", 3)
        shared = [fw for fw in base.frameworks if fw in run.frameworks]
        alone = [f"{fw} only in {a}" for fw in base.frameworks if fw not in shared] + [
            f"{fw} only in {b}" for fw in run.frameworks if fw not in shared]
        if alone:
            note("Not compared: " + "; ".join(alone) + ".")
        if not shared:
            left_out(f"{a} and {b} share no framework")
            continue
        results = {fw: base.for_framework(fw).compare(run.for_framework(fw), labels=(a, b)) for fw in shared}
        first = next(iter(results.values()))
        for warning in first.warnings:  # e.g. two different models: said before their deltas
            note(warning, "⚠")
        latency = pd.concat([r.table for r in results.values()], ignore_index=True)
        latency.attrs = first.table.attrs
        shown = latency.drop(columns="scenario") if latency["scenario"].nunique() == 1 else latency
        shown.attrs = latency.attrs
        report_table(_relabel(shown, a, b), f"Median latency: {b} against {a}", note=first.note, columns=[
            "framework", "batch_size", f"{a}_median_ms", f"{b}_median_ms", "delta_median_ms", "delta_median_pct",
            "latency_ratio", "latency_ratio_low", "latency_ratio_high", "p_value", "significant", "faster"])
        if not latency.empty:
            figure(first.draw(latency, backend), backend)
        for fw, result in results.items():
            deltas = result.extra.get("layers")
            if deltas is None or deltas.empty:
                left_out(f"{fw}: no per-layer deltas: both runs must be traced ({TRACE_HINT})")
                continue
            top = deltas.reindex(deltas["delta_ms"].abs().sort_values(ascending=False).index).head(12)
            top.attrs = deltas.attrs
            report_table(_relabel(top, a, b), f"{fw}: per-layer deltas of self time, the 12 largest", columns=[
                  "batch_size", "name", f"{a}_layer_type", f"{a}_median_ms", f"{b}_median_ms", "delta_ms", "delta_pct",
                  "p_value", "significant"])
            figure(result.draw(deltas, backend), backend)
