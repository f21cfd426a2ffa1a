"""Kept converters for a user's own model: PyTorch or Keras -> ONNX, ONNX -> TensorFlow (Keras).

``to_onnx(model, example_inputs, out_dir)`` and ``to_tensorflow(onnx_path, out_dir)`` each write one file into
``out_dir`` (default: ``artifacts_dir()/user/<sha256 of the source>[:16]/<framework>``) next to an
``artifact.json`` recording the file's sha256, what it was built from (the source's sha256), the route, every
route tried with its error, the time it took and the max |output difference| measured against the source
framework; a cached file is reused while both sha256s match (:func:`mlms_nb.frameworks.convert.build_artifact`).

Routes measured here (see the report in ``docs/``): torch -> ONNX by ``torch.onnx`` (legacy first, for its
module-scoped node names, then dynamo), Keras -> ONNX by tf2onnx, ONNX -> Keras by our own port
(:mod:`.onnx_keras`). Importing this package imports no framework.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Sequence

from mlms_nb._fs import sha256_file
from mlms_nb._optional import require
from mlms_nb.frameworks.converters.torch_onnx import ROUTES, Attempt, ConversionError, OnnxExport
from mlms_nb.paths import artifacts_dir

__all__ = ["to_onnx", "to_tensorflow", "ConversionError", "Attempt", "OnnxExport", "ROUTES", "source_digest",
           "read_record"]

TF_FILE, ONNX_FILE, RECORD = "model.keras", "model.onnx", "artifact.json"


def source_digest(model: Any, example_inputs: Any = None) -> str:
    """sha256 of what a conversion is built from: a file's bytes (a folder's files), or a module's class, its
    weights (state dict or Keras weights) and the example inputs' shapes."""
    if isinstance(model, (str, Path)):
        path = Path(model)
        if path.is_dir():
            h = hashlib.sha256()
            for f in sorted(p for p in path.rglob("*") if p.is_file()):
                h.update(str(f.relative_to(path)).encode() + sha256_file(f, memo=False).encode())
            return h.hexdigest()
        return sha256_file(path, memo=False)
    import numpy as np

    h = hashlib.sha256(f"{type(model).__module__}.{type(model).__qualname__}".encode())
    if hasattr(model, "state_dict"):
        for key, value in model.state_dict().items():
            h.update(key.encode() + np.ascontiguousarray(value.detach().cpu().numpy()).tobytes())
    elif hasattr(model, "get_weights"):
        for value in model.get_weights():
            h.update(np.ascontiguousarray(value).tobytes())
    items = example_inputs if isinstance(example_inputs, (tuple, list)) else (example_inputs,)
    h.update(repr([tuple(getattr(t, "shape", ())) for t in items if t is not None]).encode())
    return h.hexdigest()


