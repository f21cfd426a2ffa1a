"""Layers: how often each layer type runs, how long each layer takes, what memory it holds.

Input: a spans frame (:mod:`mlms_nb.schema.trace`) traced at FRAMEWORK level or deeper. A *layer call*
is a span of kind ``"layer"``; its *predict call* is the nearest enclosing MODEL span named ``"predict"``
(whose ``attrs["batch"]`` is the batch size). Each predict call is one repetition; spreads are taken over
repetitions. A generate trace's predict calls carry their phase (``attrs["phase"]``: ``prefill``, or ``decode`` with
its ``step`` k; :mod:`mlms_nb.generation.traced`): then every table is per phase too (a ``phase`` column), so the
prefill's layers (the whole prompt) are never pooled with a decode step's (one token), and a decode step's layers
are aggregated over every decode step of the traced batch (their spread includes the KV cache growing by a
position per step). When layers nest (a layer span inside another), a layer's **self time** is its duration
minus its direct child layers', so per-type sums never count a nanosecond twice.

- :func:`layer_calls` -- one row per layer span with its predict call, batch size and repetition.
- :func:`occurrence` -- per layer type: calls per predict call, distinct modules, % of all layer calls.
- :func:`latency` -- per layer (``by="layer"``) or per type (``by="type"``): median, p25/p75, IQR, mean.
- :func:`memory` -- per layer: memory held at the end (``memory``) and bytes moved (``bytes``).
- :func:`compute` dispatches on ``what``; :func:`plot` draws any of these frames.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from mlms_nb.display import people_table
from mlms_nb.schema.trace import attrs_dict

from . import _plot
from ._plot import AnalysisError
from .phases import PHASES, groups, only_phase

SPAN_COLUMNS_USED = ("trace_id", "span_id", "parent_id", "name", "kind", "start_ns", "duration_ns", "layer_index",
                     "layer_type", "attrs")
_GROUP = ["framework", "batch_size"]


# ------------------------------------------------------------------------------------------ span plumbing

def _positions(spans: pd.DataFrame) -> np.ndarray:
    """Row position of each span's parent (-1 for roots and parents not in the frame)."""
    trace = spans["trace_id"]
    tcode = (trace.cat.codes if isinstance(trace.dtype, pd.CategoricalDtype) else pd.factorize(trace)[0])
    tcode = np.asarray(tcode, dtype=np.int64)
    key = (tcode << 40) | spans["span_id"].to_numpy(np.int64)
    parent = spans["parent_id"].to_numpy(np.int64)
    pkey = (tcode << 40) | parent
    order = np.argsort(key, kind="stable")
    at = np.searchsorted(key[order], pkey)
    at = np.minimum(at, len(key) - 1) if len(key) else at
    found = (parent != 0) & (len(key) > 0) & (key[order][at] == pkey) if len(key) else np.zeros(0, bool)
    return np.where(found, order[at] if len(key) else -1, -1)


def nearest_ancestor(parent_pos: np.ndarray, rows: np.ndarray, target: np.ndarray, max_depth: int = 256) -> np.ndarray:
    """For each row position in ``rows``: the position of its nearest strict ancestor where ``target`` is
    True, or -1 when none."""
    result = np.full(len(rows), -1, dtype=np.int64)
    cur = parent_pos[rows] if len(rows) else np.zeros(0, np.int64)
    for _ in range(max_depth):
        active = cur >= 0
        if not active.any():
            break
        hit = np.zeros(len(cur), bool)
        hit[active] = target[cur[active]]
        result[hit] = cur[hit]
        nxt = np.full(len(cur), -1, dtype=np.int64)
        go = active & ~hit
        nxt[go] = parent_pos[cur[go]]
        cur = nxt
    return result


