"""Per-layer outputs of an eager PyTorch module: forward hooks on every submodule.

A point is one module call (:mod:`mlms_nb.frameworks.capture`); PyTorch has a tensor for every point, so its
:meth:`TorchCapture.structure` -- the module calls of one forward pass in the order they return, with which
convolutions feed a BatchNorm directly -- is what the other frameworks are aligned to.
"""
from __future__ import annotations

import contextlib
from typing import Any, Collection, Iterator

import numpy as np
import torch

from mlms_nb.frameworks.capture import Key, LayerCapture, Point, calls_in_order


class TorchCapture(LayerCapture):
    """Forward hooks on every submodule of an eval-mode ``nn.Module`` (the opened predictor's native model)."""

    def __init__(self, model: Any, label: str = "torch"):
        self.model = model
        self.framework = label
        self.module_names = {name for name, _ in model.named_modules() if name}
        self.points: list[Point] = []
        self.conv_feeds_bn: set[Key] = set()
        self.keys: set[Key] = set()

    @contextlib.contextmanager
    def _hooked(self, on_return) -> Iterator[None]:
        """Forward hooks on every submodule calling ``on_return(key, module, inputs, output)`` with the call's
        point; the call counts start at 0 for each forward pass run inside."""
        counts: dict[str, int] = {}

        def make(name):
            def hook(module, inputs, output):
                call = counts.get(name, 0)
                counts[name] = call + 1
                on_return((name, call), module, inputs, output)
            return hook

        handles = [module.register_forward_hook(make(name)) for name, module in self.model.named_modules() if name]
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()

    def structure(self, x: np.ndarray) -> list[Point]:
        """Run ``x`` once and record the module calls in return order, their shapes, and which convs feed
        a BatchNorm directly (what the ONNX exporter folds)."""
        records: list[tuple[Key, Any, Any, Any]] = []

        def on_return(key, module, inputs, output):
            records.append((key, module, inputs[0] if inputs else None, first_tensor(output)))

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
        self.keys = {key for key, _, _, out in records if out is not None}  # calls that returned a tensor
        return self.points

    def run(self, x: np.ndarray, wanted: Collection[Key]) -> tuple[dict[Key, np.ndarray], np.ndarray]:
        wanted = set(wanted)
        outs: dict[Key, np.ndarray] = {}

        def on_return(key, module, inputs, output):
            tensor = first_tensor(output)
            if key in wanted and tensor is not None:
                outs[key] = tensor.detach().cpu().numpy().copy()

        with self._hooked(on_return), torch.inference_mode():
            logits = self.model(torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)))
        return outs, logits.detach().cpu().numpy()

    def layer_keys(self, layers) -> list[Key | None]:
        """Layer spans are named after their module (:mod:`.tracing`): the k-th span of a name in a predict call
        is that module's k-th call."""
        return calls_in_order(layers, layers["name"].astype(str))

    def close(self) -> None:
        self.model = None


def first_tensor(output: Any) -> Any:
    """A module's output tensor: the output itself, or the first tensor of a tuple or list (an attention block
    returning ``(hidden_states, weights)``); None when it has none."""
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, (tuple, list)):
        return next((o for o in output if isinstance(o, torch.Tensor)), None)
    return None
