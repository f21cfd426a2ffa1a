"""The Evaluation value object: JSON round trip, per-framework parts, summary, HTML and text renderings."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from mlms_nb.errors import MlmsError
from mlms_nb.evaluation.result import Evaluation
from mlms_nb.stack import detect_stack, stack_hash
from mlms_nb.evaluation.stats import latency_stats, stability_warning

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


FRAMES = ("latency", "cold_start", "accuracy", "predictions")


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
    assert "nothing measured" in ev.to_text() and "interrupted" in ev._repr_html_()


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
    assert list(s.columns) == ["framework", "batch_size", "top1", "top5", "median_ms", "p90_ms", "p99_ms",
                               "throughput_per_s"]
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
    page = ev._repr_html_()
    for needle in ("<table", "torch", "onnxruntime", "(ms)", "(/s)", "2 threads", "Warnings", "AMD" if "AMD" in
                   ev.stack["hardware"]["cpu_model"] else ev.stack["hardware"]["cpu_arch"]):
        assert needle in page, needle
    assert "<script" not in page


def test_html_escapes():
    ev = make_evaluation(frameworks=("torch",))
    ev.warnings.append("<script>alert(1)</script>")
    assert "<script>" not in ev._repr_html_() and "&lt;script&gt;" in ev._repr_html_()
