"""The history store on a real SQLite file and on a real PostgreSQL server (tests/pg_support.py): round trip,
queries, version ranges, traces and ceilings, concurrent writers."""
from __future__ import annotations

import multiprocessing as mp
import sqlite3

import numpy as np
import pandas as pd
import pytest

from mlms_nb.errors import MlmsError
from mlms_nb.evaluation.result import Evaluation
from mlms_nb.stack import detect_stack
from mlms_nb.evaluation.stats import latency_stats
from mlms_nb.store.history import QUERY_COLUMNS, HistoryStore, NotInHistoryError

MS = 1_000_000


def small_evaluation(model="resnet50", version="1.0.0", frameworks=("torch",), seed=0, complete=True,
                     created_at=None) -> Evaluation:
    rng = np.random.default_rng(seed)
    ev = Evaluation(model=model, model_version=version, frameworks=list(frameworks),
                    manifests={fw: {"name": model, "version": version} for fw in frameworks},
                    stack=detect_stack(frameworks), complete=complete,
                    options={"batch_sizes": [1, 4], "dataset": "synthetic", "scenario": "single-stream",
                             "threads": 1, "warmup": 5, "min_repeats": 10, "min_time_s": 0.1})
    if created_at:
        ev.created_at = created_at
    rows = []
    for i, fw in enumerate(frameworks):
        for b in (4, 1):
            s = (rng.normal(2 + i, 0.01, 30) * MS * b).astype(np.int64)
            rows.append({"framework": fw, "batch_size": b, "scenario": "single-stream", **latency_stats(s, b)})
            ev.samples[(fw, b, "single-stream")] = s
    ev.latency = pd.DataFrame(rows)
    ev.accuracy = pd.DataFrame([{"framework": fw, "dataset": "synthetic", "n": 10, "top1": 0.5 + 0.1 * i,
                                 "top5": 0.9, "skipped": 0} for i, fw in enumerate(frameworks)])
    ev.cold_start = pd.DataFrame([{"framework": fw, "load_ms": 100.0, "first_inference_ms": 5.0, "batch_size": 1}
                                  for fw in frameworks])
    return ev


@pytest.fixture
def sqlite_store(mlms_home, monkeypatch) -> HistoryStore:
    monkeypatch.delenv("MLMS_HISTORY_URL", raising=False)
    return HistoryStore()


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request, mlms_home, monkeypatch) -> HistoryStore:
    """The default SQLite store, or a fresh database on the session's PostgreSQL server."""
    monkeypatch.delenv("MLMS_HISTORY_URL", raising=False)
    if request.param == "sqlite":
        return HistoryStore()
    return HistoryStore(request.getfixturevalue("postgres_url"))


def test_default_store_is_a_wal_sqlite_file(sqlite_store, mlms_home):
    store = sqlite_store
    path = mlms_home / "history.sqlite"
    assert path.exists() and str(path) in store.display_url
    assert len(store) == 0
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert {"evaluations", "traces", "ceilings"} <= tables
    HistoryStore()  # creating the tables again is harmless


def test_url_from_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("MLMS_HISTORY_URL", f"sqlite:///{tmp_path / 'elsewhere' / 'h.db'}")
    store = HistoryStore()
    store.save(small_evaluation())
    assert (tmp_path / "elsewhere" / "h.db").exists() and len(store) == 1


def test_save_query_load_round_trip(store):
    ev = small_evaluation(frameworks=("torch", "onnxruntime"))
    ids = store.save(ev)
    assert len(ids) == 2 and len(store) == 2
    assert store.save(ev) == ids and len(store) == 2  # saving again adds nothing
    frame = store.query()
    assert list(frame.columns) == list(QUERY_COLUMNS) and "payload" not in frame
    row = frame[frame.framework == "onnxruntime"].iloc[0]
    assert row["model"] == "resnet50" and row["model_version"] == "1.0.0" and bool(row["complete"])
    assert row["batch_sizes"] == [1, 4] and row["dataset"] == "synthetic"
    assert row["top1"] == pytest.approx(0.6) and row["top5"] == pytest.approx(0.9) and row["n"] == 10
    lat = ev.latency
    expected = lat[(lat.framework == "onnxruntime") & (lat.batch_size == 1)]["median_ms"].iloc[0]
    assert row["median_ms"] == pytest.approx(expected)  # at the smallest batch size
    assert row["stack_hash"] == ev.framework_stack_hash("onnxruntime")
    assert row["framework_version"] == ev.stack["software"]["onnxruntime"]

    whole = store.load(ev.id)
    assert whole == ev and whole.history_ids == ids
    pd.testing.assert_frame_equal(whole.latency, ev.latency)
    part = store.load(ids[1])
    assert part == ev.for_framework("onnxruntime") and part.history_ids == [ids[1]]
    assert store.load(ev.id[:8]).frameworks == ["torch", "onnxruntime"]


