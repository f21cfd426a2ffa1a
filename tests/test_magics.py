"""%mlms in a real IPython shell, as IPython's own magics behave: help, verbs, -o and --save, what was displayed
(captured, as pyinstrument's magic tests do), errors as one-line UsageErrors that fail the cell, %%mlms trace
failing with the cell's own error after keeping the trace; and a real kernel running a notebook that stops at a
failed %mlms."""
from __future__ import annotations

import logging
import os
import signal
import threading

import nbformat
import pandas as pd
import pytest
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell
from IPython.utils.capture import capture_output

from mlms_nb.evaluation.result import Evaluation
from mlms_nb.schema.evaluation import FRAMES, SUMMARY
from mlms_nb.tracing.trace import Trace
from tests.helpers import html_text


@pytest.fixture(scope="module")
def ip():
    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "mlms_nb")
    yield shell
    InteractiveShell.clear_instance()


def test_no_verb_prints_help_that_names_the_cell_magic(ip, capsys):
    assert ip.run_line_magic("mlms", "") is None
    out = capsys.readouterr().out
    assert "%mlms VERB" in out and "eval" in out and "history" in out and "%%mlms trace" in out
    ip.run_line_magic("mlms", "--help")
    assert "%%mlms trace" in capsys.readouterr().out
    assert "%%mlms trace" in ip.find_line_magic("mlms").__doc__  # what `%mlms?` shows


def test_verb_and_cell_help_read_as_typed(ip, capsys):
    ip.run_line_magic("mlms", "eval -h")
    out = capsys.readouterr().out
    assert out.startswith("usage: %mlms eval ") and "::" not in out and "%%mlms eval" not in out
    assert "--min-time SECONDS" in out and "(default: 1.0 s)" in out  # help from the options model, with units
    ip.run_cell("%%mlms trace -h\npass")
    out = capsys.readouterr().out
    assert out.startswith("usage: %%mlms trace ") and "%%%mlms" not in out


@pytest.mark.parametrize("line, message", [
    ("eval", "%mlms eval: the following arguments are required: model"),
    ("frobnicate", "%mlms: unknown verb 'frobnicate'"),
    ("eval resnet50 --min-time -1 --no-history", "%mlms eval: --min-time -1: expected at least 0 s"),
    ("eval resnet50 --batch-sizes 1,x --no-history", "%mlms eval: --batch-sizes 1,x: 'x' is not an integer"),
    ("layers nosuchvar", "%mlms layers: "),
])
def test_failures_raise_usage_errors_that_fail_the_cell(ip, mlms_home, line, message):
    with pytest.raises(UsageError) as info:
        ip.run_line_magic("mlms", line)
    assert str(info.value).startswith(message) and "Traceback" not in str(info.value)
    result = ip.run_cell(f"%mlms {line}")  # in a cell: the cell fails, so Run All stops there
    assert not result.success and isinstance(result.error_in_exec, UsageError)


def test_errors_are_sentences(ip, mlms_home):
    with pytest.raises(UsageError, match=r"^%mlms eval: unknown model 'efficientnet_lite00'; did you mean "
                                         r"efficientnet_lite0"):
        ip.run_line_magic("mlms", "eval efficientnet_lite00 --no-history")


def test_models_returns_frame_and_saves(ip):
    frame = ip.run_line_magic("mlms", "models --framework tf -o")
    assert isinstance(frame, pd.DataFrame) and set(frame["framework"]) == {"tensorflow"}
    with capture_output() as captured:
        ip.run_line_magic("mlms", "models --save listing")
    assert isinstance(ip.user_ns["listing"], pd.DataFrame) and len(ip.user_ns["listing"]) >= 8
    shown = captured.outputs[0].data
    assert "<table" in shown["text/html"] and "efficientnet_lite0" in shown["text/plain"]


