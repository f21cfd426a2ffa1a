"""Record the small profiles under tests/data/ that the importer tests read, so importer logic is tested in
milliseconds and on any framework build (run once, by hand; commit what it writes).

    .venv/bin/python scripts/record_fixtures.py            # writes tests/data/
    MLMS_HOME=/tmp/x .venv/bin/python scripts/record_fixtures.py --out /tmp/data

Each profile is what the framework's profiler writes when an mlms-nb predictor traces (same options), next to a
``*.expected.json`` holding what the importer is given besides the file (clock anchors, the ``perf_counter_ns``
windows of the profiled calls) and what the tests compare with, derived from the model when it was recorded:

- ``kineto_small.json``: ``torch.profiler`` (CPU, shapes, memory) Chrome export of 3 ``predict`` calls of a
  5-layer CNN; expected: the calls, the number of Conv2d modules, the input shape;
- ``ort_lite0.json``: ONNX Runtime session profile of 2 runs of EfficientNet-Lite0 (the manifest's ONNX graph,
  the predictor's session options plus ``enable_profiling``); expected: profiling start (Unix ns), the clock
  offset, the windows, the optimized graph's nodes in execution order;
- ``tf_lite0.xplane.pb``: ``tf.profiler`` XSpace of 2 marked calls of EfficientNet-Lite0's Keras copy run as a
  ``tf.function``; expected: the clock offset, the windows, the :class:`ModelGraph`, and the Keras layer calls
  of one eager forward pass (the layer calls every trace must account for).
"""
from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
MODEL = "efficientnet_lite0"


def _write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n", encoding="utf-8")


def _photo(framework: str) -> np.ndarray:
    from mlms_nb.data.datasets import open_dataset
    from mlms_nb.data.transforms import Preprocessor
    from mlms_nb.manifest import find_manifest

    manifest = find_manifest(MODEL, framework=framework)
    return next(open_dataset("imagenet-samples", manifest).iter_batches(1, Preprocessor(manifest))).data


def profile_kineto(path: Path):
    """The Kineto recipe: 3 ``predict`` calls of a 5-layer CNN under ``torch.profiler`` (CPU, shapes, memory),
    exported to ``path``; returns (model, input, calls). tests/test_tracing.py's live fixture runs it too."""
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(8, 16, 3, padding=1), torch.nn.ReLU(),
        torch.nn.Conv2d(16, 16, 3, padding=1), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
        torch.nn.Linear(16, 10)).eval()
    x = torch.randn(2, 3, 32, 32)
    calls = 3
    with torch.no_grad(), profile(activities=[ProfilerActivity.CPU], record_shapes=True,
                                  profile_memory=True) as prof:
        for _ in range(calls):
            with record_function("predict"):
                model(x)
    prof.export_chrome_trace(str(path))
    return model, x, calls


def record_kineto(out: Path) -> None:
    import torch

    model, x, calls = profile_kineto(out / "kineto_small.json")
    _write_json(out / "kineto_small.expected.json", {
        "torch": torch.__version__, "calls": calls, "input_shape": list(x.shape),
        "conv2d_modules": sum(isinstance(m, torch.nn.Conv2d) for m in model.modules()),
        "conv2d_channels": [m.out_channels for m in model.modules() if isinstance(m, torch.nn.Conv2d)]})


def record_onnxruntime(out: Path) -> None:
    import onnx
    import onnxruntime as ort

    from mlms_nb.frameworks import open_predictor
    from mlms_nb.manifest import find_manifest
    from mlms_nb.tracing.align import wall_offset_ns

    batch = _photo("onnxruntime")
    with open_predictor(find_manifest(MODEL, framework="onnxruntime")) as predictor, \
            tempfile.TemporaryDirectory() as folder:
        so = predictor.session_options()
        so.enable_profiling = True
        so.profile_file_prefix = str(Path(folder) / "ort")
        session = ort.InferenceSession(predictor.artifact_path, sess_options=so, providers=["CPUExecutionProvider"])
        start_ns, offset = session.get_profiling_start_time_ns(), wall_offset_ns()
        windows = []
        for call in range(2):
            t0 = time.perf_counter_ns()
            session.run(None, {session.get_inputs()[0].name: batch})
            windows.append((t0, time.perf_counter_ns(), call + 1))
        shutil.copyfile(session.end_profiling(), out / "ort_lite0.json")
        so = predictor.session_options()
        so.optimized_model_filepath = str(Path(folder) / "optimized.onnx")
        ort.InferenceSession(predictor.artifact_path, sess_options=so, providers=["CPUExecutionProvider"])
        nodes = [(n.name, n.op_type) for n in onnx.load(so.optimized_model_filepath).graph.node]
    _write_json(out / "ort_lite0.expected.json", {
        "onnxruntime": ort.__version__, "profile_start_ns": start_ns, "wall_offset_ns": offset,
        "windows": windows, "nodes": nodes})


def record_tensorflow(out: Path) -> None:
    import tensorflow as tf

    from mlms_nb.frameworks import open_predictor
    from mlms_nb.frameworks.tensorflow.graph import model_graph
    from mlms_nb.frameworks.tensorflow.xplane import MARKER, PROFILER_OPTIONS, find_xplane
    from mlms_nb.manifest import find_manifest
    from mlms_nb.tracing.align import wall_offset_ns

    batch = tf.convert_to_tensor(_photo("tensorflow"))
    with open_predictor(find_manifest(MODEL, framework="tensorflow")) as predictor, \
            tempfile.TemporaryDirectory() as folder:
        model = predictor.native_model
        function = tf.function(lambda x: model(x, training=False), reduce_retracing=True)  # as the predictor runs it
        function(batch)
        calls = _eager_layer_calls(model, batch)
        tf.profiler.experimental.start(folder, options=tf.profiler.experimental.ProfilerOptions(**PROFILER_OPTIONS))
        offset, windows = wall_offset_ns(), {}
        for step in range(2):
            t0 = time.perf_counter_ns()
            with tf.profiler.experimental.Trace(MARKER, step_num=step):
                function(batch)
            windows[step] = (t0, time.perf_counter_ns(), step + 1, threading.get_native_id())
        tf.profiler.experimental.stop()
        shutil.copyfile(find_xplane(folder), out / "tf_lite0.xplane.pb")
        graph = model_graph(model, function)
    _write_json(out / "tf_lite0.expected.json", {
        "tensorflow": tf.__version__, "wall_offset_ns": offset, "windows": windows, "graph": graph.to_dict(),
        "keras_calls": calls})


def _eager_layer_calls(model, batch) -> list[list]:
    """``[layer name, class, returned its input unchanged]`` per Keras layer call of one eager forward pass."""
    calls = []

    def recorder(layer):
        inner = layer.call

        def call(*args, **kwargs):
            result = inner(*args, **kwargs)
            calls.append([layer.name, type(layer).__name__, result is args[0]])
            return result
        return call

    for layer in model.layers:
        layer.call = recorder(layer)
    try:
        model(batch, training=False)
    finally:
        for layer in model.layers:
            del layer.call
    return calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=REPO / "tests" / "data")
    parser.add_argument("--only", choices=["kineto", "onnxruntime", "tensorflow"], action="append")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    recorders = {"kineto": record_kineto, "onnxruntime": record_onnxruntime, "tensorflow": record_tensorflow}
    for name in args.only or recorders:
        recorders[name](args.out)
    for path in sorted(args.out.iterdir()):
        print(f"{path.stat().st_size / 1024:8.1f} KiB  {path}")


if __name__ == "__main__":
    main()
