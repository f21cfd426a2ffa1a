"""How far each framework's outputs are from a reference framework's, from the values both captured (the
``outputs`` frame, :mod:`mlms_nb.evaluation.outputs`): one row per framework x output x metric.

Always: ``max_abs_error`` and ``mean_abs_error`` over every element (the output's unit), ``max_rel_error`` =
max|a - r| / max|r| and ``mean_rel_error`` = mean|a - r| / mean|r| (fractions of the reference's range, as the
layer-level divergence defines them: an element-wise ratio explodes on zeros). ``cosine`` (per input, averaged;
1 = same direction) only over inputs whose output is a vector of 2 or more elements: the cosine of two single values
is their signs' agreement, 1.0 beside any error. ``flipped_decisions``: how many inputs' decisions differ from the
reference's, where a rule turns the output into one (the ``detail`` column says which): ``argmax`` of an input's
vector of 2 or more values (a class), or ``value > 0.5`` of one value per input when every value of both frameworks
lies in [0, 1] (a probability, as a sigmoid gives); no row where neither applies. An output that cannot be
compared (one framework lacks it, or kept no values of it, or its shapes differ on every input) is one
``not_compared`` row whose ``detail`` says why, not metrics of NaN over 0 inputs. Built-in metrics by name (``outputs[].metrics`` in the manifest, or ``metrics=[...]``), each averaged
over the inputs: ``mse``, ``mae``, ``iou`` (masks: elements > 0.5; 1 when both are empty) and ``exact_match``
(1 when every element is equal). A user metric is a callable ``fn(output, reference) -> float`` given as
``metrics={"name": fn}`` in the Python API; it runs on each input's pair of arrays (shaped as the output) and is
averaged too. Inputs whose shapes differ between the two frameworks are not compared (``inputs`` counts the rest).
"""
from __future__ import annotations

from typing import Any, Callable, Iterable, Mapping

import numpy as np
import pandas as pd

from mlms_nb.errors import MlmsError
from mlms_nb.schema.evaluation import OUTPUT_AGREEMENT

EPS = 1e-12


def _iou(a: np.ndarray, r: np.ndarray) -> float:
    a, r = a > 0.5, r > 0.5
    union = np.logical_or(a, r).sum()
    return 1.0 if union == 0 else float(np.logical_and(a, r).sum() / union)


BUILTIN_METRICS: dict[str, Callable[[np.ndarray, np.ndarray], float]] = {
    "mse": lambda a, r: float(np.mean((a - r) ** 2)),
    "mae": lambda a, r: float(np.mean(np.abs(a - r))),
    "iou": _iou,
    "exact_match": lambda a, r: float(np.array_equal(a, r)),
}


METRIC_UNITS = {"max_abs_error": "output's unit", "mean_abs_error": "output's unit", "max_rel_error": "fraction",
                "mean_rel_error": "fraction", "cosine": "-1..1", "flipped_decisions": "inputs", "not_compared": "",
                "mse": "output's unit²", "mae": "output's unit", "iou": "fraction", "exact_match": "fraction"}
"""The unit of each metric's value; a user metric's is its own."""


def metric_unit(metric: str) -> str:
    """The unit of ``metric``'s value (``"the metric's own"`` for a user metric)."""
    return METRIC_UNITS.get(metric, "the metric's own")


def resolve_metrics(metrics: Mapping[str, Any] | Iterable[str] | None) -> dict[str, Callable]:
    """Names (built-in) and ``{name: callable}`` as one mapping name -> function; an unknown name is refused."""
    if metrics is None:
        return {}
    items = metrics.items() if isinstance(metrics, Mapping) else [(m, m) for m in ([metrics] if isinstance(
        metrics, str) else metrics)]
    out = {}
    for name, fn in items:
        if isinstance(fn, str):
            if fn not in BUILTIN_METRICS:
                raise MlmsError(f"metrics: unknown metric {fn!r}; built in: {', '.join(BUILTIN_METRICS)}, or pass "
                                "{name: fn} with fn(output, reference) -> float")
            fn = BUILTIN_METRICS[fn]
        if not callable(fn):
            raise MlmsError(f"metrics[{name!r}]: expected a built-in name or a callable fn(output, reference) -> "
                            f"float, got {type(fn).__name__}")
        out[str(name)] = fn
    return out