def layer_calls(spans: pd.DataFrame) -> pd.DataFrame:
    """One row per layer span: ``framework, batch_size, repetition, trace_id, span_id, predict_span,
    layer_index, name, layer_type, shape, start_ns, duration_ns, self_ns, nested, memory_bytes, io_bytes,
    flops, predict_duration_ns, phase, step`` (times in ns, sizes in bytes; ``phase`` ``""`` and ``step`` -1 outside
    a generate trace).

    ``framework``: the predict span's ``attrs["framework"]`` (else its ``trace_id``); ``repetition``: the
    predict call's rank (0, 1, ...) among those of its framework and batch size (and phase); ``layer_index``: the
    span's own (execution order), else its rank by start time in the predict call; ``nested``: True when
    the layer runs inside another layer; ``self_ns``: duration minus the direct child layers' durations.
    """
    _plot.require_columns(spans, SPAN_COLUMNS_USED, "spans frame")
    spans = spans.reset_index(drop=True)
    kind = spans["kind"].astype(str).to_numpy()
    is_layer = kind == "layer"
    if not is_layer.any():
        levels = ", ".join(sorted(set(kind))) or "none"
        raise AnalysisError(f"this trace has no layer spans (its span kinds: {levels}); trace the evaluation at "
                            f"trace_level='FRAMEWORK' or deeper")
    names = spans["name"].astype(str).to_numpy()
    is_predict = (kind == "model") & (names == "predict")
    parent_pos = _positions(spans)
    rows = np.flatnonzero(is_layer)
    predict = nearest_ancestor(parent_pos, rows, is_predict)
    if (predict < 0).all():  # a source without "predict" spans: any enclosing model span
        predict = nearest_ancestor(parent_pos, rows, kind == "model")
    if (predict < 0).all():
        raise AnalysisError("the layer spans have no enclosing MODEL span (a 'predict' call), so they cannot be "
                            "grouped into repetitions; trace through mlms_nb.evaluate or a predictor")
    keep = predict >= 0
    rows, predict = rows[keep], predict[keep]
    parent_layer = nearest_ancestor(parent_pos, rows, is_layer)

    model_rows = np.unique(predict)
    info = {}
    trace_ids = spans["trace_id"].astype(str).to_numpy()
    for pos in model_rows:
        a = attrs_dict(str(spans["attrs"].iat[pos]))
        batch = a.get("batch", a.get("batch_size", -1))
        info[pos] = (str(a.get("framework") or trace_ids[pos]), int(batch) if batch is not None else -1,
                     str(a.get("phase") or ""), int(a["step"]) if a.get("step") is not None else -1)
    duration = spans["duration_ns"].to_numpy(np.int64)
    start = spans["start_ns"].to_numpy(np.int64)

    out = pd.DataFrame({
        "framework": [info[p][0] for p in predict],
        "batch_size": np.array([info[p][1] for p in predict], dtype=np.int64),
        "trace_id": trace_ids[rows],
        "span_id": spans["span_id"].to_numpy(np.int64)[rows],
        "predict_span": spans["span_id"].to_numpy(np.int64)[predict],
        "predict_pos": predict,
        "name": names[rows],
        "layer_type": spans["layer_type"].astype(str).to_numpy()[rows],
        "shape": spans["shape"].astype(str).to_numpy()[rows] if "shape" in spans else "",
        "layer_index": spans["layer_index"].to_numpy(np.int64)[rows],
        "start_ns": start[rows],
        "duration_ns": duration[rows],
        "nested": parent_layer >= 0,
        "memory_bytes": spans["memory"].to_numpy(float)[rows] if "memory" in spans else np.nan,
        "io_bytes": spans["bytes"].to_numpy(float)[rows] if "bytes" in spans else np.nan,
        "flops": spans["flops"].to_numpy(float)[rows] if "flops" in spans else np.nan,
        "predict_duration_ns": duration[predict],
        "phase": [info[p][2] for p in predict],
        "step": np.array([info[p][3] for p in predict], dtype=np.int64),
    })
    # self time: subtract each nested layer's duration from its parent layer's
    child_sum = pd.Series(duration[rows][parent_layer >= 0]).groupby(parent_layer[parent_layer >= 0]).sum()
    own = pd.Series(np.arange(len(rows)), index=rows)
    self_ns = duration[rows].copy()
    hit = child_sum.index.isin(own.index)
    self_ns[own.loc[child_sum.index[hit]].to_numpy()] -= child_sum.to_numpy()[hit]
    out["self_ns"] = self_ns
    # repetition: rank of the predict call within framework x batch size, by start time
    keys = groups(out)
    calls = out[keys + ["predict_pos"]].drop_duplicates()
    calls = calls.assign(start=start[calls["predict_pos"].to_numpy()]).sort_values(keys + ["start"])
    calls["repetition"] = calls.groupby(keys).cumcount()
    out = out.merge(calls[["predict_pos", "repetition"]], on="predict_pos", how="left")
    # layer_index: the span's own where every span has one, else the order of starts in its predict call
    out = out.sort_values(["predict_pos", "start_ns"], kind="stable", ignore_index=True)
    if (out["layer_index"] < 0).any():
        out["layer_index"] = out.groupby("predict_pos").cumcount()
    cols = ["framework", "batch_size", "repetition", "trace_id", "span_id", "predict_span", "layer_index", "name",
            "layer_type", "shape", "start_ns", "duration_ns", "self_ns", "nested", "memory_bytes", "io_bytes", "flops",
            "predict_duration_ns", "phase", "step"]
    out = out[cols].sort_values(keys + ["repetition", "layer_index"], kind="stable", ignore_index=True)
    out.attrs["note"] = ("one row per layer span (kind 'layer'); repetitions are the predict calls of the traced "
                         "pass; times from the trace's clock (ns)")
    return out


