"""Issue 20 ("No silent wrong number"), items 4 and 5: every figure is right, or says why it cannot be.

Models the tests write with onnx.helper (milliseconds, no download): a 10-class conv net (Conv, ReLU, global average
pool, Gemm) and a copy whose first call spins a Loop for about two seconds (so a signal lands before anything is
measured). Datasets are ``.npz`` files written here, labeled with the model's own class ids or with ImageNet's."""
from __future__ import annotations

import json
import re
import signal
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

from tests.faults.models import Mlms, fault_env

pytest.importorskip("onnxruntime")

HW = 8
FAST = dict(batch_sizes=[2], min_time_s=0.01, min_repeats=2, warmup=1, progress=False)


def conv_net(path: Path, spin_trips: int = 0) -> Path:
    """A 10-class conv net ``x [N,3,8,8] -> logits [N,10]`` with fixed random weights; ``spin_trips``: a Loop of
    that many iterations adds 0 to the logits (each call takes that long, the result unchanged)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.normal(0, 0.5, (4, 3, 3, 3)).astype(np.float32), "k"),
             numpy_helper.from_array(rng.normal(0, 0.5, (4, 10)).astype(np.float32), "w"),
             numpy_helper.from_array(np.zeros(10, np.float32), "b")]
    nodes = [helper.make_node("Conv", ["x", "k"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("GlobalAveragePool", ["r"], ["g"]),
             helper.make_node("Flatten", ["g"], ["f"]),
             helper.make_node("Gemm", ["f", "w", "b"], ["logits"])]
    out = "logits"
    if spin_trips:
        body = helper.make_graph(
            [helper.make_node("Identity", ["cond_in"], ["cond_out"]), helper.make_node("Add", ["v_in", "one"], ["v_out"])],
            "spin", [helper.make_tensor_value_info("i", TensorProto.INT64, []),
                     helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
                     helper.make_tensor_value_info("v_in", TensorProto.FLOAT, [])],
            [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
             helper.make_tensor_value_info("v_out", TensorProto.FLOAT, [])],
            [numpy_helper.from_array(np.array(0.0, np.float32), "one")])
        inits += [numpy_helper.from_array(np.array(spin_trips, np.int64), "trips"),
                  numpy_helper.from_array(np.array(True), "go"), numpy_helper.from_array(np.array(0.0, np.float32), "zero"),
                  numpy_helper.from_array(np.array(0.0, np.float32), "nought")]
        nodes += [helper.make_node("Loop", ["trips", "go", "zero"], ["spun"], body=body),
                  helper.make_node("Mul", ["spun", "nought"], ["none"]),
                  helper.make_node("Add", ["logits", "none"], ["spun_logits"])]
        out = "spun_logits"
    graph = helper.make_graph(nodes, "convnet", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, HW, HW])],
                              [helper.make_tensor_value_info(out, TensorProto.FLOAT, ["N", 10])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def write_manifest(folder: Path, graph: str = "convnet.onnx", name: str = "convnet", **output) -> Path:
    """A manifest for the conv net with trained weights (so labeled data is scored), its output as ``output``."""
    data = {"name": name, "version": "1.0.0", "framework": {"name": "onnxruntime", "version": "*"},
            "inputs": [{"type": "tensor", "layout": "NCHW", "dimensions": [3, HW, HW]}],
            "outputs": [{"type": "classification", **output}],
            "postprocess": ["softmax", {"top_k": {"k": 5}}],
            "model": {"graph_path": graph}}
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def reference_logits(graph: Path, x: np.ndarray) -> np.ndarray:
    """The bare ONNX Runtime loop the evaluation must agree with."""
    import onnxruntime as ort

    return ort.InferenceSession(str(graph), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


@pytest.fixture
def net(tmp_path, mlms_home):
    conv_net(tmp_path / "convnet.onnx")
    x = np.random.default_rng(1).normal(size=(8, 3, HW, HW)).astype(np.float32)
    return tmp_path, x


# ---------------------------------------------------------------------------------------------- labels


def test_a_label_space_mismatch_gives_accuracy_na_with_the_reason_not_zero(net):
    import mlms_nb
    from mlms_nb import display

    folder, x = net
    imagenet_ids = np.array([243, 559, 7, 999, 65, 1, 430, 880])  # ImageNet class ids for a 10-class model
    np.savez(folder / "imagenet.npz", x=x, y=imagenet_ids)
    ev = mlms_nb.evaluate(str(write_manifest(folder)), dataset=str(folder / "imagenet.npz"), history=False, **FAST)
    [acc] = ev.accuracy.to_dict("records")
    assert np.isnan(acc["top1"]) and np.isnan(acc["top5"]) and acc["n"] == 0
    assert "10 classes" in acc["reason"] and "999" in acc["reason"]
    text = display.render_text(ev)
    assert "n/a" in text and "0.0" not in text.split("top-1 (%)")[1].split("\n")[2]
    assert any("label spaces differ" in w for w in ev.warnings)
    assert not ev.saved  # history=False: no row, so not "saved"

    # the same data labeled with the model's own ids is scored, and agrees with a bare ONNX Runtime loop
    own = reference_logits(folder / "convnet.onnx", x).argmax(axis=1)
    own[:3] = (own[:3] + 1) % 10  # three wrong on purpose: top-1 is 5/8
    np.savez(folder / "own.npz", x=x, y=own)
    ev = mlms_nb.evaluate(str(write_manifest(folder)), dataset=str(folder / "own.npz"), history=False, **FAST)
    [acc] = ev.accuracy.to_dict("records")
    assert acc["top1"] == pytest.approx(5 / 8) and acc["n"] == 8 and not acc["reason"]


def test_the_label_space_is_checked_from_the_manifest_before_the_model_loads(net):
    """outputs[0].classes: 10 against ids up to 700: the sentence names the manifest's field (what was known before
    the model opened), not the output's width (known only after)."""
    import mlms_nb

    folder, x = net
    np.savez(folder / "imagenet.npz", x=x, y=np.arange(8) * 100)
    ev = mlms_nb.evaluate(str(write_manifest(folder, classes=10)), dataset=str(folder / "imagenet.npz"),
                          history=False, **FAST)
    [acc] = ev.accuracy.to_dict("records")
    assert np.isnan(acc["top1"]) and "outputs[0].classes" in acc["reason"]
    assert sum("label spaces differ" in w for w in ev.warnings) == 1  # said once, not again after the pass


