"""A/B comparison of two evaluations: per-metric deltas with a significance test, and per-layer deltas.

**Test**: the two-sided Mann-Whitney U test (SciPy, ``method="auto"``: exact for small samples without ties,
else the normal approximation) on the raw per-call latency samples of A and B: it asks whether one side's
calls tend to take longer than the other's, without assuming any distribution. ``significant``: ``p_value <
alpha`` (default 0.05). The median delta's 95% interval is a seeded percentile bootstrap (2000 resamples of
each side's median, drawn as order statistics: :mod:`mlms_nb._bootstrap`, the same bootstrap as the
evaluation's CI of the median).

Deltas are B - A (positive: B is slower / has more), percentages relative to A.

- :func:`compute` -- per framework, batch size and scenario present in both: medians, p90s, throughputs,
  deltas, p-value. When the two share no framework and each has one (torch vs onnxruntime), rows are
  matched on batch size and scenario.
- :func:`layers` -- per layer name: median per-predict-call time (self time, summed over the calls of that
  name) in A and B, delta, Mann-Whitney p-value over the traced repetitions.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from mlms_nb._bootstrap import RESAMPLES, bootstrap_medians
from mlms_nb.display import people_table
from mlms_nb.schema.evaluation import LATENCY, SampleKey

from . import _plot
from . import layers as _layers
from ._plot import AnalysisError

ALPHA = 0.05
KEY = LATENCY.key
REQUIRED = LATENCY.pick("framework", "batch_size", "median_ms")
OPTIONAL = LATENCY.pick("scenario", "p90_ms", "throughput_per_s")
"""The latency columns read (names from :mod:`mlms_nb.schema.evaluation`); the optional ones may be missing."""
TEST = "two-sided Mann-Whitney U test on the raw per-call latency samples (scipy.stats.mannwhitneyu)"


def _parts(ev, side: str) -> tuple[pd.DataFrame, dict]:
    """An Evaluation (``.latency``, ``.samples``) or a ``(latency frame, samples)`` pair."""
    if isinstance(ev, tuple) and len(ev) == 2:
        latency, samples = ev
    else:
        latency, samples = getattr(ev, "latency", None), getattr(ev, "samples", None)
    if not isinstance(latency, pd.DataFrame):
        raise AnalysisError(f"compare: {side} must be an Evaluation or a (latency frame, samples) pair, "
                            f"got {type(ev).__name__}")
    _plot.require_columns(latency, REQUIRED, f"{side}'s latency frame")
    latency = latency.copy()
    if "scenario" not in latency:
        latency["scenario"] = "single-stream"
    return latency, dict(samples or {})


def _test(a_ns: np.ndarray | None, b_ns: np.ndarray | None, seed: int) -> dict:
    if a_ns is None or b_ns is None or len(a_ns) == 0 or len(b_ns) == 0:
        return dict(p_value=np.nan, delta_ci_low_ms=np.nan, delta_ci_high_ms=np.nan)
    stats = _plot.scipy_stats()
    a, b = np.asarray(a_ns, dtype=float) / 1e6, np.asarray(b_ns, dtype=float) / 1e6
    p = float(stats.mannwhitneyu(b, a, alternative="two-sided").pvalue)
    rng = np.random.default_rng(seed)
    diff = bootstrap_medians(b, RESAMPLES, rng) - bootstrap_medians(a, RESAMPLES, rng)
    lo, hi = np.quantile(diff, [0.025, 0.975])
    return dict(p_value=p, delta_ci_low_ms=float(lo), delta_ci_high_ms=float(hi))


@people_table
def compute(a, b, labels: tuple[str, str] = ("A", "B"), alpha: float = ALPHA, seed: int = 0) -> pd.DataFrame:
    """Per matched (framework, batch size, scenario): ``a_median_ms, b_median_ms, delta_median_ms,
    delta_median_pct, delta_ci_low_ms, delta_ci_high_ms, a_p90_ms, b_p90_ms, delta_p90_ms, a_throughput_per_s,
    b_throughput_per_s, delta_throughput_pct, a_samples, b_samples, p_value, significant, faster``.

    ``a``/``b``: Evaluations, or ``(latency frame, samples)`` pairs (samples: ``{(framework, batch_size,
    scenario): int64 ns array}``). ``faster``: the label of the side with the lower median when significant,
    else ``"no significant difference"``.
    """
    lat_a, samples_a = _parts(a, labels[0])
    lat_b, samples_b = _parts(b, labels[1])
    merged = lat_a.merge(lat_b, on=list(KEY), suffixes=("_a", "_b"))
    by_framework = True
    if merged.empty and lat_a["framework"].nunique() == 1 and lat_b["framework"].nunique() == 1:
        by_framework = False
        merged = lat_a.merge(lat_b, on=["batch_size", "scenario"], suffixes=("_a", "_b"))
    if merged.empty:
        raise AnalysisError(f"{labels[0]} and {labels[1]} share no framework x batch size x scenario to compare "
                            f"({labels[0]}: {sorted(set(map(str, lat_a['framework'])))}, batch sizes "
                            f"{sorted(lat_a['batch_size'].unique())}; {labels[1]}: "
                            f"{sorted(set(map(str, lat_b['framework'])))}, batch sizes "
                            f"{sorted(lat_b['batch_size'].unique())})")
    rows = []
    for i, r in enumerate(merged.to_dict("records")):
        fa = r["framework"] if by_framework else r["framework_a"]
        fb = r["framework"] if by_framework else r["framework_b"]
        sa = samples_a.get(SampleKey(fa, int(r["batch_size"]), r["scenario"]))
        sb = samples_b.get(SampleKey(fb, int(r["batch_size"]), r["scenario"]))
        test = _test(sa, sb, seed + i)
        med_a, med_b = float(r["median_ms_a"]), float(r["median_ms_b"])
        tp_a, tp_b = r.get("throughput_per_s_a", np.nan), r.get("throughput_per_s_b", np.nan)
        p90_a, p90_b = r.get("p90_ms_a", np.nan), r.get("p90_ms_b", np.nan)
        significant = bool(test["p_value"] < alpha) if np.isfinite(test["p_value"]) else False
        rows.append({
            "framework": fa if by_framework else f"{fa} vs {fb}", "batch_size": int(r["batch_size"]),
            "scenario": r["scenario"], "a_median_ms": med_a, "b_median_ms": med_b,
            "delta_median_ms": med_b - med_a, "delta_median_pct": 100.0 * (med_b - med_a) / med_a,
            "delta_ci_low_ms": test["delta_ci_low_ms"], "delta_ci_high_ms": test["delta_ci_high_ms"],
            "a_p90_ms": p90_a, "b_p90_ms": p90_b, "delta_p90_ms": p90_b - p90_a,
            "a_throughput_per_s": tp_a, "b_throughput_per_s": tp_b,
            "delta_throughput_pct": 100.0 * (tp_b - tp_a) / tp_a if tp_a else np.nan,
            "a_samples": len(sa) if sa is not None else 0, "b_samples": len(sb) if sb is not None else 0,
            "p_value": test["p_value"], "significant": significant,
            "faster": (labels[0] if med_a < med_b else labels[1]) if significant else "no significant difference",
        })
    out = pd.DataFrame(rows)
    missing = int((out["a_samples"].eq(0) | out["b_samples"].eq(0)).sum())
    out.attrs.update(analysis="compare", labels=tuple(labels), alpha=alpha, test=TEST)
    out.attrs["note"] = (f"deltas are {labels[1]} - {labels[0]} (positive: {labels[1]} slower), % of {labels[0]}; "
                         f"p_value: {TEST}; significant: p < {alpha}; delta CI: 95% percentile bootstrap of the "
                         f"difference of medians ({RESAMPLES} resamples, seeded); medians, p90 and throughput as "
                         f"each evaluation reported them (untraced timed loops)"
                         + (f"; {missing} row(s) had no raw samples, so no test" if missing else ""))
    out.attrs["title"] = f"{labels[1]} vs {labels[0]}: latency"
    return out


def _per_call(spans, framework: str | None, side: str) -> pd.DataFrame:
    calls = _layers._calls(spans)
    frameworks = sorted(calls["framework"].unique())
    if framework is None:
        if len(frameworks) > 1:
            raise AnalysisError(f"{side}'s trace holds several frameworks ({', '.join(frameworks)}); "
                                f"say which with framework_{side.lower()}=...")
        framework = frameworks[0]
    calls = calls[calls["framework"] == framework]
    if calls.empty:
        raise AnalysisError(f"{side}'s trace has no layers of framework {framework!r}; it has: {', '.join(frameworks)}")
    per = (calls.groupby(["batch_size", "repetition", "name"])
           .agg(self_ns=("self_ns", "sum"), layer_type=("layer_type", "first"), first=("layer_index", "min"))
           .reset_index())
    return per.assign(framework=framework)


@people_table
def layers(spans_a, spans_b, labels: tuple[str, str] = ("A", "B"), framework_a: str | None = None,
           framework_b: str | None = None, alpha: float = ALPHA) -> pd.DataFrame:
    """Per batch size and layer name present in both traces: ``a_median_ms, b_median_ms`` (median over the
    predict calls of the layer's per-call self time, summed over its calls in one predict call), ``a_p25_ms,
    a_p75_ms, b_p25_ms, b_p75_ms, delta_ms, delta_pct, a_repetitions, b_repetitions, p_value, significant``.

    Names match across frameworks (ONNX Runtime and TensorFlow layers carry the PyTorch module names).
    ``framework_a``/``framework_b`` pick one framework from a trace holding several.
    """
    stats = _plot.scipy_stats()
    pa = _per_call(spans_a, framework_a, labels[0])
    pb = _per_call(spans_b, framework_b, labels[1])
    rows = []
    for (bs, name), ga in pa.groupby(["batch_size", "name"], sort=False):
        gb = pb[(pb["batch_size"] == bs) & (pb["name"] == name)]
        if gb.empty:
            continue
        a, b = ga["self_ns"].to_numpy(float) / 1e6, gb["self_ns"].to_numpy(float) / 1e6
        qa, qb = np.percentile(a, [25, 50, 75]), np.percentile(b, [25, 50, 75])
        p = float(stats.mannwhitneyu(b, a, alternative="two-sided").pvalue)
        rows.append({"batch_size": int(bs), "name": name, "a_layer_type": ga["layer_type"].iloc[0],
                     "b_layer_type": gb["layer_type"].iloc[0], "order": int(ga["first"].min()),
                     "a_median_ms": qa[1], "a_p25_ms": qa[0], "a_p75_ms": qa[2],
                     "b_median_ms": qb[1], "b_p25_ms": qb[0], "b_p75_ms": qb[2],
                     "delta_ms": qb[1] - qa[1], "delta_pct": 100.0 * (qb[1] - qa[1]) / qa[1] if qa[1] else np.nan,
                     "a_repetitions": len(a), "b_repetitions": len(b), "p_value": p, "significant": p < alpha})
    if not rows:
        raise AnalysisError(f"{labels[0]} and {labels[1]} share no layer name at a common batch size")
    out = pd.DataFrame(rows).sort_values(["batch_size", "order"], ignore_index=True).drop(columns="order")
    n_a = sorted(set(pa["name"])), sorted(set(pb["name"]))
    only = len(set(n_a[0]) ^ set(n_a[1]))
    out.attrs.update(analysis="compare_layers", labels=tuple(labels), alpha=alpha)
    out.attrs["note"] = (f"per layer name: self time per predict call (summed over that module's calls), median and "
                         f"p25/p75 over the traced predict calls; deltas {labels[1]} - {labels[0]}; p_value: two-sided "
                         f"Mann-Whitney U over the repetitions (with few repetitions no p-value can be small: 3 vs 3 "
                         f"calls give at least 0.1); significant: p < {alpha}; traced timings include tracer overhead"
                         + (f"; {only} layer name(s) appear in only one trace and are left out" if only else ""))
    out.attrs["title"] = f"{labels[1]} vs {labels[0]}: per-layer latency"
    return out


def plot(df: pd.DataFrame, backend: str = "bokeh", *, batch_size: int | None = None, top: int = 30,
         title: str | None = None):
    """:func:`compute` frame: median latency delta (% of A) per framework and batch size with the bootstrap
    CI; :func:`layers` frame: delta per layer (ms) for the ``top`` layers by |delta|, one batch size."""
    kind = _plot.require_analysis(df, "compare", "compare_layers")
    la, lb = df.attrs["labels"]
    if df.empty:
        raise AnalysisError("nothing to plot: the frame has no rows")
    if kind == "compare":
        labels = [f"{f}, batch {b}" + (f", {s}" if df["scenario"].nunique() > 1 else "")
                  for f, b, s in zip(df["framework"], df["batch_size"], df["scenario"])]
        panel = _plot.charts(backend, [dict(
            title=title or f"{df.attrs['title']}: median delta ({lb} - {la}, % of {la}), 95% bootstrap CI; "
                           f"orange: significant (Mann-Whitney U, p < {df.attrs['alpha']})",
            x_label=f"median latency change, {lb} vs {la} (%)", y_label="framework, batch size",
            categories=labels)], height=_layers._height(len(labels)))[0]
        for sig, color in ((False, _plot.color(0)), (True, _plot.color(1))):
            sel = df["significant"].to_numpy() == sig
            if sel.any():
                panel.hbars(np.array(labels)[sel], df.loc[sel, "delta_median_pct"], color=color)
        scale = 100.0 / df["a_median_ms"]
        panel.whiskers(labels, df["delta_ci_low_ms"] * scale, df["delta_ci_high_ms"] * scale, horizontal=True)
        panel.text(df["delta_median_pct"], labels, [f"p={p:.2g}" for p in df["p_value"]])
        return _plot.combine([panel])
    bs = batch_size if batch_size is not None else int(df["batch_size"].min())
    part = df[df["batch_size"] == bs]
    if part.empty:
        raise AnalysisError(f"no rows for batch size {batch_size}; the frame has {sorted(df['batch_size'].unique())}")
    part = part.reindex(part["delta_ms"].abs().sort_values(ascending=False).index).head(top)
    labels = [f"{n} ({t})" for n, t in zip(part["name"], part["a_layer_type"])]
    panel = _plot.charts(backend, [dict(
        title=title or f"{df.attrs['title']} (batch size {bs}): delta of the median self time per predict call "
                       f"({lb} - {la}), top {len(part)} by |delta|; orange: significant (Mann-Whitney U)",
        x_label=f"latency change, {lb} - {la} (ms)", y_label="layer", categories=labels)],
        height=_layers._height(len(labels)))[0]
    for sig, color in ((False, _plot.color(0)), (True, _plot.color(1))):
        sel = part["significant"].to_numpy() == sig
        if sel.any():
            panel.hbars(np.array(labels)[sel], part.loc[sel, "delta_ms"], color=color)
    return _plot.combine([panel])