def _calls(data: pd.DataFrame) -> pd.DataFrame:
    """Accept a spans frame or the output of :func:`layer_calls`."""
    if isinstance(data, pd.DataFrame) and "self_ns" in data.columns and "repetition" in data.columns:
        return data
    return layer_calls(data)


def _reps_note(calls: pd.DataFrame) -> str:
    reps = calls.groupby(groups(calls))["repetition"].nunique()
    lo, hi = int(reps.min()), int(reps.max())
    text = f"{lo}" if lo == hi else f"{lo} to {hi}"
    if "phase" in groups(calls):
        text += (" (per phase: the prefill, or every decode step of the traced batch, each step one new token "
                 "against a KV cache one position longer than the last)")
    return text


# ------------------------------------------------------------------------------------------ occurrence

@people_table
def occurrence(spans: pd.DataFrame) -> pd.DataFrame:
    """Per framework and layer type: ``count`` (layer calls in one predict call), ``modules`` (distinct layer
    names), ``percent`` (of all layer calls in one predict call). Counts are taken from each framework's
    first predict call; ``attrs["note"]`` says whether every predict call ran the same layers."""
    calls = _calls(spans)
    by = ["framework"] + (["phase"] if "phase" in groups(calls) else [])
    ordered = calls.sort_values(by + ["batch_size", "repetition"], kind="stable")
    key = ordered.groupby(by)[["batch_size", "repetition"]].first().reset_index()
    one = calls.merge(key, on=by + ["batch_size", "repetition"])
    table = (one.groupby(by + ["layer_type"], observed=True)
             .agg(count=("name", "size"), modules=("name", "nunique")).reset_index())
    table["percent"] = 100.0 * table["count"] / table.groupby(by)["count"].transform("sum")
    table = table.sort_values(by + ["count", "layer_type"], ascending=[True] * len(by) + [False, True],
                              ignore_index=True)
    per_call = calls.groupby(by + ["batch_size", "repetition"]).size()
    same = per_call.groupby(level=by).nunique().eq(1).all()
    typical = per_call.groupby(level="framework").median().astype(int)
    table.attrs["analysis"] = "occurrence"
    table.attrs["note"] = (f"layer calls (spans of kind 'layer') per predict call, counted in each framework's first "
                           f"traced predict call; {'every' if same else 'NOT every'} predict call ran the same number "
                           f"of layers ({', '.join(f'{k}: {v}' for k, v in typical.items())} "
                           f"layer calls per predict call)")
    table.attrs["title"] = "Layer occurrence per type (layer calls in one predict call)"
    return table


# ------------------------------------------------------------------------------------------ latency

