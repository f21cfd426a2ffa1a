"""Output-level divergence, for any model: each framework runs its own manifest's preprocessing on the same
dataset items, every output of every input is captured (:mod:`mlms_nb.evaluation.outputs`) and compared with the
reference framework's (:mod:`mlms_nb.evaluation.agreement`). Unlike the layer-level divergence
(:mod:`mlms_nb.divergence.run`) it needs no built-in architecture and no layer alignment: named multi-tensor
outputs, dynamic sizes and recurrent models over ordered chunks all work.

``diverge_outputs("my_model", frameworks="torch,onnxruntime")`` (or ``mlms_nb.diverge(model, outputs=True)``,
``mlms diverge MODEL --outputs``) -> :class:`OutputDivergence`: one row per framework x output x metric with its
unit, ``diverges`` when ``max_rel_error`` (max|b - a| / max|a|) exceeds ``tolerance``. A dataset with targets per
output also scores every framework against them (:mod:`mlms_nb.evaluation.targets`): ``OutputDivergence.targets``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable

import pandas as pd

from mlms_nb.display import FramesForPeople, ShownByDisplay
from mlms_nb._quiet import quieted
from mlms_nb.errors import MlmsError


@dataclass(repr=False)
class OutputDivergence(ShownByDisplay, FramesForPeople):
    """Every output of ``model`` in each framework against the reference (``frameworks[0]``)."""
    model: str
    frameworks: list[str]
    dataset: str
    tolerance: float
    table: pd.DataFrame                       # output_agreement rows + ``unit`` + ``diverges`` (max_rel_error rows)
    outputs: pd.DataFrame                     # the captured outputs frame of every framework
    #: each framework against the dataset's targets (the ``target_metrics`` frame); empty without targets
    targets: pd.DataFrame = field(default_factory=pd.DataFrame)
    notes: dict[str, str] = field(default_factory=dict)

    @property
    def title(self) -> str:
        return f"Output divergence of {self.model} (reference: {self.frameworks[0]})"

    @property
    def note(self) -> str:
        n = self.outputs["input_id"].nunique() if not self.outputs.empty else 0
        return (f"{n} inputs of {self.dataset}; errors in each output's own unit, rel = max|b - a| / max|a|; "
                f"diverges: max_rel_error > {self.tolerance:g}" + "".join(f"; {v}" for v in self.notes.values()))

    @property
    def extra(self) -> dict[str, pd.DataFrame]:
        """Shown below the table (and in ``--json``): the metrics against the dataset's targets, when it has them."""
        return {} if self.targets.empty else {"against_targets": self.targets}

    @property
    def diverged(self) -> list[tuple[str, str]]:
        """``(framework, output)`` pairs whose max_rel_error exceeds the tolerance."""
        rows = self.table[self.table["diverges"]] if not self.table.empty else self.table
        return [(r.framework, r.output) for r in rows.itertuples()]

    def plot(self, backend: str = "bokeh"):
        from mlms_nb.analyses.divergence import plot_outputs

        return plot_outputs(self.table, backend=backend, tolerance=self.tolerance, title=self.title)


@quieted("diverge")
def diverge_outputs(model: Any, frameworks: str | Iterable[str] = ("torch", "onnxruntime"),
                    dataset: Any = None, tolerance: float = 1e-4, limit: int | None = 16, batch_size: int = 4,
                    trust: bool = False, metrics: Any = None) -> OutputDivergence:
    """Run ``model`` in each framework (its manifest per framework) on ``dataset`` (default: the evaluation's
    default for it) and compare every output with the first framework's; ``limit`` inputs (None: all).

    ``model``: a name, a manifest path, or the manifests themselves (a list, one per framework, the reference
    first: what :func:`mlms_nb.diverge` gives for a PyTorch manifest with converted copies)."""
    from mlms_nb.data.datasets import open_dataset
    from mlms_nb.data.transforms import Preprocessor
    from mlms_nb.divergence.run import check_numbers
    from mlms_nb.evaluation.agreement import agreement, manifest_metrics, metric_unit, resolve_metrics
    from mlms_nb.evaluation.inputs import load_inputs
    from mlms_nb.evaluation.outputs import OutputRecorder, outputs_pass
    from mlms_nb.evaluation.targets import TargetScores
    from mlms_nb.evaluation.manifests import manifests_for
    from mlms_nb.evaluation.runner import default_dataset
    from mlms_nb.frameworks import PredictorOptions, open_predictor
    from mlms_nb.frameworks.live import check_trust
    from mlms_nb.options import DivergeOptions

    tolerance = check_numbers(tolerance, limit, batch_size, 1)
    resolve_metrics(metrics)  # an unknown name or a non-callable is refused before anything runs
    if isinstance(model, (list, tuple)):
        manifests = list(model)
        names = [m.framework.name for m in manifests]
    else:
        names = DivergeOptions(frameworks=frameworks).frameworks
        manifests = manifests_for(model, names, trust=trust) if len(names) > 1 else []
    if len(names) < 2 or len(set(names)) < len(names):
        raise MlmsError(f"an output divergence compares at least two frameworks; got {', '.join(names)}")
    dataset = dataset if dataset is not None else default_dataset(manifests[0])
    frames, scores, notes = [], [], {}
    for manifest in manifests:
        check_trust(manifest, trust)
        preprocess = Preprocessor(manifest, trust=trust)
        inputs = load_inputs(open_dataset(dataset, manifest), preprocess, limit)
        recorder = OutputRecorder(manifest, manifest.framework.name, "all")
        with open_predictor(manifest, options=PredictorOptions(trust=trust)) as predictor:
            outputs_pass(predictor.predict, manifest, inputs, recorder, batch_size)
        frames.append(recorder.frame())
        if inputs.targets and inputs.kind == "sequences":
            notes["targets"] = "the dataset's targets are not compared for inputs cut into ordered chunks"
        elif inputs.targets:  # the dataset's ground truth: each framework's outputs against it
            score = TargetScores(manifest, manifest.framework.name, metrics)
            score.add_captured(frames[-1], inputs.targets)
            scores.append(score.frame())
    outputs = pd.concat(frames, ignore_index=True)
    targets = pd.concat(scores, ignore_index=True) if scores else pd.DataFrame()
    table = agreement(outputs, names[0], metrics, manifest_metrics({m.framework.name: m.to_dict() for m in manifests}))
    if not table.empty:
        table.insert(table.columns.get_loc("value") + 1, "unit", table["metric"].map(metric_unit))
        table["diverges"] = (table["metric"] == "max_rel_error") & (table["value"] > tolerance)
    return OutputDivergence(manifests[0].name, names, dataset_name(dataset), float(tolerance), table, outputs, targets,
                            notes)


def dataset_name(dataset: Any) -> str:
    """A dataset's name for the result: the text given, or a Python object's own name."""
    if isinstance(dataset, str):
        return dataset
    return str(getattr(dataset, "name", None) or f"python:{type(dataset).__name__}")
