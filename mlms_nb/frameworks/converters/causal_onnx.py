"""A Hugging Face ``transformers`` causal language model -> two ONNX graphs: the prefill and the decode step.

``causal_lm_to_onnx(model)`` exports, with ``torch.onnx``'s dynamo route (``torch.export``), two graphs into
``artifacts_dir()/user/<sha256 of the source>[:16]/onnxruntime-generate/{prefill,decode}/model.onnx``, each beside
its ``artifact.json`` (the kept converters' cache, :func:`mlms_nb.frameworks.convert.build_artifact`: reused while
the file's and the source's sha256 match):

- ``prefill``: ``input_ids``, ``attention_mask``, ``position_ids`` (all ``int64 (batch, seq)``) ->
  ``logits`` (``float32 (batch, vocab)``, the last position's) and ``present.<layer>.key`` / ``.value``
  (``(batch, kv_heads, seq, head_dim)``).
- ``decode``: ``input_ids`` and ``position_ids`` ``(batch, 1)``, ``attention_mask`` ``(batch, past + 1)`` and
  ``past.<layer>.key`` / ``.value`` ``(batch, kv_heads, past, head_dim)`` -> ``logits`` and the presents, one
  position longer.

Both are exported from an example with batch 2 and several positions, the second row left-padded, with every axis
above dynamic (exporting from a batch of 1 or one position lets ``torch.export`` specialise that axis to a
constant). The source is the model's class, config and weights (:func:`source_digest`). Each graph is checked
against PyTorch on another batch (3 rows, other lengths, left padding): the max |logit difference| is recorded in
``artifact.json`` and on the returned :class:`CausalOnnx`; above ``tolerance`` x max |logit| it is an error.
"""
from __future__ import annotations

import hashlib
import json
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from mlms_nb._optional import require
from mlms_nb.frameworks.converters.torch_onnx import ConversionError, first_cause, stdout_to_stderr
from mlms_nb.paths import artifacts_dir

PREFILL_INPUTS = ("input_ids", "attention_mask", "position_ids")


@dataclass
class CausalOnnx:
    """The two graphs, the model's cache geometry, and the max |logit difference| from PyTorch of each graph."""
    prefill: Path
    decode: Path
    layers: int
    kv_heads: int
    head_dim: int
    vocab_size: int
    max_abs_diff: dict[str, float] = field(default_factory=dict)


def cache_names(layers: int, prefix: str) -> list[str]:
    """``prefix.<layer>.key``, ``prefix.<layer>.value`` for every layer, in the graphs' order."""
    return [f"{prefix}.{i}.{kv}" for i in range(layers) for kv in ("key", "value")]


def position_ids(attention_mask: np.ndarray) -> np.ndarray:
    """``cumsum(mask) - 1`` clipped at 0 (as :func:`mlms_nb.generation.step.position_ids`, which the frameworks
    layer may not import)."""
    return np.maximum(np.cumsum(attention_mask, axis=1) - 1, 0).astype(np.int64)


