"""``diverge(model, frameworks, ...)``: run one model in several frameworks on the same inputs, layer by layer."""
from __future__ import annotations

import itertools
from typing import Any, Iterable

import numpy as np
import pandas as pd

from mlms_nb.analyses import divergence as _analysis

from mlms_nb.divergence.align import build_rows, fold_map
from mlms_nb.divergence.latency import how_measured, row_latency, traced_calls
from mlms_nb.divergence.result import Divergence
from mlms_nb._quiet import quieted
from mlms_nb.errors import MlmsError, UnknownModelError
from mlms_nb.frameworks.base import Predictor, PredictorOptions, open_predictor
from mlms_nb.frameworks.live import check_trust
from mlms_nb.frameworks.onnxruntime.quantize import ALIASES as INT8_ALIASES
from mlms_nb.frameworks.onnxruntime.quantize import FRAMEWORK as INT8
from mlms_nb.frameworks.onnxruntime.quantize import SETTINGS as INT8_SETTINGS
from mlms_nb.frameworks.onnxruntime.quantize import quantized_manifest
from mlms_nb.manifest import FRAMEWORKS, Manifest, canonical_framework, find_manifest
from mlms_nb.options import spell_on

ALIGNMENT_RULE = ("rows are PyTorch module calls in execution order that at least two frameworks have a tensor "
                  "for; ONNX nodes map by the module scopes the export gave their names (a Conv with its BatchNorm "
                  "folded in is compared with the BatchNorm's output), Keras layers by name (NHWC transposed to "
                  "NCHW), int8 tensors are the dequantized QuantizeLinear outputs of the fp32 tensors")

RELATIVE_ERRORS = ("max_rel_error: the largest |b - a| of any element of any input over the largest |a| of the "
                   "reference layer (a worst case: one element far off makes it large); rms_rel_error: the root mean "
                   "square of b - a over that of a (what the layer as a whole is off by)")


def use_outputs() -> str:
    """The advice a layer-level refusal ends with, spelled as the caller writes options."""
    return (f"compare its outputs across frameworks instead with {spell_on('outputs')} (any model: several inputs "
            "and outputs, dynamic sizes, no built-in architecture)")


def layer_level_refusal(manifest: Manifest) -> str | None:
    """Why the layer-level divergence cannot follow ``manifest``'s model (None when it can): it feeds one static
    float input through an eager PyTorch module and aligns the layers of one output."""
    from mlms_nb.data.feeds import is_plain

    spec = manifest.inputs[0]
    fed = [s for s in manifest.inputs if s.type != "constant"]
    if manifest.framework.name != "torch":
        return f"{manifest.source or manifest.key} is a manifest for {manifest.framework.name}, not for PyTorch"
    if len(fed) > 1 or manifest.state:
        return f"{manifest.key} has {len(fed)} inputs" + (" and state carried between calls" if manifest.state
                                                              else "")
    if not is_plain(manifest):
        return (f"{manifest.key}'s input {spec.name or 'input'} has dynamic sizes, a constant or a batch axis "
                "that is not first")
    if not spec.element_type.startswith("float") or spec.type not in ("image", "tensor"):
        return f"{manifest.key}'s input is {spec.type} of {spec.element_type}, not a float tensor"
    if len(manifest.outputs) > 1:
        return f"{manifest.key} has {len(manifest.outputs)} outputs"
    if any(step.op == "chunk" for step in manifest.preprocess):
        return f"{manifest.key} runs over ordered chunks"
    return None


def _torch_manifest(model: str) -> Manifest:
    """The PyTorch manifest the layer-level divergence follows; a model it cannot follow is refused with advice."""
    try:
        manifest = find_manifest(model, framework="torch")
    except UnknownModelError as err:
        try:
            find_manifest(model)  # the model exists in another framework: say what would work
        except MlmsError:
            raise err from None
        raise UnknownModelError(f"{err}; the layer-level divergence follows the layers of a PyTorch module: "
                                f"{use_outputs()}") from None
    reason = layer_level_refusal(manifest)
    if reason:
        raise MlmsError(f"the layer-level divergence cannot follow {model}: {reason}; {use_outputs()}")
    return manifest


def _frameworks(frameworks: str | Iterable[str], quantized: bool | str) -> list[str]:
    names = [f.strip() for f in (frameworks.split(",") if isinstance(frameworks, str) else frameworks)]
    out: list[str] = []
    for name in names:
        if not name:
            continue
        key = INT8 if name.lower() in INT8_ALIASES else canonical_framework(name)
        if key != INT8 and key not in FRAMEWORKS:
            raise MlmsError(f"unknown framework {name!r}; expected some of {', '.join(FRAMEWORKS)}, {INT8}")
        if key not in out:
            out.append(key)
    if quantized is True or (isinstance(quantized, str) and quantized):
        if isinstance(quantized, str) and quantized.lower() not in INT8_ALIASES:
            raise MlmsError(f"quantized={quantized!r}: the only quantized copy is {INT8!r} (or quantized=True)")
        if INT8 not in out:
            out.append(INT8)
    elif quantized not in (False, None):
        raise MlmsError(f"quantized must be True, False or {INT8!r}, got {quantized!r}")
    if len(out) < 2:
        raise MlmsError(f"divergence needs at least two frameworks, got {', '.join(out) or 'none'}")
    return out


