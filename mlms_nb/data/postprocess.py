"""Postprocessing of a classifier's outputs: logits ``(N, C)`` -> :class:`Prediction` (probabilities and the top-k),
following ``manifest.postprocess`` (softmax and top-5 by default; none for a ``tensor`` output)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mlms_nb.data.code_steps import check_code, compile_code
from mlms_nb.errors import MlmsError
from mlms_nb.manifest import Manifest, SoftmaxArgs, Step, TopKArgs

DEFAULT_TOP_K = 5


@dataclass
class Prediction:
    """Probabilities ``(N, C)`` float32 and the top-k classes ``(N, k)``, highest first."""
    probabilities: np.ndarray
    top_k_indices: np.ndarray
    top_k_probabilities: np.ndarray

    @property
    def top1(self) -> np.ndarray:
        return self.top_k_indices[:, 0]

    def __len__(self) -> int:
        return int(self.probabilities.shape[0])


NARROW = 64
"""Rows (N, C) of fewer classes than this are reduced across a transposed copy: numpy reduces along a short last
axis at a fixed cost per row (10 classes x 1024 rows: about 10x slower than across the rows)."""


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """Numerically stable softmax in float32 (the max is subtracted first); NaN rows stay NaN."""
    x = np.asarray(x, dtype=np.float32)
    if x.ndim == 2 and axis in (-1, 1) and x.shape[1] < NARROW:
        across = np.ascontiguousarray(x.T)  # (C, N): the same max and sums, taken across the rows
        across -= across.max(axis=0)
        np.exp(across, out=across)
        across /= across.sum(axis=0)
        return across.T
    shifted = x - np.max(x, axis=axis, keepdims=True)
    np.exp(shifted, out=shifted)
    shifted /= np.sum(shifted, axis=axis, keepdims=True)
    return shifted


def top_k(probabilities: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The ``k`` largest entries of each row, highest first (ties: lower index first)."""
    rows, width = probabilities.shape
    k = max(1, min(int(k), width))
    flat = width * np.arange(rows, dtype=np.int64)
    if width > WIDE_ROW and k < width and np.isfinite(probabilities).all():
        # k argmax passes, each taking the row's largest left (the first of equals: the stable sort's order) and
        # marking it -inf: k passes over the rows instead of sorting every row whole (1,000 classes: ~30x faster)
        work = np.array(probabilities, copy=True)
        marked = work.reshape(-1)
        order = np.empty((rows, k), np.int64)
        for j in range(k):
            best = work.argmax(axis=1)
            order[:, j] = best
            marked[flat + best] = -np.inf
    else:  # narrow rows (a sort of 10 is as cheap as a pass), or NaN/Inf, whose order the sort defines
        order = np.ascontiguousarray(np.argsort(-probabilities, axis=1, kind="stable")[:, :k], dtype=np.int64)
    # taken by flat index: np.take_along_axis costs about as much as the sort itself on narrow rows
    return order, np.take(probabilities, order + flat[:, None])


WIDE_ROW = 32
"""Rows wider than this get their top k by argmax passes rather than a sort (measured: a sort wins on 10 classes)."""


class Postprocessor:
    """A batch of model outputs ``(N, C)`` (logits) -> `Prediction`, following ``manifest.postprocess``."""

    def __init__(self, manifest: Manifest, trust: bool = False):
        self.manifest = manifest
        self.trust = trust
        #: False for a tensor output with no postprocess steps listed: nothing to run (no softmax on a feature map)
        self.active = bool(manifest.postprocess) or manifest.outputs[0].type != "tensor"
        steps = list(manifest.postprocess) or ([Step(op="softmax", args=SoftmaxArgs()),
                                                Step(op="top_k", args=TopKArgs(k=DEFAULT_TOP_K))] if self.active else [])
        if any(s.op == "code" for s in steps):
            check_code(manifest, "postprocess", trust)
        self.steps: list[Step] = steps
        self.k = next((s.args.k for s in reversed(steps) if s.op == "top_k"), DEFAULT_TOP_K)
        self._code = {i: compile_code(s.args.source, manifest, f"postprocess[{i}]")
                      for i, s in enumerate(steps) if s.op == "code"}

    def __repr__(self) -> str:
        return f"Postprocessor({self.manifest.key}, steps=[{', '.join(s.op for s in self.steps)}], k={self.k})"

    def __call__(self, outputs: np.ndarray) -> Prediction:
        x = np.asarray(outputs)
        if x.ndim == 1:
            x = x[None]
        elif x.ndim > 2:
            x = x.reshape(x.shape[0], -1)
        x = x.astype(np.float32, copy=False)
        for i, step in enumerate(self.steps):
            if step.op == "softmax":
                x = softmax(x, axis=step.args.axis)
            elif step.op == "code":
                x = np.asarray(self._code[i](x), dtype=np.float32)
                if x.ndim == 1:
                    x = x[None]
        if x.ndim != 2:
            raise MlmsError(f"{self.manifest.key}: postprocessing expects outputs shaped (N, classes), "
                            f"got {list(x.shape)}")
        x = np.ascontiguousarray(x, dtype=np.float32)
        indices, probs = top_k(x, self.k)
        return Prediction(probabilities=x, top_k_indices=indices,
                          top_k_probabilities=np.ascontiguousarray(probs, dtype=np.float32))
