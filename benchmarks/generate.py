"""mlms-nb's generate loop against a hand-written one over the same model, interleaved in one process.

For each batch size (default 1 and 4): rounds alternate A then B, B then A (mlms-nb: :func:`mlms_nb.generation.loop.run_generate`,
offline scenario, over a :class:`~mlms_nb.generation.step.StepModel`) and B (a bare loop written the way a user
would: the framework called directly, argmax, the KV cache fed back), so drift and other load hit both alike. Both
decode greedily the same equal-length prompts for the same number of new tokens (no stop token).

Reported per batch size: output tokens/s of each (total output tokens / the round's wall time), the ratio A/B
(median over rounds, with min..max across rounds; target >= 0.97), and the TTFT of each (median over every request
of every round, with its IQR).

How "the TTFT of both within each other's spread" is judged (:func:`ttft_verdict`): the spread is each loop's IQR
of TTFT over requests, and the verdict is ``yes`` only when each median lies inside the other's IQR. Otherwise the
row says which loop is faster, by how much (ms and % of the bare median) and the 95% bootstrap CI of that
difference of medians (seeded, 2000 resamples): a CI holding 0 means the two are not told apart by these samples
even though one median sits just outside the other's quartiles; a CI away from 0 is a real difference, reported,
never hidden. A faster mlms-nb TTFT counts against the verdict like a slower one: both clocks must time the same
thing.

Any framework plugs in with :func:`compare`: give it a StepModel and a bare loop ``bare(prompts (B, T) int64,
max_new_tokens) -> (first_token_ns_from_start, total_ns)``; :func:`torch_case` builds the PyTorch pair (KV cache),
:func:`ort_case` the ONNX Runtime one (the kept converter's prefill and decode graphs; the bare loop makes two ``session.run``
calls on the step model's own sessions with the cache fed back by hand).

Run: ``.venv/bin/python benchmarks/generate.py [--rounds 6] [--round-time 1.0] [--threads 1] [--max-new-tokens 32]
[--batch-sizes 1,4] [--frameworks torch,onnxruntime]``.
"""
from __future__ import annotations

import argparse
import time
from typing import Callable

import numpy as np

from mlms_nb.generation.loop import run_generate
from mlms_nb.generation.step import StepModel
from mlms_nb.options import Timing

Bare = Callable[[np.ndarray, int], tuple[int, int]]


def torch_case(threads: int) -> tuple[StepModel, Bare]:
    """tiny_gpt2 in PyTorch with its KV cache: mlms-nb's step model, and a bare loop over the same module."""
    import torch

    from mlms_nb.frameworks.torch.generate import TorchStepModel
    from mlms_nb.zoo.registry import build_torch_model

    torch.set_num_threads(threads)
    model = build_torch_model("tiny_gpt2")

    def bare(prompts: np.ndarray, max_new_tokens: int) -> tuple[int, int]:
        start = time.perf_counter_ns()
        with torch.inference_mode():
            ids = torch.from_numpy(prompts)
            out = model(input_ids=ids, use_cache=True)
            token = out.logits[:, -1, :].argmax(-1, keepdim=True)
            first = time.perf_counter_ns()
            past = out.past_key_values
            for _ in range(max_new_tokens - 1):
                out = model(input_ids=token, past_key_values=past, use_cache=True)
                past = out.past_key_values
                token = out.logits[:, -1, :].argmax(-1, keepdim=True)
        return first - start, time.perf_counter_ns() - start

    return TorchStepModel(model, kv_cache=True), bare


def ort_case(threads: int) -> tuple[StepModel, Bare]:
    """tiny_gpt2 exported by the kept converter (prefill + decode-step graphs, cached): mlms-nb's ONNX Runtime step
    model, and a bare loop calling the same two sessions with the KV cache fed back by hand."""

    from mlms_nb.frameworks.onnxruntime.generate import OrtCausalLM
    from mlms_nb.zoo.registry import build_torch_model

    step = OrtCausalLM.from_torch(build_torch_model("tiny_gpt2"), kv_cache=True, threads=threads, label="tiny_gpt2")
    # the same two sessions, as the torch case shares one model: two sessions of one graph differ by a few percent
    # between themselves (where their weights and buffers landed in memory), which is not the loop's cost
    prefill, decode = step.sessions
    past_names = [i.name for i in decode.get_inputs() if i.name.startswith("past.")]

    def bare(prompts: np.ndarray, max_new_tokens: int) -> tuple[int, int]:
        start = time.perf_counter_ns()
        rows, length = prompts.shape
        mask = np.ones((rows, length), np.int64)
        positions = np.broadcast_to(np.arange(length, dtype=np.int64), (rows, length))
        logits, *past = prefill.run(None, {"input_ids": prompts, "attention_mask": mask, "position_ids": positions})
        token = logits.argmax(-1).reshape(-1, 1).astype(np.int64)
        first = time.perf_counter_ns()
        for k in range(max_new_tokens - 1):
            mask = np.ones((rows, length + k + 1), np.int64)
            feed = {"input_ids": token, "attention_mask": mask,
                    "position_ids": np.full((rows, 1), length + k, np.int64), **dict(zip(past_names, past))}
            logits, *past = decode.run(None, feed)
            token = logits.argmax(-1).reshape(-1, 1).astype(np.int64)
        return first - start, time.perf_counter_ns() - start

    return step, bare


CASES = {"torch": torch_case, "onnxruntime": ort_case}


def _mlms_round(step: StepModel, prompts: np.ndarray, max_new_tokens: int, seconds: float) -> tuple[float, list[float]]:
    cfg = Timing(warmup=0, min_repeats=3, min_time_s=seconds)
    timing = run_generate("generate", step, list(prompts), len(prompts), max_new_tokens, cfg)
    tokens = sum(len(t) for run, _ in timing.batches for t in run.tokens)
    ttft = [(run.prefill_end_ns - run.start_ns) / 1e6 for run, _ in timing.batches]
    return tokens / (timing.wall_ns / 1e9), ttft


