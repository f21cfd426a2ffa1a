"""Helpers the tests share (named for what they give): synthetic evaluations, figure labels, plain reference
implementations that the library's fast ones are checked against. Nothing here is part of the library."""
from __future__ import annotations

import time

import numpy as np
import pandas as pd

from mlms_nb.evaluation.result import Evaluation
from mlms_nb.evaluation.stats import latency_stats, stability_warning
from mlms_nb.stack import detect_stack

MS = 1_000_000


def make_evaluation(frameworks=("torch", "onnxruntime"), batch_sizes=(1, 8), seed=0, scenario="single-stream",
                    model="resnet50", version="1.0.0") -> Evaluation:
    """A small synthetic evaluation, as the runner would fill it in (no framework needed)."""
    rng = np.random.default_rng(seed)
    ev = Evaluation(
        model=model, model_version=version, frameworks=list(frameworks),
        manifests={fw: {"name": model, "version": version, "framework": {"name": fw, "version": "*"}}
                   for fw in frameworks},
        stack=detect_stack(frameworks),
        options={"batch_sizes": list(batch_sizes), "dataset": "imagenet-samples", "scenario": scenario,
                 "device": "cpu", "threads": 2, "trace_level": "NONE", "warmup": "auto", "min_repeats": 20,
                 "min_time_s": 1.0, "predictors": {fw: {"providers": [fw]} for fw in frameworks}})
    rows, cold, acc, preds = [], [], [], []
    for fw in frameworks:
        noisy = fw == "torch"
        for b in batch_sizes:
            s = (rng.lognormal(0, 0.3 if noisy else 0.02, 40) * MS * b).astype(np.int64)
            row = {"framework": fw, "batch_size": b, "scenario": scenario, **latency_stats(s, b), "warmup_calls": 12}
            if scenario == "server":
                row.update(target_qps=50.0, achieved_qps=49.5, latency_bound_ms=5.0, meets_bound=bool(b == 1))
            rows.append(row)
            ev.samples[(fw, b, scenario)] = s
            if stability_warning(row):
                ev.warnings.append(stability_warning(row))
        ev.warnings.append(f"{fw}: skipped 1 unreadable input(s): broken.jpg (not an image)")
        cold.append({"framework": fw, "load_ms": 812.5, "first_inference_ms": 45.25, "batch_size": batch_sizes[0]})
        acc.append({"framework": fw, "dataset": "imagenet-samples", "n": 3, "top1": 2 / 3, "top5": 1.0, "skipped": 1})
        preds.append(pd.DataFrame({
            "framework": fw, "input_id": ["a.jpg", "b.jpg", "c.jpg"], "label": [1, 2, 3],
            "label_name": ["goldfish", None, "tiger shark"], "top1": [1, 2, 4],
            "top1_name": ["goldfish", "great white shark", None], "top1_prob": [0.9, 0.55, 0.3],
            "top5": [[1, 2, 3, 4, 5], [2, 1, 3, 4, 5], [4, 3, 2, 1, 0]],
            "top5_probs": [[0.9, 0.05, 0.02, 0.02, 0.01], [0.55, 0.2, 0.1, 0.1, 0.05], [0.3, 0.3, 0.2, 0.1, 0.1]],
            "correct_top1": [True, True, False], "correct_top5": [True, True, True]}))
        ev.probabilities[fw] = rng.random((3, 10)).astype(np.float32)
    ev.latency = pd.DataFrame(rows)
    ev.cold_start = pd.DataFrame(cold)
    ev.accuracy = pd.DataFrame(acc)
    ev.predictions = pd.concat(preds, ignore_index=True)
    ev.trace_ids = ["t-1"]
    return ev


def axis_labels(fig) -> list[str]:
    """Every axis label of a figure (Bokeh or matplotlib): where the tests look for units."""
    if type(fig).__module__.startswith("bokeh."):
        from bokeh.models import Axis

        return [a.axis_label for a in fig.select({"type": Axis}) if a.axis_label]
    return [lab for ax in fig.axes for lab in (ax.get_xlabel(), ax.get_ylabel()) if lab]


def titles(fig) -> list[str]:
    """Every panel's title with its subtitle (Bokeh or matplotlib), the figure's own suptitle included."""
    from mlms_nb.analyses._titles import subtitle_of

    if type(fig).__module__.startswith("bokeh."):
        from bokeh.plotting import figure

        panels = [fig] if isinstance(fig, figure) else list(fig.select({"type": figure}))
        return [f"{p.title.text} {subtitle_of(p)}".strip() for p in panels if p.title is not None and p.title.text]
    return [f"{ax.get_title()} {subtitle_of(ax)}".strip() for ax in fig.axes if ax.get_title()] + (
        [fig.get_suptitle()] if fig.get_suptitle() else [])


# --------------------------------------------------------------------------------------------- tracing references