def _wrappers(model):
    """(prefill module, decode module) around ``model`` taking and returning flat tensors."""
    torch = require("torch")
    cache_utils = require("transformers.cache_utils")
    layers = model.config.num_hidden_layers

    def flat(out) -> tuple:
        tensors = []
        for layer in out.past_key_values.layers:
            tensors += [layer.keys, layer.values]
        return (out.logits[:, -1, :].float(), *tensors)

    class Prefill(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lm = model

        def forward(self, input_ids, attention_mask, position_ids):
            cache = cache_utils.DynamicCache(config=self.lm.config)
            return flat(self.lm(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                                past_key_values=cache, use_cache=True))

    class Decode(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lm = model

        def forward(self, input_ids, attention_mask, position_ids, past):
            cache = cache_utils.DynamicCache(config=self.lm.config)
            for i in range(layers):
                cache.update(past[2 * i], past[2 * i + 1], i)
            return flat(self.lm(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                                past_key_values=cache, use_cache=True))

    return Prefill().eval(), Decode().eval()


def _example(vocab: int, rows: int, length: int, seed: int) -> dict[str, np.ndarray]:
    """Random prompts, every row after the first left-padded by one more position than the one before."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, vocab, (rows, length), dtype=np.int64)
    mask = np.ones((rows, length), np.int64)
    for r in range(1, rows):
        mask[r, :min(r, length - 1)] = 0
    return {"input_ids": ids, "attention_mask": mask, "position_ids": position_ids(mask)}


def _step_example(prompt: dict[str, np.ndarray], vocab: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    rows = prompt["input_ids"].shape[0]
    mask = np.concatenate([prompt["attention_mask"], np.ones((rows, 1), np.int64)], axis=1)
    return {"input_ids": rng.integers(0, vocab, (rows, 1), dtype=np.int64), "attention_mask": mask,
            "position_ids": position_ids(mask)[:, -1:]}


def _torch_run(module, feed: dict[str, np.ndarray], past=None) -> list[np.ndarray]:
    torch = require("torch")
    args = [torch.from_numpy(feed[n]) for n in PREFILL_INPUTS]
    with torch.no_grad():
        out = module(*args) if past is None else module(*args, tuple(torch.from_numpy(p) for p in past))
    return [t.detach().float().numpy() for t in out]


def _export(module, feed: dict[str, np.ndarray], past, layers: int, out: Path) -> None:
    torch = require("torch")
    require("onnxscript", "the dynamo ONNX exporter")
    batch = torch.export.Dim("batch", min=1)
    args = tuple(torch.from_numpy(feed[n]) for n in PREFILL_INPUTS)
    outputs = ["logits", *cache_names(layers, "present")]
    if past is None:
        seq = torch.export.Dim("seq", min=1)
        shapes: tuple = tuple({0: batch, 1: seq} for _ in PREFILL_INPUTS)
        inputs = list(PREFILL_INPUTS)
    else:
        positions, total = torch.export.Dim("past", min=1), torch.export.Dim("total", min=2)
        args = (*args, tuple(torch.from_numpy(p) for p in past))
        shapes = ({0: batch}, {0: batch, 1: total}, {0: batch}, tuple({0: batch, 2: positions} for _ in past))
        inputs = [*PREFILL_INPUTS, *cache_names(layers, "past")]
    with torch.no_grad(), warnings.catch_warnings(), stdout_to_stderr():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(module, args, dynamo=True, input_names=inputs, output_names=outputs,
                                    dynamic_shapes=shapes, optimize=True, verbose=False)
    program.save(str(out))


def _ort_run(path: Path, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
    ort = require("onnxruntime")
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, feed)


def _max_diff(actual: list[np.ndarray], expected: list[np.ndarray], mask: np.ndarray) -> float:
    """Max |difference| over the logits and the keys and values of the real (unpadded) positions: a padding
    position attends to nothing, and what frameworks put there (uniform weights, zeros) is never read."""
    diff = float(np.max(np.abs(actual[0] - expected[0])))
    real = mask.astype(bool)[:, None, -actual[1].shape[2]:, None] if len(actual) > 1 else None
    for a, e in zip(actual[1:], expected[1:]):
        diff = max(diff, float(np.max(np.abs(np.where(real, a - e, 0.0)))))
    return diff


PROVENANCE = ("_name_or_path", "architectures", "dtype", "transformers_version")
"""Config keys save_pretrained and from_pretrained write about a model's origin, not its computation: the folder,
the class (already in the digest), the weights' dtype (the weights' bytes are) and the library's version."""


def source_digest(model) -> str:
    """sha256 of the model's class, its config (JSON), its attention implementation (``eager``, ``sdpa``: another
    graph) and its weights. Left out are the config's records of where the model came from (:data:`PROVENANCE`): a
    live model, its save_pretrained folder and a copy of that folder elsewhere are the same source, and share graphs."""
    from mlms_nb.frameworks.converters import source_digest as weights_digest

    config = {k: v for k, v in model.config.to_dict().items() if k not in PROVENANCE}
    config["_attn_implementation"] = getattr(model.config, "_attn_implementation", None)
    h = hashlib.sha256(weights_digest(model).encode())
    h.update(json.dumps(config, sort_keys=True, default=str).encode())
    return h.hexdigest()


def causal_lm_to_onnx(model, out_dir: str | Path | None = None, *, tolerance: float = 1e-4, force: bool = False,
                      label: str | None = None) -> CausalOnnx:
    """The prefill and decode-step ONNX graphs of ``model`` (a ``transformers`` ``*ForCausalLM`` in eval mode),
    built once and cached by sha256 (see the module docstring). Raises :class:`ConversionError` with one sentence
    naming the model and what failed."""
    from mlms_nb.frameworks.convert import build_artifact

    label = label or type(model).__name__
    config = getattr(model, "config", None)
    if config is None or not hasattr(config, "num_hidden_layers"):
        raise ConversionError(f"{label}: exporting generation graphs needs a transformers causal LM (a model with a "
                              "config); got a model without one")
    model.eval()
    layers, vocab = int(config.num_hidden_layers), int(config.vocab_size)
    digest = source_digest(model)
    base = Path(out_dir) if out_dir is not None else artifacts_dir() / "user" / digest[:16] / "onnxruntime-generate"
    prefill_module, decode_module = _wrappers(model)
    example = _example(vocab, 2, 4, seed=0)  # batch 2, 4 positions, the second row left-padded
    check = _example(vocab, 3, 6, seed=1)    # another batch and length: the dynamic axes are exercised
    example_past = _torch_run(prefill_module, example)[1:]
    check_past = _torch_run(prefill_module, check)[1:]
    diffs: dict[str, float] = {}

    def build_one(kind: str, module, feed, past, check_feed, past_check):
        def build(tmp: Path) -> dict:
            started = time.perf_counter()
            try:
                _export(module, feed, past, layers, tmp)
            except Exception as err:  # noqa: BLE001 - the exporter's failure, as one sentence
                line = first_cause(str(err)) or type(err).__name__
                raise ConversionError(f"{label}: the {kind} graph did not export to ONNX ({type(err).__name__}: "
                                      f"{line[:300]})") from err
            names = list(PREFILL_INPUTS) + (cache_names(layers, "past") if past_check is not None else [])
            values = [check_feed[n] for n in PREFILL_INPUTS] + list(past_check or [])
            actual = _ort_run(tmp, dict(zip(names, values)))
            expected = _torch_run(module, check_feed, past_check)
            diff = _max_diff(actual, expected, check_feed["attention_mask"])
            scale = max(1.0, float(np.max(np.abs(expected[0]))))
            if not diff <= tolerance * scale:
                raise ConversionError(f"{label}: the {kind} graph's outputs differ from PyTorch by {diff:.3g} "
                                      f"(tolerance {tolerance:g} x {scale:.3g})")
            return {"route": "dynamo", "max_abs_diff": diff, "checked_on": {k: list(v.shape) for k, v in
                                                                            check_feed.items()},
                    "export_seconds": round(time.perf_counter() - started, 3),
                    "versions": {"torch": require("torch").__version__, "onnx": require("onnx").__version__}}

        folder = base / kind
        folder.mkdir(parents=True, exist_ok=True)
        target = folder / "model.onnx"
        build_artifact(folder, target, f"{label} -> onnx {kind}", build,
                       {"name": label, "framework": "onnxruntime", "graph": kind}, force, source_sha256=digest)
        from mlms_nb.frameworks.converters import read_record

        diffs[kind] = float(read_record(target).get("max_abs_diff", float("nan")))
        return target

    prefill = build_one("prefill", prefill_module, example, None, check, None)
    decode = build_one("decode", decode_module, _step_example(example, vocab, 2), example_past,
                       _step_example(check, vocab, 3), check_past)
    key = example_past[0]
    return CausalOnnx(prefill, decode, layers, int(key.shape[1]), int(key.shape[3]), vocab, diffs)
