"""The Evaluation value object: JSON round trip, per-framework parts, summary, HTML and text renderings."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from mlms_nb import display
from mlms_nb.errors import MlmsError
from mlms_nb.evaluation.result import Evaluation
from mlms_nb.stack import stack_hash
from tests.helpers import make_evaluation

FRAMES = ("latency", "cold_start", "accuracy", "predictions", "trace_overhead")
DATA = Path(__file__).parent / "data"


def assert_same(a: Evaluation, b: Evaluation) -> None:
    for name in FRAMES:
        pd.testing.assert_frame_equal(getattr(a, name), getattr(b, name))
    assert a.samples.keys() == b.samples.keys()
    for key in a.samples:
        assert b.samples[key].dtype == np.int64
        np.testing.assert_array_equal(a.samples[key], b.samples[key])
    for fw in a.probabilities:
        assert b.probabilities[fw].dtype == a.probabilities[fw].dtype
        np.testing.assert_array_equal(a.probabilities[fw], b.probabilities[fw])
    for name in ("id", "created_at", "model", "model_version", "frameworks", "manifests", "stack", "options",
                 "complete", "warnings", "trace_ids"):
        assert getattr(a, name) == getattr(b, name), name
    assert a == b


@pytest.mark.parametrize("scenario", ["single-stream", "server"])
def test_json_round_trip_is_lossless(scenario):
    ev = make_evaluation(scenario=scenario)
    text = ev.to_json()
    json.loads(text)  # strict JSON
    assert "NaN" not in text
    back = Evaluation.from_json(text)
    assert_same(ev, back)
    assert back.predictions["top5"][0] == [1, 2, 3, 4, 5]
    assert back.latency["unstable"].dtype == bool


def test_missing_values_and_infinities_survive():
    ev = make_evaluation(frameworks=("torch",))
    ev.latency.loc[0, "p99_ms"] = np.nan
    ev.latency.loc[1, "iqr_over_median"] = np.inf
    ev.accuracy.loc[0, "top1"] = np.nan
    back = Evaluation.from_json(ev.to_json())
    assert_same(ev, back)
    assert np.isnan(back.latency.loc[0, "p99_ms"]) and np.isinf(back.latency.loc[1, "iqr_over_median"])


def test_empty_evaluation_round_trip(tmp_path):
    ev = Evaluation(model="m", frameworks=["torch"], complete=False, warnings=["interrupted"])
    back = Evaluation.load(ev.save(tmp_path / "sub" / "e.json"))
    assert_same(ev, back)
    assert back.latency.empty and not back.complete
    assert "nothing measured" in ev.to_text() and "interrupted" in display.render_html(ev)


def test_save_and_load_file(tmp_path):
    ev = make_evaluation()
    path = ev.save(tmp_path / "eval.json")
    assert_same(ev, Evaluation.load(path))
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(MlmsError, match="not a saved mlms-nb evaluation"):
        Evaluation.load(tmp_path / "bad.json")
    with pytest.raises(MlmsError, match="cannot read"):
        Evaluation.load(tmp_path / "missing.json")


def test_for_framework_and_combine():
    ev = make_evaluation()
    part = ev.for_framework("onnxruntime")
    assert part.id == ev.id and part.frameworks == ["onnxruntime"]
    assert set(part.latency["framework"]) == {"onnxruntime"} and len(part.latency) == 2
    assert set(part.predictions["framework"]) == {"onnxruntime"}
    assert list(part.samples) == [("onnxruntime", 1, "single-stream"), ("onnxruntime", 8, "single-stream")]
    assert list(part.probabilities) == ["onnxruntime"] and list(part.manifests) == ["onnxruntime"]
    assert "torch" not in part.stack["software"] and list(part.options["predictors"]) == ["onnxruntime"]
    assert all(not w.startswith("torch") for w in part.warnings) and part.warnings
    assert stack_hash(part.stack) == ev.framework_stack_hash("onnxruntime")
    assert ev.framework_stack_hash("torch") != ev.framework_stack_hash("onnxruntime")
    back = Evaluation.combine([ev.for_framework("torch"), part])
    assert_same(ev, back)
    with pytest.raises(MlmsError, match="not in this evaluation"):
        ev.for_framework("tensorflow")


def test_summary_has_units_and_a_note():
    ev = make_evaluation()
    s = ev.summary
    assert list(s.columns) == ["framework", "batch_size", "top1", "top5", "median_ms", "median_ci_low_ms",
                               "median_ci_high_ms", "p90_ms", "p99_ms", "throughput_per_s", "samples"]
    assert len(s) == 4 and list(s["framework"]) == ["torch", "torch", "onnxruntime", "onnxruntime"]
    assert s["top1"].iloc[0] == pytest.approx(2 / 3)
    row = ev.latency[(ev.latency.framework == "torch") & (ev.latency.batch_size == 8)].iloc[0]
    assert s.loc[1, "median_ms"] == row["median_ms"]
    note = s.attrs["note"]
    assert "40 timed calls" in note and "12 untimed warm-up calls" in note and "2 threads" in note


def test_text_and_html_reprs():
    ev = make_evaluation(scenario="server")
    text = ev.to_text()
    assert repr(ev) == text
    for needle in ("resnet50", "torch", "onnxruntime", "(ms)", "(/s)", "median", "p99", "top-1 (%)", "Warnings",
                   "unstable", "Stack:", "Measured:", "met", "missed"):
        assert needle in text, needle
    page = display.render_html(ev)
    for needle in ("<table", "torch", "onnxruntime", "(ms)", "(/s)", "2 threads", "Warnings", "AMD" if "AMD" in
                   ev.stack["hardware"]["cpu_model"] else ev.stack["hardware"]["cpu_arch"]):
        assert needle in page, needle
    assert "<script" not in page


def test_html_escapes():
    ev = make_evaluation(frameworks=("torch",))
    ev.warnings.append("<script>alert(1)</script>")
    assert "<script>" not in display.render_html(ev) and "&lt;script&gt;" in display.render_html(ev)


def format1_evaluation() -> Evaluation:
    """The evaluation that tests/data/evaluation_format1.json holds, built anew."""
    ev = make_evaluation(scenario="server")
    ev.id, ev.created_at = "0f1e2d3c4b5a69788796a5b4c3d2e1f0", "2025-01-02T03:04:05.678901Z"
    ev.stack = {"hardware": {"cpu_model": "Example CPU", "cpu_arch": "x86_64", "logical_cores": 2, "gpus": []},
                "software": {"python": "3.11.2", "torch": "2.13.0", "onnxruntime": "1.23.0"}, "hostname": "example"}
    ev.latency.loc[0, "p99_ms"] = np.nan
    ev.latency.loc[1, "iqr_over_median"] = np.inf
    ev.accuracy.loc[0, "top1"] = np.nan
    ev.trace_overhead = pd.DataFrame([{"framework": "torch", "batch_size": 1, "trace_level": "FRAMEWORK",
                                       "untraced_median_ms": 1.25, "traced_median_ms": 1.5, "traced_calls": 5,
                                       "overhead_pct": 20.0}])
    return ev


def test_reads_the_payloads_format_1_wrote():
    """History stores hold payloads of format 1 ({"columns", "dtypes", "data"} per frame): the file was written by
    mlms-nb before the Arrow codec (main at b81683c, ``format1_evaluation().to_json(indent=1)``)."""
    text = (DATA / "evaluation_format1.json").read_text()
    assert json.loads(text)["format_version"] == 1
    old = Evaluation.from_json(text)
    assert_same(format1_evaluation(), old)
    assert np.isnan(old.latency.loc[0, "p99_ms"]) and np.isinf(old.latency.loc[1, "iqr_over_median"])
    again = old.to_json()
    assert json.loads(again)["format_version"] == 2
    assert_same(old, Evaluation.from_json(again))


def test_floats_keep_every_bit_and_odd_columns_survive():
    ev = make_evaluation(frameworks=("torch",))
    ev.latency["median_ms"] = [2 / 3, 1e-300]  # 17 significant digits; orient="table" JSON would keep 15
    ev.predictions["mixed"] = [1, "two", None] * (len(ev.predictions) // 3)  # no Arrow type: kept as JSON
    ev.cold_start["when"] = pd.to_datetime(["2025-01-02T03:04:05.123456789"])
    back = Evaluation.from_json(ev.to_json())
    assert back.latency["median_ms"].tolist() == [2 / 3, 1e-300]
    assert back.predictions["mixed"].tolist() == ev.predictions["mixed"].tolist()
    assert_same(ev, back)
    with pytest.raises(MlmsError, match="damaged"):
        Evaluation.from_json(ev.to_json().replace('"latency": "', '"latency": "AAAA'))


def test_summary_digits_follow_each_rows_ci_in_text_html_and_the_evaluation_table():
    """``ev.summary`` carries the median's 95% CI, so its digits are the ones that CI supports, row by row
    (torch.utils.benchmark's rule: floor(log10(median / half-width)) significant figures): a 0.51234 ms median
    known to +-0.0005 ms shows 0.512; a 50.1234 ms one known to +-0.6 ms shows 50. The evaluation's own table and
    the summary's HTML read the same; counts are integers."""
    ev = make_evaluation(frameworks=("torch",))
    lat = ev.latency.copy()
    lat["median_ms"] = [0.51234, 50.1234]
    lat["median_ci_low_ms"] = [0.51184, 49.5234]
    lat["median_ci_high_ms"] = [0.51284, 50.7234]
    lat["p90_ms"] = [0.61234, 60.1234]
    ev.latency = lat
    text = repr(ev.summary)
    rows = [line.split() for line in text.splitlines()[1:3]]
    assert rows[0][4:8] == ["0.512", "0.512", "0.513", "0.612"] and rows[1][4:8] == ["50", "50", "51", "60"], text
    assert [line.split()[-1] for line in text.splitlines()[-2:]] == ["40", "40"]  # calls, in the table's 2nd part
    assert "e+" not in text and "median CI low (ms)" in text
    html = ev.summary._repr_html_()
    assert ">0.512<" in html and ">50<" in html and ">0.51234<" not in html
    table = ev.to_text()
    assert "0.512 to 0.513" in table and "50 to 51" in table and "50.1" not in table


def test_one_throughput_reads_the_same_in_every_view_of_an_evaluation():
    """The summary, a selection of ``ev.latency`` without its CI columns and the evaluation's own table show one
    throughput with the same digits (its median's CI, two figures at least: 1.808/s is 1.8 everywhere, never "2"
    in one view and "1.808" in another); the user's ``.round(3)`` shows 1.808."""
    ev = make_evaluation(frameworks=("torch",))
    lat = ev.latency.copy()
    lat["median_ms"] = [1944.6, 4424.8]
    lat["median_ci_low_ms"] = [1500.0, 3200.0]
    lat["median_ci_high_ms"] = [2600.0, 5900.0]
    lat["throughput_per_s"] = [0.51423, 1.80812]
    ev.latency = lat

    def throughput(text: str) -> list[str]:
        lines = text.splitlines()
        head = next(i for i, line in enumerate(lines) if "throughput (/s)" in line)
        at = lines[head].index("throughput (/s)")
        return [line[:at + len("throughput (/s)")].split()[-1] for line in lines[head + 1:head + 3]]

    assert throughput(repr(ev.summary)) == ["0.51", "1.8"]
    assert throughput(repr(ev.latency[["framework", "batch_size", "throughput_per_s"]])) == ["0.51", "1.8"]
    assert throughput(ev.to_text().split("\n\n", 1)[1]) == ["0.51", "1.8"]
    assert throughput(repr(ev.latency[["framework", "batch_size", "throughput_per_s"]].round(3))) == ["0.514", "1.808"]
