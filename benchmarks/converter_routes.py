"""Which conversion route works on which real model here: time (s), max |logit difference| against the source on the
20 labeled ImageNet photos (imagenet-samples), top-1 agreement, and each failure's error.

Routes: torch -> ONNX by ``torch.onnx`` legacy and dynamo (``to_onnx(routes=...)``), ONNX -> Keras by our port
(``to_tensorflow``), Keras -> ONNX by tf2onnx (on the port's Keras copy), and the third-party ONNX -> TF/Keras
routes when importable: onnx2keras (``pip install --no-deps --target DIR onnx2keras==0.0.25`` and
``--onnx2keras DIR``; its ``tensorflow`` requirement would pull a second TensorFlow) and nobuco (torch -> Keras).
Models: the built-in architectures with their pretrained weights, and a small CNN with seeded random weights.
Every conversion is forced (no cache), one after another in this process, so times include first-use imports.

Run: ``.venv/bin/python benchmarks/converter_routes.py [--models efficientnet_lite0,resnet50,small_cnn]
[--onnx2keras /tmp/o2k]``.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np


def _torch_model(name: str):
    import torch

    if name == "small_cnn":
        torch.manual_seed(0)
        return torch.nn.Sequential(
            torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.BatchNorm2d(16), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
            torch.nn.Conv2d(16, 32, 3, padding=1), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
            torch.nn.Linear(32, 1000)).eval()
    from mlms_nb.data.assets import resolve_asset
    from mlms_nb.manifest import find_manifest
    from mlms_nb.zoo.registry import build_torch_model

    m = find_manifest(name, framework="torch")
    weights = None
    if m.model.weights == "pretrained":
        base = Path(m.source).parent if m.source else None
        weights = str(resolve_asset(m.model.weights_path, m.model.sha256.get("weights_path"), base))
    return build_torch_model(m.model.architecture, weights).eval()


def _photos(name: str) -> np.ndarray:
    from mlms_nb.data.datasets import open_dataset
    from mlms_nb.data.transforms import Preprocessor
    from mlms_nb.manifest import find_manifest

    m = find_manifest("resnet50" if name == "small_cnn" else name, framework="torch")
    batches = list(open_dataset("imagenet-samples", m).iter_batches(20, Preprocessor(m)))
    return np.concatenate([b.data for b in batches]).astype(np.float32)


def _row(model, route, started, out=None, ref=None, error=""):
    seconds = time.perf_counter() - started
    if out is None:
        print(f"{model:18s} {route:22s} {seconds:7.1f} s  FAILED: {error[:160]}", flush=True)
        return
    diff = float(np.max(np.abs(out - ref)))
    agree = float(np.mean(out.argmax(1) == ref.argmax(1)))
    print(f"{model:18s} {route:22s} {seconds:7.1f} s  max|d| {diff:.2e}  top-1 agreement {agree:.0%}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="small_cnn,efficientnet_lite0,resnet50")
    parser.add_argument("--onnx2keras", default=None, help="folder onnx2keras was installed into (--target)")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    import onnxruntime as ort
    import torch

    from mlms_nb.frameworks.converters import ConversionError, to_onnx, to_tensorflow

    print(f"{'model':18s} {'route':22s} {'time':>9s}  result")
    for name in args.models.split(","):
        module = _torch_model(name)
        x = _photos(name)
        with torch.no_grad():
            ref = module(torch.from_numpy(x)).numpy()
        work = Path(tempfile.mkdtemp(prefix=f"routes-{name}-"))
        onnx_paths = {}
        for route in ("legacy", "dynamo"):
            t = time.perf_counter()
            try:
                path = onnx_paths[route] = to_onnx(module, x[:1], work / route, routes=(route,), force=True, label=name)
                s = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
                _row(name, f"torch->onnx {route}", t, s.run(None, {s.get_inputs()[0].name: x})[0], ref)
            except ConversionError as err:
                _row(name, f"torch->onnx {route}", t, error=str(err))
        for route, onnx_path in onnx_paths.items():
            t = time.perf_counter()
            try:
                keras_path = to_tensorflow(onnx_path, work / f"tf-{route}", force=True, label=name)
                import keras

                k = keras.models.load_model(str(keras_path), compile=False)
                _row(name, f"onnx({route})->keras port", t, np.asarray(k(x.transpose(0, 2, 3, 1))), ref)
            except ConversionError as err:
                _row(name, f"onnx({route})->keras port", t, error=str(err))
                continue
            if route == "legacy":
                t = time.perf_counter()
                try:
                    back = to_onnx(keras_path, out_dir=work / "tf2onnx", force=True, label=name)
                    s = ort.InferenceSession(str(back), providers=["CPUExecutionProvider"])
                    _row(name, "keras->onnx tf2onnx", t, s.run(None, {s.get_inputs()[0].name: x.transpose(0, 2, 3, 1)})[0], ref)
                except ConversionError as err:
                    _row(name, "keras->onnx tf2onnx", t, error=str(err))
        if args.onnx2keras and "legacy" in onnx_paths:
            t = time.perf_counter()
            try:
                sys.path.insert(0, args.onnx2keras)
                import onnx
                from onnx2keras import onnx_to_keras

                k = onnx_to_keras(onnx.load(str(onnx_paths["legacy"])), ["input"], change_ordering=False)
                _row(name, "onnx->keras onnx2keras", t, np.asarray(k(x)), ref)
            except Exception as err:  # noqa: BLE001 - a third-party converter's failure is the result
                _row(name, "onnx->keras onnx2keras", t, error=f"{type(err).__name__}: {err}")
        t = time.perf_counter()
        try:
            import nobuco

            k = nobuco.pytorch_to_keras(module, args=[torch.from_numpy(x[:1])])
            _row(name, "torch->keras nobuco", t, np.asarray(k(x)), ref)
        except Exception as err:  # noqa: BLE001 - a third-party converter's failure is the result
            _row(name, "torch->keras nobuco", t, error=f"{type(err).__name__}: {err}")


if __name__ == "__main__":
    main()