def manifest_metrics(manifests: Mapping[str, dict]) -> dict[str, list[str]]:
    """Output name -> the built-in metrics its manifests (framework -> ``Manifest.to_dict()``) list."""
    out: dict[str, list[str]] = {}
    for manifest in manifests.values():
        for i, spec in enumerate(manifest.get("outputs") or []):
            name = spec.get("name") or ("output" if i == 0 else f"output_{i}")
            for metric in spec.get("metrics") or []:
                out.setdefault(name, [])
                if metric not in out[name]:
                    out[name].append(metric)
    return out


def agreement(outputs: pd.DataFrame, reference: str | None = None, metrics: Any = None,
              per_output: Mapping[str, Iterable[str]] | None = None) -> pd.DataFrame:
    """The ``output_agreement`` frame of every framework in ``outputs`` against ``reference`` (default: the first
    framework); ``metrics`` apply to every output, ``per_output`` maps an output name to built-in metric names."""
    if outputs.empty or "values" not in outputs or outputs["values"].isna().all():
        return pd.DataFrame()
    frameworks = list(dict.fromkeys(outputs["framework"]))
    reference = reference or frameworks[0]
    if reference not in frameworks:
        raise MlmsError(f"reference framework {reference!r} captured no outputs; captured: {', '.join(frameworks)}")
    extra = resolve_metrics(metrics)
    kept = outputs[outputs["values"].notna()]
    ref = {(r.input_id, r.chunk, r.output): r for r in kept[kept["framework"] == reference].itertuples()}
    rows = []
    for fw in frameworks:
        if fw == reference:
            continue
        mine = kept[kept["framework"] == fw]
        both = outputs[outputs["framework"].isin([fw, reference])]
        for output in dict.fromkeys(both["output"]):
            pairs, shapes = [], None
            for r in mine[mine["output"] == output].itertuples():
                other = ref.get((r.input_id, r.chunk, r.output))
                if other is not None and list(r.shape) == list(other.shape):
                    shape = tuple(int(d) for d in r.shape)
                    pairs.append((np.asarray(r.values, np.float64).reshape(shape),
                                  np.asarray(other.values, np.float64).reshape(shape)))
                elif other is not None and shapes is None:
                    shapes = (list(r.shape), list(other.shape))
            base = {"framework": fw, "reference": reference, "output": output}
            if not pairs:
                why = _why_not_compared(outputs, fw, reference, output, shapes)
                rows.append({**base, "metric": "not_compared", "value": float("nan"), "inputs": 0, "detail": why})
                continue
            functions = {**extra, **resolve_metrics(list((per_output or {}).get(output, ())))}
            for metric, (value, inputs, detail) in _compare(pairs, functions).items():
                rows.append({**base, "metric": metric, "value": value, "inputs": inputs, "detail": detail})
    return OUTPUT_AGREEMENT.frame(rows) if rows else pd.DataFrame()


def _why_not_compared(outputs: pd.DataFrame, fw: str, reference: str, output: str,
                      shapes: tuple[list, list] | None) -> str:
    """Why no input of ``output`` could be compared between ``fw`` and ``reference``: one sentence."""
    if shapes is not None:
        return f"its shapes differ on every input ({fw} {shapes[0]}, {reference} {shapes[1]})"
    for who in (fw, reference):
        rows = outputs[(outputs["framework"] == who) & (outputs["output"] == output)]
        if rows.empty:
            others = ", ".join(dict.fromkeys(outputs.loc[outputs["framework"] == who, "output"])) or "none"
            return f"{who} has no output {output!r} (its outputs: {others})"
        if rows["values"].isna().all():
            return f"{who} kept no values of it (summaries only)"
    return f"no input has values of it in both {fw} and {reference}"