def _stats_ms(grouped, column: str, prefix: str = "") -> pd.DataFrame:
    q = grouped[column].quantile([0.25, 0.5, 0.75]).unstack() / 1e6
    out = pd.DataFrame({f"{prefix}median_ms": q[0.5], f"{prefix}p25_ms": q[0.25], f"{prefix}p75_ms": q[0.75]})
    out[f"{prefix}iqr_ms"] = out[f"{prefix}p75_ms"] - out[f"{prefix}p25_ms"]
    out[f"{prefix}mean_ms"] = grouped[column].mean() / 1e6
    out[f"{prefix}total_ms"] = grouped[column].sum() / 1e6
    return out


@people_table
def latency(spans: pd.DataFrame, by: str = "layer") -> pd.DataFrame:
    """Layer latency over repetitions (predict calls), per framework and batch size.

    ``by="layer"``: one row per layer call position (``layer_index, name, layer_type``): ``repetitions``,
    ``median_ms, p25_ms, p75_ms, iqr_ms, mean_ms, total_ms`` of the span's duration, the same of its self
    time (``self_median_ms`` ...), and ``share_pct`` (mean self time / mean predict time).
    ``by="type"``: one row per layer type: ``calls_per_predict`` and the statistics of the per-predict-call
    sum of the type's self times (so each type's ``mean_ms``/``total_ms`` equal the sums of its layers'
    ``self_mean_ms``/``self_total_ms``).
    """
    calls = _calls(spans)
    by = str(by).lower()
    group = groups(calls)
    predict = calls.drop_duplicates(group + ["repetition"])
    predict_mean = predict.groupby(group)["predict_duration_ns"].mean()
    if by == "layer":
        keys = group + ["layer_index", "name", "layer_type"]
        g = calls.groupby(keys, sort=True)
        table = pd.concat([g["repetition"].nunique().rename("repetitions"), _stats_ms(g, "duration_ns"),
                           _stats_ms(g, "self_ns", "self_")], axis=1).reset_index()
        table["nested"] = g["nested"].first().to_numpy()
        how = "each layer span's duration (and self time)"
    elif by == "type":
        per_call = (calls.groupby(group + ["repetition", "layer_type"])
                    .agg(self_ns=("self_ns", "sum"), calls=("name", "size")).reset_index())
        g = per_call.groupby(group + ["layer_type"], sort=True)
        table = pd.concat([g["repetition"].nunique().rename("repetitions"),
                           g["calls"].median().rename("calls_per_predict"), _stats_ms(g, "self_ns")],
                          axis=1).reset_index()
        how = "the sum of each type's layer self times in one predict call"
    else:
        raise AnalysisError(f"latency(by={by!r}): expected 'layer' or 'type'")
    mean_col = "self_mean_ms" if by == "layer" else "mean_ms"
    base = table.set_index(group).index.map(predict_mean).to_numpy(float) / 1e6
    table["share_pct"] = 100.0 * table[mean_col] / base
    if by == "type":
        table = table.sort_values(group + ["mean_ms"], ascending=[True] * len(group) + [False], ignore_index=True)
    table.attrs["analysis"] = f"latency_{by}"
    table.attrs["note"] = (f"{how}, from FRAMEWORK-level layer spans of the traced pass; median, p25, p75 (IQR) "
                           f"and mean over {_reps_note(calls)} predict calls per framework and batch size; "
                           f"self time = duration minus nested layers' durations; share_pct = mean self time / "
                           f"mean predict-call time; traced timings include the tracer's overhead")
    table.attrs["title"] = ("Latency per layer" if by == "layer" else "Latency per layer type")
    return table


# ------------------------------------------------------------------------------------------ memory

