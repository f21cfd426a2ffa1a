"""%mlms in a real IPython shell: help, verbs, -o and --save, mime bundles, errors as sentences."""
from __future__ import annotations

import pandas as pd
import pytest
from IPython.core.interactiveshell import InteractiveShell

from mlms_nb.commands import Output


@pytest.fixture(scope="module")
def ip():
    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "mlms_nb")
    yield shell
    InteractiveShell.clear_instance()


def test_no_verb_prints_help(ip, capsys):
    assert ip.run_line_magic("mlms", "") is None
    out = capsys.readouterr().out
    assert "%mlms VERB" in out and "eval" in out and "history" in out


def test_verb_help_and_usage_errors(ip, capsys):
    ip.run_line_magic("mlms", "eval -h")
    assert "--batch-sizes" in capsys.readouterr().out
    ip.run_line_magic("mlms", "eval")
    assert "the following arguments are required: model" in capsys.readouterr().out
    ip.run_line_magic("mlms", "frobnicate")
    assert "unknown verb 'frobnicate'" in capsys.readouterr().out


def test_models_returns_frame_and_saves(ip):
    frame = ip.run_line_magic("mlms", "models --framework tf -o")
    assert isinstance(frame, pd.DataFrame) and set(frame["framework"]) == {"tensorflow"}
    ip.run_line_magic("mlms", "models --save listing")
    assert isinstance(ip.user_ns["listing"], pd.DataFrame) and len(ip.user_ns["listing"]) >= 8


def test_errors_are_sentences(ip, capsys, mlms_home):
    assert ip.run_line_magic("mlms", "eval efficientnet_lite00 --no-history") is None
    assert "%mlms eval: unknown model 'efficientnet_lite00'; did you mean efficientnet_lite0" in capsys.readouterr().out


def test_eval_saves_an_evaluation_with_a_mime_bundle(ip, shared_home):
    ip.run_line_magic("mlms", "eval resnet50 --framework onnxruntime --dataset synthetic:2 --batch-sizes 2 "
                              "--min-repeats 3 --min-time 0 --warmup 1 --no-history --save ev")
    ev = ip.user_ns["ev"]
    assert ev.model == "resnet50" and ev.complete
    row = ev.latency.iloc[0]
    assert row["batch_size"] == 2 and row["samples"] >= 3
    assert ev.accuracy.empty  # synthetic data is unlabeled: no accuracy claimed
    bundle = Output(ev, ev.to_text(), ev._repr_html_())._repr_mimebundle_()
    assert "median" in bundle["text/plain"] and "<table" in bundle["text/html"]