def test_the_listing_reads_batch_sizes_as_sizes_and_counts_the_inputs_scored(sqlite_store):
    """The history as a table shows batch sizes ``1, 4`` (not the shape ``1×4``), the inputs each accuracy was
    measured on beside it, and a note that agrees with its % columns."""
    from mlms_nb.display import format_frame, render_text

    sqlite_store.save(small_evaluation())
    frame = sqlite_store.query()
    shown = format_frame(frame)
    assert shown["batch sizes"].tolist() == ["1, 4"] and shown["n"].tolist() == ["10"]
    assert shown["top-1 (%)"].tolist() == ["50.0"]
    text = render_text(frame)
    assert "top1/top5: fractions" not in text and "×" not in text
    assert "top-1 and top-5 (%): of the n labelled inputs scored" in text


def test_query_filters_and_order(store):
    store.save(small_evaluation(version="1.0.0", created_at="2024-01-01T00:00:00.000000+00:00"))
    store.save(small_evaluation(version="1.2.0", created_at="2024-02-01T00:00:00.000000+00:00", complete=False))
    store.save(small_evaluation(version="2.0.0", created_at="2024-03-01T00:00:00.000000+00:00"))
    store.save(small_evaluation(model="mobilenet_v2", version="1.5.0", frameworks=("onnxruntime",),
                                created_at="2024-04-01T00:00:00.000000+00:00"))
    everything = store.query()
    assert list(everything["model_version"]) == ["1.5.0", "2.0.0", "1.2.0", "1.0.0"]  # newest first
    assert list(store.query(model="resnet50", version="^1.0")["model_version"]) == ["1.2.0", "1.0.0"]
    assert list(store.query(version=">=1.2.0 <2")["model_version"]) == ["1.5.0", "1.2.0"]
    assert list(store.query(version="^1", limit=1)["model_version"]) == ["1.5.0"]
    assert list(store.query(framework="onnxruntime")["model"]) == ["mobilenet_v2"]
    assert list(store.query(complete=False)["model_version"]) == ["1.2.0"]
    assert len(store.query(limit=2)) == 2
    h = everything["stack_hash"].iloc[1]
    assert len(store.query(stack_hash=h)) == 3
    assert store.query(model="nothing").empty and list(store.query(model="nothing").columns) == list(QUERY_COLUMNS)
    with pytest.raises(MlmsError, match="npm-style range"):
        store.query(version="not a range!")


def test_missing_and_delete(store):
    with pytest.raises(NotInHistoryError, match="not in the history store"):
        store.load(12345)
    with pytest.raises(MlmsError):
        store.load("0123456789abcdef")
    ev = small_evaluation(frameworks=("torch", "onnxruntime"))
    ids = store.save(ev)
    assert store.delete(ids[0]) == 1 and len(store) == 1
    assert store.delete(ev.id) == 1 and len(store) == 0


def test_traces_and_ceilings_tables(store):
    store.add_trace("abc", "t1", "chrome-json", path="/tmp/t1.json")
    assert list(store.traces("abc")["trace_id"]) == ["t1"]
    store.save_ceilings({"stack_hash": "0123456789abcdef", "device": "cpu", "peak_flops_per_s": 1e12,
                         "bandwidth_bytes_per_s": 5e10, "ridge_flop_per_byte": 20.0, "measured_at": "2026-01-01",
                         "method": "matmul"})
    figures = store.ceilings("0123456789abcdef").set_index("metric")
    assert figures.loc["cpu/peak_flops_per_s", "value"] == 1e12 and figures.loc["cpu/peak_flops_per_s", "unit"] == "FLOP/s"
    assert store.load_ceilings("0123456789abcdef", "cpu")["ridge_flop_per_byte"] == 20.0


def test_bad_url_is_a_sentence():
    with pytest.raises(MlmsError, match="not an SQLAlchemy URL"):
        HistoryStore("no url at all")


# ---------------------------------------------------------------- several processes at once

def _writer(url: str, worker: int, count: int, barrier) -> list[str]:
    """Run in a spawned process: wait for the others, then save ``count`` evaluations."""
    barrier.wait(timeout=60)
    store = HistoryStore(url)
    saved = []
    for i in range(count):
        ev = small_evaluation(model=f"model{worker}", version=f"1.{i}.0", seed=worker * 1000 + i)
        store.save(ev)
        saved.append(ev.id)
    return saved


def test_concurrent_writers_lose_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("MLMS_HOME", str(tmp_path / "home"))
    url = f"sqlite:///{tmp_path / 'shared.sqlite'}"
    workers, count = 4, 25
    ctx = mp.get_context("spawn")
    with ctx.Manager() as manager:
        barrier = manager.Barrier(workers)
        with ctx.Pool(workers) as pool:
            results = pool.starmap(_writer, [(url, w, count, barrier) for w in range(workers)])
    ids = [e for r in results for e in r]
    assert len(ids) == len(set(ids)) == workers * count
    store = HistoryStore(url)
    assert len(store) == workers * count
    frame = store.query()
    assert len(frame) == workers * count and set(frame["evaluation_id"]) == set(ids)
    for w in range(workers):
        assert len(store.query(model=f"model{w}")) == count
    for row_id in frame["id"]:
        ev = store.load(int(row_id))
        assert ev.frameworks == ["torch"] and len(ev.samples) == 2 and not ev.latency.empty
