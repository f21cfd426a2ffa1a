"""Per-layer outputs and per-layer durations of one model in one framework (see :mod:`.align` for the keys).

Each capture has ``framework`` (its label), ``keys`` (the points it has a tensor for), ``run(x)`` -> ({point:
NCHW float32 array}, logits) for an NCHW float32 batch, ``durations(x, repeats)`` -> ({point or None: ns per
timed call}, a sentence saying how it was timed), and ``close()``.
"""
from __future__ import annotations

import contextlib
import json
import os
import tempfile
import time
from typing import Any, Collection, Iterator, Mapping

import numpy as np

from mlms_nb.divergence.align import Key, Point, onnx_key

LOGITS = "logits"


# ------------------------------------------------------------------------------------------ PyTorch

class TorchCapture:
    """Forward hooks on every submodule of an eval-mode ``nn.Module`` (the opened predictor's ``.model``)."""

    framework = "torch"

    def __init__(self, model: Any, label: str = "torch"):
        self.model = model
        self.framework = label
        self.module_names = {name for name, _ in model.named_modules() if name}
        self.points: list[Point] = []
        self.conv_feeds_bn: set[Key] = set()
        self.keys: set[Key] = set()

    @contextlib.contextmanager
    def _hooked(self, on_return) -> Iterator[dict[str, int]]:
        """Forward hooks on every submodule calling ``on_return(key, module, inputs, output)``; yields the
        per-module call counts (clear them before each forward)."""
        counts: dict[str, int] = {}

        def make(name):
            def hook(module, inputs, output):
                call = counts.get(name, 0)
                counts[name] = call + 1
                on_return((name, call), module, inputs, output)
            return hook

        handles = [module.register_forward_hook(make(name)) for name, module in self.model.named_modules() if name]
        try:
            yield counts
        finally:
            for handle in handles:
                handle.remove()

    def structure(self, x: np.ndarray) -> list[Point]:
        """Run ``x`` once and record the module calls in return order, their shapes, and which convs feed
        a BatchNorm directly (what the ONNX exporter folds)."""
        import torch

        records: list[tuple[Key, Any, Any, Any]] = []

        def on_return(key, module, inputs, output):
            records.append((key, module, inputs[0] if inputs else None, output))

        with self._hooked(on_return), torch.inference_mode():
            self.model(torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)))
        self.points = []
        for i, (key, module, inp, out) in enumerate(records):
            shape = tuple(out.shape[1:]) if hasattr(out, "shape") else ()
            self.points.append(Point(i, key[0], key[1], type(module).__name__, shape))
            if i and isinstance(module, torch.nn.modules.batchnorm._BatchNorm):
                prev_key, prev_module, _, prev_out = records[i - 1]
                if isinstance(prev_module, torch.nn.Conv2d) and inp is prev_out:
                    self.conv_feeds_bn.add(prev_key)
        self.keys = {p.key for p in self.points}
        return self.points

    def run(self, x: np.ndarray, wanted: Collection[Key]) -> tuple[dict[Key, np.ndarray], np.ndarray]:
        import torch

        wanted = set(wanted)
        outs: dict[Key, np.ndarray] = {}

        def on_return(key, module, inputs, output):
            if key in wanted:
                outs[key] = output.detach().cpu().numpy().copy()

        with self._hooked(on_return), torch.inference_mode():
            logits = self.model(torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)))
        return outs, logits.detach().cpu().numpy()

    def durations(self, x: np.ndarray, repeats: int) -> tuple[dict[Key | None, list[float]], str]:
        """Per module call: ns from the previous module call's return (or the forward's start) to its own
        return, stamped with ``time.perf_counter_ns`` in forward hooks; the tail after the last return is
        unattributed. One warm-up call first."""
        import torch

        xt = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))
        out: dict[Key | None, list[float]] = {}
        last = [0]

        def on_return(key, module, inputs, output):
            now = time.perf_counter_ns()
            out.setdefault(key, []).append(now - last[0])
            last[0] = now

        with torch.inference_mode():
            self.model(xt)  # warm-up, untimed
        with self._hooked(on_return) as counts, torch.inference_mode():
            for _ in range(repeats):
                counts.clear()
                last[0] = time.perf_counter_ns()
                self.model(xt)
                out.setdefault(None, []).append(time.perf_counter_ns() - last[0])
        how = ("PyTorch forward hooks on every module, time.perf_counter_ns from one module's return to the "
               "next (includes the hooks' own Python overhead, a few us per module)")
        return out, how

    def close(self) -> None:
        self.model = None


