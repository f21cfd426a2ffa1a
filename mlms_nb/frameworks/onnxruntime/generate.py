"""A causal language model in ONNX Runtime, as a :class:`mlms_nb.generation.step.StepModel`.

Two graphs (:mod:`mlms_nb.frameworks.converters.causal_onnx`): ``prefill`` (the prompt, left-padded, -> the last
position's logits and every layer's keys and values) and ``decode`` (one token and the past keys and values -> the
next logits and the presents, one position longer). With ``kv_cache=False`` every step runs the prefill graph over
the whole sequence so far (a full forward per token; only ``logits`` is fetched), so the two modes can be compared
on the same graphs. ``OrtCausalLM.from_torch(model)`` exports a ``transformers`` model first (cached by sha256).

The state with a cache is an :class:`OrtCache`: the ``present`` arrays (host numpy, as ONNX Runtime returns them)
and each row's last position, so a decode step feeds its position as ``last + 1`` instead of summing the mask again;
without a cache, the token ids so far. The decode step does what a hand-written loop does and nothing more (the
feed built once per call, no copy of inputs already ``int64`` and contiguous): benchmarks/generate.py holds it to
>= 0.97 of the bare loop's tokens/s. Logits come back as host ``float32`` arrays: ``session.run`` returns when the work is done.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from mlms_nb._optional import require
from mlms_nb.errors import MlmsError


def _positions(attention_mask: np.ndarray) -> np.ndarray:
    return np.maximum(np.cumsum(attention_mask, axis=1) - 1, 0).astype(np.int64)


def _int64(a: np.ndarray) -> np.ndarray:
    """``a`` itself when it already is contiguous ``int64`` (the loop's arrays are), else a contiguous copy."""
    if type(a) is np.ndarray and a.dtype == np.int64 and a.flags.c_contiguous:
        return a
    return np.ascontiguousarray(a, np.int64)


class OrtCache(NamedTuple):
    """The state between decode steps with a KV cache: every layer's ``present`` keys and values, and each row's
    position of the last token fed (``int64 (B, 1)``)."""
    presents: list
    last: np.ndarray


class OrtCausalLM:
    """The prefill and decode graphs of one model in ONNX Runtime sessions (CPU, or CUDA when ``device`` says)."""

    framework = "onnxruntime"

    def __init__(self, prefill: str | Path, decode: str | Path, *, kv_cache: bool = True, threads: int | None = None,
                 device: str = "cpu", max_abs_diff: dict[str, float] | None = None):
        ort = require("onnxruntime")
        so = ort.SessionOptions()
        if threads:
            so.intra_op_num_threads = int(threads)
        providers = ["CPUExecutionProvider"]
        if device.startswith("cuda"):
            if "CUDAExecutionProvider" not in ort.get_available_providers():
                raise MlmsError(f"device {device}: this onnxruntime has no CUDAExecutionProvider; install "
                                "onnxruntime-gpu, or use device cpu")
            index = int(device.split(":")[1]) if ":" in device else 0
            providers = [("CUDAExecutionProvider", {"device_id": index}), "CPUExecutionProvider"]
        self.kv_cache = bool(kv_cache)
        self.max_abs_diff = dict(max_abs_diff or {})  # per graph, against PyTorch, as the converter measured it
        self.paths = {"prefill": Path(prefill), "decode": Path(decode)}
        self._prefill = ort.InferenceSession(str(prefill), sess_options=so, providers=providers)
        self._decode = ort.InferenceSession(str(decode), sess_options=so, providers=providers) if kv_cache else None
        inputs = [i.name for i in self._prefill.get_inputs()]
        outputs = [o.name for o in self._prefill.get_outputs()]
        if outputs[:1] != ["logits"] or inputs != ["input_ids", "attention_mask", "position_ids"]:
            raise MlmsError(f"{prefill}: not a prefill graph of mlms-nb's causal LM export (inputs {inputs}, "
                            f"outputs {outputs[:3]}...)")
        self._present_names = outputs[1:]
        self._past_names = [n.replace("present.", "past.", 1) for n in self._present_names]
        vocab = self._prefill.get_outputs()[0].shape[-1]
        self.vocab_size = int(vocab) if isinstance(vocab, int) else -1

    @classmethod
    def from_torch(cls, model, *, kv_cache: bool = True, threads: int | None = None, device: str = "cpu",
                   label: str | None = None) -> "OrtCausalLM":
        """Export ``model`` (a ``transformers`` causal LM) with the kept converter (cached), then open it."""
        from mlms_nb.frameworks.converters.causal_onnx import causal_lm_to_onnx

        graphs = causal_lm_to_onnx(model, label=label)
        step = cls(graphs.prefill, graphs.decode, kv_cache=kv_cache, threads=threads, device=device,
                   max_abs_diff=graphs.max_abs_diff)
        step.vocab_size = graphs.vocab_size
        return step

    def _run_prefill(self, ids: np.ndarray, mask: np.ndarray, outputs: list[str] | None) -> list[np.ndarray]:
        mask = _int64(mask)
        feed = {"input_ids": _int64(ids), "attention_mask": mask, "position_ids": _positions(mask)}
        return self._prefill.run(outputs, feed)

    def prefill(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> tuple[np.ndarray, Any]:
        if not self.kv_cache:
            logits = self._run_prefill(input_ids, attention_mask, ["logits"])[0]
            return logits, np.asarray(input_ids, np.int64)
        logits, *presents = self._run_prefill(input_ids, attention_mask, None)
        last = np.maximum(np.asarray(attention_mask).sum(axis=1, keepdims=True) - 1, 0).astype(np.int64)
        return logits, OrtCache(presents, last)

    def decode(self, next_ids: np.ndarray, attention_mask: np.ndarray, state: Any) -> tuple[np.ndarray, Any]:
        next_ids = _int64(next_ids).reshape(-1, 1)
        mask = _int64(attention_mask)
        if not self.kv_cache:
            ids = np.concatenate([state, next_ids], axis=1)
            return self._run_prefill(ids, mask, ["logits"])[0], ids
        last = state.last + 1  # the new token's position: one past the last one fed
        feed = dict(zip(self._past_names, state.presents))
        feed["input_ids"], feed["attention_mask"], feed["position_ids"] = next_ids, mask, last
        logits, *presents = self._decode.run(None, feed)
        return logits, OrtCache(presents, last)

    @property
    def sessions(self) -> tuple[Any, Any]:
        """The prefill and decode-step ``InferenceSession`` (decode None without a KV cache): what a hand-written loop
        over this very model calls (benchmarks/generate.py)."""
        return self._prefill, self._decode

    def kv_cache_bytes(self, state: Any) -> int:
        if not self.kv_cache or state is None:
            return 0
        return int(sum(a.nbytes for a in state.presents))

    def close(self) -> None:
        self._prefill = self._decode = None


def open_step_model(manifest, *, kv_cache: bool, device: str = "cpu", threads: int | None = None,
                    trust: bool = False) -> OrtCausalLM:
    """The ONNX Runtime step model of a text-generation manifest: its PyTorch causal LM
    (:func:`~mlms_nb.frameworks.causal_lm.load_causal_lm`) exported as prefill and decode-step graphs by the kept
    converter (cached by sha256, checked against PyTorch), run with ``threads`` intra-op threads."""
    from mlms_nb.frameworks.causal_lm import load_causal_lm

    return OrtCausalLM.from_torch(load_causal_lm(manifest, trust), kv_cache=kv_cache, threads=threads, device=device,
                                  label=manifest.name)