@pytest.mark.parametrize("dataset", ["synthetic:2", "folder", "npz"])
def test_a_labels_file_that_does_not_exist_is_refused_before_the_model_loads(net, dataset):
    """The model file is not a model: had it been loaded first, the error would be about the model."""
    import mlms_nb
    from mlms_nb.errors import ManifestError

    folder, x = net
    (folder / "broken.onnx").write_bytes(b"not an ONNX model")
    spec = dataset
    if dataset == "folder":
        for i, row in enumerate(x[:2]):
            (folder / "arrays" / "3").mkdir(parents=True, exist_ok=True)
            np.save(folder / "arrays" / "3" / f"{i}.npy", row)
        spec = str(folder / "arrays")
    elif dataset == "npz":
        np.savez(folder / "d.npz", x=x, y=np.zeros(8, int))
        spec = str(folder / "d.npz")
    manifest = write_manifest(folder, graph="broken.onnx", labels="nolabels.txt")
    with pytest.raises(ManifestError) as err:
        mlms_nb.evaluate(str(manifest), dataset=spec, history=False, **FAST)
    assert "outputs[0].labels" in str(err.value) and "nolabels.txt" in str(err.value)


@pytest.mark.parametrize("key", ["labels", "label", "targets"])
def test_an_npz_array_that_looks_like_labels_but_is_not_read_is_refused_with_the_name_to_use(net, key):
    import mlms_nb
    from mlms_nb.errors import DatasetError

    folder, x = net
    np.savez(folder / "d.npz", x=x, **{key: np.zeros(8, int)})
    with pytest.raises(DatasetError) as err:
        mlms_nb.evaluate(str(write_manifest(folder)), dataset=str(folder / "d.npz"), history=False, **FAST)
    assert repr(key) in str(err.value) and "'y'" in str(err.value)


def test_integer_class_ids_under_target_are_refused_for_a_classifier_with_the_name_y(net):
    from mlms_nb.data.datasets import NpzDataset
    from mlms_nb.errors import DatasetError
    from mlms_nb.manifest import find_manifest

    folder, x = net
    np.savez(folder / "d.npz", x=x, target=np.zeros(8, int))
    with pytest.raises(DatasetError, match="'y'"):
        NpzDataset(folder / "d.npz", manifest=find_manifest(str(write_manifest(folder))))
    np.savez(folder / "t.npz", x=x, target=np.zeros((8, 10), np.float32))  # ground truth per output value: read
    assert set(NpzDataset(folder / "t.npz", manifest=find_manifest(str(write_manifest(folder)))).targets) == {""}


