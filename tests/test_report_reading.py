"""What makes a report read well, checked on its parts with no kernel and no browser (seconds): notes numbered and
each told once, only the options that apply to the run, a reproduce command that copies back into a shell
exactly, each warning once, the printed page's title and the exporter's one-sentence log line (issue 37). The
same properties are read back from a real report's PDF in tests/test_report.py."""
from __future__ import annotations

import shlex

import nbformat
import pytest

from mlms_nb.options import Generation
from mlms_nb.reporting import describe, notes, sections
from mlms_nb.reporting.exporter import MlmsPdfExporter, export_summary
from mlms_nb.schema.trace import spans_frame
from mlms_nb.tracing import Trace

from tests.helpers import make_evaluation

#: The labels the Options table gives the generation options (a classifier's report must show none of them).
GENERATION_LABELS = ("max new tokens", "sampling", "temperature", "top k", "sampling seed", "stop tokens",
                     "kv cache", "prompt column", "prompt length", "ttft limit ms", "tpot limit ms")


def with_generation_options(ev, scenario: str | None = None):
    ev.options.update(Generation().model_dump())
    if scenario:
        ev.options["scenario"] = scenario
    return ev


def test_notes_are_numbered_and_each_told_once_in_a_report():
    notes.start(["torch", "onnxruntime"])
    ceilings = "torch's ceilings: " + "its own GEMM and convolution, the faster; a STREAM add " * 5
    note = (f"torch: per layer: FLOPs over self time; roof: peak 60 GFLOP/s ({ceilings}); bound: memory if left\n"
            f"onnxruntime: per layer: FLOPs over self time; roof: peak 64 GFLOP/s (other kernels; a copy); "
            "bound: memory if left")
    refs, first = notes.referenced(note)
    shown = repr(first)
    assert shown.count("per layer: FLOPs over self time") == 1 and "torch: per layer" not in shown  # shared: once
    assert "torch: roof: peak 60 GFLOP/s (see note" in shown and "onnxruntime: roof: peak 64 GFLOP/s (other" in shown
    assert shown.count("a STREAM add") == 5 and "\n" not in ceilings  # the long aside is a note of its own, whole
    assert refs.startswith(" (notes 1") and all(len(line) < 400 for line in shown.splitlines())
    again, new = notes.referenced("bound: memory if left; a new clause (with; its own parts)")
    assert new is not None and repr(new).strip().endswith("a new clause (with; its own parts)")
    assert len(new.notes) == 1 and again == f" (notes {notes.NOTES.numbers['bound: memory if left']}, " \
                                            f"{new.notes[0][0]})"
    assert notes.numbers_text([1, 2, 3, 5, 7, 8]) == "notes 1-3, 5, 7-8" and notes.numbers_text([4]) == "note 4"


def test_a_classifiers_options_leave_out_the_generation_options():
    table = describe.options_table([with_generation_options(make_evaluation())], [""])
    assert not set(GENERATION_LABELS) & set(table["option"])
    assert {"batch sizes (inputs per call)", "warm-up"} <= set(table["option"])
    generate = with_generation_options(make_evaluation(), scenario="generate")
    assert generate.generates and not make_evaluation().generates
    assert {"max new tokens", "kv cache"} <= set(describe.options_table([generate], [""])["option"])
    side = describe.options_table([with_generation_options(make_evaluation()), generate], ["A", "B"])
    row = side[side["option"] == "max new tokens"].iloc[0]
    assert (row["A"], row["B"]) == ("n/a", "32")  # beside a run it does not apply to, said so


@pytest.mark.parametrize("command", [
    "mlms eval efficientnet_lite0 --framework torch,onnxruntime --batch-sizes 1,2 --dataset imagenet-samples "
    "--trace-level ML_LIBRARY --trace-repeats 3 --warmup 2 --min-repeats 5 --min-time 0.05 --limit 4 --trust",
    "mlms eval '/data/my models/a very long folder name that goes on and on/manifest.yaml' --framework onnxruntime "
    "--stop-tokens 50256,50257 --prompt-column 'the prompt' --isolate --memory-limit 4GiB",
    "mlms eval m --framework torch  # the dataset was a Python object (python:list): pass it again"])
def test_the_reproduce_command_breaks_only_between_arguments(command):
    shown = describe.command_lines(command)
    lines = shown.splitlines()
    assert all(len(line) <= describe.COMMAND_WIDTH for line in lines if not line.startswith("#"))
    assert all(line.endswith(" \\") for line in lines[:-1] if not line.startswith("#"))
    pasted = shown.replace("\\\n", "")  # what a shell does with a line continuation
    assert shlex.split(pasted, comments=True) == shlex.split(command, comments=True)
    for line in lines:  # a flag and its value stay on one line
        words = shlex.split(line.rstrip("\\"), comments=True)
        assert not (words and words[-1].startswith("--") and words[-1] not in ("--trust", "--isolate"))


def test_each_warning_once(capsys):
    ev = make_evaluation()
    why = "not supported: ONNX Runtime runs each node as one kernel call"
    ev.warnings += [f"onnxruntime: onnxruntime ML_LIBRARY not traced: {why}"] * 2
    spans = spans_frame({"trace_id": ["t"], "span_id": [1], "parent_id": [0], "name": ["predict"], "level": ["MODEL"],
                         "kind": ["model"], "start_ns": [0], "end_ns": [10], "thread": [1]})
    ev.traces = {"onnxruntime": Trace(spans, metadata={"unavailable": {"onnxruntime ML_LIBRARY": why},
                                                       "trace_id": "t"}),
                 "torch": Trace(spans, metadata={"unavailable": {"torch SYSTEM_LIBRARY": "no CUDA here"},
                                                 "trace_id": "t"})}
    sections.warnings([ev], [""])
    out = capsys.readouterr().out
    assert out.count(why) == 1 and out.count("no CUDA here") == 1  # said once, in the evaluation's own wording
    assert out.count("skipped 1 unreadable input") == 2  # two frameworks, two warnings


def test_the_printed_page_is_titled_by_the_report_and_the_log_line_is_a_sentence():
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x", outputs=[nbformat.v4.new_output(
        "display_data", data={"text/markdown": "# resnet50: evaluation report"},
        metadata={"mlms": {"title": "resnet50: evaluation report (torch)", "date": "2026-11-28"}})])])
    html, resources = MlmsPdfExporter().print_html(nb, {"metadata": {"name": "report_mainjob"}})
    assert "<title>resnet50: evaluation report (torch)</title>" in html and "report_mainjob" not in html
    line = export_summary({**resources["mlms_pdf"], "pages": 7, "seconds": 33.71,
                           "fit": {"split": 3, "scaled": 0, "overflow": []}})
    assert line == ('printed "resnet50: evaluation report (torch)" on 7 A4 pages in 33.7 s: 3 wide tables split '
                    "into parts.")
    assert "{" not in export_summary({"title": "t", "cleanup": {"streams": 1, "widgets": 0}, "fit": {}})