def containment_parents_reference(group, start, end) -> np.ndarray:
    """A plain stack sweep giving what :func:`mlms_nb.tracing.attribution.containment_parents` must give: per span,
    the nearest earlier span in (group, start, -end) order whose end is >= its end (test_tracing)."""
    n = len(start)
    order = sorted(range(n), key=lambda i: (group[i], start[i], -end[i]))
    out = np.full(n, -1, np.int64)
    stack: list[int] = []
    last_group = None
    for i in order:
        if group[i] != last_group:
            stack = []
            last_group = group[i]
        while stack and end[stack[-1]] < end[i]:
            stack.pop()
        out[i] = stack[-1] if stack else -1
        stack.append(i)
    return out


def innermost_enclosing_reference(start, end, q_start, q_end) -> list[int]:
    """Per query interval, by brute force, the innermost of the (properly nested) intervals containing it: one that
    contains no other containing interval -- of two siblings touching at the query, the later -- or -1. What
    :func:`mlms_nb.tracing.attribution.innermost_enclosing` must give (test_cupti)."""
    out = []
    for qs, qe in zip(q_start, q_end):
        cont = [i for i in range(len(start)) if start[i] <= qs and qe <= end[i]]
        minimal = [i for i in cont if not any(j != i and start[i] <= start[j] and end[j] <= end[i] and
                                              (start[j], end[j]) != (start[i], end[i]) for j in cont)]
        out.append(max(minimal, key=lambda i: (start[i], -end[i])) if minimal else -1)
    return out


# --------------------------------------------------------------------------------------------- profilers


def spin_cpu(ms: float) -> int:
    """Keep this thread busy until it has used ``ms`` of CPU time (not wall time: on a loaded machine a wall-time
    loop may get little CPU); returns the CPU ns it used (test_profilers)."""
    t0 = time.thread_time_ns()
    end = t0 + int(ms * 1e6)
    x = 0
    while time.thread_time_ns() < end:
        x += 1
    return time.thread_time_ns() - t0


def tiny_gpt2_lm():
    """The zoo's ``tiny_gpt2`` as mlms-nb loads it (2 layers, hidden 64, GPT-2's 50,257-token vocabulary, seeded
    random weights): the same model, and so the same ONNX export (cached in a home by its sha256), as the zoo decoder's
    own runs in a shared home."""
    from mlms_nb.frameworks.causal_lm import load_causal_lm
    from mlms_nb.manifest import find_manifest

    return load_causal_lm(find_manifest("tiny_gpt2", framework="torch")).eval()


def tiny_llama_lm():
    """A 2-layer Llama causal LM (random weights, seed 1; vocabulary 96, grouped-query attention, eager attention as
    mlms-nb loads a save_pretrained folder), shared like :func:`tiny_gpt2_lm`: its two ONNX graphs take about 10 s to
    export, so the tests that export it use one home (the folder test's copy reuses the fixture's graphs)."""
    import torch
    import transformers

    torch.manual_seed(1)
    config = transformers.LlamaConfig(num_hidden_layers=2, hidden_size=64, intermediate_size=128,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=96,
                                      max_position_embeddings=64, bos_token_id=0, eos_token_id=0,
                                      attn_implementation="eager")
    return transformers.LlamaForCausalLM(config).eval()


def once_per_run(name: str, make) -> str:
    """``make()``'s text, made once per test run and shared by every pytest-xdist worker: the first caller runs it
    under a file lock and keeps the text in this run's folder; the others wait and read it. Keyed by the run
    (PYTEST_XDIST_TESTRUNUID, else this process), so a later run never sees an old result."""
    import fcntl
    import os
    import tempfile
    from pathlib import Path

    run = os.environ.get("PYTEST_XDIST_TESTRUNUID") or f"pid{os.getpid()}"
    folder = Path(tempfile.gettempdir()) / f"mlms-nb-tests-{run}"
    folder.mkdir(exist_ok=True)
    done = folder / f"{name}.done"
    with open(folder / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            text = make()
            part = done.with_suffix(".part")
            part.write_text(text)
            os.replace(part, done)
    return done.read_text()


def broken_words(text: str, words) -> list[str]:
    """The places where ``text`` (a PDF's text, as pdftotext gives it) holds one of ``words`` broken into pieces:
    consecutive tokens that together spell the word (``prefil l``, ``b at c h si ze``); [] when every one of them
    is whole wherever it appears."""
    tokens = text.split()
    wanted = set(words)
    longest = max(map(len, wanted), default=0)
    found = []
    for i, token in enumerate(tokens):
        joined = token
        for j in range(i + 1, len(tokens)):
            joined += tokens[j]
            if len(joined) > longest:
                break
            if joined in wanted:
                found.append(" ".join(tokens[i:j + 1]))
    return found


def pdf_text(pdf) -> str:
    """The text of a PDF (a path) in drawing order (pdftotext ``-raw``: a table cell's lines stay together), on one
    line."""
    import subprocess

    done = subprocess.run(["pdftotext", "-raw", str(pdf), "-"], capture_output=True, text=True, check=True)
    return " ".join(done.stdout.split())


def html_text(html: str) -> str:
    """What an HTML fragment reads (tags removed): a table's header ``IQR/median (%)`` is split by the span that
    keeps ``IQR/median`` on one line."""
    import re

    return re.sub(r"<[^>]+>", "", html)