def _compare(pairs: list[tuple[np.ndarray, np.ndarray]],
             functions: dict[str, Callable]) -> dict[str, tuple[float, int, str]]:
    """metric -> (value, inputs it covers, detail) over ``pairs`` (output, reference) of the compared inputs."""
    a = np.concatenate([p[0].reshape(-1) for p in pairs])
    r = np.concatenate([p[1].reshape(-1) for p in pairs])
    abs_err = np.abs(a - r)
    scale_max = max(float(np.max(np.abs(r))) if r.size else 0.0, EPS)
    scale_mean = max(float(np.mean(np.abs(r))) if r.size else 0.0, EPS)
    n = len(pairs)
    out = {"max_abs_error": (float(abs_err.max()) if abs_err.size else 0.0, n, ""),
           "mean_abs_error": (float(abs_err.mean()) if abs_err.size else 0.0, n, ""),
           "max_rel_error": (float(abs_err.max()) / scale_max if abs_err.size else 0.0, n, ""),
           "mean_rel_error": (float(abs_err.mean()) / scale_mean if abs_err.size else 0.0, n, "")}
    cosines = []
    for x, y in pairs:
        if x.size >= 2:  # vectors only: two single values are parallel whatever their gap
            x, y = x.reshape(-1), y.reshape(-1)
            norm = np.linalg.norm(x) * np.linalg.norm(y)
            cosines.append(float(x @ y / norm) if norm > 0 else float(np.array_equal(x, y)))
    if cosines:
        out["cosine"] = (float(np.mean(cosines)), len(cosines), "" if len(cosines) == n else
                         "over the inputs whose output has 2 or more elements")
    flipped = flipped_decisions(pairs)
    if flipped is not None:
        out["flipped_decisions"] = flipped
    for name, fn in functions.items():
        try:
            out[name] = (float(np.mean([float(fn(x, y)) for x, y in pairs])), n, "")
        except Exception as err:  # noqa: BLE001 - a user's metric failing is named, not a traceback
            raise MlmsError(f"metric {name!r} failed: {type(err).__name__}: {err}") from None
    return out


def flipped_decisions(pairs: list[tuple[np.ndarray, np.ndarray]]) -> tuple[float, int, str] | None:
    """How many inputs decide otherwise than the reference, the inputs a rule applied to, and the rule: argmax of
    an input's 1-D vector of 2 or more values; ``value > 0.5`` of an input's one value when every single value of
    both frameworks lies in [0, 1]. None when no rule applies to any input."""
    vectors = [(x, y) for x, y in pairs if x.ndim == 1 and x.size >= 2]
    singles = [(x, y) for x, y in pairs if x.size == 1]
    if singles:
        values = np.concatenate([np.concatenate([x.reshape(-1), y.reshape(-1)]) for x, y in singles])
        if not (np.all(values >= 0) and np.all(values <= 1)):  # NaN fails both: no threshold applies
            singles = []
    flips, parts = 0, []
    if vectors:
        flips += sum(int(np.argmax(x) != np.argmax(y)) for x, y in vectors)
        sizes = sorted({x.size for x, _ in vectors})
        count = str(sizes[0]) if len(sizes) == 1 else f"{sizes[0]} to {sizes[-1]}"
        parts.append(f"argmax of each input's {count} values")
    if singles:
        flips += sum(int((float(x.reshape(-1)[0]) > 0.5) != (float(y.reshape(-1)[0]) > 0.5)) for x, y in singles)
        parts.append("each input's one value > 0.5, all values in [0, 1]")
    if not parts:
        return None
    return float(flips), len(vectors) + len(singles), "; ".join(parts)
