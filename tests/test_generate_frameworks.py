"""Generation in ONNX Runtime and TensorFlow (issue 21 item 2): each framework's StepModel, driven by a plain greedy
loop of this test's own, gives PyTorch's tokens and logits for tiny causal LMs built from their configs (the zoo's
GPT-2 and a Llama, random weights): batch 1 and a left-padded batch of 2, with and without the KV cache.

The reference is the ``transformers`` model itself, run on the whole sequence at every step (no cache, nothing of
mlms-nb's). The ONNX graphs are exported once per session into the session's MLMS_HOME (cached by sha256).
"""
from __future__ import annotations

import json

import numpy as np
import pytest

from tests.helpers import tiny_gpt2_lm, tiny_llama_lm

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("onnxruntime")

pytestmark = pytest.mark.slow  # the first run exports two graphs per model (tens of seconds); later runs reuse them

NEW_TOKENS = 6
TOLERANCE = 1e-4  # |logit| difference allowed, float32 kernels of different frameworks


MODELS = {"gpt2": tiny_gpt2_lm, "llama": tiny_llama_lm}  # tests/helpers.py: the zoo decoder's and test_generation's


@pytest.fixture(scope="module")
def models():
    return {name: build() for name, build in MODELS.items()}


@pytest.fixture(scope="module")
def home():
    """The session's MLMS_HOME (where converted models are cached across tests), for this module."""
    from tests.conftest import SESSION_HOME

    SESSION_HOME.mkdir(parents=True, exist_ok=True)
    return SESSION_HOME


@pytest.fixture(scope="module")
def steps(models, home):
    """{(arch, framework): step model with a KV cache}, built once (ONNX graphs cached in the session's home)."""
    from mlms_nb.frameworks.onnxruntime.generate import OrtCausalLM

    built = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MLMS_HOME", str(home))
        for arch, model in models.items():
            built[arch, "onnxruntime"] = OrtCausalLM.from_torch(model, label=f"tiny-{arch}")
    return built


