"""Every failure is one sentence (issue 23 items 6 and 8): the history's fallback that cannot be written either
(said once), a driver's multi-line error on one line, an option of several types named, sizes said as written, a
damaged store with the way out, a model failing at its first inference (exit 1, said once), and ONNX Runtime's own
logger quiet when a call is cancelled. The TLS and agent-name sentences are in tests/test_agents.py."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

import mlms_nb
from mlms_nb.errors import MlmsError
from tests.faults.models import fault_env, manifest, run_mlms, tiny_onnx

pytest.importorskip("onnxruntime")

QUICK = dict(dataset="synthetic:2", batch_sizes=[1], warmup=1, min_repeats=3, min_time_s=0, progress=False)
CLI_QUICK = ["--dataset", "synthetic:2", "--min-time", "0", "--min-repeats", "3", "--warmup", "1", "--json"]


@pytest.fixture
def tiny(tmp_path) -> Path:
    tiny_onnx(tmp_path / "tiny.onnx")
    return manifest(tmp_path, "tiny", "tiny.onnx")


def _corrupt_store(home: Path) -> str:
    home.mkdir(parents=True, exist_ok=True)
    (home / "history.sqlite").write_bytes(b"this is not a database\0" * 100)
    return f"sqlite:///{home / 'history.sqlite'}"


def test_a_fallback_that_cannot_be_written_is_said_once_on_one_line(tiny, mlms_home):
    url = _corrupt_store(mlms_home)
    (mlms_home / "unsaved").write_text("a file where the fallback folder should be")  # the fallback fails too
    ev = mlms_nb.evaluate(str(tiny), history=url, **{**QUICK, "batch_sizes": [1, 2]})  # two rows: two attempts
    [warning] = [w for w in ev.warnings if w.startswith("not saved to history")]
    assert warning.count("could not be written either") == 1 and "\n" not in warning
    assert "exists only in memory" in warning and not ev.saved
    assert sorted(ev.latency["batch_size"]) == [1, 2]  # nothing measured was lost
    assert not list(mlms_home.glob("**/*.tmp"))  # no empty temporary file left behind


def test_a_driver_error_of_several_lines_becomes_one_line(tiny, mlms_home):
    pytest.importorskip("psycopg")
    url = "postgresql+psycopg://nobody@127.0.0.1:1/mlms"  # nothing listens on port 1: refused at once
    ev = mlms_nb.evaluate(str(tiny), history=url, **QUICK)
    [warning] = [w for w in ev.warnings if w.startswith("not saved to history")]
    assert "\n" not in warning and "\t" not in warning and "unsaved" in warning


def test_an_option_of_several_types_is_named():
    with pytest.raises(MlmsError) as err:
        mlms_nb.evaluate("efficientnet_lite0", history=None)
    assert str(err.value).startswith("history=None:") and "bool=" not in str(err.value)


def test_a_memory_limit_is_said_as_written(tiny):
    rc, _, err = run_mlms(["eval", str(tiny), "--memory-limit", "2GiB", *CLI_QUICK], fault_env(tiny.parent / "h"))
    assert rc == 2 and "--memory-limit 2GiB" in err and "2147483648" not in err


def test_a_damaged_store_says_how_to_recover(mlms_home):
    from mlms_nb.store.history import HistoryStore

    url = _corrupt_store(mlms_home)
    with pytest.raises(MlmsError) as err:
        HistoryStore(url)
    text = str(err.value)
    assert "move it aside" in text and "history import" in text and "\n" not in text


def test_a_failure_at_the_first_inference_exits_1_and_is_said_once(tmp_path):
    tiny_onnx(tmp_path / "fixed.onnx", batch=1)  # ONNX Runtime refuses batch size 2 for real
    path, env = manifest(tmp_path, "fixed", "fixed.onnx"), fault_env(tmp_path / "home")
    rc, out, err = run_mlms(["eval", str(path), "--batch-sizes", "2", *CLI_QUICK], env)
    assert rc == 1, err  # it was loaded and run: not "refused before measuring" (2)
    said = [line for line in err.splitlines() if "dimensions" in line or "INVALID_ARGUMENT" in line]
    assert len(said) == 1, err


def test_a_cancelled_onnx_runtime_call_prints_no_raw_log_line(tmp_path):
    tiny_onnx(tmp_path / "forever.onnx", never_returns=True)
    path, env = manifest(tmp_path, "forever", "forever.onnx"), fault_env(tmp_path / "home")
    rc, out, err = run_mlms(["eval", str(path), "--batch-sizes", "1", "--call-timeout", "0.5", *CLI_QUICK], env)
    assert rc == 1 and "--call-timeout" in err, err
    assert "[E:onnxruntime" not in err and "terminate flag" not in err
    assert json.loads(out)["outcomes"]["onnxruntime"]["reason"] == "timeout"