@people_table
def memory(spans: pd.DataFrame) -> pd.DataFrame:
    """Per layer call position: ``memory_bytes`` (median net bytes allocated during the layer and still held
    at its end), ``memory_p25_bytes``, ``memory_p75_bytes``, ``memory_max_bytes``; ``io_bytes`` (median bytes
    read + written, where the tracer recorded them) and ``shape`` (input shapes). NaN where not recorded."""
    calls = _calls(spans)
    keys = groups(calls) + ["layer_index", "name", "layer_type"]
    g = calls.groupby(keys, sort=True)
    q = g["memory_bytes"].quantile([0.25, 0.5, 0.75]).unstack()
    table = pd.DataFrame({"repetitions": g["repetition"].nunique(), "shape": g["shape"].first(),
                          "memory_bytes": q[0.5], "memory_p25_bytes": q[0.25], "memory_p75_bytes": q[0.75],
                          "memory_max_bytes": g["memory_bytes"].max(),
                          "io_bytes": g["io_bytes"].median()}).reset_index()
    recorded = [what for what, col in (("memory", "memory_bytes"), ("bytes", "io_bytes")) if table[col].notna().any()]
    table.attrs["analysis"] = "memory"
    table.attrs["note"] = ("per layer span: 'memory' = net bytes allocated during the layer and still held at its end, "
                           "'io_bytes' = bytes read + written, as the tracer recorded them; median (p25, p75, max) "
                           f"over {_reps_note(calls)} predict calls; "
                           + (f"recorded here: {', '.join(recorded)}" if recorded else
                              "this trace recorded neither (the framework's tracer gave no memory or byte counts)"))
    table.attrs["title"] = "Memory per layer"
    return table


@people_table
def compute(spans: pd.DataFrame, what: str = "latency", by: str = "layer", phase: str | None = None) -> pd.DataFrame:
    """``what``: ``"occurrence"``, ``"latency"`` (``by="layer"`` or ``"type"``) or ``"memory"``; ``phase``
    (a generate trace): only ``"prefill"`` or ``"decode"`` (default: both, a ``phase`` column tells them apart)."""
    what = str(what).lower()
    if what == "occurrence":
        table = occurrence(spans)
    elif what == "latency":
        table = latency(spans, by=by)
    elif what == "memory":
        table = memory(spans)
    else:
        raise AnalysisError(f"layers.compute(what={what!r}): expected 'occurrence', 'latency' or 'memory'")
    if "phase" in table:  # the prefill before the decode steps, as they ran
        keys = [k for k in ("framework", "batch_size") if k in table] + ["phase"]
        attrs = table.attrs
        table = table.sort_values(keys, key=lambda c: c.map({"prefill": 0, "decode": 1}) if c.name == "phase" else c,
                                  kind="stable", ignore_index=True)
        table.attrs = attrs
    return only_phase(table, phase)


# ------------------------------------------------------------------------------------------ plots

def _select(df: pd.DataFrame, framework: str | None, batch_size: int | None,
            phase: str | None = None) -> tuple[pd.DataFrame, str]:
    if df.empty:
        raise AnalysisError("nothing to plot: the frame has no rows")
    fw = framework if framework is not None else df["framework"].iloc[0]
    part = df[df["framework"] == fw]
    if part.empty:
        raise AnalysisError(f"no rows for framework {framework!r}; the frame has: "
                            f"{', '.join(map(str, df['framework'].unique()))}")
    if phase is not None:
        part = part[part["phase"] == phase]
        fw = f"{fw}, {phase}"  # (a decode panel's subtitle says its steps are aggregated)
    if "batch_size" in part:
        bs = batch_size if batch_size is not None else int(part["batch_size"].min())
        part = part[part["batch_size"] == bs]
        if part.empty:
            raise AnalysisError(f"no rows for batch size {batch_size}; the frame has: "
                                f"{', '.join(map(str, sorted(df['batch_size'].unique())))}")
        return part, f"{fw}, batch size {bs}"
    return part, str(fw)