# ------------------------------------------------------------------------------------------ ONNX Runtime

def _session(model: Any, profile_dir: str | None = None):
    import onnxruntime as ort

    so = ort.SessionOptions()
    if profile_dir is not None:
        so.enable_profiling = True
        so.profile_file_prefix = os.path.join(profile_dir, "ort")
    data = model if isinstance(model, (str, bytes)) else model.SerializeToString()
    return ort.InferenceSession(data, sess_options=so, providers=["CPUExecutionProvider"])


class OnnxCapture:
    """An ONNX model with its intermediate tensors added as graph outputs.

    fp32: one output per point (the last node of the point, conv points re-keyed by ``fold``).
    int8 (``fp32_path`` given, QDQ format): the outputs of the ``QuantizeLinear`` nodes of fp32 tensors,
    dequantized here with their own scale and zero point.
    """

    def __init__(self, path: str, module_names: Collection[str], fold: Mapping[Key, Key], label: str = "onnxruntime",
                 fp32_path: str | None = None):
        import onnx
        from onnx import numpy_helper

        self.framework = label
        self.path = str(path)
        self.module_names = set(module_names)
        model = onnx.load(self.path)
        graph = model.graph
        existing = {o.name for o in graph.output}
        self._tensor_of: dict[Key, str] = {}
        self._dequant: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        if fp32_path is None:
            typed = onnx.shape_inference.infer_shapes(model)
            elem = {v.name: v.type.tensor_type.elem_type for v in list(typed.graph.value_info) + list(typed.graph.output)}
            for node in graph.node:
                key = onnx_key(node.name, self.module_names)
                if key is None or not node.output or elem.get(node.output[0]) != onnx.TensorProto.FLOAT:
                    continue
                self._tensor_of[fold.get(key, key)] = node.output[0]  # the last node of the point wins
            types = dict.fromkeys(self._tensor_of.values(), onnx.TensorProto.FLOAT)
        else:
            fp32 = onnx.load(str(fp32_path), load_external_data=False)
            point_of_tensor = {}
            for node in fp32.graph.node:
                key = onnx_key(node.name, self.module_names)
                if key is not None and node.output:
                    point_of_tensor[node.output[0]] = fold.get(key, key)
            inits = {t.name: t for t in graph.initializer}
            types = {}
            for node in graph.node:
                if node.op_type != "QuantizeLinear" or node.input[0] not in point_of_tensor:
                    continue
                key = point_of_tensor[node.input[0]]
                if key in self._tensor_of:
                    continue
                scale = numpy_helper.to_array(inits[node.input[1]]).astype(np.float32)
                zero = numpy_helper.to_array(inits[node.input[2]]) if len(node.input) > 2 and node.input[2] else np.array(0)
                self._tensor_of[key] = node.output[0]
                self._dequant[node.output[0]] = (scale, zero.astype(np.int32))
                # the Q node's output type is its zero point's (uint8 when it has none)
                types[node.output[0]] = inits[node.input[2]].data_type if len(node.input) > 2 and node.input[2] \
                    else onnx.TensorProto.UINT8
        for key, name in self._tensor_of.items():
            if name not in existing:
                graph.output.append(onnx.helper.make_tensor_value_info(name, types[name], None))
        self.keys = set(self._tensor_of)
        self._logits = graph.output[0].name
        self._input = graph.input[0].name
        self._session = _session(model)
        self._names = [o.name for o in self._session.get_outputs()]

    def run(self, x: np.ndarray, wanted: Collection[Key]) -> tuple[dict[Key, np.ndarray], np.ndarray]:
        values = dict(zip(self._names, self._session.run(None, {self._input: np.ascontiguousarray(x, np.float32)})))
        outs = {}
        for key in wanted:
            name = self._tensor_of.get(key)
            if name is None:
                continue
            v = values[name]
            if name in self._dequant:
                scale, zero = self._dequant[name]
                v = (v.astype(np.int32) - zero).astype(np.float32) * scale
            outs[key] = v
        return outs, values[self._logits]

    def durations(self, x: np.ndarray, repeats: int) -> tuple[dict[Key | None, list[float]], str]:
        """ONNX Runtime's own profiler on the unmodified model (default graph optimizations, so fused nodes
        keep the scope of one of the nodes they replace): per node ``dur`` of the ``Node`` events, by run."""
        with tempfile.TemporaryDirectory(prefix="mlms-ort-profile-") as folder:
            session = _session(self.path, profile_dir=folder)
            feed = {session.get_inputs()[0].name: np.ascontiguousarray(x, np.float32)}
            for _ in range(repeats + 1):
                session.run(None, feed)
            with open(session.end_profiling(), encoding="utf-8") as handle:
                events = json.load(handle)
        runs = sorted((e["ts"], e["ts"] + e["dur"]) for e in events
                      if e.get("cat") == "Session" and e.get("name") == "model_run")[1:]  # drop the warm-up run
        starts = np.array([s for s, _ in runs])
        out: dict[Key | None, np.ndarray] = {}
        for e in events:
            if e.get("cat") != "Node" or not str(e.get("name", "")).endswith("_kernel_time"):
                continue
            j = int(np.searchsorted(starts, e["ts"], side="right")) - 1
            if j < 0 or e["ts"] > runs[j][1]:
                continue
            key = onnx_key(e["name"][: -len("_kernel_time")], self.module_names)
            out.setdefault(key, np.zeros(len(runs)))[j] += e["dur"] * 1000.0  # us -> ns
        how = (f"ONNX Runtime profiler (SessionOptions.enable_profiling), kernel time per node of the optimized "
               f"graph, attributed by node name scope")
        return {k: list(v) for k, v in out.items()}, how

    def close(self) -> None:
        self._session = None


