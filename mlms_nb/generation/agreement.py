"""Truth across frameworks for generation: greedy decoding must give the same tokens in every framework.

:func:`sequence_agreement` compares one framework's greedy run with the reference's, over the same prompts: how many
sequences are identical, and per differing one the first divergent position with both frameworks' top-2 tokens and
logits there; and the logits' agreement at the prefill (step 0) and at each decode step, over the sequences that had
not diverged before that step (after a divergence the two frameworks condition on different tokens).
:func:`compare_step_models` runs it over any step models (torch, ONNX Runtime, TensorFlow), so a new framework plugs in
by passing its :class:`~mlms_nb.generation.step.StepModel`.
"""
from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np
import pandas as pd

from mlms_nb.generation.loop import generate_batch
from mlms_nb.generation.records import GreedyTokens
from mlms_nb.generation.step import StepModel

AGREEMENT_PROMPTS = 4
"""How many prompts the greedy agreement pass decodes in each framework."""


def greedy_tokens(step: StepModel, prompts: Sequence[np.ndarray], max_new_tokens: int) -> GreedyTokens:
    """Greedy tokens and every step's logits of ``prompts`` in one batch (no stop tokens: every step compared)."""
    run = generate_batch(step, list(prompts), max_new_tokens, keep_logits=True)
    tokens = np.stack(run.tokens).astype(np.int64)
    return GreedyTokens(step.framework, step.kv_cache, tokens, np.stack(run.logits).astype(np.float32))


def _top2(logits: np.ndarray) -> list:
    order = np.argsort(logits)[::-1][:2]
    return [[int(i), float(logits[i])] for i in order]


def sequence_agreement(reference: GreedyTokens, other: GreedyTokens) -> pd.DataFrame:
    """One row per compared quantity (see the module): ``kind`` sequences (identical count), divergence (one per
    differing sequence) or logits (per step)."""
    ref_t, oth_t = reference.tokens, other.tokens
    n, steps = min(len(ref_t), len(oth_t)), min(ref_t.shape[1], oth_t.shape[1])
    base = {"framework": other.framework, "reference": reference.framework, "kv_cache": bool(other.kv_cache)}
    rows = []
    diverged_at = np.full(n, steps, dtype=np.int64)
    for i in range(n):
        differ = np.nonzero(ref_t[i, :steps] != oth_t[i, :steps])[0]
        if differ.size:
            k = int(differ[0])
            diverged_at[i] = k
            rows.append({**base, "kind": "divergence", "sequence": i, "step": k, "value": float(k),
                         "detail": {"reference_top2": _top2(reference.logits[k, i]),
                                    "framework_top2": _top2(other.logits[k, i])}})
    identical = int((diverged_at == steps).sum())
    rows.insert(0, {**base, "kind": "identical_sequences", "sequence": -1, "step": -1, "value": float(identical),
                    "detail": {"sequences": n, "tokens_each": steps}})
    for k in range(min(reference.logits.shape[0], other.logits.shape[0], steps)):
        live = diverged_at >= k  # not diverged before step k: both fed the same tokens so far
        if not live.any():
            break
        a = reference.logits[k, :n][live].astype(np.float64)
        b = other.logits[k, :n][live].astype(np.float64)
        diff = np.abs(a - b)
        rows.append({**base, "kind": "logits_max_abs_diff", "sequence": -1, "step": k, "value": float(diff.max()),
                     "detail": {"phase": "prefill" if k == 0 else f"decode step {k}", "sequences": int(live.sum()),
                                "max_rel_diff": float((diff / np.maximum(np.abs(a), 1e-6)).max())}})
    return pd.DataFrame(rows)


def compare_step_models(models: Mapping[str, StepModel], prompts: Sequence[np.ndarray],
                        max_new_tokens: int = 32) -> pd.DataFrame:
    """Greedy agreement of every step model against the first (see :func:`sequence_agreement`)."""
    runs = [greedy_tokens(step, prompts, max_new_tokens) for step in models.values()]
    frames = [sequence_agreement(runs[0], run) for run in runs[1:]]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