def test_eval_displays_the_evaluation_and_saves_it(ip, shared_home):
    with capture_output() as captured:
        ip.run_line_magic("mlms", "eval efficientnet_lite0 --framework onnxruntime --dataset imagenet-samples "
                                  "--limit 4 --batch-sizes 2 --min-repeats 3 --min-time 0 --warmup 1 --no-history "
                                  "--save ev")
    ev = ip.user_ns["ev"]
    assert isinstance(ev, Evaluation) and ev.model == "efficientnet_lite0" and ev.complete
    row = ev.latency.iloc[0]
    assert row["batch_size"] == 2 and row["samples"] >= 3
    assert ev.accuracy["n"].tolist() == [4] and len(ev.predictions) == 4
    assert ev.options["min_time_s"] == 0 and ev.options["warmup"] == 1
    for name, schema in FRAMES.items():  # what the runner fills in is what the schema says
        assert schema.problems(getattr(ev, name)) == [], name
    assert SUMMARY.problems(ev.summary) == []
    [shown] = [o.data for o in captured.outputs]
    for needle in ("median (ms)", "95% CI of median (ms)", "IQR/median (%)", "top-1 (%)", "Measured:"):
        assert needle in shown["text/plain"] and needle in html_text(shown["text/html"])
    assert "<table" in shown["text/html"] and "onnxruntime" in shown["text/plain"]


def test_ctrl_c_shows_what_was_measured_then_fails_the_cell(ip, shared_home):
    """Ctrl-C (a real SIGINT) one second into the timed loop: the magic shows the partial evaluation, keeps it under
    --save, and fails the cell with a UsageError, so Run All stops there."""
    timers: list[threading.Timer] = []

    class InterruptOnceTimed(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.getMessage().startswith("timing ") and not timers:
                timers.append(threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGINT)))
                timers[0].start()

    runner_log = logging.getLogger("mlms_nb.evaluation.work")
    handler, level = InterruptOnceTimed(), runner_log.level
    runner_log.addHandler(handler)
    runner_log.setLevel(logging.INFO)
    try:
        with capture_output() as captured:
            result = ip.run_cell("%mlms eval efficientnet_lite0 --framework onnxruntime --dataset synthetic:2 "
                                 "--min-time 60 --warmup 1 --no-history --save partial")
    finally:
        runner_log.removeHandler(handler)
        runner_log.setLevel(level)
        for timer in timers:
            timer.cancel()
    assert not result.success and isinstance(result.error_in_exec, UsageError)
    assert "interrupted (Ctrl-C)" in str(result.error_in_exec) and "`partial`" in str(result.error_in_exec)
    partial = ip.user_ns["partial"]
    assert not partial.complete and partial.latency["samples"].iloc[0] > 0
    assert "Incomplete:" in captured.outputs[0].data["text/plain"]


def test_trace_cell_keeps_the_trace_then_fails_with_the_cells_error(ip, tmp_path):
    chrome = tmp_path / "cell.json"
    result = ip.run_cell(f"%%mlms trace --level MODEL --save failed_trace --chrome {chrome}\n"
                         "x = sum(range(10))\nraise ValueError('the cell broke')")
    assert not result.success
    assert isinstance(result.error_in_exec, ValueError) and str(result.error_in_exec) == "the cell broke"
    trace = ip.user_ns["failed_trace"]
    assert isinstance(trace, Trace) and (trace.spans["kind"] == "application").any()
    assert chrome.exists()
    other = ip.run_cell("1 / 0")  # the next error is shown and raised as usual
    assert isinstance(other.error_in_exec, ZeroDivisionError)
    with capture_output() as captured:
        ok = ip.run_cell("%%mlms trace --level MODEL\ny = 2")
    assert ok.success and "Trace" in captured.outputs[0].data["text/plain"]


@pytest.mark.parametrize("failing, ename, evalue, shown", [
    ("%mlms eval nosuchmodel", "UsageError", "unknown model 'nosuchmodel'", "stream"),  # one line, on stderr
    ("%%mlms trace --level MODEL --save kept\nraise ValueError('the cell broke')", "ValueError", "the cell broke",
     "error"),  # the cell's traceback
])
def test_a_notebook_stops_at_a_failed_magic(tmp_path, mlms_home, failing, ename, evalue, shown):
    """A real kernel (nbclient, as papermill and nbconvert run notebooks): the failed cell raises
    CellExecutionError with its own error, shows it once, and the cells after it do not run."""
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(src) for src in (
        "%load_ext mlms_nb", failing, "after = 'ran'\nprint(after)")])
    client = NotebookClient(nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}})
    with pytest.raises(CellExecutionError) as info:
        client.execute()
    assert info.value.ename == ename and evalue in info.value.evalue
    outputs = nb.cells[1].outputs
    assert [o.output_type for o in outputs] == [shown]
    if shown == "stream":
        assert outputs[0].text.startswith("UsageError: %mlms eval: unknown model 'nosuchmodel'")
    assert nb.cells[2].execution_count is None and not nb.cells[2].outputs
