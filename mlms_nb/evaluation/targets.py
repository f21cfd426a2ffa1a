"""Metrics against ground truth: each framework's outputs against the targets a dataset carries
(``Batch.targets``: a ``.npz`` array or a table column ``target`` / ``target:<output>``, or Python
``(input, targets)`` pairs; see :mod:`mlms_nb.data.datasets`), beside the agreement between frameworks
(:mod:`mlms_nb.evaluation.agreement`).

Per input and output with a target, each metric runs on the pair ``(output, target)`` (float64 arrays shaped as the
output; a flat target of the output's size is reshaped to it): the built-in metrics the manifest names for that
output (``outputs[].metrics``) and ``metrics=`` (built-in names, or ``{name: fn(output, target) -> float}``);
``mse`` and ``mae`` when neither names any. :class:`TargetScores` keeps one float per input x output x metric (not
the arrays), and :meth:`TargetScores.frame` averages them over the inputs: the ``target_metrics`` frame
(:data:`mlms_nb.schema.evaluation.TARGET_METRICS`), with the standard deviation, a 95% confidence interval of
the mean (Student's t) and the count.
"""
from __future__ import annotations

import pickle
from typing import Any, Callable, Mapping

import numpy as np
import pandas as pd

from mlms_nb.data.feeds import output_names
from mlms_nb.errors import MlmsError
from mlms_nb.evaluation.agreement import manifest_metrics, metric_unit, resolve_metrics
from mlms_nb.evaluation.stats import summarize
from mlms_nb.manifest import Manifest
from mlms_nb.schema.evaluation import TARGET_METRICS

DEFAULT_METRICS = ("mse", "mae")
"""What an output with a target gets when neither the manifest nor ``metrics=`` names a metric."""

def shippable(metrics: Any) -> tuple[Any, list[str]]:
    """``metrics`` as a worker process can receive them (pickled): names, and the callables that pickle; and the
    names of those that do not (a lambda, a function defined in a notebook cell)."""
    if metrics is None or isinstance(metrics, str) or not isinstance(metrics, Mapping):
        return metrics, []
    kept, dropped = {}, []
    for name, fn in metrics.items():
        try:
            pickle.dumps(fn)
            kept[name] = fn
        except Exception:  # noqa: BLE001 - whatever pickling raises, the metric stays here
            dropped.append(str(name))
    return kept, dropped


class TargetScores:
    """One framework's outputs against the targets, input by input (see the module)."""

    def __init__(self, manifest: Manifest, framework: str, metrics: Any = None):
        self.framework = framework
        self.outputs = output_names(manifest)
        extra = resolve_metrics(metrics)
        named = manifest_metrics({framework: manifest.to_dict()})
        self.functions: dict[str, dict[str, Callable]] = {
            name: {**extra, **resolve_metrics(named.get(name, []))} or resolve_metrics(list(DEFAULT_METRICS))
            for name in self.outputs}
        self.values: dict[tuple[str, str], list[float]] = {}

    def output_of(self, key: str) -> str:
        """The output a target key names (``""``: the first output)."""
        name = self.outputs[0] if key == "" else key
        if name not in self.outputs:
            raise MlmsError(f"the dataset has targets for output {key!r}, but the model's outputs are "
                            f"{', '.join(self.outputs)}: name the array or column target:<output>")
        return name

    def add(self, ids: list[str], outputs: Mapping[str, Any], targets: Mapping[str, Any] | None) -> None:
        """One call's outputs (name -> array, batch first) against the targets of the inputs ``ids``."""
        for key, target in (targets or {}).items():
            name = self.output_of(key)
            out = np.asarray(outputs[name])
            for row, input_id in enumerate(ids):
                one = out[row] if out.ndim and out.shape[0] == len(ids) else out
                self.score(input_id, name, np.asarray(one, np.float64), np.asarray(target[row], np.float64))

    def score(self, input_id: str, name: str, output: np.ndarray, target: np.ndarray) -> None:
        """One input's output (float64, no batch axis) against its target."""
        if target.shape != output.shape:
            if target.size != output.size:
                raise MlmsError(f"{input_id}: the target of output {name!r} has shape {list(target.shape)} but the "
                                f"output has {list(output.shape)}")
            target = target.reshape(output.shape)
        for metric, fn in self.functions[name].items():
            try:
                value = float(fn(output, target))
            except Exception as err:  # noqa: BLE001 - a user's metric failing is named, not a traceback
                raise MlmsError(f"metric {metric!r} failed against the target of {input_id}: "
                                f"{type(err).__name__}: {err}") from None
            self.values.setdefault((name, metric), []).append(value)

    def add_captured(self, outputs: pd.DataFrame, targets: Mapping[str, Mapping[str, Any]]) -> None:
        """Score captured values (an ``outputs`` frame of this framework with ``values``; chunks are not scored)
        against ``targets``: input id -> target key -> array."""
        rows = {(r.input_id, r.output): r for r in outputs.itertuples() if r.chunk < 0 and r.values is not None}
        for input_id, per_output in targets.items():
            for key, target in per_output.items():
                name = self.output_of(key)
                row = rows.get((input_id, name))
                if row is not None:
                    shape = tuple(int(d) for d in row.shape)
                    self.score(input_id, name, np.asarray(row.values, np.float64).reshape(shape),
                               np.asarray(target, np.float64))

    @property
    def scored(self) -> bool:
        return bool(self.values)

    def frame(self) -> pd.DataFrame:
        """The ``target_metrics`` rows of this framework: per output x metric, over the inputs."""
        rows = [{"framework": self.framework, "output": name, "metric": metric, **summarize(values),
                 "unit": metric_unit(metric)} for (name, metric), values in self.values.items()]
        return TARGET_METRICS.frame(rows) if rows else pd.DataFrame()