def _bare_round(bare: Bare, prompts: np.ndarray, max_new_tokens: int, seconds: float) -> tuple[float, list[float]]:
    ttft, calls = [], 0
    start = time.perf_counter_ns()
    while True:
        first, _ = bare(prompts, max_new_tokens)
        ttft.append(first / 1e6)
        calls += 1
        if calls >= 3 and time.perf_counter_ns() - start >= seconds * 1e9:
            break
    wall = time.perf_counter_ns() - start
    return calls * prompts.shape[0] * max_new_tokens / (wall / 1e9), ttft


def ttft_verdict(mlms_ms: list[float], bare_ms: list[float], seed: int = 0) -> tuple[bool, str]:
    """Whether each TTFT median lies inside the other's IQR, and a sentence that says so or gives the difference of
    medians (mlms - bare) with its 95% bootstrap CI (see the module docstring)."""
    a, b = np.asarray(mlms_ms, float), np.asarray(bare_ms, float)
    (a25, a50, a75), (b25, b50, b75) = np.percentile(a, [25, 50, 75]), np.percentile(b, [25, 50, 75])
    if b25 <= a50 <= b75 and a25 <= b50 <= a75:
        return True, "yes: each median inside the other's IQR"
    rng = np.random.default_rng(seed)
    diffs = np.median(rng.choice(a, (2000, a.size)), axis=1) - np.median(rng.choice(b, (2000, b.size)), axis=1)
    lo, hi = np.percentile(diffs, [2.5, 97.5])
    d = a50 - b50
    held = "holds 0: not told apart" if lo <= 0 <= hi else "excludes 0: a real difference"
    return False, (f"no: mlms {'faster' if d < 0 else 'slower'} by {abs(d):.3f} ms ({100 * abs(d) / b50:.1f}%), "
                   f"95% CI of the difference [{lo:+.3f}, {hi:+.3f}] ms {held}")


def compare(step: StepModel, bare: Bare, batch_size: int, rounds: int, seconds: float, max_new_tokens: int,
            prompt_length: int = 16) -> dict:
    """Interleaved rounds of mlms-nb and the bare loop at one batch size (see the module docstring)."""
    prompts = np.random.default_rng(0).integers(0, step.vocab_size, size=(batch_size, prompt_length)).astype(np.int64)
    _mlms_round(step, prompts, max_new_tokens, 0.2)  # warm both up
    _bare_round(bare, prompts, max_new_tokens, 0.2)
    ratios, a_tps, b_tps, a_ttft, b_ttft = [], [], [], [], []
    for r in range(rounds):  # A B, then B A: neither always runs first
        if r % 2 == 0:
            a, ta = _mlms_round(step, prompts, max_new_tokens, seconds)
            b, tb = _bare_round(bare, prompts, max_new_tokens, seconds)
        else:
            b, tb = _bare_round(bare, prompts, max_new_tokens, seconds)
            a, ta = _mlms_round(step, prompts, max_new_tokens, seconds)
        ratios.append(a / b)
        a_tps.append(a)
        b_tps.append(b)
        a_ttft += ta
        b_ttft += tb
    q = lambda xs: np.percentile(xs, [25, 50, 75])  # noqa: E731
    within, verdict = ttft_verdict(a_ttft, b_ttft)
    (a25, a50, a75), (b25, b50, b75) = q(a_ttft), q(b_ttft)
    return {"framework": step.framework, "batch_size": batch_size, "ratio_median": float(np.median(ratios)),
            "ratio_min": float(min(ratios)), "ratio_max": float(max(ratios)),
            "mlms_tokens_per_s": float(np.median(a_tps)), "bare_tokens_per_s": float(np.median(b_tps)),
            "mlms_ttft_ms": (a25, a50, a75), "bare_ttft_ms": (b25, b50, b75),
            "ttft_within_spread": within, "ttft_verdict": verdict}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--round-time", type=float, default=1.0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--batch-sizes", default="1,4")
    parser.add_argument("--frameworks", default="torch,onnxruntime")
    args = parser.parse_args()
    print(f"greedy, {args.max_new_tokens} new tokens from 16-token prompts, {args.threads} thread(s), "
          f"{args.rounds} interleaved rounds of >= {args.round_time} s; median (min..max over rounds); TTFT median "
          "[IQR] over every request")
    print(f"{'framework':10} {'batch':>5} {'mlms tok/s':>11} {'bare tok/s':>11} {'ratio':>20} "
          f"{'mlms TTFT ms':>22} {'bare TTFT ms':>22}  TTFT within each other's spread")
    cases = [CASES[fw](args.threads) for fw in args.frameworks.split(",")]
    for (step, bare), b in ((case, int(x)) for case in cases for x in args.batch_sizes.split(",")):
        r = compare(step, bare, b, args.rounds, args.round_time, args.max_new_tokens)
        fmt = lambda t: f"{t[1]:.3f} [{t[0]:.3f}-{t[2]:.3f}]"  # noqa: E731
        print(f"{r['framework']:10} {b:>5} {r['mlms_tokens_per_s']:>11.1f} {r['bare_tokens_per_s']:>11.1f} "
              f"{r['ratio_median']:>8.3f} ({r['ratio_min']:.3f}..{r['ratio_max']:.3f}) "
              f"{fmt(r['mlms_ttft_ms']):>22} {fmt(r['bare_ttft_ms']):>22}  {r['ttft_verdict']}")


if __name__ == "__main__":
    main()