def test_the_label_convention_is_in_eval_help_and_the_docs():
    from mlms_nb.commands import cli_parser

    parser = cli_parser()
    eval_parser = parser._subparsers._group_actions[0].choices["eval"]
    help_text = " ".join(eval_parser.format_help().split())
    for said in ("subfolder names", "'y'", "'label'", "(input, label) pairs", "docs/datasets.md"):
        assert said in help_text, said
    root = Path(__file__).resolve().parent.parent
    page = (root / "docs" / "datasets.md").read_text(encoding="utf-8")
    assert all(fmt in page for fmt in ("subfolder name", "array **`y`**", "column **`label`**", "**`(input, label)` pairs**"))
    assert "docs/datasets.md" in (root / "README.md").read_text(encoding="utf-8")


# ---------------------------------------------------------------------------------------------- NaN and Inf


def test_an_all_nan_dataset_is_reported_not_averaged(net):
    import mlms_nb

    folder, x = net
    np.savez(folder / "nan.npz", x=np.full_like(x, np.nan), y=np.zeros(8, int))
    ev = mlms_nb.evaluate(str(write_manifest(folder)), dataset=str(folder / "nan.npz"), history=False, **FAST)
    [acc] = ev.accuracy.to_dict("records")
    assert acc["n"] == 0 and np.isnan(acc["top1"]) and "NaN" in acc["reason"]
    [full] = ev.full_pass.to_dict("records")
    assert full["nonfinite_inputs"] == 8 and full["nonfinite_outputs"] == 8
    assert any("all 8 inputs held NaN or Inf in their data (first: nan.npz[0])" in w for w in ev.warnings), ev.warnings

    np.savez(folder / "nan_t.npz", x=np.full_like(x, np.nan), target=np.zeros((8, 10), np.float32))
    ev = mlms_nb.evaluate(str(write_manifest(folder)), dataset=str(folder / "nan_t.npz"), history=False, **FAST)
    assert ev.target_metrics.empty  # nothing to average: no mse over NaN


def test_inputs_holding_nan_or_inf_are_counted_and_left_out_of_accuracy_and_targets(net):
    import mlms_nb

    folder, x = net
    x = x.copy()
    x[2, 0, 1, 1] = np.nan
    x[5, 2, 0, 0] = np.inf
    own = reference_logits(folder / "convnet.onnx", x).argmax(axis=1)
    np.savez(folder / "some.npz", x=x, y=own)
    ev = mlms_nb.evaluate(str(write_manifest(folder)), dataset=str(folder / "some.npz"), history=False, **FAST)
    [acc] = ev.accuracy.to_dict("records")
    assert acc["n"] == 6 and acc["top1"] == 1.0 and not acc["reason"]
    assert ev.full_pass["nonfinite_inputs"].iloc[0] == 2
    assert any("2 of 8 inputs held NaN or Inf in their data (first: some.npz[2])" in w for w in ev.warnings)

    logits = reference_logits(folder / "convnet.onnx", np.nan_to_num(x, nan=0.0, posinf=0.0))
    np.savez(folder / "some_t.npz", x=x, target=logits)
    ev = mlms_nb.evaluate(str(write_manifest(folder)), dataset=str(folder / "some_t.npz"), history=False,
                          metrics=["mae"], **FAST)
    row = ev.target_metrics.set_index("metric").loc["mae"]
    assert row["inputs"] == 6 and row["value"] < 1e-5  # the six finite inputs, exactly their reference outputs


def test_bad_rows_checks_whole_batches_of_named_inputs():
    from mlms_nb.evaluation.checks import bad_rows

    a = np.zeros((4, 3), np.float32)
    b = np.zeros((4, 2), np.float64)
    b[3, 1] = -np.inf
    assert bad_rows({"a": a, "b": b, "ids": np.arange(4)}, 4).tolist() == [False, False, False, True]
    assert bad_rows(a, 4) is None and bad_rows(np.arange(8).reshape(4, 2), 4) is None


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
@pytest.mark.parametrize("layout", ["contiguous", "strided", "unaligned"])
def test_bad_rows_fast_path_finds_every_nan_and_inf_and_no_more(dtype, layout):
    """Contiguous float32/float64 batches are first checked by their sum of squares: an overflow of that sum (huge
    but finite values) must not count as NaN/Inf, and NaN or Inf anywhere must be found, whatever the layout."""
    from mlms_nb.evaluation.checks import bad_rows

    def shaped(values):
        values = np.asarray(values, dtype)
        if layout == "strided":
            return np.repeat(values, 2, axis=1)[:, ::2]
        if layout == "unaligned":
            raw = np.zeros(values.nbytes + 1, np.uint8)
            out = np.frombuffer(raw[1:].data, dtype).reshape(values.shape)
            out[...] = values
            return out
        return values

    huge = float(np.finfo(dtype).max) / 2
    assert bad_rows(shaped(np.full((3, 5), huge)), 3) is None  # the squares overflow; every element is finite
    for value in (np.nan, np.inf, -np.inf):
        x = np.ones((3, 5))
        x[1, 4] = value
        assert bad_rows(shaped(x), 3).tolist() == [False, True, False]
        x[1, 4] = huge
        x[2, 0] = value
        assert bad_rows(shaped(x), 3).tolist() == [False, False, True]


