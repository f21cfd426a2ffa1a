"""Generative models: mlms-nb's generate loop over real transformers causal LMs (random weights from configs, built
here; nothing downloaded), MLPerf's TTFT/TPOT definitions, the offline and server scenarios, the way in (a zoo
decoder, a save_pretrained folder, prompts files) and the greedy agreement across KV-cache settings."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

import mlms_nb
from mlms_nb.errors import MlmsError
from mlms_nb.generation.loop import BatchRun, GenerateTiming, Sampling, generate_batch
from mlms_nb.generation.metrics import generation_row, nearest_rank, request_records
from mlms_nb.generation.prompts import open_prompts
from mlms_nb.generation.step import StepModel, open_step_model
from mlms_nb.manifest import find_manifest
from tests.helpers import html_text

FAST = dict(warmup=1, min_repeats=2, min_time_s=0, threads=1, progress=False)


@pytest.fixture(scope="module")
def gpt2():
    return find_manifest("tiny_gpt2", framework="torch")


@pytest.fixture(scope="module")
def steps(gpt2):
    models = {kv: open_step_model(gpt2, kv_cache=kv, threads=1) for kv in (True, False)}
    yield models
    for m in models.values():
        m.close()


def test_torch_step_model_keeps_the_contract(steps):
    assert all(isinstance(s, StepModel) for s in steps.values())
    rng = np.random.default_rng(1)
    prompts = [rng.integers(0, 50257, n) for n in (5, 9, 3)]
    alone = [generate_batch(steps[True], [p], 6).tokens[0] for p in prompts]
    padded = generate_batch(steps[True], prompts, 6)
    no_cache = generate_batch(steps[False], prompts, 6)
    for i in range(3):  # left padding and the cache change nothing in greedy tokens
        np.testing.assert_array_equal(padded.tokens[i], alone[i])
        np.testing.assert_array_equal(no_cache.tokens[i], alone[i])
    # GPT-2 cache: 2 layers x (K, V) x 3 rows x 2 heads x (9 prompt + 5 fed) positions x 32 dims x 4 bytes
    assert padded.kv_cache_bytes == 2 * 2 * 3 * 2 * 14 * 32 * 4
    assert no_cache.kv_cache_bytes == 0
    assert list(padded.prompt_tokens) == [5, 9, 3]
    assert all(np.all(np.diff(s) > 0) for s in padded.stamps_ns)  # one stamp per token, in order


def test_stop_tokens_and_seeded_sampling(steps):
    prompts = [np.arange(1, 6), np.arange(100, 108)]
    greedy = generate_batch(steps[True], prompts, 5)
    first = int(greedy.tokens[0][0])
    stopped = generate_batch(steps[True], prompts, 5, stop_ids=[first])
    assert len(stopped.tokens[0]) == 1 and stopped.tokens[0][0] == first  # the stop token is kept, then it ends
    assert len(stopped.tokens[1]) == 5 or first in stopped.tokens[1]
    a = generate_batch(steps[True], prompts, 5, Sampling(greedy=False, seed=3))
    b = generate_batch(steps[True], prompts, 5, Sampling(greedy=False, seed=3))
    c = generate_batch(steps[True], prompts, 5, Sampling(greedy=False, seed=4))
    assert all(np.array_equal(x, y) for x, y in zip(a.tokens, b.tokens))
    assert not all(np.array_equal(x, y) for x, y in zip(a.tokens, c.tokens))


def test_mlperf_definitions_on_known_stamps():
    ms = 1_000_000
    # two rows of one batch arriving at t=0; tokens at 10, 12, 15, 19 ms (row 1 stops after 2 tokens)
    stamps = np.array([10, 12, 15, 19]) * ms
    run = BatchRun(np.array([4, 6]), [np.array([1, 2, 3, 4]), np.array([5, 6])], [stamps, stamps[:2]], 0, 10 * ms)
    timing = GenerateTiming([(run, np.zeros(2, dtype=np.int64))], 20 * ms, 0)
    reqs = request_records(timing)
    assert [r["ttft_ms"] for r in reqs] == [10, 10]
    assert [r["latency_ms"] for r in reqs] == [19, 12]
    assert reqs[0]["tpot_ms"] == pytest.approx((19 - 10) / 3) and reqs[1]["tpot_ms"] == pytest.approx(2)
    assert reqs[0]["itl_ms"] == [2, 3, 4]
    row = generation_row(timing, reqs, ttft_limit_ms=11, tpot_limit_ms=2.5)
    assert row["output_tokens_per_s"] == pytest.approx(6 / 0.020)
    assert row["prefill_tokens_per_s_median"] == pytest.approx(10 / 0.010)
    assert row["goodput_fraction"] == 0.5  # row 0's TPOT (3 ms) misses 2.5 ms
    # nearest rank (MLPerf) vs linear interpolation
    values = np.arange(1, 11, dtype=float)
    assert nearest_rank(values, 90) == 9 and nearest_rank(values, 99) == 10 and nearest_rank(values, 50) == 5
    assert np.percentile(values, 90) == pytest.approx(9.1)


def test_prompts_from_files_and_python(tmp_path, gpt2):
    text = tmp_path / "prompts.txt"
    text.write_text("Hello world\n\nThe quick brown fox\n")
    p = open_prompts(str(text), gpt2, 50257)
    assert [list(x) for x in p.ids] == [[15496, 995], [464, 2068, 7586, 21831]]  # GPT-2's real BPE
    assert p.decode(p.ids[0]) == "Hello world"
    (tmp_path / "p.jsonl").write_text('{"text": "Hello world"}\n{"text": "Hi"}\n')
    assert len(open_prompts(str(tmp_path / "p.jsonl"), gpt2, 50257)) == 2
    pd.DataFrame({"ids": [[1, 2, 3], [4, 5]]}).to_parquet(tmp_path / "p.parquet")
    assert [len(x) for x in open_prompts(str(tmp_path / "p.parquet"), gpt2, 50257, column="ids").ids] == [3, 2]
    np.savez(tmp_path / "p.npz", input_ids=np.array([[0, 7, 8], [6, 7, 8]]), attention_mask=np.array([[0, 1, 1], [1, 1, 1]]))
    assert [list(x) for x in open_prompts(str(tmp_path / "p.npz"), gpt2, 50257).ids] == [[7, 8], [6, 7, 8]]
    assert len(open_prompts(["a b", "c"], gpt2, 50257)) == 2
    with pytest.raises(MlmsError, match="vocabulary"):
        open_prompts([[1, 60000]], gpt2, 50257)
    with pytest.raises(MlmsError, match="column"):
        open_prompts(str(tmp_path / "p.jsonl"), gpt2, 50257, column="nope")


def test_evaluate_generate_offline_both_kv_settings(mlms_home):
    ev = mlms_nb.evaluate("tiny_gpt2", scenario="generate", batch_sizes="1,4", max_new_tokens=6, **FAST)
    gen = ev.generation
    assert len(gen) == 4 and set(gen["kv_cache"]) == {True, False} and set(gen["batch_size"]) == {1, 4}
    for col in ("ttft_median_ms", "ttft_ci_low_ms", "ttft_p99_ms", "ttft_p99_linear_ms", "tpot_median_ms",
                "itl_p99_ms", "output_tokens_per_s", "prefill_tokens_per_s_median"):
        assert (gen[col] > 0).all(), col
    assert (gen["ttft_ci_low_ms"] <= gen["ttft_median_ms"]).all()
    assert (gen.loc[gen["kv_cache"], "kv_cache_peak_bytes"] > 0).all()
    assert (gen.loc[~gen["kv_cache"], "kv_cache_peak_bytes"] == 0).all()
    reqs = ev.generation_requests
    assert (reqs["output_tokens"] == 6).all() and (reqs["tpot_ms"] >= 0).all()
    assert len(reqs) == int(gen["requests"].sum())
    same = ev.generation_agreement.query("kind == 'identical_sequences'")
    assert same["value"].tolist() == [4.0]  # no KV cache decodes the same greedy tokens as the cache
    text = repr(ev)
    assert "TTFT median (ms)" in text and "TPOT median (ms)" in text and "tokens/s total" in text
    assert "Greedy agreement" in text
    # every "unstable" tag has its sentence, and sits with TPOT, whose spread it is about (not in "requests")
    said = {(int(w.split("batch size ")[1].split(",")[0]), "(KV cache)" in w) for w in ev.warnings
            if "TPOT is unstable" in w}
    assert said == {(int(r.batch_size), bool(r.kv_cache)) for r in gen.itertuples() if r.unstable}
    ev.generation = ev.generation.assign(unstable=[True, False, False, False])
    cells: dict[int, dict[str, str]] = {}  # row -> header -> cell, over every part of the (split) table
    for part in ev._repr_html_().split('<table class="mlms-split"')[1:]:
        part = part.split("</table>")[0]
        headers = [html_text(h) for h in re.findall(r"<th[^>]*>(.*?)</th>", part)]
        if "requests" not in headers and "TPOT median (ms)" not in headers:
            continue
        for i, row in enumerate(r for r in re.findall(r"<tr>(.*?)</tr>", part) if "<td" in r):
            cells.setdefault(i, {}).update(zip(headers, (html_text(c) for c in re.findall(r"<td[^>]*>(.*?)</td>", row))))
    cells = [cells[i] for i in sorted(cells)]
    tagged = [(name, value) for row in cells for name, value in row.items() if value.endswith("unstable")]
    assert len(cells) == 4 and tagged == [("TPOT median (ms)", cells[0]["TPOT median (ms)"])]
    back = mlms_nb.load_evaluation(ev.history_ids[0])  # stored in the history, generation frames included
    assert len(back.generation) == 4 and len(back.generation_requests) == len(reqs)
    assert ev.outcomes["torch"]["status"] == "complete"


def test_server_scenario_gives_percentiles_and_goodput(mlms_home):
    ev = mlms_nb.evaluate("tiny_gpt2", scenario="generate-server", target_qps=40, batch_sizes="1,3", kv_cache="on",
                          max_new_tokens=4, ttft_limit_ms=10_000, tpot_limit_ms=0.001, history=False,
                          **{**FAST, "min_repeats": 6})
    gen = ev.generation
    assert len(gen) == 2 and (gen["requests"] >= 6).all()
    assert (gen["ttft_p90_ms"] <= gen["ttft_p99_ms"]).all() and (gen["tpot_p99_ms"] > 0).all()
    assert (gen["goodput_fraction"] == 0).all()  # no request makes a TPOT of 1 µs
    assert (gen["target_qps"] == 40).all() and (gen["achieved_qps"] > 0).all()
    reqs = ev.generation_requests
    assert (reqs["queue_ms"] >= 0).all() and (reqs["ttft_ms"] >= reqs["queue_ms"]).all()
    assert reqs.loc[reqs["batch_size"] == 3, "batch_rows"].max() <= 3
    assert "goodput (%)" in repr(ev) and "achieved (req/s)" in repr(ev)
    assert not [w for w in ev.warnings if "cut short" in w or "unstable" in w]  # queueing spread is not noise


def _tiny_llama(folder):
    """tests/helpers.py's tiny Llama written by save_pretrained, with a word-level tokenizer of its 96 ids."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    from tests.helpers import tiny_llama_lm

    tiny_llama_lm().save_pretrained(folder)
    words = ["<unk>"] + [f"w{i}" for i in range(95)]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(folder / "tokenizer.json"))