def check_numbers(tolerance, limit, batch_size, latency_repeats) -> float:
    """The relative tolerance as a float; a bad tolerance, limit, batch size or repeat count is one sentence."""
    try:
        tol = float(tolerance)
    except (TypeError, ValueError):
        tol = float("nan")
    if not np.isfinite(tol) or tol <= 0:
        raise MlmsError(f"tolerance must be a positive number (a relative error), got {tolerance!r}")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, (int, np.integer)) or limit < 1):
        raise MlmsError(f"limit must be None or a positive integer, got {limit!r}")
    for name, value in (("batch_size", batch_size), ("latency_repeats", latency_repeats)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise MlmsError(f"{name} must be a positive integer, got {value!r}")
    return tol


def compare_captures(captures, names, rows, batches) -> tuple[dict, dict]:
    """Run every NCHW batch through each framework's capture and accumulate the error of every aligned layer.

    Returns ({(row index, framework a, framework b): ErrorStats}, {framework: logits of all inputs})."""
    pairs = list(itertools.combinations(names, 2))
    stats = {(i, a, b): _analysis.ErrorStats() for i, r in enumerate(rows) for a, b in pairs
             if r.key in captures[a].keys and r.key in captures[b].keys}
    wanted = [r.key for r in rows]
    logits = {fw: [] for fw in names}
    for data in batches:
        outs = {}
        for fw in names:
            outs[fw], out = captures[fw].run(data, wanted)
            logits[fw].append(np.asarray(out, dtype=np.float32).reshape(len(data), -1))
        for i, row in enumerate(rows):  # each tensor made float64 once, for all the pairs it is in
            flat = {fw: np.asarray(o[row.key], np.float64).ravel() for fw, o in outs.items() if row.key in o}
            for a, b in pairs:
                if (i, a, b) in stats:
                    stats[(i, a, b)].update(flat[a], flat[b])
            del flat
        del outs
    return stats, {fw: np.concatenate(v) for fw, v in logits.items()}


def layer_frame(rows) -> pd.DataFrame:
    """The aligned layers: index, label, module name, call, module type and output shape (without the batch)."""
    return pd.DataFrame({
        "layer_index": range(len(rows)), "layer": [r.label for r in rows], "layer_name": [r.name for r in rows],
        "call": [r.call for r in rows], "layer_type": [r.layer_type for r in rows],
        "shape": ["x".join(map(str, r.shape)) for r in rows]})


def _open(model: str, framework: str, torch_predictor: Predictor | None = None, trust: bool = False) -> Predictor:
    """The opened predictor of ``model`` in ``framework`` (the INT8 copy: ONNX Runtime on its quantized graph).

    A model with no manifest for ``framework`` (a manifest path names one framework) but an eager PyTorch module
    (``torch_predictor``) gets a converted copy (:func:`converted_copy`). ``trust``: the run trusts the manifest's
    entrypoint or code steps."""
    if framework == INT8:
        return open_predictor(quantized_manifest(model))
    try:
        manifest = find_manifest(model, framework=framework)
        if manifest.framework.name != framework:
            raise UnknownModelError(f"{model} is a manifest for {manifest.framework.name}, not {framework}")
    except UnknownModelError:
        if torch_predictor is None or framework not in ("onnxruntime", "tensorflow"):
            raise
        manifest = converted_copy(torch_predictor, framework)
    return open_predictor(manifest, options=PredictorOptions(trust=trust))


def converted_copy(torch_predictor: Predictor, framework: str):
    """The manifest of an ``onnxruntime`` or ``tensorflow`` copy of the opened PyTorch model, converted with the
    kept converters (:mod:`mlms_nb.frameworks.converters`; cached by checksum) from its eager module."""
    from mlms_nb.frameworks.converters.manifests import copy_of_module

    return copy_of_module(torch_predictor.manifest, torch_predictor.native_model, framework)


@quieted("diverge")
def diverge(model: str, frameworks: str | Iterable[str] = ("torch", "onnxruntime"), dataset: Any = None,
            tolerance: float = 1e-4, limit: int | None = None, quantized: bool | str = False, batch_size: int = 4,
            latency_repeats: int = 5, trust: bool = False) -> Divergence:
    """Run ``model`` in each framework on the same preprocessed inputs and compare every aligned layer.

    ``frameworks``: names or aliases (``torch``, ``onnxruntime``, ``tensorflow``, ``onnxruntime-int8``), as a
    list or ``"a,b,c"``; the first is the reference. ``quantized=True`` (or ``"onnxruntime-int8"``) adds the
    INT8 ONNX Runtime copy. ``tolerance`` is *relative*: a layer diverges when max|b - a| / max|a| exceeds it.
    ``limit``: at most this many inputs (None: the whole dataset). Inputs run ``batch_size`` at a time; layer
    latencies are medians over ``latency_repeats`` timed calls at batch 1 (one warm-up call first). ``model``: a
    name, or the path of a PyTorch manifest (its other frameworks are converted copies); ``trust``: run its
    entrypoint or code steps (docs/trust.md).
    """
    from mlms_nb.data.datasets import open_dataset
    from mlms_nb.data.labels import load_labels
    from mlms_nb.data.transforms import Preprocessor

    names = _frameworks(frameworks, quantized)
    dataset = "imagenet-samples" if dataset is None else dataset
    tol = check_numbers(tolerance, limit, batch_size, latency_repeats)
    torch_manifest = _torch_manifest(model)
    check_trust(torch_manifest, trust)
    data = open_dataset(dataset, torch_manifest)
    batches = list(data.iter_batches(batch_size, Preprocessor(torch_manifest), limit=limit))
    if not batches:
        raise MlmsError(f"dataset {dataset!r} gave no inputs")

    predictors: dict[str, Predictor] = {}
    captures = {}
    try:
        predictors["torch"] = _open(model, "torch", trust=trust)
        structure = captures["torch"] = predictors["torch"].capture()
        try:
            points = structure.structure(batches[0].data[:1])
        except MlmsError:
            raise
        except Exception as err:  # noqa: BLE001 - a module the layer capture cannot run: one sentence, with advice
            raise MlmsError(f"the layer-level divergence could not run {model}'s PyTorch module layer by layer "
                            f"({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}); "
                            f"{use_outputs()}") from None
        fold = fold_map(points, structure.conv_feeds_bn)
        for fw in names:
            if fw not in predictors:
                predictors[fw] = _open(model, fw, predictors["torch"], trust)
                captures[fw] = predictors[fw].capture(structure.module_names, fold)
        rows = build_rows(points, {fw: captures[fw].keys for fw in names})
        if not rows:
            raise MlmsError(f"{model}: no layer output is shared by two of {', '.join(names)}; {use_outputs()}")
        pairs = list(itertools.combinations(names, 2))
        stats, logits = compare_captures(captures, names, rows, [b.data for b in batches])

        latency, notes, summary, traces = {}, {"alignment": ALIGNMENT_RULE}, [], {}
        x1 = batches[0].data[:1]
        for fw in names:
            trace = traces[fw] = traced_calls(predictors[fw], x1, latency_repeats, fw)
            per_row, unattributed, total = row_latency(trace, captures[fw], points, rows)
            for i, row in enumerate(rows):
                if i in per_row:
                    q25, med, q75 = np.percentile(per_row[i] / 1e6, [25, 50, 75])
                    latency[(i, fw)] = (float(med), float(q75 - q25))
                elif row.key in captures[fw].keys:  # its op was fused into a later one, timed there
                    latency[(i, fw)] = (0.0, 0.0)
            layers_ns = sum(per_row.values()) if per_row else np.zeros_like(total)
            q25, q75 = np.percentile(total / 1e6, [25, 75])
            how = how_measured(predictors[fw], latency_repeats, trace, captures[fw], points)
            summary.append(dict(framework=fw, layers_ms=float(np.median(layers_ns / 1e6)),
                                unattributed_ms=float(np.median(unattributed / 1e6)),
                                total_ms=float(np.median(total / 1e6)), total_iqr_ms=float(q75 - q25),
                                timed_calls=int(latency_repeats), batch_size=1, how=how))
            notes[f"latency {fw}"] = how
    finally:
        for capture in captures.values():
            capture.close()
        for predictor in predictors.values():
            predictor.close()

    layers = layer_frame(rows)
    errors = {(i, _analysis.pair_label(a, b)): v.result() for (i, a, b), v in stats.items()}
    table = _analysis.layer_table(layers, errors, latency, pairs, names, tol)
    first = {}
    for a, b in pairs:
        key = _analysis.pair_label(a, b)
        pos = _analysis.first_divergent(table, key, tol)
        first[key] = None if pos is None else table["layer"].iloc[pos]
    ids = [i for b in batches for i in b.ids]
    labels = np.concatenate([b.labels for b in batches]) if all(b.labels is not None for b in batches) else None
    try:
        class_names = load_labels(torch_manifest)
    except MlmsError:
        class_names = None
    per_input = _analysis.per_input_table(ids, labels, logits, class_names)
    quant = None
    if INT8 in names:
        quant = dict(INT8_SETTINGS)
        notes["int8"] = ("onnxruntime.quantization.quantize_static, QDQ format, uint8 activations / int8 per-channel "
                         "weights, MinMax calibration on the imagenet-samples photos (the same photos accuracy is "
                         "measured on)")
    notes["tolerance"] = f"{tol:g} relative: max|b - a| / max|a| over all inputs, per layer"
    notes["relative errors"] = RELATIVE_ERRORS
    return Divergence(model=model, dataset=str(dataset), frameworks=names, pairs=pairs, tolerance=tol,
                      layers=table, outputs=_analysis.output_table(logits, pairs), per_input=per_input,
                      accuracy=_analysis.accuracy_table(per_input, names[0]), first_divergent_layer=first,
                      latency=pd.DataFrame(summary), notes=notes, quantization=quant, traces=traces)