# ------------------------------------------------------------------------------------------ Keras

class KerasCapture:
    """A ``keras.Model`` with the outputs of every layer call (NHWC outputs transposed to NCHW)."""

    def __init__(self, model: Any, label: str = "tensorflow"):
        import keras

        from mlms_nb.naming import keras_layer_to_torch_name

        self.framework = label
        self.model = model
        self._name_of = {id(layer): keras_layer_to_torch_name(layer.name) for layer in model.layers}
        outputs, keys = [], []
        for layer in model.layers:
            if isinstance(layer, keras.layers.InputLayer):
                continue
            for k, node in enumerate(layer._inbound_nodes):
                outputs.append(node.output_tensors[0])
                keys.append((self._name_of[id(layer)], k))
        self._keys = keys
        self.keys = set(keys)
        self._capture = keras.Model(model.inputs, [model.outputs[0], *outputs])

    def run(self, x: np.ndarray, wanted: Collection[Key]) -> tuple[dict[Key, np.ndarray], np.ndarray]:
        wanted = set(wanted)
        values = self._capture(np.ascontiguousarray(x.transpose(0, 2, 3, 1)), training=False)
        outs = {}
        for key, v in zip(self._keys, values[1:]):
            if key in wanted:
                v = np.asarray(v)
                outs[key] = v.transpose(0, 3, 1, 2) if v.ndim == 4 else v
        return outs, np.asarray(values[0])

    def durations(self, x: np.ndarray, repeats: int) -> tuple[dict[Key | None, list[float]], str]:
        """Eager forward, each layer's ``call`` wrapped and stamped with ``time.perf_counter_ns`` (eager CPU ops
        run synchronously); the model's own overhead between layers is unattributed."""
        xs = np.ascontiguousarray(x.transpose(0, 2, 3, 1))
        out: dict[Key | None, list[float]] = {}
        counts: dict[str, int] = {}
        originals = {}

        def wrap(layer):
            call, name = layer.call, self._name_of[id(layer)]

            def timed(*args, **kwargs):
                start = time.perf_counter_ns()
                result = call(*args, **kwargs)
                k = counts.get(name, 0)
                counts[name] = k + 1
                out.setdefault((name, k), []).append(time.perf_counter_ns() - start)
                return result
            return timed

        self.model(xs, training=False)  # warm-up, untimed
        for layer in self.model.layers:
            originals[id(layer)] = layer
            layer.call = wrap(layer)
        try:
            for _ in range(repeats):
                counts.clear()
                start = time.perf_counter_ns()
                self.model(xs, training=False)
                total = time.perf_counter_ns() - start
                timed = sum(v[-1] for k, v in out.items() if k is not None and counts.get(k[0], 0) > k[1])
                out.setdefault(None, []).append(max(total - timed, 0))
        finally:
            for layer in self.model.layers:
                if "call" in layer.__dict__:
                    del layer.__dict__["call"]
        how = ("Keras eager forward, each layer's call() timed with time.perf_counter_ns (eager mode: slower "
               "than the tf.function the predictor runs)")
        return out, how

    def close(self) -> None:
        self.model = self._capture = None
