"""Per-layer output capture, the part of the predictor contract that cross-framework comparison uses.

Every framework names its layers after the PyTorch module they come from (:mod:`mlms_nb.naming`), so a layer's
output is keyed by a *point*: ``(PyTorch module name, call index)`` -- the k-th call of that module in one
forward pass (a shared ``ReLU6`` called twice in a block is ``(_blocks.1._swish, 0)`` and
``(_blocks.1._swish, 1)``). :meth:`mlms_nb.frameworks.base.Predictor.capture` returns a :class:`LayerCapture`
for the opened model; each framework folder has its own in ``<framework>/capture.py``.

A capture gives tensors only. Per-layer *latency* is not measured here: it comes from the FRAMEWORK-level trace
the predictor records (:meth:`~mlms_nb.frameworks.base.Predictor.start_tracing`), and
:meth:`LayerCapture.layer_keys` says which point each of that trace's layer spans stands for.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Collection

import numpy as np
import pandas as pd

Key = tuple  # (PyTorch module name, call index)


@dataclass(frozen=True)
class Point:
    """One PyTorch module call: its position in execution order (by return), module name, call index, module
    type and output shape (without the batch axis)."""
    position: int
    name: str
    call: int
    layer_type: str
    shape: tuple

    @property
    def key(self) -> Key:
        return (self.name, self.call)

    @property
    def label(self) -> str:
        """``_blocks.1._swish`` or ``_blocks.1._swish#1`` for a module's second call."""
        return self.name if self.call == 0 else f"{self.name}#{self.call}"


class LayerCapture(ABC):
    """Per-layer outputs of one opened model.

    ``framework``: a label for the framework (``"onnxruntime-int8"`` for a quantized copy); ``keys``: the points
    this model has a tensor for. Inputs are always NCHW float32 batches (a capture of an NHWC model transposes
    them); output tensors are returned NCHW, as PyTorch lays them out.
    """

    framework: str
    keys: set

    @abstractmethod
    def run(self, x: np.ndarray, wanted: Collection[Key]) -> tuple[dict[Key, np.ndarray], np.ndarray]:
        """Run the NCHW batch ``x``: (``{point: output}`` for the ``wanted`` points this model has, the logits)."""

    @abstractmethod
    def layer_keys(self, layers: pd.DataFrame) -> list[Key | None]:
        """The point each FRAMEWORK layer span of this predictor's trace stands for (None: no point).

        ``layers``: one row per layer span, with columns ``name``, ``attrs`` (JSON text) and ``predict_span``
        (the predict call it ran in), ordered by predict call and then execution order (``layer_index``)."""

    def close(self) -> None:
        """Free what the capture holds (sessions, models)."""


def calls_in_order(layers: pd.DataFrame, names) -> list[Key]:
    """``(name, k)`` where k counts earlier rows of the same name in the same predict call: the call index of
    layer spans named after their PyTorch module (``layers`` ordered as :meth:`LayerCapture.layer_keys` says)."""
    frame = pd.DataFrame({"predict": layers["predict_span"].to_numpy(), "name": list(names)})
    k = frame.groupby(["predict", "name"], sort=False).cumcount().to_numpy()
    return [(n, int(c)) for n, c in zip(frame["name"], k)]
