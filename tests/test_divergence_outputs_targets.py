"""Metrics against ground truth (issue 11): a dataset carries targets per output (``.npz`` arrays ``target`` /
``target:<output>``, Parquet columns, Python ``(input, targets)`` pairs) and each framework's outputs are scored
against them, beside the agreement between frameworks. The model is the real two-input streamer of
tests/test_io_stateful.py; the targets are its own outputs plus a known offset, so the expected metrics are exact."""
from __future__ import annotations

import json
import re

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("onnxruntime")

import mlms_nb  # noqa: E402
from mlms_nb import display  # noqa: E402
from mlms_nb.cli import main  # noqa: E402
from mlms_nb.errors import MlmsError  # noqa: E402
from tests.test_io_stateful import STATE, streamer_models  # noqa: E402,F401  (the fixture: a real two-input model)

OFFSET = 0.5
QUICK = dict(batch_sizes=[2], warmup=1, min_repeats=3, min_time_s=0, progress=False)


@pytest.fixture(scope="module")
def truth(streamer_models):  # noqa: F811
    """The inputs, and the module's own outputs for them (zero state, sr 16000)."""
    x = np.load(streamer_models["folder"] / "signals.npz")["x"]
    with torch.no_grad():
        out, new_state = streamer_models["module"](torch.from_numpy(x), torch.zeros(len(x), STATE), torch.tensor(16000))
    return x, out.numpy(), new_state.numpy()


@pytest.fixture
def streamer(streamer_models, mlms_home, monkeypatch):  # noqa: F811
    monkeypatch.setenv("MLMS_MANIFEST_PATH", str(streamer_models["manifests"]))
    return streamer_models["folder"]


def test_evaluate_scores_each_framework_against_npz_targets_and_stores_them(streamer, truth):
    x, out, new_state = truth
    path = streamer / "with_targets.npz"
    np.savez(path, x=x, target=out - OFFSET, **{"target:new_state": new_state + OFFSET})
    below = []

    def share_below(output, target):  # a user metric: the fraction of elements below the target
        below.append(output.shape)
        return float(np.mean(output < target))

    ev = mlms_nb.evaluate("streamer", framework="torch,onnxruntime", trust=True, dataset=str(path),
                          metrics={"below": share_below}, capture_outputs="all", **QUICK)
    frame = ev.target_metrics.set_index(["framework", "output", "metric"])
    for fw in ("torch", "onnxruntime"):
        row = frame.loc[(fw, "new_state", "mse")]  # the manifest's metric for new_state
        assert row["value"] == pytest.approx(OFFSET ** 2, abs=1e-5) and row["unit"] == "output's unit²"
        assert row["inputs"] == len(x) and row["std"] < 1e-5 and row["ci95_low"] <= row["value"] <= row["ci95_high"]
        assert frame.loc[(fw, "new_state", "below"), "value"] == 1.0  # every element is OFFSET below its target
        assert frame.loc[(fw, "out", "below"), "value"] == 0.0  # out's target is OFFSET below it
        assert (fw, "out", "mse") not in frame.index  # metrics= named one: no default for out
    assert sorted(set(below)) == [(1,), (STATE,)]
    assert len(below) == (2 + 1) * 2 * len(x)  # 2 frameworks against targets + 1 pair in the agreement, x 2 outputs
    assert ev.output_agreement.set_index(["output", "metric"]).loc[("new_state", "max_abs_error"), "value"] < 1e-5
    back = mlms_nb.load_evaluation(ev.id)  # stored with the evaluation in the history store
    assert back.target_metrics.equals(ev.target_metrics)
    data = display.render_json(ev)["results"][0]["target_metrics"]
    assert {r["metric"] for r in data} == {"mse", "below"} and all("ci95_high" in r for r in data)
    assert re.search(r"Against targets: .*torch, new_state: .*mse 0\.25\d* ± [0-9.e-]+ \(output's unit²\)",
                     display.render_text(ev))


def test_python_pairs_and_parquet_columns_carry_targets_to_the_output_divergence(streamer, truth, capsys):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    x, out, new_state = truth
    pairs = [(x[i], {"new_state": new_state[i] + OFFSET}) for i in range(4)]
    result = mlms_nb.diverge("streamer", outputs=True, trust=True, dataset=pairs, metrics=["mae"])
    rows = result.targets.set_index(["framework", "output", "metric"])["value"]
    assert rows[("onnxruntime", "new_state", "mae")] == pytest.approx(OFFSET, abs=1e-5)
    assert set(result.targets["output"]) == {"new_state"} and (result.targets["inputs"] == 4).all()

    table = pa.table({"x": pa.array([list(r) for r in x]), "target:out": pa.array(out[:, 0] - OFFSET)})
    pq.write_table(table, streamer / "rows.parquet")
    assert main(["diverge", "streamer", "--outputs", "--trust", "--dataset", str(streamer / "rows.parquet"),
                 "--json"]) == 0
    against = json.loads(capsys.readouterr().out)["against_targets"]
    mae = {(r["framework"], r["metric"]): r for r in against if r["output"] == "out"}
    assert mae[("torch", "mae")]["value"] == pytest.approx(OFFSET, abs=1e-5)  # mse and mae: none named
    assert mae[("onnxruntime", "mse")]["value"] == pytest.approx(OFFSET ** 2, abs=1e-5)
    assert mae[("torch", "mae")]["inputs"] == len(x) and mae[("torch", "mae")]["unit"] == "output's unit"


def test_targets_that_do_not_fit_are_one_sentence(streamer, truth):
    x, out, _ = truth
    np.savez(streamer / "wrong_name.npz", x=x, **{"target:logits": out})
    with pytest.raises(MlmsError, match=r"targets for output 'logits', but the model's outputs are out, new_state"):
        mlms_nb.diverge("streamer", outputs=True, trust=True, dataset=str(streamer / "wrong_name.npz"))
    np.savez(streamer / "wrong_shape.npz", x=x, target=np.zeros((len(x), 3)))
    with pytest.raises(MlmsError, match=r"the target of output 'out' has shape \[3\] but the output has \[1\]"):
        mlms_nb.diverge("streamer", outputs=True, trust=True, dataset=str(streamer / "wrong_shape.npz"))
    np.savez(streamer / "short.npz", x=x, target=out[:2])
    with pytest.raises(MlmsError, match=r"'target' must hold numbers, one per input \(6\)"):
        mlms_nb.diverge("streamer", outputs=True, trust=True, dataset=str(streamer / "short.npz"))


def test_a_worker_process_scores_builtin_metrics_and_names_the_ones_it_cannot_receive(streamer, truth):
    x, _, new_state = truth
    np.savez(streamer / "isolated.npz", x=x, **{"target:new_state": new_state + OFFSET})
    ev = mlms_nb.evaluate("streamer", framework="onnxruntime", dataset=str(streamer / "isolated.npz"), isolate=True,
                          metrics={"mae": "mae", "local": lambda o, t: 0.0}, history=False, **QUICK)
    frame = ev.target_metrics.set_index(["output", "metric"])["value"]
    assert frame[("new_state", "mae")] == pytest.approx(OFFSET, abs=1e-5)
    assert ("new_state", "local") not in frame.index
    assert any("metric(s) local not computed against the targets" in w for w in ev.warnings)
