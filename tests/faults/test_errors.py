"""Real errors mid-sweep and a history that cannot take the result (issue 12): what was measured is kept and the
exit code says something is missing.

- an ONNX graph exported with its batch dimension fixed at 1, evaluated at batch sizes 1 and 2: ONNX Runtime
  refuses the second for real; batch size 1 is stored, the row partial with reason ``error``;
- a corrupt history file and a history locked by another process: a clear sentence, and the evaluation written to
  a fallback file named in it (``mlms_nb.load_evaluation`` reads it back);
- a manifest path with ``--framework`` naming another framework: one sentence, nothing run;
- a batch size whose input batch alone exceeds the memory: refused before loading, naming the estimate."""
from __future__ import annotations

import json
import re
import sqlite3
from pathlib import Path

import pytest

from tests.faults.models import fault_env, manifest, run_mlms, tiny_onnx

pytest.importorskip("onnxruntime")

QUICK = ["--dataset", "synthetic:2", "--min-time", "0", "--min-repeats", "3", "--warmup", "1", "--json"]


def test_an_error_at_the_second_batch_size_keeps_the_first(tmp_path):
    tiny_onnx(tmp_path / "fixed.onnx", batch=1)
    path, env = manifest(tmp_path, "fixed", "fixed.onnx"), fault_env(tmp_path / "home")
    rc, out, err = run_mlms(["eval", str(path), "--batch-sizes", "1,2", *QUICK], env)
    assert rc == 1, err
    data = json.loads(out)
    outcome = data["outcomes"]["onnxruntime"]
    assert (outcome["status"], outcome["reason"]) == ("partial", "error")
    assert outcome["measured_batch_sizes"] == [1] and outcome["missing_batch_sizes"] == [2]
    assert "dimensions" in outcome["message"] and data["missing"]
    from mlms_nb.store.history import HistoryStore

    [row] = HistoryStore(f"sqlite:///{env['MLMS_HOME']}/history.sqlite").query().to_dict("records")
    assert (row["status"], row["reason"], row["batch_sizes"]) == ("partial", "error", [1, 2])


def _kept_in_fallback(err: str, out: str):
    from mlms_nb import load_evaluation

    match = re.search(r"written to (\S+\.json)", err)
    assert match, err
    kept = load_evaluation(match.group(1))
    assert not json.loads(out)["saved"] and sorted(kept.latency["batch_size"]) == [1, 2]
    return kept


def test_a_corrupt_history_keeps_the_measurement_in_a_fallback_file(tmp_path):
    tiny_onnx(tmp_path / "tiny.onnx")
    path, env = manifest(tmp_path, "tiny", "tiny.onnx"), fault_env(tmp_path / "home")
    history = Path(env["MLMS_HOME"]) / "history.sqlite"
    history.parent.mkdir(parents=True, exist_ok=True)
    history.write_bytes(b"this is not a database\0" * 100)
    rc, out, err = run_mlms(["eval", str(path), "--batch-sizes", "1,2", *QUICK], env)
    assert rc == 1, err
    assert "not saved to history" in err and "not a database" in err
    _kept_in_fallback(err, out)


def test_a_locked_history_is_waited_for_then_the_measurement_kept(tmp_path):
    tiny_onnx(tmp_path / "tiny.onnx")
    path = manifest(tmp_path, "tiny", "tiny.onnx")
    env = fault_env(tmp_path / "home", MLMS_HISTORY_LOCK_TIMEOUT_S="1")
    history = Path(env["MLMS_HOME"]) / "history.sqlite"
    history.parent.mkdir(parents=True, exist_ok=True)
    holder = sqlite3.connect(history, isolation_level=None)
    holder.execute("CREATE TABLE held (x)")
    holder.execute("BEGIN EXCLUSIVE")  # another process holds the store, as a stuck writer would
    try:
        rc, out, err = run_mlms(["eval", str(path), "--batch-sizes", "1,2", *QUICK], env)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert rc == 1, err
    assert "locked by another process" in err and "MLMS_HISTORY_LOCK_TIMEOUT_S" in err
    _kept_in_fallback(err, out)


def test_a_manifest_path_runs_only_its_own_framework(tmp_path):
    tiny_onnx(tmp_path / "tiny.onnx")
    path, env = manifest(tmp_path, "tiny", "tiny.onnx"), fault_env(tmp_path / "home")
    rc, _, err = run_mlms(["eval", str(path), "--framework", "torch", *QUICK], env)
    assert rc == 2 and "is for framework onnxruntime" in err and "--framework asks for torch" in err
    assert not (Path(env["MLMS_HOME"]) / "history.sqlite").exists()
    rc, out, err = run_mlms(["eval", str(path), "--framework", "onnxruntime", "--batch-sizes", "1", *QUICK], env)
    assert rc == 0, err
    assert [r["framework"] for r in json.loads(out)["results"]] == ["onnxruntime"]


def test_a_batch_size_too_big_for_memory_is_refused_before_loading(tmp_path):
    import psutil

    tiny_onnx(tmp_path / "tiny.onnx")
    path, env = manifest(tmp_path, "tiny", "tiny.onnx"), fault_env(tmp_path / "home")
    huge = psutil.virtual_memory().total // (3 * 8 * 8 * 4) * 2  # twice the machine's memory in inputs alone
    rc, _, err = run_mlms(["eval", str(path), "--batch-sizes", f"1,{huge}", *QUICK], env)
    assert rc == 2
    assert f"batch size {huge} needs at least" in err and "GiB of memory available" in err
    assert "opened" not in err  # refused before loading anything