def test_the_same_model_in_another_folder_is_the_same_export_source(tmp_path):
    """The ONNX graphs of a causal LM are cached by the sha256 of its class, config, attention implementation and
    weights: the live model, its save_pretrained folder and a copy of that folder elsewhere share them (where the
    model came from is not the model), another attention implementation does not (another graph)."""
    import transformers

    from mlms_nb.frameworks.converters.causal_onnx import source_digest
    from tests.helpers import tiny_llama_lm

    for name in ("a", "b"):
        _tiny_llama(tmp_path / name)
    load = transformers.AutoModelForCausalLM.from_pretrained
    a, b = (load(str(tmp_path / name), local_files_only=True, attn_implementation="eager") for name in "ab")
    assert source_digest(a) == source_digest(b) == source_digest(tiny_llama_lm())
    sdpa = load(str(tmp_path / "a"), local_files_only=True, attn_implementation="sdpa")
    assert source_digest(sdpa) != source_digest(a)


def test_a_save_pretrained_folder_evaluates_in_torch(tmp_path, mlms_home):
    folder = tmp_path / "llama"
    _tiny_llama(folder)
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("w1 w2 w3\nw4 w5\nw6 w7 w8 w9\n")
    ev = mlms_nb.evaluate(str(folder), scenario="generate", dataset=str(prompts), batch_sizes=2,
                          max_new_tokens=5, history=False, **FAST)
    assert ev.model == "llama" and len(ev.generation) == 2
    assert ev.generation["prompt_tokens_mean"].between(2, 4).all()
    # the documented way in: a manifest naming the folder and its tokenizer
    (tmp_path / "llama.yaml").write_text(
        "name: tiny_llama\nframework: {name: torch}\ntask: text-generation\ntokenizer: llama/tokenizer.json\n"
        "inputs: [{name: input_ids, type: tensor, element_type: int64, dimensions: [null]}]\n"
        "outputs: [{name: logits, type: tensor}]\nmodel: {graph_path: llama, weights: random}\n")
    ev = mlms_nb.evaluate(str(tmp_path / "llama.yaml"), dataset=str(prompts), kv_cache="on", max_new_tokens=3,
                          history=False, **FAST)
    assert ev.options["scenario"] == "generate" and len(ev.generation) == 1