def _prompts(rows: int, vocab: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(rows)
    ids = rng.integers(1, vocab, (rows, 5), dtype=np.int64)
    mask = np.ones_like(ids)
    if rows > 1:
        mask[1, :2] = 0  # the second prompt is 3 tokens, left-padded
        ids[1, :2] = 0
    return ids, mask


def greedy(step, ids: np.ndarray, mask: np.ndarray) -> tuple[np.ndarray, list[np.ndarray], list[int]]:
    """(new tokens, logits at every step, KV-cache bytes after every step): the plainest greedy loop."""
    logits, state = step.prefill(ids, mask)
    tokens, every, cache = [], [logits], [step.kv_cache_bytes(state)]
    for _ in range(NEW_TOKENS - 1):
        nxt = logits.argmax(-1).astype(np.int64)[:, None]
        tokens.append(nxt)
        mask = np.concatenate([mask, np.ones_like(nxt)], axis=1)
        logits, state = step.decode(nxt, mask, state)
        every.append(logits)
        cache.append(step.kv_cache_bytes(state))
    tokens.append(logits.argmax(-1)[:, None])
    return np.concatenate(tokens, axis=1), every, cache


def torch_greedy(model, ids: np.ndarray, mask: np.ndarray) -> tuple[np.ndarray, list[np.ndarray]]:
    """The same loop on the transformers model, a full forward over the sequence so far at every step."""
    ids, mask = torch.from_numpy(ids), torch.from_numpy(mask)
    tokens, every = [], []
    with torch.no_grad():
        for _ in range(NEW_TOKENS):
            positions = (mask.cumsum(1) - 1).clamp(min=0)
            logits = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits[:, -1, :]
            every.append(logits.numpy())
            nxt = logits.argmax(-1, keepdim=True)
            tokens.append(nxt)
            ids, mask = torch.cat([ids, nxt], 1), torch.cat([mask, torch.ones_like(nxt)], 1)
    return torch.cat(tokens, 1).numpy(), every


def _step(steps, models, arch: str, framework: str, kv_cache: bool):
    if framework == "onnxruntime":
        from mlms_nb.frameworks.onnxruntime.generate import OrtCausalLM

        cached = steps[arch, "onnxruntime"]
        return OrtCausalLM(cached.paths["prefill"], cached.paths["decode"], kv_cache=kv_cache)
    pytest.importorskip("tensorflow")
    pytest.importorskip("keras_hub", reason="pip install --no-deps 'keras-hub>=0.32,<0.33'")
    from mlms_nb.frameworks.tensorflow.generate import KerasCausalLM

    key = (arch, "tensorflow")
    if key not in steps:
        steps[key] = KerasCausalLM.from_torch(models[arch])
    steps[key].kv_cache = kv_cache
    return steps[key]


@pytest.mark.parametrize("kv_cache", [True, False], ids=["kv-cache", "no-cache"])
@pytest.mark.parametrize("framework", ["onnxruntime", "tensorflow"])
@pytest.mark.parametrize("arch", list(MODELS))
def test_greedy_tokens_and_logits_match_pytorch(steps, models, arch, framework, kv_cache):
    from mlms_nb.generation.step import StepModel

    model = models[arch]
    step = _step(steps, models, arch, framework, kv_cache)
    assert isinstance(step, StepModel) and step.kv_cache is kv_cache
    assert step.framework == framework and step.vocab_size == model.config.vocab_size
    for rows in (1, 2):
        ids, mask = _prompts(rows, model.config.vocab_size)
        expected_tokens, expected_logits = torch_greedy(model, ids, mask)
        tokens, logits, cache = greedy(step, ids, mask)
        np.testing.assert_array_equal(tokens, expected_tokens)
        worst = max(float(np.max(np.abs(a - e))) for a, e in zip(logits, expected_logits))
        assert worst < TOLERANCE, f"{framework} {arch} rows={rows}: max |logit diff| {worst:.3g}"
        assert all(lg.dtype == np.float32 and lg.shape == (rows, model.config.vocab_size) for lg in logits)
        config = model.config
        kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
        per_position = config.num_hidden_layers * 2 * rows * kv_heads * (config.hidden_size // config.num_attention_heads) * 4
        # the cache holds the prompt and every token fed so far, float32; none without a cache
        assert cache == [per_position * (5 + k) if kv_cache else 0 for k in range(NEW_TOKENS)]
        assert len(set(tokens.ravel().tolist())) > 1 or rows == 1  # a real model, not a constant


def test_onnx_graphs_are_cached_by_sha256_and_checked_against_pytorch(steps, models, home, monkeypatch):
    from mlms_nb.frameworks.converters.causal_onnx import causal_lm_to_onnx

    monkeypatch.setenv("MLMS_HOME", str(home))
    first = steps["gpt2", "onnxruntime"]
    records = {k: json.loads((p.parent / "artifact.json").read_text()) for k, p in first.paths.items()}
    again = causal_lm_to_onnx(models["gpt2"], label="tiny-gpt2")
    assert again.prefill == first.paths["prefill"] and again.decode == first.paths["decode"]
    for kind, path in first.paths.items():
        record = json.loads((path.parent / "artifact.json").read_text())
        assert record["created_at"] == records[kind]["created_at"]  # reused, not rebuilt
        assert 0 <= record["max_abs_diff"] < TOLERANCE and record["route"] == "dynamo"
    assert set(again.max_abs_diff) == {"prefill", "decode"} and again.layers == 2
    # the artifact's folder is named by the source's sha256, so other weights get another one (not exported here:
    # an export is about 5 s per graph, and the name is all this checks)
    from mlms_nb.frameworks.converters.causal_onnx import source_digest

    digest = source_digest(models["gpt2"])
    assert first.paths["prefill"].parent.parent.parent.name == digest[:16]
    assert records["prefill"]["source_sha256"] == digest
    other = tiny_gpt2_lm()
    with torch.no_grad():
        other.lm_head.weight.mul_(2)  # tied to the token embedding: a different model
    assert source_digest(other) != digest


def test_tensorflow_refuses_an_architecture_keras_hub_lacks_in_one_sentence():
    pytest.importorskip("tensorflow")
    pytest.importorskip("keras_hub")
    from mlms_nb.errors import MlmsError
    from mlms_nb.frameworks.tensorflow.generate import KerasCausalLM

    config = transformers.GPTNeoXConfig(num_hidden_layers=1, hidden_size=32, intermediate_size=64,
                                        num_attention_heads=2, vocab_size=64, max_position_embeddings=32)
    with pytest.raises(MlmsError) as refused:
        KerasCausalLM.from_torch(transformers.GPTNeoXForCausalLM(config).eval())
    text = str(refused.value)
    assert "gpt_neox" in text and "\n" not in text


def test_a_model_without_a_transformers_config_is_refused_in_one_sentence():
    from mlms_nb.frameworks.converters import ConversionError
    from mlms_nb.frameworks.converters.causal_onnx import causal_lm_to_onnx

    with pytest.raises(ConversionError) as refused:
        causal_lm_to_onnx(torch.nn.Linear(2, 2), label="linear")
    assert "linear" in str(refused.value) and "\n" not in str(refused.value)


@pytest.mark.slow  # the decoder exported to ONNX (cached) and ported to Keras, then timed in three frameworks
def test_the_zoo_decoder_generates_in_three_frameworks_with_identical_greedy_tokens(home, monkeypatch):
    """Issue 21's must-show through the Python API: tiny_gpt2 (a torch manifest) runs in ONNX Runtime and TensorFlow
    as is (their step models export or port it when they open), TTFT/TPOT/tokens/s per framework, batch size and KV
    setting, and every framework's greedy tokens identical to PyTorch's."""
    pytest.importorskip("keras_hub")
    import mlms_nb

    monkeypatch.setenv("MLMS_HOME", str(home))  # the session's: its ONNX graphs are the gpt2 fixture's (same model)
    ev = mlms_nb.evaluate("tiny_gpt2", framework="torch,onnxruntime,tensorflow", scenario="generate",
                          batch_sizes=[1, 2], max_new_tokens=4, dataset="synthetic:2", warmup=1, min_repeats=2,
                          min_time_s=0, threads=1, progress=False, history=False)
    assert ev.complete, ev.missing()
    gen = ev.generation
    assert set(gen["framework"]) == {"torch", "onnxruntime", "tensorflow"} and set(gen["kv_cache"]) == {True, False}
    assert len(gen) == 12 and (gen["ttft_median_ms"] > 0).all() and (gen["output_tokens_per_s"] > 0).all()
    same = ev.generation_agreement.query("kind == 'identical_sequences'")
    assert len(same) == 5 and (same["value"] == 2.0).all()  # 2 prompts, every framework and KV setting vs torch