def _folder(out_dir, digest: str, framework: str) -> Path:
    folder = Path(out_dir) if out_dir is not None else artifacts_dir() / "user" / digest[:16] / framework
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def read_record(path: str | Path) -> dict:
    """The ``artifact.json`` beside a converted file ({} when there is none)."""
    record = Path(path).parent / RECORD
    try:
        return json.loads(record.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def _versions(*modules: str) -> dict[str, str]:
    """Versions of the modules among ``modules`` this process has imported (none is imported for it)."""
    import sys

    return {name: str(getattr(sys.modules[name], "__version__", "")) for name in modules if name in sys.modules}


def to_onnx(model: Any, example_inputs: Any = None, out_dir: str | Path | None = None, *,
            routes: Sequence[str] = ROUTES, trust: bool = False, force: bool = False, label: str | None = None,
            dynamic_axes: Sequence[Sequence[int]] = ()) -> Path:
    """``model`` as an ONNX file (cached; see the package docstring); returns its path.

    ``model``: an ``nn.Module``, a ``keras.Model``, or a file: ``.onnx`` (kept as is), TorchScript ``.pt``/``.pt``
    and ``torch.export`` ``.pt2`` programs (trusted only: loading them runs their code), ``.keras`` (safe mode
    unless trusted) or a SavedModel folder (trusted only). ``example_inputs``: a batch (tensor, array, or a tuple
    of them) PyTorch models are traced with (2 rows or more, 2 positions or more along each dynamic axis); Keras
    models need none. ``dynamic_axes``: per input, its axes besides the batch whose size varies (a sequence
    length), exported as dynamic. ``routes``: the torch exporters to try, in order. Raises :class:`ConversionError` naming the model and each route's error when none works."""
    from mlms_nb.frameworks.convert import build_artifact

    label = label or (Path(model).name if isinstance(model, (str, Path)) else type(model).__name__)
    path = Path(model) if isinstance(model, (str, Path)) else None
    if path is not None and not path.exists():
        raise ConversionError(f"{label}: {path} does not exist")
    if path is not None and path.suffix == ".onnx":
        return path
    if path is not None and path.suffix in (".pt", ".pth", ".pt2", ".ts") and not trust:
        raise ConversionError(f"{label}: a TorchScript or torch.export file runs its own code when loaded; convert it "
                              "with trust=True (--trust) if you trust its source")
    digest = source_digest(model, example_inputs)
    folder = _folder(out_dir, digest, "onnxruntime")
    target = folder / ONNX_FILE

    def build(tmp: Path) -> dict:
        if path is not None and (path.is_dir() or path.suffix in (".keras", ".h5")):
            from mlms_nb.frameworks.converters.keras_onnx import keras_to_onnx, load_keras_file

            export = keras_to_onnx(load_keras_file(path, trust), tmp, label)
        elif _is_keras(model):
            from mlms_nb.frameworks.converters.keras_onnx import keras_to_onnx

            export = keras_to_onnx(model, tmp, label)
        else:
            from mlms_nb.frameworks.converters.torch_onnx import load_torch_file, torch_to_onnx

            module = load_torch_file(path) if path is not None else model
            if example_inputs is None:
                raise ConversionError(f"{label}: exporting a PyTorch model needs example_inputs (a batch to trace)")
            export = torch_to_onnx(module, example_inputs, tmp, routes, label=label, dynamic_axes=dynamic_axes)
        return {"route": export.route, "attempts": [a.to_dict() for a in export.attempts],
                "module_names": export.module_names, "max_abs_diff": export.max_abs_diff,
                "versions": _versions("torch", "onnx", "tensorflow", "tf2onnx", "onnxscript")}

    build_artifact(folder, target, f"{label} -> onnx", build, {"name": label, "framework": "onnxruntime"}, force,
                   source_sha256=digest, dynamic_axes=[list(map(int, ax)) for ax in dynamic_axes])
    return target


def _is_keras(model: Any) -> bool:
    return any(c.__module__.startswith(("keras", "tf_keras")) for c in type(model).__mro__)


def to_tensorflow(onnx_path: str | Path, out_dir: str | Path | None = None, *, module_names=None,
                  tolerance: float = 1e-4, force: bool = False, label: str | None = None) -> Path:
    """The ONNX graph at ``onnx_path`` as a Keras model (``model.keras``, standard layers only; cached); returns its
    path. Input NHWC, outputs as the graph's. Layer names follow the graph's module scopes (:mod:`.onnx_keras`);
    ``module_names`` (default: those :func:`to_onnx` recorded beside the graph) makes them exact. The copy is
    checked against ONNX Runtime on random inputs: more than ``tolerance`` x max|output| apart is an error."""
    from mlms_nb.frameworks.convert import build_artifact

    onnx_path = Path(onnx_path)
    label = label or read_record(onnx_path).get("name") or onnx_path.stem
    if not onnx_path.is_file():
        raise ConversionError(f"{label}: ONNX file {onnx_path} does not exist")
    digest = sha256_file(onnx_path, memo=False)
    if module_names is None:
        module_names = read_record(onnx_path).get("module_names") or None
    folder = _folder(out_dir, digest, "tensorflow")
    target = folder / TF_FILE

    def build(tmp: Path) -> dict:
        return _port(onnx_path, tmp, module_names, tolerance, label)

    build_artifact(folder, target, f"{label} -> tensorflow", build, {"name": label, "framework": "tensorflow"},
                   force, source_sha256=digest)
    return target


def _port(onnx_path: Path, out: Path, module_names, tolerance: float, label: str) -> dict:
    import time

    import numpy as np

    from mlms_nb.frameworks.converters.onnx_keras import UnsupportedOps, onnx_to_keras

    onnx = require("onnx")
    ort = require("onnxruntime")
    started = time.perf_counter()
    model = onnx.load(str(onnx_path))
    initializers = {t.name for t in model.graph.initializer}
    graph_input = next(i for i in model.graph.input if i.name not in initializers)
    dims = [d.dim_value if d.HasField("dim_value") else None for d in graph_input.type.tensor_type.shape.dim][1:]
    if len(dims) != 3 or any(not d for d in dims):
        raise ConversionError(f"{label}: the ONNX to Keras port needs one NCHW input with fixed C, H, W; "
                              f"{graph_input.name} has {dims}")
    try:
        keras_model = onnx_to_keras(model, tuple(dims), module_names, name=_keras_name(label))
    except UnsupportedOps as err:
        raise ConversionError(f"{label}: {err}") from None
    keras_model.save(str(out))
    x = np.random.default_rng(0).standard_normal((2, *dims)).astype(np.float32)
    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    expected = session.run(None, {graph_input.name: x})[0]
    actual = np.asarray(keras_model(np.ascontiguousarray(x.transpose(0, 2, 3, 1)), training=False))
    diff = float(np.max(np.abs(actual - expected)))
    scale = max(1.0, float(np.max(np.abs(expected))))
    if not diff <= tolerance * scale:
        raise ConversionError(f"{label}: the Keras port differs from ONNX Runtime by {diff:.3g} on random inputs "
                              f"(tolerance {tolerance:g} x {scale:.3g})")
    attempt = Attempt("onnx_keras_port", True, time.perf_counter() - started, "", diff)
    return {"route": "onnx_keras_port", "attempts": [attempt.to_dict()], "max_abs_diff": diff,
            "input_layout": "NHWC", "input_shape_nchw": dims, "layers": len(keras_model.layers),
            "versions": _versions("onnx", "tensorflow", "keras")}


def _keras_name(label: str) -> str:
    return "".join(c if c.isalnum() or c == "_" else "_" for c in label) or "model"

