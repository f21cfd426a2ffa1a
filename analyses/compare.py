"""A/B comparison of two evaluations: per-metric deltas with a significance test, and per-layer deltas.

**Test**: the two-sided Mann-Whitney U test (SciPy, ``method="auto"``: exact for small samples without ties,
else the normal approximation) on the raw per-call latency samples of A and B: it asks whether one side's
calls tend to take longer than the other's, without assuming any distribution. ``significant``: ``p_value <
alpha`` (default 0.05).

**Interval**: the 95% interval of the median's change is a seeded percentile bootstrap of the *ratio* of the
medians, B's over A's (2000 resamples of each side's median, drawn as order statistics: :mod:`mlms_nb._bootstrap`,
the same bootstrap as the evaluation's CI of the median): ``latency_ratio_low`` .. ``latency_ratio_high`` around
``latency_ratio`` (the names :mod:`.normalized` gives the same ratio across agents). A latency is positive, so
the ratio is, and the change it stands for can never fall below -100% (a bootstrap of the *difference* of
medians, divided by A's median, gave -126% where A's calls were spread wide); the percentile interval of a
ratio is that of its logarithm, so a halving and a doubling are treated alike.

Deltas are B - A (positive: B is slower / has more), percentages relative to A.

- :func:`compute` -- per framework, batch size and scenario present in both: medians, p90s, throughputs,
  deltas, p-value. When the two share no framework and each has one (torch vs onnxruntime), rows are
  matched on batch size and scenario. What cannot hold silently is said in ``attrs["warnings"]``: two
  different models compared, and frameworks or batch sizes in one side only (left out by name).
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
from .normalized import busy_flags

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


def ratio_ci(a, b, seed: int = 0, resamples: int = RESAMPLES) -> tuple[float, float]:
    """The 95% percentile-bootstrap interval of median(b) / median(a) (positive samples, any one unit): each
    side's median resampled on its own, the ratio of each pair of resampled medians, its 2.5% and 97.5%
    quantiles. Always within (0, inf) for positive samples."""
    rng = np.random.default_rng(seed)
    ratio = bootstrap_medians(b, resamples, rng) / bootstrap_medians(a, resamples, rng)
    lo, hi = np.quantile(ratio, [0.025, 0.975])
    return float(lo), float(hi)


def _test(a_ns: np.ndarray | None, b_ns: np.ndarray | None, seed: int) -> dict:
    if a_ns is None or b_ns is None or len(a_ns) == 0 or len(b_ns) == 0:
        return dict(p_value=np.nan, latency_ratio_low=np.nan, latency_ratio_high=np.nan)
    stats = _plot.scipy_stats()
    a, b = np.asarray(a_ns, dtype=float) / 1e6, np.asarray(b_ns, dtype=float) / 1e6
    p = float(stats.mannwhitneyu(b, a, alternative="two-sided").pvalue)
    lo, hi = ratio_ci(a, b, seed)
    return dict(p_value=p, latency_ratio_low=lo, latency_ratio_high=hi)


def _sides(lat: pd.DataFrame) -> dict[str, set[int]]:
    """framework -> the batch sizes a latency frame measured."""
    return {str(fw): set(int(b) for b in part["batch_size"]) for fw, part in lat.groupby("framework", sort=False)}


def _left_out(lat_a: pd.DataFrame, lat_b: pd.DataFrame, labels: tuple[str, str], by_framework: bool) -> list[str]:
    """What one side measured and the other did not, by name (never dropped in silence)."""
    sides = _sides(lat_a), _sides(lat_b)
    out = []
    if by_framework:
        for (mine, other), label in ((sides, labels[0]), (sides[::-1], labels[1])):
            alone = [fw for fw in mine if fw not in other]
            if alone:
                out.append(f"left out: {', '.join(alone)} measured in {label} only")
            for fw in (f for f in mine if f in other):
                extra = sorted(mine[fw] - other[fw])
                if extra:
                    out.append(f"left out: {fw} at batch size(s) {', '.join(map(str, extra))}, measured in {label} "
                               "only")
    else:
        for (mine, other), label in ((sides, labels[0]), (sides[::-1], labels[1])):
            extra = sorted(set().union(*mine.values()) - set().union(*other.values()))
            if extra:
                out.append(f"left out: batch size(s) {', '.join(map(str, extra))}, measured in {label} only")
    return out


def _models(a, b, labels: tuple[str, str]) -> list[str]:
    """A sentence when the two sides are evaluations of different models (named), else none."""
    ma, mb = getattr(a, "model", None), getattr(b, "model", None)
    if ma is None or mb is None or ma == mb:
        return []
    return [f"{labels[0]} is {ma} and {labels[1]} is {mb}: two different models, so the deltas compare the models "
            "(and whatever else differs), not one model on two stacks"]


@people_table
def compute(a, b, labels: tuple[str, str] = ("A", "B"), alpha: float = ALPHA, seed: int = 0) -> pd.DataFrame:
    """Per matched (framework, batch size, scenario): ``a_median_ms, b_median_ms, delta_median_ms,
    delta_median_pct, latency_ratio, latency_ratio_low, latency_ratio_high, a_p90_ms, b_p90_ms, delta_p90_ms, a_throughput_per_s,
    b_throughput_per_s, delta_throughput_pct, a_samples, b_samples, p_value, significant, faster``.

    ``a``/``b``: Evaluations, or ``(latency frame, samples)`` pairs (samples: ``{(framework, batch_size,
    scenario): int64 ns array}``). ``faster``: the label of the side with the lower median when significant,
    else ``"no significant difference"``; followed by ``" (machine busy)"`` when either side's loop ran on a busy
    machine (``machine_busy``: that side's label, "both" or "" for neither; the latency frames' ``busy``,
    :mod:`mlms_nb.profilers.load`): such a difference may be the other programs', not A's or B's.
    ``attrs["warnings"]``: different models, rows of one side only.
    """
    lat_a, samples_a = _parts(a, labels[0])
    lat_b, samples_b = _parts(b, labels[1])
    read = "busy" in lat_a or "busy" in lat_b  # the machine's load, read since issue 37
    lat_a, lat_b = (lat.assign(busy=busy_flags(lat)) for lat in (lat_a, lat_b))
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
        busy = [label for label, side in zip(labels, ("_a", "_b")) if r["busy" + side]]
        busy = "both" if len(busy) == 2 else "".join(busy)
        rows.append({
            "framework": fa if by_framework else f"{fa} vs {fb}", "batch_size": int(r["batch_size"]),
            "scenario": r["scenario"], "a_median_ms": med_a, "b_median_ms": med_b,
            "delta_median_ms": med_b - med_a, "delta_median_pct": 100.0 * (med_b - med_a) / med_a,
            "latency_ratio": med_b / med_a, "latency_ratio_low": test["latency_ratio_low"],
            "latency_ratio_high": test["latency_ratio_high"],
            "a_p90_ms": p90_a, "b_p90_ms": p90_b, "delta_p90_ms": p90_b - p90_a,
            "a_throughput_per_s": tp_a, "b_throughput_per_s": tp_b,
            "delta_throughput_pct": 100.0 * (tp_b - tp_a) / tp_a if tp_a else np.nan,
            "a_samples": len(sa) if sa is not None else 0, "b_samples": len(sb) if sb is not None else 0,
            "p_value": test["p_value"], "significant": significant,
            "faster": ((labels[0] if med_a < med_b else labels[1]) if significant else "no significant difference")
            + (" (machine busy)" if busy else ""),
            **({"machine_busy": busy} if read else {}),
        })
    out = pd.DataFrame(rows)
    missing = int((out["a_samples"].eq(0) | out["b_samples"].eq(0)).sum())
    out.attrs.update(analysis="compare", labels=tuple(labels), alpha=alpha, test=TEST)
    out.attrs["note"] = (f"deltas are {labels[1]} - {labels[0]} (positive: {labels[1]} slower), % of {labels[0]}; "
                         f"p_value: {TEST}; significant: p < {alpha}; latency ratio: {labels[1]}'s median over "
                         f"{labels[0]}'s, its low..high the 95% percentile bootstrap interval of that ratio "
                         f"({RESAMPLES} resamples of each side, seeded): above 0, a change above -100%; medians, p90 "
                         "and throughput as each evaluation reported them (untraced timed loops)"
                         + (f"; {missing} row(s) had no raw samples, so no test" if missing else "")
                         + ("; machine busy: a side timed while other programs took the CPU its threads needed (see "
                            "its warnings): its difference may be theirs" if "machine_busy" in out
                            and out["machine_busy"].astype(bool).any() else ""))
    models = _models(a, b, labels)
    out.attrs["warnings"] = models + _left_out(lat_a, lat_b, labels, by_framework)
    out.attrs["title"] = f"{labels[1]} vs {labels[0]}: latency" + (
        f" of two different models ({b.model} vs {a.model})" if models else "")
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
        panel.whiskers(labels, 100.0 * (df["latency_ratio_low"] - 1.0), 100.0 * (df["latency_ratio_high"] - 1.0),
                       horizontal=True)
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