# ---------------------------------------------------------------------------------------------- saved


def _store_rows(env) -> list[dict]:
    from mlms_nb.store.history import HistoryStore

    db = Path(env["MLMS_HOME"]) / "history.sqlite"
    return HistoryStore(f"sqlite:///{db}").query().to_dict("records") if db.exists() else []


@pytest.mark.slow
def test_eval_json_interrupted_before_any_measurement_never_says_saved_without_a_row(tmp_path):
    """SIGINT during the first inference (a Loop of about two seconds): nothing is measured. The JSON says
    "saved": true only with the failed row in the store, its reason 'interrupt'; else "saved": false."""
    conv_net(tmp_path / "slow.onnx", spin_trips=400_000)
    manifest = write_manifest(tmp_path, graph="slow.onnx", name="slow")
    env = fault_env(tmp_path / "home")
    run = Mlms(["eval", str(manifest), "--dataset", "synthetic:2", "--batch-sizes", "1", "--json"], env)
    run.wait_for("opened slow")
    time.sleep(0.2)
    run.proc.send_signal(signal.SIGINT)
    rc, out, err = run.finish()
    assert rc == 130, err
    data = json.loads(out)
    assert data["outcomes"]["onnxruntime"]["status"] == "failed", data["outcomes"]
    rows = _store_rows(env)
    if data["saved"]:
        assert [(r["status"], r["reason"]) for r in rows] == [("failed", "interrupt")]
    else:
        assert rows == []


def test_a_run_that_fails_with_nothing_measured_leaves_a_failed_row(tmp_path, mlms_home):
    """A first inference past the call timeout (ONNX Runtime cancels it): nothing measured, and the history holds
    the attempt, failed, with its reason; "saved" says the row is there."""
    import mlms_nb

    conv_net(tmp_path / "slow.onnx", spin_trips=2_000_000)
    manifest = write_manifest(tmp_path, graph="slow.onnx", name="slow")
    ev = mlms_nb.evaluate(str(manifest), dataset="synthetic:2", call_timeout_s=0.3, **{**FAST, "batch_sizes": [1]})
    assert ev.outcomes["onnxruntime"]["status"] == "failed" and ev.latency.empty
    rows = mlms_nb.history()
    assert [(r["status"], r["reason"]) for r in rows.to_dict("records")] == [("failed", "timeout")]
    assert ev.saved and ev.history_ids == [int(rows["id"].iloc[0])]


# ---------------------------------------------------------------------------------------------- statements


def _latency(throughputs: list[float]) -> "pd.DataFrame":
    import pandas as pd

    bs = [1, 2, 4, 8, 16, 32][:len(throughputs)]
    return pd.DataFrame({"framework": "onnxruntime", "batch_size": bs, "throughput_per_s": throughputs,
                         "median_ms": [b * 1e3 / t for b, t in zip(bs, throughputs)]})


@pytest.mark.parametrize("throughputs, said", [
    ([100, 190, 300, 340, 350, 352], "onnxruntime: saturates at 8"),
    ([100, 200, 400], "onnxruntime: saturation not reached up to batch size 4"),
])
def test_the_plot_legend_and_the_note_state_the_same_saturation(throughputs, said):
    from mlms_nb.analyses import batch_scaling

    table = batch_scaling.compute(_latency(throughputs))
    fig = batch_scaling.plot(table, backend="matplotlib")
    legend = [text for ax in fig.axes for text in ax.get_legend_handles_labels()[1]]
    sentences = [t for t in legend if "saturat" in t]
    assert sentences == [said] and said in table.attrs["note"]
    assert ("saturates at" in said) == ("saturates at" in table.attrs["note"])