def test_a_live_causal_lm_and_token_id_prompts(mlms_home):
    import torch
    import transformers

    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=100, n_positions=64, n_embd=32, n_layer=1,
                                                                 n_head=2))
    ev = mlms_nb.evaluate(model, scenario="generate", dataset=[[1, 2, 3], [4, 5], [6, 7, 8, 9]], batch_sizes=3,
                          kv_cache="on", max_new_tokens=4, stop_tokens=[], history=False, **FAST)
    reqs = ev.generation_requests
    assert ev.model == "gpt2lmheadmodel" and sorted(set(reqs["prompt_tokens"])) == [2, 3, 4]  # left-padded batch
    assert (reqs["output_tokens"] == 4).all()


def test_a_hub_id_without_a_local_copy_is_refused(mlms_home):
    with pytest.raises(MlmsError, match="downloads nothing") as err:
        mlms_nb.evaluate("Qwen/Qwen2-0.5B", scenario="generate", history=False, progress=False)
    assert "\n" not in str(err.value)
    with pytest.raises(MlmsError, match="text-generation"):
        mlms_nb.evaluate("bert_tiny", scenario="generate", history=False, progress=False)


def test_a_manifest_naming_a_hub_id_is_refused_in_one_sentence(tmp_path, mlms_home):
    (tmp_path / "qwen.yaml").write_text(
        "name: qwen\nframework: {name: torch}\ntask: text-generation\n"
        "inputs: [{name: input_ids, type: tensor, element_type: int64, dimensions: [null]}]\n"
        "outputs: [{name: logits, type: tensor}]\nmodel: {graph_path: Qwen/Qwen2-0.5B}\n")
    with pytest.raises(MlmsError, match="downloads nothing") as err:
        mlms_nb.evaluate(str(tmp_path / "qwen.yaml"), history=False, progress=False)
    assert "model.graph_path 'Qwen/Qwen2-0.5B' is not a local folder" in str(err.value)