def plot(df: pd.DataFrame, backend: str = "bokeh", *, framework: str | None = None, batch_size: int | None = None,
         top: int = 40, title: str | None = None):
    """Horizontal bars of a :func:`compute` frame, one panel per framework (``framework``: only that one), stacked,
    and per phase in a generate trace (prefill and decode side by side for one framework),
    at one batch size (default: each framework's smallest): occurrence counts; latency medians with p25-p75
    whiskers (the ``top`` slowest layers, or every type); memory held per layer (or bytes moved when no memory)."""
    kind = _plot.require_analysis(df, "occurrence", "latency_layer", "latency_type", "memory")
    if df.empty:
        raise AnalysisError("nothing to plot: the frame has no rows")
    frameworks = [framework] if framework is not None else list(dict.fromkeys(df["framework"]))
    have = set(df["phase"]) if "phase" in df else set()
    phases = [p for p in PHASES if p in have] or [None]
    drawn = [_panel(kind, df, *_select(df, fw, batch_size, ph), top, title) for fw in frameworks for ph in phases]
    # a generate trace's phases next to each other on a static page; an interactive figure stretches to the output
    # width, so there each phase gets all of it, one under the other (long row labels would squeeze two side by side)
    side_by_side = len(phases) > 1 and len(frameworks) == 1 and _plot.check_backend(backend) == "matplotlib"
    panels = _plot.charts(backend, [spec for spec, _ in drawn], stacked=not side_by_side)
    for panel, (_, draw) in zip(panels, drawn):
        draw(panel)
    return _plot.combine(panels)


def _panel(kind: str, df: pd.DataFrame, part: pd.DataFrame, which: str, top: int, title: str | None):
    """The spec of one framework's panel and how to draw its bars."""
    steps = "every traced decode step aggregated; " if "phase" in part and (part["phase"] == "decode").any() else ""
    if kind == "occurrence":
        labels = [f"{t}" for t in part["layer_type"]]
        spec = dict(title=title or f"Layer occurrence per type ({which})",
                    subtitle=steps + "layer calls in one predict call, counted from the traced layer spans",
                    x_label="layer calls per predict call (count)", y_label="layer type", categories=labels,
                    height=_height(len(labels)))

        def draw(panel):
            panel.hbars(labels, part["count"])
            panel.text(part["count"], labels, [f"{c} ({p:.1f}%)" for c, p in zip(part["count"], part["percent"])])
        return spec, draw
    if kind.startswith("latency"):
        col, lo, hi = ("self_median_ms", "self_p25_ms", "self_p75_ms") if kind == "latency_layer" else (
            "median_ms", "p25_ms", "p75_ms")
        part = part.sort_values(col, ascending=False).head(top)
        if kind == "latency_layer":
            labels = [f"{i} {n} ({t})" for i, n, t in zip(part["layer_index"], part["name"], part["layer_type"])]
            what = f"the {len(part)} slowest layers, self time"
        else:
            labels = list(part["layer_type"].astype(str))
            what = "self time summed per type in each predict call"
        reps = int(part["repetitions"].max())
        spec = dict(title=title or f"{df.attrs['title']} ({which})",
                    subtitle=f"{steps}median and p25-p75 over {reps} traced predict calls; {what}",
                    x_label="latency (ms)", y_label="layer" if kind == "latency_layer" else "layer type",
                    categories=labels, height=_height(len(labels)))

        def draw(panel):
            panel.hbars(labels, part[col])
            panel.whiskers(labels, part[lo], part[hi], horizontal=True)
        return spec, draw
    col, x_label, what = "memory_bytes", "memory held at the layer's end (bytes)", "net bytes allocated and held"
    if not part[col].notna().any():
        col, x_label, what = "io_bytes", "bytes read + written (bytes)", "bytes moved"
        if not part[col].notna().any():
            raise AnalysisError("nothing to plot: this trace recorded no memory and no bytes per layer "
                                "(see the frame's attrs['note'])")
    part = part.dropna(subset=[col]).sort_values(col, ascending=False).head(top)
    labels = [f"{i} {n} ({t})" for i, n, t in zip(part["layer_index"], part["name"], part["layer_type"])]
    spec = dict(title=title or f"{df.attrs['title']} ({which})",
                subtitle=f"{steps}median {what} per layer span, over the traced predict calls", x_label=x_label,
                y_label="layer", categories=labels,
                height=_height(len(labels)))

    def draw(panel):
        panel.hbars(labels, part[col])
        if col == "memory_bytes":
            panel.whiskers(labels, part["memory_p25_bytes"], part["memory_p75_bytes"], horizontal=True)
    return spec, draw


def _height(rows: int) -> int:
    return int(min(1600, max(260, 90 + 16 * rows)))
