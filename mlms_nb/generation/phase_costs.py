"""Theoretical per-layer costs of a generate run's traced batch, per phase: what its roofline per phase divides by
the traced layer times. The shapes come from the trace itself (:mod:`mlms_nb.generation.traced`): the prefill's
prompt (the first layer's input, ``(B, T)``) and its decode steps (one token each, the k-th against a KV cache of
``T + k - 1`` positions; costed at the median step's cache length, which only the attention core in between the
layers depends on). Costs are counted on the run's PyTorch causal LM
(:func:`mlms_nb.frameworks.torch.generate.phase_costs`), the only step model that records layer spans."""
from __future__ import annotations

import json

import pandas as pd

from mlms_nb.errors import MlmsError
from mlms_nb.manifest import Manifest


def _attrs(text) -> dict:
    try:
        return json.loads(text) if isinstance(text, str) and text else {}
    except ValueError:
        return {}


def traced_phase_shapes(spans: pd.DataFrame, batch_size: int) -> tuple[int, int]:
    """``(prompt_length, kv_length)`` of the traced batch at ``batch_size``: the prefill's first layer input's
    length, and the median decode step's KV-cache length (see the module)."""
    predicts = spans[(spans["kind"] == "model") & (spans["name"] == "predict")]
    tags = [(sid, _attrs(a)) for sid, a in zip(predicts["span_id"], predicts["attrs"].astype(str))]
    mine = [(sid, a) for sid, a in tags if int(a.get("batch", -1)) == int(batch_size) and "phase" in a]
    prefill = [sid for sid, a in mine if a["phase"] == "prefill"]
    decodes = [a for _, a in mine if a["phase"] == "decode"]
    if not prefill:
        raise MlmsError(f"the trace has no prefill call at batch size {batch_size}: its phase costs cannot be counted")
    layers = spans[(spans["kind"] == "layer") & (spans["parent_id"].isin(prefill[:1]))].sort_values("layer_index")
    for text in layers["shape"].astype(str):
        try:
            shape = json.loads(text)[0]
        except (ValueError, IndexError, TypeError):
            continue
        if isinstance(shape, list) and len(shape) == 2 and shape[0] == int(batch_size):
            prompt = int(shape[1])
            return prompt, prompt + max((len(decodes) - 1) // 2, 0)
    raise MlmsError(f"no traced layer of the prefill at batch size {batch_size} reads the token ids (B, T): the "
                    "prompt's length is unknown, so its costs cannot be counted")


def generate_phase_costs(manifest: Manifest, spans: pd.DataFrame, batch_size: int, trust: bool = False) -> pd.DataFrame:
    """Per-layer costs of ``manifest``'s causal LM at ``batch_size`` in each phase, at the traced shapes (a
    ``phase`` column: ``prefill`` and ``decode``)."""
    from mlms_nb.frameworks.causal_lm import load_causal_lm
    from mlms_nb.frameworks.torch.generate import phase_costs

    prompt, kv = traced_phase_shapes(spans, batch_size)
    return phase_costs(load_causal_lm(manifest, trust), batch_size, prompt, kv)