def test_an_overhead_inside_its_noise_is_never_a_negative_percentage(net):
    import mlms_nb
    from mlms_nb import display
    from mlms_nb.display.numbers import CONDITIONS_CHANGED

    assert display.fmt_overhead(-4.0, 5.0) == "within noise (±5.0%)"
    assert display.fmt_overhead(3.0, 5.0) == "within noise (±5.0%)"
    assert display.fmt_overhead(40.0, 5.0) == "+40.0% (±5.0%)"
    # faster traced than untraced beyond the noise: no overhead measured, and why, not "-33%" nor "within noise"
    assert display.fmt_overhead(-33.0, 5.0) == "none: traced 33.0% faster (noise ±5.0%)"
    assert display.fmt_overhead(-33.0, float("nan")).startswith("within noise")
    folder, _ = net
    ev = mlms_nb.evaluate(str(write_manifest(folder)), dataset="synthetic:2", history=False, trace_level="MODEL",
                          trace_repeats=9, **FAST)
    [row] = ev.trace_overhead.to_dict("records")
    assert np.isfinite(row["noise_pct"]) and row["noise_pct"] >= 0
    [text] = display.overhead_frame(ev.trace_overhead)["overhead"]
    busy = "; machine busy" if row.get("busy") in (True, 1) else ""  # a busy pass is named (profilers/load.py)
    assert text == display.fmt_overhead(row["overhead_pct"], row["noise_pct"]) + busy
    assert not re.search(r"(?<![±\d])-\d", text)  # never a bare negative percentage
    # the frame as a notebook shows it (ev.trace_overhead as a cell's value) reads the same, not the raw column
    shown = repr(ev.trace_overhead) + ev.trace_overhead._repr_html_()
    assert "overhead (%)" not in shown and text.split(" (")[0] in shown
    slower = ev.trace_overhead.assign(overhead_pct=-50.0, noise_pct=10.0)  # as the busy machine of issue 37 gave
    assert "none: traced 50.0% faster (noise ±10.0%)" in repr(slower)
    assert CONDITIONS_CHANGED.split(":")[0] in " ".join(repr(slower).split())


@pytest.mark.slow
def test_the_reproduce_command_is_generated_from_the_options_and_reproduces_them(tmp_path):
    """A CLI run with many options; the report's command, run as printed, stores the same options."""
    import shlex

    from mlms_nb import load_evaluation
    from mlms_nb.reporting import describe
    from tests.faults.models import run_mlms

    conv_net(tmp_path / "convnet.onnx")
    manifest = write_manifest(tmp_path)
    env = fault_env(tmp_path / "home")
    first = ["eval", str(manifest), "--framework", "onnxruntime", "--batch-sizes", "1,2", "--dataset", "synthetic:3",
             "--limit", "3", "--warmup", "1", "--min-repeats", "2", "--min-time", "0.01", "--max-time", "2",
             "--reader-niceness", "5", "--capture-outputs", "first:2", "--graph-optimization-level", "basic",
             "--threads", "1", "--trace-level", "MODEL", "--trace-repeats", "2", "--json"]
    rc, out, err = run_mlms(first, env)
    assert rc == 0, err
    original = load_evaluation(json.loads(out)["evaluation_id"], url=f"sqlite:///{env['MLMS_HOME']}/history.sqlite")
    command = describe.reproduce_command(original)
    words = shlex.split(command)
    assert words[:2] == ["mlms", "eval"] and "--graph-optimization-level" in words and "--reader-niceness" in words
    rc, out, err = run_mlms([*words[1:], "--json"], env)
    assert rc == 0, err
    again = load_evaluation(json.loads(out)["evaluation_id"], url=f"sqlite:///{env['MLMS_HOME']}/history.sqlite")
    drop = ("predictors",)
    assert {k: v for k, v in again.options.items() if k not in drop} == \
        {k: v for k, v in original.options.items() if k not in drop}


@pytest.mark.slow
def test_a_converted_models_sha256_is_recorded_and_shown(models_home):
    import mlms_nb
    from mlms_nb._fs import sha256_file
    from mlms_nb.reporting import describe

    ev = mlms_nb.evaluate("efficientnet_lite0", framework="onnxruntime", dataset="synthetic:1", history=False,
                          **{**FAST, "batch_sizes": [1]})
    artifact = ev.options["predictors"]["onnxruntime"]["artifact"]
    table = describe.manifests_table([ev], [""])
    [row] = table[table["asset"] == "graph"].to_dict("records")
    assert row["sha256"] == sha256_file(artifact, memo=False)
