"""The one options model: the facade's signatures, the CLI/magic flags and their help come from it; errors and
advice name an option as the caller spells it (``min_time_s=`` in Python, ``--min-time`` on the command line)."""
from __future__ import annotations

import inspect

import numpy as np
import pytest

import mlms_nb
from mlms_nb.commands import ARGUMENTS, cli_parser
from mlms_nb.evaluation.stats import latency_stats, stability_warning
from mlms_nb.options import EvaluateOptions, OptionsError, Timing, fields, spelling


def test_evaluate_keeps_its_python_signature():
    params = inspect.signature(mlms_nb.evaluate).parameters
    assert list(params) == [
        "model", "framework", "batch_sizes", "dataset", "scenario", "device", "threads", "graph_optimization_level",
        "trace_level", "trace_repeats", "warmup", "min_repeats", "min_time_s", "max_time_s", "target_qps",
        "latency_bound_ms", "wait_for_quiet_s", "max_new_tokens", "sampling", "temperature", "top_k", "sampling_seed", "stop_tokens",
        "kv_cache", "prompt_column", "prompt_length", "ttft_limit_ms", "tpot_limit_ms",
        "isolate", "call_timeout_s", "run_timeout_s", "memory_limit_bytes",
        "on", "where", "all_agents", "tls_ca_file", "tls_cert", "tls_key",
        "limit", "reader", "reader_niceness", "keep_probabilities", "capture_outputs", "trust", "progress", "history",
        "inputs", "outputs", "preprocess", "postprocess",  # keyword-only: a live model's description
        "metrics"]  # keyword-only: output metrics (names or callables), applied where the evaluation is assembled
    defaults = {name: p.default for name, p in params.items()
                if name not in ("model", "inputs", "outputs", "preprocess", "postprocess", "metrics")}
    assert defaults == {
        "framework": "torch", "batch_sizes": (1,), "dataset": None, "scenario": "single-stream", "device": "cpu",
        "threads": None, "graph_optimization_level": None, "trace_level": "NONE", "trace_repeats": 5,
        "warmup": "auto", "min_repeats": 20,
        "min_time_s": 1.0, "max_time_s": 120.0, "target_qps": None, "latency_bound_ms": None,
        "wait_for_quiet_s": 0.0, "max_new_tokens": 32, "sampling": "greedy", "temperature": 1.0, "top_k": 0, "sampling_seed": 0, "stop_tokens": (),
        "kv_cache": "both", "prompt_column": None, "prompt_length": 16, "ttft_limit_ms": None, "tpot_limit_ms": None,
        "isolate": False,
        "call_timeout_s": None, "run_timeout_s": None, "memory_limit_bytes": None, "on": None, "where": None,
        "all_agents": False, "tls_ca_file": None, "tls_cert": None, "tls_key": None, "limit": None, "reader": "threads",
        "reader_niceness": 19, "keep_probabilities": False, "capture_outputs": "summary", "trust": False, "progress": True,
        "history": True}
    assert "``min_time_s`` (default 1.0, s) [--min-time]" in mlms_nb.evaluate.__doc__


@pytest.mark.parametrize("call, python, cli", [
    (dict(min_time_s=-1), "min_time_s=-1: expected at least 0 s", "--min-time -1: expected at least 0 s"),
    (dict(batch_sizes="1,x"), "batch_sizes='1,x': 'x' is not an integer", "--batch-sizes 1,x: 'x' is not an integer"),
    (dict(warmup=-2), "warmup=-2: expected a count of calls >= 0, or auto", "--warmup -2: expected a count"),
    (dict(scenario="server"), "needs a target rate: target_qps=...", "needs a target rate: --qps"),
    (dict(threads=0), "threads=0: expected at least 1", "--threads 0: expected at least 1"),
    (dict(min_time=2), "unknown option min_time=2; did you mean min_time_s?", "unknown option min_time=2"),
])
def test_bad_options_are_one_sentence_in_the_callers_spelling(call, python, cli):
    with pytest.raises(OptionsError) as info:
        mlms_nb.evaluate("resnet50", **call)  # fails before any model is looked up or loaded
    assert python in str(info.value)
    with spelling("cli"), pytest.raises(OptionsError) as info:
        EvaluateOptions.from_keywords(**call)
    assert cli in str(info.value)


def test_positional_options_still_bind_and_validate():
    with pytest.raises(OptionsError, match="framework='caffe': unknown framework 'caffe'"):
        mlms_nb.evaluate("resnet50", "caffe")
    with pytest.raises(TypeError, match="missing a required argument: 'model'"):
        mlms_nb.evaluate()
    with pytest.raises(OptionsError, match="what='bogus': expected 'occurrence', 'latency' or 'memory'"):
        mlms_nb.layers(None, what="bogus")


def test_the_flags_and_their_help_come_from_the_fields():
    eval_flags = {a.kwargs.get("dest"): a for a in ARGUMENTS["eval"]}
    for name, info in fields(EvaluateOptions):
        flag = (info.json_schema_extra or {}).get("cli")
        if flag:
            assert eval_flags[name].flags == (flag,) and eval_flags[name].kwargs["help"].startswith(
                (info.json_schema_extra or {}).get("cli_help", info.description))
    args = cli_parser().parse_args(["eval", "m", "--min-time", "0.5", "--no-history"])
    assert args.min_time_s == "0.5" and args.history is False and not hasattr(args, "threads")
    assert EvaluateOptions.from_keywords(min_time_s=args.min_time_s).timing.min_time_s == 0.5


def test_the_record_keeps_what_shaped_the_numbers():
    record = EvaluateOptions.from_keywords(batch_sizes="1,8", min_time_s=0.5, warmup="3").record()
    assert record["batch_sizes"] == [1, 8] and record["min_time_s"] == 0.5 and record["warmup"] == 3
    assert {"scenario", "threads", "trace_level", "max_repeats", "clock", "isolation"} <= set(record)
    assert not {"progress", "history", "trust", "framework"} & set(record)
    assert Timing.rule(record) == "at least 20 calls and at least 0.5 s"


def test_advice_names_flags_under_the_cli():
    noisy = np.concatenate([np.full(25, 10_000_000), np.full(25, 14_000_000)])
    row = {"framework": "torch", "batch_size": 1, **latency_stats(noisy, 1)}
    assert "(threads=...) or time longer (min_time_s=...)" in stability_warning(row)
    with spelling("cli"):
        assert "(--threads) or time longer (--min-time)" in stability_warning(row)
