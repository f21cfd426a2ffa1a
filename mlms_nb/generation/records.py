"""The records a framework's generation work emits (beside :mod:`mlms_nb.evaluation.records`' own), assembled into
the `Evaluation`'s ``generation``, ``generation_requests`` and ``generation_agreement`` frames."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class GenerateLoop:
    """One generate scenario's timed loop at one batch size, with or without the KV cache: its statistics row
    (:func:`mlms_nb.generation.metrics.generation_row`), one record per request, the per-request latencies (int64 ns,
    for the ``latency`` frame) and the loop's wall time. ``complete`` False: cut short (``reason``)."""
    framework: str
    batch_size: int
    scenario: str
    kv_cache: bool
    row: dict
    requests: list
    latency_ns: np.ndarray
    wall_ns: int
    warmup_calls: int
    extra: dict = field(default_factory=dict)
    complete: bool = True
    reason: str = ""


@dataclass(frozen=True)
class GreedyTokens:
    """Greedy decoding of the agreement prompts: the tokens of each (``(prompts, new tokens)``, -1 after a stop) and
    the logits of every step (``(steps, prompts, vocab)``, float32; step 0 is the prefill's), compared across
    frameworks as they arrive (:mod:`mlms_nb.generation.agreement`); the logits are not stored."""
    framework: str
    kv_cache: bool
    tokens: np.ndarray
    logits: np.ndarray
