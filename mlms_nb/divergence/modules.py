"""Divergence of a user's own PyTorch module against its converted copies, with no manifest and no built-in table.

``diverge_module(module, inputs)`` exports the module to ONNX and ports that to Keras with the kept converters
(:mod:`mlms_nb.frameworks.converters`), or takes the files given, then compares every aligned layer. The alignment
comes from the export itself: the module's calls in execution order (forward hooks) are the rows; ONNX nodes map
to them by their module scopes (``/features/features.0/Conv`` -> ``features.0``) and the Keras layers by the names
the port gave them from those same scopes (:mod:`mlms_nb.naming`), so any module exported with scoped names
lines up -- the rule :data:`~mlms_nb.divergence.run.ALIGNMENT_RULE` states. Layer latencies are not measured here
(no predictor runs the files); :func:`mlms_nb.diverge` does that for models described by manifests.
"""
from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any, Iterable

import numpy as np
import pandas as pd

from mlms_nb.analyses import divergence as _analysis
from mlms_nb.divergence.align import build_rows, fold_map
from mlms_nb.divergence.result import Divergence
from mlms_nb.divergence.run import ALIGNMENT_RULE, RELATIVE_ERRORS, compare_captures, layer_frame
from mlms_nb.errors import MlmsError

LATENCY_COLUMNS = ("framework", "layers_ms", "unattributed_ms", "total_ms", "total_iqr_ms", "timed_calls", "batch_size",
                   "how")


def module_captures(module: Any, x1: np.ndarray, onnx_path: str | Path | None = None,
                    keras_path: str | Path | None = None) -> tuple[list, dict]:
    """(points of one forward pass of ``module`` on ``x1``, {framework: capture}) for ``torch`` and each file given."""
    from mlms_nb.frameworks.torch.capture import TorchCapture

    torch_capture = TorchCapture(module.eval())
    points = torch_capture.structure(x1)
    fold = fold_map(points, torch_capture.conv_feeds_bn)
    captures = {"torch": torch_capture}
    if onnx_path is not None:
        from mlms_nb.frameworks.onnxruntime.capture import OnnxCapture

        captures["onnxruntime"] = OnnxCapture(str(onnx_path), torch_capture.module_names, fold)
    if keras_path is not None:
        import keras

        from mlms_nb.frameworks.tensorflow.capture import KerasCapture

        captures["tensorflow"] = KerasCapture(keras.models.load_model(str(keras_path), compile=False), rekey=fold)
    return points, captures


def diverge_module(module: Any, inputs: np.ndarray, frameworks: str | Iterable[str] = ("torch", "onnxruntime", "tensorflow"),
                   onnx_path: str | Path | None = None, keras_path: str | Path | None = None, tolerance: float = 1e-4,
                   batch_size: int = 4, labels: np.ndarray | None = None, name: str | None = None) -> Divergence:
    """Compare ``module`` (an eval-mode ``nn.Module``) layer by layer with its ONNX and Keras copies on ``inputs``
    (NCHW float32, batch first). Copies not given are converted (and cached) here. ``tolerance``: relative, as in
    :func:`mlms_nb.diverge`."""
    from mlms_nb.frameworks.converters import to_onnx, to_tensorflow

    names = [f.strip() for f in (frameworks.split(",") if isinstance(frameworks, str) else frameworks) if f.strip()]
    if names[:1] != ["torch"] or not set(names) <= {"torch", "onnxruntime", "tensorflow"} or len(names) < 2:
        raise MlmsError(f"diverge_module compares torch (first) with onnxruntime and/or tensorflow, got {names}")
    x = np.ascontiguousarray(inputs, dtype=np.float32)
    if x.ndim < 2 or not len(x):
        raise MlmsError("inputs must be a non-empty batch (NCHW float32)")
    label = name or type(module).__name__
    if "onnxruntime" in names or "tensorflow" in names:
        onnx_path = onnx_path or to_onnx(module, x[:1], label=label)
    if "tensorflow" in names:
        keras_path = keras_path or to_tensorflow(onnx_path, label=label)
    points, captures = module_captures(module, x[:1], onnx_path if "onnxruntime" in names else None,
                                       keras_path if "tensorflow" in names else None)
    try:
        rows = build_rows(points, {fw: captures[fw].keys for fw in names})
        if not rows:
            raise MlmsError(f"{label}: no layer output is shared by two of {', '.join(names)}")
        batches = [x[i:i + batch_size] for i in range(0, len(x), batch_size)]
        stats, logits = compare_captures(captures, names, rows, batches)
    finally:
        for capture in captures.values():
            capture.close()
    pairs = list(itertools.combinations(names, 2))
    errors = {(i, _analysis.pair_label(a, b)): v.result() for (i, a, b), v in stats.items()}
    table = _analysis.layer_table(layer_frame(rows), errors, {}, pairs, names, tolerance)
    first = {}
    for a, b in pairs:
        pos = _analysis.first_divergent(table, _analysis.pair_label(a, b), tolerance)
        first[_analysis.pair_label(a, b)] = None if pos is None else table["layer"].iloc[pos]
    per_input = _analysis.per_input_table([str(i) for i in range(len(x))], labels, logits, None)
    notes = {"alignment": ALIGNMENT_RULE, "latency": "not measured: the copies ran in per-layer captures, not in "
             "predictors (mlms_nb.diverge measures layer latency for models described by manifests)",
             "tolerance": f"{tolerance:g} relative: max|b - a| / max|a| over all inputs, per layer",
             "relative errors": RELATIVE_ERRORS,
             "copies": f"onnx: {onnx_path}; keras: {keras_path}"}
    return Divergence(model=label, dataset=f"{len(x)} inputs given", frameworks=names, pairs=pairs,
                      tolerance=float(tolerance), layers=table, outputs=_analysis.output_table(logits, pairs),
                      per_input=per_input, accuracy=_analysis.accuracy_table(per_input, names[0]),
                      first_divergent_layer=first, latency=pd.DataFrame(columns=list(LATENCY_COLUMNS)), notes=notes)