@pytest.mark.slow  # a subprocess importing torch and transformers, the ONNX export in a fresh home: ~40 s
def test_cli_generate_json_carries_the_requests(mlms_home):
    """Through the CLI from a fresh home: each step says what it does (opened, timing per batch size), the one-time
    ONNX export is reported apart from the cold start, and the exporter's own lines stay in frameworks.log."""
    pytest.importorskip("onnxruntime")
    env = {**os.environ, "MLMS_HOME": str(mlms_home)}
    out = subprocess.run([sys.executable, "-m", "mlms_nb.cli", "eval", "tiny_gpt2", "--framework", "torch,onnxruntime",
                          "--scenario", "generate", "--batch-sizes", "1,4", "--max-new-tokens", "4", "--warmup", "1",
                          "--min-repeats", "2", "--min-time", "0", "--threads", "1", "--no-progress", "--json"],
                         capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    run = json.loads(out.stdout)
    torch_result, ort_result = run["results"]
    assert len(torch_result["generation"]) == 4
    assert {"ttft_ms", "tpot_ms", "itl_ms", "output_ids"} <= set(torch_result["generation_requests"][0])
    for fw in ("torch", "onnxruntime"):
        assert re.search(rf"^opened tiny_gpt2\S*{fw} \(with KV cache\) in [\d,]+ ms", out.stderr, re.M), out.stderr
        assert re.search(rf"^timing {fw} at batch size 4 \(generate, without KV cache\)", out.stderr, re.M)
    assert ort_result["cold_start"]["conversion_ms"] > 0 and torch_result["cold_start"]["conversion_ms"] == 0
    assert re.search(r"opened \S+onnxruntime \(with KV cache\) in [\d,]+ ms, after a one-time conversion",
                     out.stderr)
    assert "torchvision" not in out.stderr and " W1" not in out.stderr


def test_language_models_page_names_only_real_flags_and_keywords():
    import inspect
    import re
    from pathlib import Path

    from mlms_nb.commands import cli_parser

    text = (Path(__file__).resolve().parent.parent / "docs" / "language-models.md").read_text(encoding="utf-8")
    verbs = cli_parser()._subparsers._group_actions[0].choices
    flags = {f for verb in verbs.values() for action in verb._actions for f in action.option_strings}
    named = set(re.findall(r"(--[a-z][a-z-]+)", text))
    assert named and named <= flags, named - flags
    params = set(inspect.signature(mlms_nb.evaluate).parameters)
    assert set(re.findall(r"`([a-z_]+)`(?:, `[a-z_]+`)? \| `--", text)) <= params
    for keywords in re.findall(r"mlms_nb\.evaluate\(([^)]*)\)", text):
        assert set(re.findall(r"(\w+)=", re.sub(r'"[^"]*"', '""', keywords))) <= params, keywords


def test_framework_trace_tags_layers_with_their_phase(mlms_home):
    from mlms_nb.schema.spans import attrs_dict

    ev = mlms_nb.evaluate("tiny_gpt2", scenario="generate", batch_sizes=2, kv_cache="on", max_new_tokens=3,
                          trace_level="FRAMEWORK", history=False, **FAST)
    spans = ev.traces["torch"].spans
    predict = spans[spans["name"] == "predict"]
    phases = [(attrs_dict(a)["phase"], attrs_dict(a)["step"]) for a in predict["attrs"]]
    assert phases == [("prefill", 0), ("decode", 1), ("decode", 2)]
    layers = spans[spans["kind"] == "layer"]
    tags = {(attrs_dict(a)["phase"], attrs_dict(a)["step"]) for a in layers["attrs"]}
    assert tags == set(phases)  # every layer call sits in one phase
    attn = layers[layers["name"].str.endswith("attn.c_attn")]  # prefill sees 2 x 16 tokens, a decode step 2 x 1
    shapes = {attrs_dict(a)["phase"]: tuple(json.loads(str(s))[0]) for a, s in zip(attn["attrs"], attn["shape"])}
    assert shapes["prefill"] == (2, 16, 64) and shapes["decode"] == (2, 1, 64)


def test_magic_shows_the_generation_table(mlms_home):
    from IPython.core.interactiveshell import InteractiveShell
    from IPython.utils.capture import capture_output

    from mlms_nb.schema.evaluation import FRAMES

    ip = InteractiveShell.instance()
    try:
        ip.run_line_magic("load_ext", "mlms_nb")
        with capture_output() as captured:
            ip.run_line_magic("mlms", "eval tiny_gpt2 --scenario generate --batch-sizes 2 --kv-cache on "
                                      "--max-new-tokens 3 --warmup 1 --min-repeats 2 --min-time 0 --threads 1 "
                                      "--no-progress --save ev")
        ev = ip.user_ns["ev"]
    finally:
        InteractiveShell.clear_instance()
    for name, schema in FRAMES.items():  # what the runner fills in is what the schema says
        assert schema.problems(getattr(ev, name)) == [], name
    [shown] = [o.data for o in captured.outputs]
    for needle in ("TTFT median (ms)", "TPOT 95% CI (ms)", "tokens/s total", "TPOT = (latency - TTFT)"):
        assert needle in shown["text/plain"] and needle in html_text(shown["text/html"])


def test_agreement_over_step_models_finds_the_first_divergence(steps):
    import torch

    from mlms_nb.frameworks.torch.generate import TorchStepModel
    from mlms_nb.generation.agreement import compare_step_models
    from mlms_nb.zoo.registry import build_torch_model

    prompts = [np.arange(1, 9), np.arange(300, 305)]
    same = compare_step_models({"kv": steps[True], "no kv": steps[False]}, prompts, 4)
    assert same.query("kind == 'identical_sequences'")["value"].tolist() == [2.0]
    assert same.query("kind == 'logits_max_abs_diff'")["value"].max() < 1e-3
    assert same.query("kind == 'logits_max_abs_diff'")["detail"].iloc[0]["phase"] == "prefill"
    other = build_torch_model("tiny_gpt2")
    with torch.no_grad():
        other.transformer.wte.weight.mul_(-1.0)  # another model: its tokens differ from the first step on
    differ = compare_step_models({"a": steps[True], "b": TorchStepModel(other, kv_cache=True)}, prompts, 4)
    rows = differ.query("kind == 'divergence'")
    assert differ.query("kind == 'identical_sequences'")["value"].tolist() == [2.0 - len(rows)] and len(rows) >= 1
    for row in rows.itertuples():
        ref, oth = row.detail["reference_top2"], row.detail["framework_top2"]
        assert ref[0][0] != oth[0][0] and ref[0][1] >= ref[1][1]  # top-1 tokens differ there; top-2 in order


@pytest.mark.slow  # the folder's Llama exported to ONNX (prefill and decode graphs) on first use
def test_a_save_pretrained_llama_folder_generates_in_torch_and_onnxruntime(tmp_path, shared_home):
    """Issue 21's must-show: a Hugging Face folder of another architecture than the zoo's, through the documented
    way in (the folder itself), in torch and ONNX Runtime, with prompts of different lengths (left padding). In the
    session's home: test_generate_frameworks.py exports the same Llama, and whichever comes second reuses the
    graphs."""
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    folder = tmp_path / "llama"
    _tiny_llama(folder)
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("w1 w2 w3\nw4 w5\nw6 w7 w8 w9\n")
    ev = mlms_nb.evaluate(str(folder), framework="torch,onnxruntime", scenario="generate", dataset=str(prompts),
                          batch_sizes=2, max_new_tokens=4, history=False, **FAST)
    assert ev.complete, ev.missing()
    assert set(ev.generation["framework"]) == {"torch", "onnxruntime"} and (ev.generation["ttft_median_ms"] > 0).all()
    same = ev.generation_agreement.query("kind == 'identical_sequences' and framework == 'onnxruntime'")
    assert len(same) == 2 and (same["value"] == 3).all()  # 3 prompts, with and without the cache, as in torch


def test_the_generate_benchmark_judges_ttft_parity_both_ways():
    """benchmarks/generate.py's verdict: yes only when each TTFT median lies inside the other's IQR; otherwise it
    says which loop is faster, by how much, and whether the bootstrap CI of the difference holds 0."""
    import runpy
    from pathlib import Path

    verdict = runpy.run_path(str(Path(__file__).resolve().parent.parent / "benchmarks" / "generate.py"))["ttft_verdict"]
    rng = np.random.default_rng(1)
    same = rng.normal(5.5, 0.1, 200)
    ok, text = verdict(list(same[:100]), list(same[100:]))
    assert ok and text.startswith("yes")
    ok, text = verdict(list(rng.normal(5.0, 0.05, 100)), list(rng.normal(5.5, 0.05, 100)))  # mlms 0.5 ms faster
    assert not ok and "mlms faster by 0.5" in text and "excludes 0" in text
    ok, text = verdict(list(rng.normal(5.6, 0.05, 100)), list(rng.normal(5.5, 0.05, 100)))
    assert not ok and "mlms slower" in text
